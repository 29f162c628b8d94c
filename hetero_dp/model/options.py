"""Typed backend options: declared as a dataclass, read from the config file, the
environment and ``-o`` flags, checked, and handed to the backend as an instance.

A backend declares its options by annotating its ``configure`` hook::

    @dataclass(frozen=True)
    class AcmeOptions:
        device_glob: str = option("/dev/acme*", help="device nodes to advertise")
        max_boards: int = option(8, help="advertise at most this many", min=1, max=64)

    @hookimpl
    def configure(options: AcmeOptions) -> None: ...

The config key of ``device_glob`` is ``deviceGlob`` (camelCase, as every other key
of the config file), so the file says ``backends.acme.deviceGlob`` and the flag is
``-o acme.deviceGlob=/dev/x*``. An unknown key is refused with the closest known
one ("did you mean"), a value of the wrong type or out of range names the option and
what it expected. The core's own settings (the top-level keys of the config file, its
``cdi``/``labels``/``metrics`` sections and each ``resources`` entry) are declared and
read the same way, so every refusal has one style: where the value came from (the file,
``env VAR``, ``flag --x``), the field as written (dotted), the reason, did-you-mean.
``hetero-dp list --options acme`` prints the table this module builds from the same
declaration.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import pathlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import closest, path_problem
from hetero_dp.model.shown import shown

log = logging.getLogger(__name__)

_META = "hetero_dp"
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


class _Required:
    """The default of an option that has none: the user must give it."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclasses.dataclass(frozen=True)
class OptionInfo:
    """What :func:`option` adds to a dataclass field."""

    help: str = ""
    key: str | None = None  # the config key; None: the camelCase of the field name
    env: str | None = None  # an environment variable that sets it (a flag still wins)
    min: float | None = None
    max: float | None = None
    internal: bool = False  # set by the framework or a command, not listed for users
    off: float | None = None  # a number outside min..max that turns the thing off (0)
    # the value as written, not converted: a str option refuses a number or bool; a bool,
    # number or list option refuses text (what a flag or the environment gives)
    strict: bool = False
    # a path on this node: absolute, no NUL, within PATH_MAX and NAME_MAX ('' still
    # allowed where the default is '': it means none)
    path: bool = False
    # the core's own settings (engine/config.py): the flag of ``hetero-dp run`` that
    # sets it, other keys of its section that flag (or ``env``) also sets, and what a
    # config reload does with a change (RELOADS)
    flag: str | None = None
    also: tuple[tuple[str, Any], ...] = ()
    reload: str = "applied"


#: What a config reload does with a changed setting: ``applied`` (it takes effect),
#: ``refused`` (the reload is refused: where sockets live; restart to change it) or
#: ``next start`` (read only at start-up: the reload is applied and says, naming the
#: key, that this one waits for a restart).
RELOADS = ("applied", "refused", "next start")


@dataclasses.dataclass(frozen=True)
class OptionDoc:
    """One row of ``hetero-dp list --options``: an option as the user writes it."""

    key: str  # dotted for a nested section: ``health.interval``
    type: str
    default: str  # "required" when there is none
    env: str
    help: str


