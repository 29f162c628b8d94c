from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hetero_dp.allocation.sharing import SharingConfig, SharingSection, sharing_config
from hetero_dp.engine.claims import Sections, installed_claims, installed_sections
from hetero_dp.engine.configfile import NOT_PLAIN, plain_scalar, read_file, set_option
from hetero_dp.engine.settings import (
    RESOURCE_KEYS,
    SCALARS,
    SECTION_KEYS,
    SECTIONS,
    SETTINGS,
    ConfigFile,
    CoreSections,
    CoreSettings,
    ResourceSettings,
    env_name,
    flag_name,
)
from hetero_dp.kits.mappings import deep_merge
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import KUBELET_SOCKET, MAX_UNIX_PATH, validate_resource_name
from hetero_dp.model.options import camel, parse_options, unknown_key
from hetero_dp.model.shown import shown

__all__ = [
    "NOT_PLAIN",
    "RESOURCE_KEYS",
    "SCALARS",
    "SECTIONS",
    "SECTION_KEYS",
    "Config",
    "ResourceSettings",
    "env_name",
    "flag_name",
    "load_config",
    "plain_scalar",
    "read_file",
    "set_option",
]

_NO_SETTINGS = ResourceSettings()

# A socket prefix is part of a file name: it must not leave its dir.
SOCKET_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class Config(CoreSettings, CoreSections):
    """A loaded config: every core setting typed as declared (engine/settings.py: the
    top-level settings, ``cdi``, ``labels`` and ``metrics`` as their dataclasses), the
    ``sharing`` block read, each resource's settings checked, each backend's options
    as given (read by its own declaration when it is configured), and where they came
    from."""

    source: str = "defaults"
    backends: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    # resource name -> its entry of the file's ``resources``, typed and checked
    resources: Mapping[str, ResourceSettings] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict)
    # backend name -> where its options were given (``file, field 'backends.x'``,
    # ``flag -o x.key``), for refusing options of a backend that is not loaded
    backend_origins: Mapping[str, str] = field(default_factory=dict)
    # backend name -> the dotted option keys ``-o`` set (a flag wins over the
    # environment variable an option declares)
    backend_flagged: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # the sections each backend claims: those of the backends the caller loads
    # (load_config's ``sections``), and the installed backends' where the file needed
    # them; a backend not among them: its installed entry point's own, looked up when asked
    sections: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def claims(self, name: str) -> dict[str, str]:
        """The config sections backend ``name`` claims (its ``config_sections`` hook)."""
        if name in self.sections:
            return dict(self.sections[name])
        return installed_claims(name)

    def backend_options(self, name: str) -> dict[str, Any]:
        """Backend ``name``'s options: the sections it claims, under ``backends.<name>``
        of the file, under ``-o`` flags."""
        claimed, _written = _claimed(self.raw, self.claims(name), self.source)
        return deep_merge(claimed, dict(self.backends.get(name, {})))

    def options_source(self, name: str) -> str:
        """Where a backend's options were given, for messages about them."""
        return self.backend_origins.get(name) or self.source or "config"

    def option_field(self, name: str, field_name: str) -> str:
        """``backends.<name>.<key>...`` as the user wrote it (``flags.<key>...`` for an
        option from a section the backend claims, such as a ``flags`` section; one also
        given under ``backends.<name>`` or ``-o`` is named there)."""
        prefix = f"backends.{name}."
        if not field_name.startswith(prefix):
            return field_name
        rest = field_name[len(prefix) :]
        if _under(rest, self.backends.get(name, {})) is not None:
            return field_name
        try:
            _claimed_options, written = _claimed(self.raw, self.claims(name), self.source)
        except ConfigError:
            return field_name
        key = _under(rest, written)  # the longest: a key may hold dots itself
        return field_name if key is None else written[key] + rest[len(key) :]

    def resource_settings(self, name: str) -> ResourceSettings:
        """Resource ``name``'s entry of the file (none: every key left out)."""
        return self.resources.get(name) or _NO_SETTINGS


def _under(rest: str, keys: Iterable[Any]) -> str | None:
    """The longest of ``keys`` that the field ``rest`` is, or lies under (``plugin`` for
    ``plugin.x`` or ``plugin[0]``); None when none."""
    found = [k for k in map(str, keys) if rest == k or rest.startswith((f"{k}.", f"{k}["))]
    return max(found, key=len, default=None)


