"""One configuration schema, from a YAML file, environment variables and flags.

Precedence: flags > environment > file > defaults. Every error names the
source (file, ``env HETERO_DP_...`` or ``flag --...``), the field and the reason,
and stops start-up before any socket is touched.

NVIDIA's config file (``version: v1`` with ``flags`` and ``sharing``) is a
subset of this schema: its ``sharing`` block is ours, and its ``flags`` become
the options of the backend named ``nvidia``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_dp.allocation.delivery import parse_delivery
from hetero_dp.allocation.sharing import REPLICA_POLICIES, SharingConfig, parse_sharing
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import (
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_PLUGINS_REGISTRY_DIR,
    KUBELET_SOCKET,
    MAX_UNIX_PATH,
    validate_resource_name,
)

ENV_PREFIX = "HETERO_DP_"
NVIDIA_FLAGS_BACKEND = "nvidia"

# key -> (type, default, environment variable)
SCALARS: dict[str, tuple[type, Any]] = {
    "kubeletDir": (str, DEFAULT_DEVICE_PLUGIN_DIR),
    "pluginsRegistryDir": (str, DEFAULT_PLUGINS_REGISTRY_DIR),
    "registration": (str, "classic"),
    "socketPrefix": (str, "hetero-dp"),
    "healthInterval": (float, 10.0),
    "rediscoverInterval": (float, 60.0),
    "hookTimeout": (float, 10.0),
    "streamTimeout": (float, 30.0),
    "logLevel": (str, "info"),
    "logFormat": (str, "text"),
}
SECTIONS = ("backends", "flags", "sharing", "resources", "cdi", "labels", "metrics", "imex")
# Parts of NVIDIA's config file (schema v1) that belong to the backend named
# NVIDIA_FLAGS_BACKEND: ``resources.gpus`` / ``resources.mig`` (renaming by pattern;
# a resource name always holds a '/', so these keys cannot clash), ``imex`` and
# ``sharing`` (parsed by the core too, which advertises the replicas).
NVIDIA_RESOURCE_KEYS = ("gpus", "mig")
RESOURCE_KEYS = {
    "deliver",
    "cdiKind",
    "cdiAnnotationPrefix",
    "replicaPolicy",
    "preferredAllocation",
}
# Intervals and timeouts in seconds. The largest values are a day for a loop and an
# hour for one wait: beyond that a value is a typo (or ``.inf``) rather than a choice.
BOUNDS: dict[str, tuple[float, float, bool]] = {
    # key: (smallest non-zero value, largest value, whether 0 means "off")
    "healthInterval": (0.01, 86_400.0, True),
    "rediscoverInterval": (0.01, 86_400.0, True),
    "hookTimeout": (0.01, 3_600.0, False),
    "streamTimeout": (0.01, 3_600.0, False),
}
# A socket prefix is part of a file name: it must not leave its dir.
SOCKET_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
CHOICES = {
    "registration": ("classic", "watcher"),
    "logLevel": ("debug", "info", "warning", "error"),
    "logFormat": ("text", "json"),
}
SECTION_KEYS: dict[str, dict[str, tuple[type, Any]]] = {
    # enabled unset (None): specs are written for the resources that deliver through
    # CDI, the dir checked when the first one is needed; false: never; true: the
    # dir is checked at start-up.
    # runtimeConfig: the node's container runtime config (containerd's config.toml or
    # dockerd's daemon.json, mounted read-only); where it says CDI is off, a CDI
    # delivery falls back to device specs with a warning (docs/cdi.md).
    "cdi": {"enabled": (bool, None), "dir": (str, "/var/run/cdi"), "runtimeConfig": (str, "")},
    "labels": {
        "enabled": (bool, False),
        "dir": (str, "/etc/kubernetes/node-feature-discovery/features.d"),
    },
    "metrics": {"address": (str, "")},
}


def env_name(key: str) -> str:
    """``kubeletDir`` -> ``HETERO_DP_KUBELET_DIR``."""
    snake = "".join("_" + c if c.isupper() else c for c in key).upper()
    return ENV_PREFIX + snake


@dataclass
class Config:
    source: str = "defaults"
    kubelet_dir: Path = Path(DEFAULT_DEVICE_PLUGIN_DIR)
    plugins_registry_dir: Path = Path(DEFAULT_PLUGINS_REGISTRY_DIR)
    registration: str = "classic"
    socket_prefix: str = "hetero-dp"
    health_interval: float = 10.0
    rediscover_interval: float = 60.0
    hook_timeout: float = 10.0
    stream_timeout: float = 30.0
    log_level: str = "info"
    log_format: str = "text"
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    cdi: dict[str, Any] = field(default_factory=lambda: _section_defaults("cdi"))
    labels: dict[str, Any] = field(default_factory=lambda: _section_defaults("labels"))
    metrics: dict[str, Any] = field(default_factory=lambda: _section_defaults("metrics"))
    raw: dict[str, Any] = field(default_factory=dict)
    # backend name -> where its options were given (``file, field 'backends.x'``,
    # ``flag -o x.key``), for refusing options of a backend that is not loaded
    backend_origins: dict[str, str] = field(default_factory=dict)
    # backend name -> the dotted option keys ``-o`` set (a flag wins over the
    # environment variable an option declares)
    backend_flagged: dict[str, frozenset[str]] = field(default_factory=dict)
    # backend name -> {option key: where the user wrote it}, for options given outside
    # ``backends.<name>`` (NVIDIA's ``flags.migStrategy``, ``resources.gpus``)
    backend_fields: dict[str, dict[str, str]] = field(default_factory=dict)

    def backend_options(self, name: str) -> dict[str, Any]:
        return dict(self.backends.get(name, {}))

    def options_source(self, name: str) -> str:
        """Where a backend's options were given, for messages about them."""
        return self.backend_origins.get(name) or self.source or "config"

    def option_field(self, name: str, field_name: str) -> str:
        """``backends.<name>.<key>...`` as the user wrote it (``flags.<key>...`` for an
        option from NVIDIA's ``flags`` section)."""
        prefix = f"backends.{name}."
        if not field_name.startswith(prefix):
            return field_name
        rest = field_name[len(prefix) :]
        key = rest.split(".", 1)[0].split("[", 1)[0]
        written = self.backend_fields.get(name, {}).get(key)
        return written + rest[len(key) :] if written else field_name

    def resource_settings(self, name: str) -> dict[str, Any]:
        return dict(self.resources.get(name, {}))