def option(
    default: Any = REQUIRED,
    *,
    help: str = "",
    key: str | None = None,
    env: str | None = None,
    min: float | None = None,
    max: float | None = None,
    internal: bool = False,
    off: float | None = None,
    strict: bool = False,
    path: bool = False,
    flag: str | None = None,
    also: Mapping[str, Any] | None = None,
    reload: str = "applied",
) -> Any:
    """A field of a backend's options dataclass, with its help text and limits.

    ``default`` may be a list or dict (each instance gets its own copy); leave it out
    for a required option. ``key`` overrides the config key (camelCase of the field
    name by default), ``env`` names an environment variable that sets the option
    (the config file < the environment < ``-o`` flags), ``min`` and ``max`` bound a
    number (or the length of a list). ``internal`` leaves the option out of
    ``hetero-dp list --options`` (one a command sets, not the user). ``off`` is a
    number outside ``min``..``max`` that is taken too, meaning "off" (``0`` for an
    interval). ``strict`` makes a ``str`` option refuse a number (a port written where
    a path or an address goes is a mistake, not a name), and a bool, number or list
    option refuse text (``"yes"``, ``"4"``, ``"a,b"``: a schema that takes the file's
    values as typed, such as the ``sharing`` block). ``path`` makes a ``str`` or ``Path``
    option a path on this node: a NUL byte, a relative path or one longer than the
    system takes is refused naming the option (:func:`~hetero_dp.model.names.path_problem`).

    For the core's own settings: ``flag`` is the flag of ``hetero-dp run`` that sets it
    (generated from this declaration), ``also`` other keys of the same section that the
    flag or ``env`` sets too (``--labels-dir`` turns ``labels.enabled`` on), ``reload``
    what a config reload does with a change (one of :data:`RELOADS`).
    """
    if reload not in RELOADS:
        raise ValueError(f"reload must be one of {', '.join(RELOADS)}, got {reload!r}")
    info = OptionInfo(
        help=help,
        key=key,
        env=env,
        min=min,
        max=max,
        internal=internal,
        off=off,
        strict=strict,
        path=path,
        flag=flag,
        also=tuple((also or {}).items()),
        reload=reload,
    )
    meta = {_META: info}
    if default is REQUIRED:
        return dataclasses.field(metadata=meta)
    if isinstance(default, list | dict | set):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def camel(name: str) -> str:
    """``device_glob`` -> ``deviceGlob``."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def is_schema(obj: object) -> bool:
    return isinstance(obj, type) and dataclasses.is_dataclass(obj)


def schema_of(function: Callable[..., Any] | None) -> type | None:
    """The options dataclass a ``configure`` hook's ``options`` argument is annotated
    with, or None (the hook takes a plain mapping, or there is no hook)."""
    if function is None:
        return None
    try:
        hints = typing.get_type_hints(function)
    except Exception as e:  # an annotation that does not resolve: treated as untyped
        if "options" in getattr(function, "__annotations__", {}):
            log.warning(
                "the annotation of %s's options argument does not resolve (%r): its "
                "options are passed as a plain mapping; declare the options class at "
                "module level",
                getattr(function, "__qualname__", function),
                e,
            )
        return None
    hint = hints.get("options")
    return hint if is_schema(hint) else None


def _info(f: dataclasses.Field[Any]) -> OptionInfo:
    info = f.metadata.get(_META)
    return info if isinstance(info, OptionInfo) else OptionInfo()


def _key(f: dataclasses.Field[Any]) -> str:
    return _info(f).key or camel(f.name)


@functools.cache
def _fields(schema: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """The fields of ``schema`` with their resolved types (resolved once per schema: it
    was most of the time reading a config took)."""
    hints = typing.get_type_hints(schema)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(schema) if f.init)


@dataclasses.dataclass(frozen=True)
class Declared:
    """One declared option, nested sections flattened (:func:`declared`)."""

    key: str  # the dotted config key: ``metrics.address``
    path: tuple[str, ...]  # the attribute names: ``("metrics", "address")``
    hint: Any  # its type
    info: OptionInfo
    default: Any  # REQUIRED when there is none


def declared(schema: type, prefix: str = "", path: tuple[str, ...] = ()) -> list[Declared]:
    """Every option of ``schema``, a nested section's options under its dotted key."""
    rows: list[Declared] = []
    for f, hint in _fields(schema):
        key, at = prefix + _key(f), (*path, f.name)
        if is_schema(hint):
            rows.extend(declared(hint, key + ".", at))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        rows.append(Declared(key, at, hint, _info(f), default))
    return rows


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def parse_options(
    schema: type,
    raw: Mapping[str, Any] | None,
    *,
    field: str,
    source: str = "",
    environ: Mapping[str, str] | None = None,
    flagged: frozenset[str] | Mapping[str, str] = frozenset(),
) -> Any:
    """An instance of ``schema`` from ``raw`` (the merged file and flag options).

    ``field`` is where the options sit (``backends.acme``), for messages; ``source``
    where ``raw`` came from (the file). An option with ``env`` set is read from
    ``environ`` unless a flag set it: ``flagged`` holds the dotted keys (relative to
    ``field``) the command line gave, or maps each to where its value came from
    (``flag --kubelet-dir``, ``env HETERO_DP_KUBELET_DIR``), which a refusal of it
    names instead of ``source``. A ConfigError the schema's ``__post_init__`` raises (a
    check across options) names its field relative to the options, as here.
    ConfigError names the option: source, the field as written, reason, did-you-mean.
    """
    env = os.environ if environ is None else environ
    origins = flagged if isinstance(flagged, Mapping) else dict.fromkeys(flagged, "")
    return _parse(schema, {} if raw is None else raw, field, source, env, origins, "")