def _check_paths(cfg: CoreSettings, sources: Mapping[str, str]) -> None:
    """``socketPrefix`` stays a file name; the kubelet's socket and ours fit a unix
    socket path (108 bytes with the NUL), or the error names the dir that is too long."""
    if not SOCKET_PREFIX.match(cfg.socket_prefix):
        raise ConfigError(
            "must be 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or "
            f"digit (it is part of a socket file name), got {shown(cfg.socket_prefix)}",
            field="socketPrefix",
            source=sources["socketPrefix"],
        )
    shortest = f"{cfg.socket_prefix}-x.sock"
    for key, directory, name in (
        ("kubeletDir", cfg.kubelet_dir, KUBELET_SOCKET),
        ("kubeletDir", cfg.kubelet_dir, shortest),
        ("pluginsRegistryDir", cfg.plugins_registry_dir, shortest),
    ):
        if key == "pluginsRegistryDir" and cfg.registration != "watcher":
            continue
        size = len(os.fsencode(directory / name))
        if size > MAX_UNIX_PATH:
            raise ConfigError(
                f"{directory} is too long: a socket in it ({name}) would have a path of "
                f"{size} bytes; unix sockets allow {MAX_UNIX_PATH}",
                field=key,
                source=sources[key],
            )


def check_backend_names(cfg: Config, loaded: Iterable[str]) -> None:
    """Refuse options (``-o``, ``backends.<name>``) for a backend that is not loaded: a
    typo there would otherwise be ignored in silence."""
    names = sorted(set(loaded))
    for name, origin in sorted(cfg.backend_origins.items()):
        if name not in names:
            raise ConfigError(
                f"options for backend {name!r}, which is not loaded "
                f"(loaded: {', '.join(names) or 'none'})",
                field=f"backends.{name}",
                source=origin,
            )


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    raw: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    sections: Sections | None = None,
) -> Config:
    """Build a Config from a file, the environment and flag overrides (camelCase keys,
    a section's keys under the section: ``{"metrics": {"address": ...}}``).

    ``sections``: the config sections each backend the caller runs claims (its
    ``config_sections`` hook; :func:`hetero_dp.engine.loading.sections_of`), so that
    a backend loaded from a file has its sections read too. A key neither the core nor
    those explain is looked up among the installed backends' sections (a section an
    installed backend claims is no typo even when that backend is not run; a file
    without such keys imports nothing for it).
    """
    env = os.environ if env is None else env
    source = str(path) if path else ("inline config" if raw is not None else "defaults")
    raw = read_file(path) if path else dict(raw or {})

    core = {*SCALARS, *SECTIONS, "version"}
    claims = {str(n): dict(c) for n, c in (sections or {}).items()}
    if _needs_backend_sections(raw, core, claims):
        claims = {**installed_sections(), **claims}
    claimed = {k.split(".", 1)[0] for c in claims.values() for k in c}
    unknown = sorted(set(raw) - core - claimed, key=str)
    if unknown:
        reason = unknown_key(str(unknown[0]), sorted(core | claimed))
        raise ConfigError(reason, field=str(unknown[0]), source=source)

    flags = dict(overrides or {})
    settings, origins = _layered(raw, env, flags)
    # one reader for every key the core reads itself (model/options.py): a refusal names
    # where the value came from (origins: env var or flag; the file otherwise)
    read = parse_options(ConfigFile, settings, field="", source=source, environ={}, flagged=origins)
    sources = {k: origins.get(k) or (source if k in raw else "defaults") for k in SCALARS}
    _check_paths(read, sources)
    backends, backend_origins = _backends(raw, flags, source)
    taken = {k.split(".", 1)[1] for c in claims.values() for k in c if k.startswith("resources.")}
    return Config(
        **{name: getattr(read, name) for name in _TYPED},
        source=source,
        raw=dict(raw),
        sharing=sharing_config(read.sharing or SharingSection(), source),
        sections=claims,
        backends=backends,
        backend_origins=backend_origins,
        backend_flagged={
            str(name): frozenset(_dotted(options))
            for name, options in _mapping(flags.get("backends"), "backends", "flag -o").items()
        },
        resources=_resources(raw.get("resources"), source, taken),
    )


# the fields a Config takes as read: the top-level settings and the core's sections
_TYPED = [f.name for f in fields(CoreSettings)] + [f.name for f in fields(CoreSections)]
_FILE_KEYS = {camel(f.name) for f in fields(ConfigFile)}