def _section_defaults(section: str) -> dict[str, Any]:
    return {k: default for k, (_t, default) in SECTION_KEYS[section].items()}


def _coerce(value: Any, typ: type, *, field: str, source: str) -> Any:
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"expected true or false, got {value!r}", field=field, source=source)
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"expected a number, got {value!r}", field=field, source=source)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"expected a number of seconds, got {value!r}", field=field, source=source
            ) from None
        if number < 0 or number != number:
            raise ConfigError(f"must be >= 0, got {value!r}", field=field, source=source)
        return number
    if not isinstance(value, str) or not value:
        raise ConfigError(f"expected a non-empty string, got {value!r}", field=field, source=source)
    return value


def _check_bounds(value: float, key: str, source: str) -> None:
    low, high, zero_is_off = BOUNDS[key]
    if not math.isfinite(value):
        raise ConfigError(
            f"must be a finite number of seconds, got {value!r}", field=key, source=source
        )
    if value == 0 and zero_is_off:
        return
    if not low <= value <= high:
        off = " (or 0: off)" if zero_is_off else ""
        raise ConfigError(
            f"must be from {low:g} to {high:g} seconds{off}, got {value:g}",
            field=key,
            source=source,
        )


def _check_paths(cfg: Config, sources: Mapping[str, str]) -> None:
    """``socketPrefix`` stays a file name; the kubelet's socket and ours fit a unix
    socket path (108 bytes with the NUL), or the error names the dir that is too long."""
    if not SOCKET_PREFIX.match(cfg.socket_prefix):
        raise ConfigError(
            "must be 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or "
            f"digit (it is part of a socket file name), got {cfg.socket_prefix!r}",
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


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML config file into a mapping; ConfigError naming the file otherwise."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file: {e.strerror}", source=str(p)) from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (bad byte at offset {e.start})", source=str(p)) from None
    import yaml  # only when there is a file: start-up without one skips ~15 ms of imports

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"invalid YAML{where}: {problem}", source=str(p)) from e
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigError("invalid YAML: nested too deeply", source=str(p)) from None
    _reject_cycles(data, str(p))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"top level must be a mapping, got {type(data).__name__}", source=str(p))
    return data