def _parse(
    schema: type,
    raw: Any,
    field: str,
    source: str,
    env: Mapping[str, str],
    flagged: Mapping[str, str],
    path: str,
) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"expected a mapping, got {shown(raw)}", field=field, source=source)
    fields = _fields(schema)
    keys = {_key(f): (f, hint) for f, hint in fields}
    raw = _nested(raw, {k for k, (_f, hint) in keys.items() if is_schema(hint)})
    for k in raw:
        if str(k) not in keys:
            listed = [key for key, (f, _hint) in keys.items() if not _info(f).internal]
            here = flagged.get(f"{path}{k}") or source
            raise ConfigError(unknown_key(str(k), listed), field=_at(field, k), source=here)
    values: dict[str, Any] = {}
    for k, (f, hint) in keys.items():
        where = _at(field, k)
        info = _info(f)
        value, here = raw.get(k, dataclasses.MISSING), flagged.get(f"{path}{k}") or source
        if info.env and env.get(info.env, "") != "" and f"{path}{k}" not in flagged:
            value, here = env[info.env], f"env {info.env}"
            where = k
        if value is dataclasses.MISSING:
            if not _has_default(f):
                raise ConfigError(
                    f"required option is missing{_help(info)}", field=where, source=source
                )
            continue
        blank = isinstance(value, str) and not value.strip()
        if blank and hint is str and f.default and info.min is None:
            # `-o acme.deviceGlob=` (a cut value, an unset shell variable) would silently
            # find nothing: an option with a default is not emptied by accident (min=0 may)
            why = f"may not be empty (leave it out for its default {f.default!r})"
            raise ConfigError(why, field=where, source=here)
        values[f.name] = _value(hint, value, info, where, here, env, flagged, f"{path}{k}.")
    try:
        return schema(**values)
    except ConfigError as e:  # a check across options (__post_init__), naming one of them
        origin = flagged.get(f"{path}{e.field}") if e.field else None
        at = _at(field, e.field) if e.field else field
        raise ConfigError(e.reason, field=at, source=origin or source) from None
    except (TypeError, ValueError) as e:  # the dataclass's own __post_init__ refused
        raise ConfigError(str(e), field=field, source=source) from None


def _at(field: str, key: object) -> str:
    return f"{field}.{key}" if field else str(key)


def _nested(raw: Mapping[str, Any], sections: set[str]) -> Mapping[str, Any]:
    """``{"plugin.x": 1}`` read as ``{"plugin": {"x": 1}}`` where ``plugin`` is a
    nested section: the dotted spelling of a nested key."""
    dotted = [k for k in raw if isinstance(k, str) and "." in k and k.split(".")[0] in sections]
    if not dotted:
        return raw
    out = {k: v for k, v in raw.items() if k not in dotted}
    for k in dotted:
        head, _, rest = k.partition(".")
        inner = out.get(head)
        inner = dict(inner) if isinstance(inner, Mapping) else {}
        inner[rest] = raw[k]
        out[head] = inner
    return out