def _layered(
    raw: Mapping[str, Any], env: Mapping[str, str], flags: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The core's keys with flags > env > file (a section as written, the keys an env
    var or flag sets over it), and where each value not from the file came from (dotted
    key -> ``env HETERO_DP_X`` or ``flag --x``). A setting whose declaration says a flag
    or env var also sets other keys of its section (``--labels-dir``: labels.enabled)
    sets them too."""
    settings: dict[str, Any] = {k: v for k, v in raw.items() if k in _FILE_KEYS}
    origins: dict[str, str] = {}
    given: dict[str, Any] = {}  # dotted key -> value, from the environment then flags
    for s in SETTINGS:
        section = s.key.split(".", 1)[0] if "." in s.key else None
        from_flags = flags.get(s.key) if section is None else _flag_in(flags, s.key)
        # (an empty variable: a top-level setting refuses it; a section's means unset,
        # as click read those variables before)
        var = s.info.env
        if var and var in env and (section is None or env[var] != ""):
            given[s.key], origins[s.key] = env[var], f"env {var}"
        if from_flags is not None and from_flags != "":
            given[s.key], origins[s.key] = from_flags, f"flag {flag_name(s.key)}"
        if s.key in given and s.info.also and section is not None:
            for k, v in s.info.also:
                given.setdefault(f"{section}.{k}", v)
                origins.setdefault(f"{section}.{k}", origins[s.key])
    for key, value in given.items():
        if "." not in key:
            settings[key] = value
            continue
        section, k = key.split(".", 1)
        inner = settings.get(section)
        if inner is None or isinstance(inner, Mapping):  # else: refused as read
            settings[section] = {**(inner or {}), k: value}
    return settings, origins


def _flag_in(flags: Mapping[str, Any], key: str) -> Any:
    section, k = key.split(".", 1)
    return _mapping(flags.get(section), section, "flags").get(k)


def _mapping(value: Any, field: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"expected a mapping, got {type(value).__name__}", field=field, source=source
        )
    return value


def _dotted(options: Any, prefix: str = "") -> list[str]:
    """The dotted keys of nested options: ``{a: {b: 1}, c: 2}`` -> ``a.b``, ``c``."""
    if not isinstance(options, Mapping):
        return []
    keys = []
    for k, v in options.items():
        keys.append(f"{prefix}{k}")
        keys.extend(_dotted(v, f"{prefix}{k}."))
    return keys


def _needs_backend_sections(
    raw: Mapping[str, Any], core: set[str], claims: Mapping[str, Mapping[str, str]]
) -> bool:
    """Whether the file has keys only an installed backend's sections can explain: a
    top-level key neither the core nor ``claims`` know, or a key of ``resources`` that
    is no resource name (and no key ``claims`` holds)."""
    claimed = {k for c in claims.values() for k in c}
    heads = {k.split(".", 1)[0] for k in claimed}
    resources = raw.get("resources")
    odd = isinstance(resources, Mapping) and any(
        "/" not in str(k) and f"resources.{k}" not in claimed for k in resources
    )
    return odd or any(k not in core and k not in heads for k in raw)


def _lookup(raw: Mapping[str, Any], dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _claimed(
    raw: Mapping[str, Any], claims: Mapping[str, str], source: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """A backend's options from the sections it claims, and where each was written
    (option key -> the field as written)."""
    options: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, target in claims.items():
        value = _lookup(raw, key)
        if value is None:
            continue
        if not target:  # the section's keys are options themselves
            for k, v in _mapping(value, key, source).items():
                options[str(k)] = v
                written[str(k)] = f"{key}.{k}"
            continue
        head, *rest = target.split(".")
        node = options
        for part in [head, *rest][:-1]:
            child = node.get(part)  # copied: the file's own mapping is never changed
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[[head, *rest][-1]] = value
        # the field as written for the option's first key: the file key less the
        # option key's tail (resources.gpus -> options resources.gpus: resources)
        written[head] = key.rsplit(".", len(rest))[0] if rest else key
    return options, written


def _backends(
    raw: Mapping[str, Any], flags: Mapping[str, Any], source: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The options of each backend under ``backends.<name>`` and ``-o`` (the sections a
    backend claims are added when its options are read: :meth:`Config.backend_options`),
    and where each backend's were given (claimed sections are not counted: such a file
    may be shared with another program)."""
    backends: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    for name, options in _mapping(raw.get("backends"), "backends", source).items():
        opts = _mapping(options, f"backends.{name}", source)
        backends[name] = deep_merge(backends.get(name, {}), opts)
        origins.setdefault(str(name), source)
    for name, options in _mapping(flags.get("backends"), "backends", "flag -o").items():
        backends[name] = deep_merge(backends.get(name, {}), options)
        origins[str(name)] = f"flag -o {name}.{next(iter(options), '')}".rstrip(".")
    return backends, origins


def _resources(value: Any, source: str, taken: set[str]) -> dict[str, ResourceSettings]:
    """``resources``: each entry read as :class:`ResourceSettings` (typed, its delivery
    checked: allocation/delivery.py), keyed by resource name."""
    out: dict[str, ResourceSettings] = {}
    for name, settings in _mapping(value, "resources", source).items():
        if name in taken:
            continue  # a key a backend claims (no '/': no resource name)
        field = f"resources.{name}"
        validate_resource_name(name, field=field, source=source)
        read = parse_options(ResourceSettings, settings, field=field, source=source, environ={})
        try:
            read.check_kind(name)
        except ConfigError as e:  # it names the key, not where the file is
            raise ConfigError(e.reason, field=f"{field}.{e.field}", source=source) from None
        out[name] = read
    return out