def _reject_cycles(
    value: Any,
    source: str,
    path: str = "",
    active: set[int] | None = None,
    done: set[int] | None = None,
) -> None:
    """A YAML alias can make a node contain itself; nothing downstream expects a cycle."""
    if not isinstance(value, dict | list):
        return
    active = set() if active is None else active
    done = set() if done is None else done
    if id(value) in done:  # shared (aliased) but already checked: keeps this linear
        return
    if id(value) in active:
        raise ConfigError(
            "a YAML alias refers to itself", field=path or "(top level)", source=source
        )
    active.add(id(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        _reject_cycles(child, source, f"{path}.{key}" if path else str(key), active, done)
    active.discard(id(value))
    done.add(id(value))


NOT_PLAIN = object()
_PLAIN_INT = re.compile(r"^(0|-?[1-9][0-9]*)$")
_PLAIN_WORD = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./*-]*$")
# the plain scalars YAML 1.1 (PyYAML) reads as booleans or null, not as strings
_YAML_WORDS = {
    **dict.fromkeys(["yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"], True),
    **dict.fromkeys(["no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"], False),
    **dict.fromkeys(["null", "Null", "NULL"], None),
}


def plain_scalar(value: str) -> Any:
    """``value`` as YAML would read it, for the common plain cases (a decimal integer,
    a word, a path), without importing a YAML parser; ``NOT_PLAIN`` otherwise."""
    if _PLAIN_INT.match(value):
        return int(value)
    if _PLAIN_WORD.match(value):
        return _YAML_WORDS.get(value, value)
    return NOT_PLAIN


def set_option(overrides: dict[str, Any], assignment: str) -> None:
    """Apply one ``-o backend.key=value`` (value parsed as YAML) to ``overrides``."""
    key, sep, value = assignment.partition("=")
    if not sep or "." not in key:
        raise ConfigError(
            f"expected BACKEND.KEY=VALUE, got {assignment!r}", field="option", source="flag -o"
        )
    backend, _, path = key.partition(".")
    parsed = plain_scalar(value)
    if parsed is NOT_PLAIN:
        import yaml  # ~11 ms and 0.9 MiB: only for values that need a YAML parser

        try:
            parsed = yaml.safe_load(value) if value else ""
        except (yaml.YAMLError, RecursionError):
            parsed = value
    node = overrides.setdefault("backends", {}).setdefault(backend, {})
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = parsed


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    raw: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build a Config from a file, the environment and flag overrides (camelCase keys)."""
    env = os.environ if env is None else env
    source = str(path) if path else ("inline config" if raw is not None else "defaults")
    raw = read_file(path) if path else dict(raw or {})
    cfg = Config(source=source, raw=dict(raw))

    unknown = sorted(set(raw) - set(SCALARS) - set(SECTIONS) - {"version"})
    if unknown:
        known = ", ".join(sorted({*SCALARS, *SECTIONS, "version"}))
        raise ConfigError(f"unknown key (known: {known})", field=unknown[0], source=source)
    if "version" in raw and raw["version"] != "v1":
        raise ConfigError(
            f"unsupported version {raw['version']!r}; only 'v1'", field="version", source=source
        )

    flags = dict(overrides or {})
    sources: dict[str, str] = {}
    for key, (typ, default) in SCALARS.items():
        value, where = default, "defaults"
        if key in raw:
            value, where = raw[key], source
        if env_name(key) in env:
            value, where = env[env_name(key)], f"env {env_name(key)}"
        if flags.get(key) is not None:
            value, where = flags[key], f"flag --{key}"
        value = _coerce(value, typ, field=key, source=where)
        sources[key] = where
        if key in BOUNDS:
            _check_bounds(value, key, where)
        if key in CHOICES and value not in CHOICES[key]:
            raise ConfigError(
                f"must be one of {', '.join(CHOICES[key])}, got {value!r}", field=key, source=where
            )
        attr = "".join("_" + c.lower() if c.isupper() else c for c in key)
        setattr(cfg, attr, Path(value) if key.endswith("Dir") else value)

    _check_paths(cfg, sources)
    cfg.sharing = parse_sharing(raw.get("sharing"), source)
    cfg.backends, cfg.backend_origins, cfg.backend_fields = _backends(raw, flags, source)
    cfg.backend_flagged = {
        str(name): frozenset(_dotted(options))
        for name, options in _mapping(flags.get("backends"), "backends", "flag -o").items()
    }
    cfg.resources = _resources(raw.get("resources"), source)
    for section in SECTION_KEYS:
        value = _section(section, raw.get(section), source)
        # flags such as --metrics-address override single keys of a section
        given = {k: v for k, v in _mapping(flags.get(section), section, "flags").items() if v}
        if given:
            parsed = _section(section, given, f"flag --{section}")
            value.update({k: parsed[k] for k in given})
        setattr(cfg, section, value)
    return cfg


def _mapping(value: Any, field: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"expected a mapping, got {type(value).__name__}", field=field, source=source
        )
    return value


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _dotted(options: Any, prefix: str = "") -> list[str]:
    """The dotted keys of nested options: ``{a: {b: 1}, c: 2}`` -> ``a.b``, ``c``."""
    if not isinstance(options, Mapping):
        return []
    keys = []
    for k, v in options.items():
        keys.append(f"{prefix}{k}")
        keys.extend(_dotted(v, f"{prefix}{k}."))
    return keys


def _backends(
    raw: Mapping[str, Any], flags: Mapping[str, Any], source: str
) -> tuple[dict[str, Any], dict[str, str], dict[str, dict[str, str]]]:
    """The options of each backend, where each backend's were given (``flags``,
    NVIDIA's section, is not counted: its file is shared with GPU feature discovery),
    and where each option taken from NVIDIA's sections was written (``flags.<key>``;
    one also given under ``backends.nvidia`` or ``-o`` is named there)."""
    backends: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    nvidia_flags = dict(_mapping(raw.get("flags"), "flags", source))
    written = {str(k): f"flags.{k}" for k in nvidia_flags}
    resources = _mapping(raw.get("resources"), "resources", source)
    renames = {k: resources[k] for k in NVIDIA_RESOURCE_KEYS if k in resources}
    if renames:
        nvidia_flags["resources"] = renames
    if raw.get("imex") is not None:
        nvidia_flags["imex"] = raw["imex"]
    if raw.get("sharing"):
        # MPS is run by the NVIDIA backend (control daemon, limits, pipe mounts) and
        # its memory guard and doctor need to know what is shared: it reads the same
        # block the core parsed (parse_sharing has checked it already).
        nvidia_flags["sharing"] = raw["sharing"]
    written.update({k: k for k in ("resources", "imex", "sharing") if k in nvidia_flags})
    if nvidia_flags:
        backends[NVIDIA_FLAGS_BACKEND] = nvidia_flags
    for name, options in _mapping(raw.get("backends"), "backends", source).items():
        opts = _mapping(options, f"backends.{name}", source)
        backends[name] = _merge(backends.get(name, {}), opts)
        origins.setdefault(str(name), source)
        if name == NVIDIA_FLAGS_BACKEND:
            for k in opts:
                written.pop(str(k), None)
    for name, options in _mapping(flags.get("backends"), "backends", "flag -o").items():
        backends[name] = _merge(backends.get(name, {}), options)
        origins[str(name)] = f"flag -o {name}.{next(iter(options), '')}".rstrip(".")
        if name == NVIDIA_FLAGS_BACKEND:
            for k in options:
                written.pop(str(k), None)
    fields = {NVIDIA_FLAGS_BACKEND: written} if written else {}
    return backends, origins, fields


def _resources(value: Any, source: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, settings in _mapping(value, "resources", source).items():
        if name in NVIDIA_RESOURCE_KEYS:
            continue  # NVIDIA's renaming, handed to that backend (see _backends)
        validate_resource_name(name, field=f"resources.{name}", source=source)
        s = _mapping(settings, f"resources.{name}", source)
        unknown = sorted(set(s) - RESOURCE_KEYS)
        if unknown:
            raise ConfigError(
                f"unknown key (known: {', '.join(sorted(RESOURCE_KEYS))})",
                field=f"resources.{name}.{unknown[0]}",
                source=source,
            )
        if "replicaPolicy" in s and s["replicaPolicy"] not in REPLICA_POLICIES:
            raise ConfigError(
                f"must be one of {', '.join(REPLICA_POLICIES)}, got {s['replicaPolicy']!r}",
                field=f"resources.{name}.replicaPolicy",
                source=source,
            )
        if "preferredAllocation" in s:
            s["preferredAllocation"] = _coerce(
                s["preferredAllocation"],
                bool,
                field=f"resources.{name}.preferredAllocation",
                source=source,
            )
        try:
            parse_delivery(s, f"resources.{name}", resource=name)
        except ConfigError as e:
            raise ConfigError(e.reason, field=e.field, source=source) from None
        out[name] = dict(s)
    return out


def _section(section: str, value: Any, source: str) -> dict[str, Any]:
    given = _mapping(value, section, source)
    spec = SECTION_KEYS[section]
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise ConfigError(
            f"unknown key (known: {', '.join(sorted(spec))})",
            field=f"{section}.{unknown[0]}",
            source=source,
        )
    out = _section_defaults(section)
    for key, (typ, _default) in spec.items():
        if key in given:
            out[key] = _coerce(given[key], typ, field=f"{section}.{key}", source=source)
    return out