def _help(info: OptionInfo) -> str:
    return f" ({info.help})" if info.help else ""


def unknown_key(key: str, known: Sequence[str]) -> str:
    """The reason refusing an unknown key, for options and the core's keys alike:
    ``unknown key; did you mean 'deviceGlob'? (known: boards, deviceGlob)``."""
    if not known:
        return "unknown key: this backend takes no options"
    close = closest(key, list(known)) or {k.lower(): k for k in known}.get(key.lower())
    hint = f"; did you mean {close!r}?" if close else ""
    return f"unknown key{hint} (known: {', '.join(sorted(known))})"


def _value(
    hint: Any,
    value: Any,
    info: OptionInfo,
    where: str,
    source: str,
    env: Mapping[str, str],
    flagged: Mapping[str, str],
    path: str,
) -> Any:
    def fail(expected: str) -> ConfigError:
        return ConfigError(f"expected {expected}, got {shown(value)}", field=where, source=source)

    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:  # X | None: X's own refusal, which may name a field inside
            return _value(others[0], value, info, where, source, env, flagged, path)
        errors = []
        for a in others:
            try:
                return _value(a, value, info, where, source, env, flagged, path)
            except ConfigError as e:
                errors.append(e.reason.removeprefix("expected ").split(", got")[0])
        raise fail(" or ".join(errors))
    if origin is typing.Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and str(choice) == value.strip()):
                return choice
        raise fail("one of " + ", ".join(str(a) for a in args))
    if is_schema(hint):
        # a section written with nothing under it (``metrics:`` whose keys are all
        # commented out) is null in YAML: it means the section's defaults
        return _parse(hint, {} if value is None else value, where, source, env, flagged, path)
    if (hint is str or hint is pathlib.Path) and info.strict and not isinstance(value, str):
        raise fail("a string")
    if origin in (list, tuple, set, frozenset, Sequence) or hint in (list, tuple):
        item = args[0] if args else Any
        if isinstance(value, str) and info.strict:
            raise fail("a list")
        if isinstance(value, str):  # from a flag or the environment: comma-separated
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise fail("a list")
        items = [
            _value(item, v, OptionInfo(), f"{where}[{i}]", source, env, flagged, path)
            for i, v in enumerate(value)
        ]
        _bounds(len(items), info, where, source, "items")
        kind = origin if origin in (tuple, set, frozenset) else list
        return kind(items)
    if origin in (dict, Mapping) or hint is dict:
        item = args[1] if len(args) == 2 else Any
        if not isinstance(value, Mapping):
            raise fail("a mapping")
        return {
            str(k): _value(item, v, OptionInfo(), f"{where}.{k}", source, env, flagged, path)
            for k, v in value.items()
        }
    if hint is bool:
        if isinstance(value, bool):
            return value
        if info.strict:
            raise fail("true or false")
        if isinstance(value, str | int) and str(value).strip().lower() in _TRUE + _FALSE:
            return str(value).strip().lower() in _TRUE
        raise fail("true or false")
    if hint is int:
        if isinstance(value, str) and info.strict:
            raise fail("an integer")
        if isinstance(value, str):
            try:
                value = int(value.strip(), 10)
            except ValueError:
                raise fail("an integer") from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise fail("an integer")
        _bounds(value, info, where, source)
        return value
    if hint is float:
        number = value
        if isinstance(value, str) and info.strict:
            raise fail("a number")
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise fail("a number") from None
        if not isinstance(number, int | float) or isinstance(number, bool):
            raise fail("a number")
        if not math.isfinite(number):
            raise fail("a finite number")
        _bounds(number, info, where, source)
        return float(number)
    if hint is str or hint is pathlib.Path:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise fail("a string")
        text = str(value)
        _bounds(len(text), info, where, source, "characters")
        problem = path_problem(text) if info.path and text else None
        if problem:
            raise ConfigError(problem, field=where, source=source)
        return pathlib.Path(text) if hint is pathlib.Path else text
    raise ConfigError(
        f"the backend declares this option with a type hetero-dp cannot read ({hint!r})",
        field=where,
        source=source,
    )


def _bounds(value: float, info: OptionInfo, where: str, source: str, unit: str = "") -> None:
    what = f"{_num(value)} {unit}".strip()
    if info.off is not None and value == info.off:
        return
    off = f" (or {_num(info.off)}: off)" if info.off is not None else ""
    if info.min is not None and value < info.min:
        raise ConfigError(
            f"must be at least {_num(info.min)}{' ' + unit if unit else ''}{off}, got {what}",
            field=where,
            source=source,
        )
    if info.max is not None and value > info.max:
        raise ConfigError(
            f"must be at most {_num(info.max)}{' ' + unit if unit else ''}{off}, got {what}",
            field=where,
            source=source,
        )


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def default_problems(schema: type, prefix: str = "") -> list[str]:
    """Defaults that do not have their option's type (``count: int = option("ninety")``),
    one line each: read as the type reads a config value, a default must come back
    unchanged (a float default may be an int; a Path default a string)."""
    problems = []
    for f, hint in _fields(schema):
        key = prefix + _key(f)
        if is_schema(hint):
            problems.extend(default_problems(hint, key + "."))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        if hint is pathlib.Path and isinstance(default, pathlib.PurePath):
            continue
        try:
            read = _value(hint, default, OptionInfo(), key, "", {}, {}, key)
        except ConfigError as e:
            problems.append(
                f"option {key!r} ({type_name(hint)}) has the default {default!r}: {e.reason}"
            )
            continue
        same = read == default or (hint is pathlib.Path and read == pathlib.Path(str(default)))
        if not same or (
            type(read) is not type(default) and not isinstance(read, float | pathlib.Path)
        ):
            problems.append(
                f"option {key!r} ({type_name(hint)}) has the default {default!r}, "
                f"which is not of type {type_name(hint)}"
            )
    return problems


def describe(schema: type, prefix: str = "") -> list[OptionDoc]:
    """Every option of ``schema`` (nested sections flattened to dotted keys)."""
    rows: list[OptionDoc] = []
    for f, hint in _fields(schema):
        key = prefix + _key(f)
        if is_schema(hint):
            rows.extend(describe(hint, key + "."))
            continue
        info = _info(f)
        if info.internal:
            continue
        if f.default is not dataclasses.MISSING:
            default = _default_text(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _default_text(f.default_factory())
        else:
            default = "required"
        low, high = info.min, info.max
        if low is not None and high is not None:
            limits = f" ({_num(low)} to {_num(high)})"
        elif low is not None:
            limits = f" (at least {_num(low)})"
        elif high is not None:
            limits = f" (at most {_num(high)})"
        else:
            limits = ""
        if info.off is not None:
            limits = limits[:-1] + f", or {_num(info.off)}: off)" if limits else ""
        text = (info.help + limits).strip()
        rows.append(OptionDoc(key, type_name(hint), default, info.env or "", text))
    return rows


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in value) or "(empty)"
    if isinstance(value, pathlib.Path):
        return str(value)
    return repr(value) if isinstance(value, str) else str(value)


def type_name(hint: Any) -> str:
    """How ``list --options`` names a type: ``int``, ``list of str``, ``a | b``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return "any"
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin is typing.Union or origin is types.UnionType:
        names = [type_name(a) for a in args if a is not type(None)]
        optional = " (or none)" if type(None) in args else ""
        return " or ".join(names) + optional
    if origin in (list, tuple, set, frozenset, Sequence):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping):
        return f"mapping of {type_name(args[1])}" if len(args) == 2 else "mapping"
    if hint is pathlib.Path:
        return "path"
    return getattr(hint, "__name__", str(hint))
