"""One configuration schema, from a YAML file, environment variables and flags.

Precedence: flags > environment > file > defaults. Every error names the
source (file, ``env HETERO_DP_...`` or ``flag --...``), the field and the reason,
and stops start-up before any socket is touched.

A backend may read sections of the file besides ``backends.<name>`` (the
``config_sections`` hook: a backend that replaces another plugin reads that
plugin's layout, such as a ``flags`` section); the core knows only the sections
each backend names.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hetero_dp.allocation.delivery import parse_delivery
from hetero_dp.allocation.sharing import SharingConfig, SharingSection, sharing_config
from hetero_dp.engine.claims import Sections, installed_claims, installed_sections
from hetero_dp.engine.configfile import NOT_PLAIN, plain_scalar, read_file, set_option
from hetero_dp.kits.mappings import deep_merge
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import (
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_PLUGINS_REGISTRY_DIR,
    KUBELET_SOCKET,
    MAX_UNIX_PATH,
    validate_resource_name,
)
from hetero_dp.model.options import camel, option, parse_options, unknown_key
from hetero_dp.model.shown import shown

__all__ = ["NOT_PLAIN", "Config", "load_config", "plain_scalar", "read_file", "set_option"]

ENV_PREFIX = "HETERO_DP_"


@dataclass(frozen=True)
class CoreSettings:
    """The top-level keys of the config file, declared like a backend's options. Each
    is also set by ``HETERO_DP_<KEY>`` and a flag of ``hetero-dp run``. Intervals and
    timeouts are in seconds: the largest values are a day for a loop and an hour for
    one wait, beyond that a value is a typo (or ``.inf``) rather than a choice."""

    kubelet_dir: str = option(
        DEFAULT_DEVICE_PLUGIN_DIR,
        help="the kubelet's device-plugin dir",
        min=1,
        strict=True,
        path=True,
    )
    plugins_registry_dir: str = option(
        DEFAULT_PLUGINS_REGISTRY_DIR,
        help="the kubelet's plugin registry (registration: watcher)",
        min=1,
        strict=True,
        path=True,
    )
    registration: Literal["classic", "watcher"] = option(
        "classic", help="classic: kubelet.sock; watcher: the plugin registry"
    )
    socket_prefix: str = option(
        "hetero-dp", help="the start of every socket file's name", min=1, strict=True
    )
    health_interval: float = option(10.0, min=0.01, max=86_400.0, off=0, help="health polls")
    rediscover_interval: float = option(60.0, min=0.01, max=86_400.0, off=0, help="discovery polls")
    hook_timeout: float = option(10.0, min=0.01, max=3_600.0, help="a backend hook's limit")
    stream_timeout: float = option(30.0, min=0.01, max=3_600.0, help="a ListAndWatch send's limit")
    log_level: Literal["debug", "info", "warning", "error"] = option("info", help="log level")
    log_format: Literal["text", "json"] = option("text", help="log line format")


_HINTS = typing.get_type_hints(CoreSettings)
# key -> (type, default), derived from CoreSettings (for docs and tests)
SCALARS: dict[str, tuple[type, Any]] = {
    camel(f.name): (float if _HINTS[f.name] is float else str, f.default)
    for f in dataclasses.fields(CoreSettings)
}
SECTIONS = ("backends", "sharing", "resources", "cdi", "labels", "metrics", "attribution")
# A socket prefix is part of a file name: it must not leave its dir.
SOCKET_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class CdiSection:
    """``cdi``: CDI specs for the resources that deliver through CDI (docs/cdi.md)."""

    enabled: bool | None = option(
        None,
        help="unset: specs for the resources that deliver through CDI, the dir checked when "
        "the first one is needed; false: never; true: the dir is checked at start-up",
    )
    dir: str = option(
        "/var/run/cdi", help="where the specs are written", min=1, strict=True, path=True
    )
    runtime_config: str = option(
        "",
        strict=True,
        path=True,
        help="the node's container runtime config (containerd's config.toml or dockerd's "
        "daemon.json, mounted read-only); where it says CDI is off, a CDI delivery falls "
        "back to device specs with a warning",
    )


@dataclass(frozen=True)
class LabelsSection:
    """``labels``: the node label file for Node Feature Discovery."""

    enabled: bool = option(False, help="write the label file")
    dir: str = option(
        "/etc/kubernetes/node-feature-discovery/features.d",
        help="Node Feature Discovery's features.d",
        min=1,
        strict=True,
        path=True,
    )


@dataclass(frozen=True)
class MetricsSection:
    """``metrics``: the Prometheus endpoint, /healthz and /readyz."""

    address: str = option("", help="host:port to serve on ('' = off)", strict=True)
    wait_for_port: bool = option(
        False,
        help="when the port is taken (the old pod of a surge rollout in the host network), "
        "start anyway and serve once it is free, instead of refusing to start",
    )
    ready_file: str = option(
        "",
        strict=True,
        path=True,
        help="a file kept present exactly while /readyz answers 200, holding its lines "
        "('' = none): an exec readiness probe reads the instance's own readiness where "
        "/readyz on a shared host port may be another instance's",
    )


@dataclass(frozen=True)
class AttributionSection:
    """``attribution``: which container holds and uses each device (docs/operations.md).
    On while the pod-resources socket exists."""

    pod_resources_socket: str = option(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        help="the kubelet's pod-resources API socket",
        min=1,
        strict=True,
        path=True,
    )
    proc_root: str = option(
        "/proc",
        help="the host's /proc, where the PIDs the driver reports are read (mounted "
        "read-only, /host/proc in the DaemonSets)",
        min=1,
        strict=True,
        path=True,
    )


@dataclass(frozen=True)
class ResourceSettings:
    """``resources.<name>``: one resource's settings (docs/configuration.md); a key left
    out keeps the backend's default. ``deliver``, ``cdiKind`` and ``cdiAnnotationPrefix``
    are checked together (allocation/delivery.py) once read here."""

    deliver: Any = option(None, help="delivery strategies, a list (docs/cdi.md)")
    cdi_kind: str | None = option(None, help="the CDI kind (vendor.com/class)", strict=True)
    cdi_annotation_prefix: str | None = option(
        None, help="the prefix of CDI annotation keys", strict=True
    )
    replica_policy: Literal["distributed", "packed", "spread"] | None = option(
        None, help="which replicas a shared device's pick takes (docs/sharing.md)"
    )
    preferred_allocation: bool | None = option(None, help="answer GetPreferredAllocation")


RESOURCE_KEYS = {camel(f.name) for f in dataclasses.fields(ResourceSettings)}


@dataclass(frozen=True)
class ConfigFile(CoreSettings):
    """The whole file as the core reads it: the top-level settings, the core's own
    sections, and the sections read by other parts (``backends`` by each backend's
    options, ``sharing`` as declared in allocation/sharing.py, ``resources`` entry by entry as
    :class:`ResourceSettings`, keyed by resource name)."""

    version: Literal["v1"] = option("v1", help="the schema version (optional; only v1)")
    backends: Any = option(None, help="each backend's options, under its name")
    sharing: SharingSection | None = option(None, help="time-slicing and MPS (docs/sharing.md)")
    resources: Any = option(None, help="settings per resource name")
    cdi: CdiSection = option(CdiSection())
    labels: LabelsSection = option(LabelsSection())
    metrics: MetricsSection = option(MetricsSection())
    attribution: AttributionSection = option(AttributionSection())


# The core's own sections, declared like a backend's options (model/options.py): one
# reader, one error style (the file, the field as written, the reason, did-you-mean).
SECTION_SCHEMAS: dict[str, type] = {
    "cdi": CdiSection,
    "labels": LabelsSection,
    "metrics": MetricsSection,
    "attribution": AttributionSection,
}
# section -> {key: (type, default)}, derived from the declarations above
SECTION_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {
    name: {camel(f.name): (f.type, f.default) for f in dataclasses.fields(schema)}
    for name, schema in SECTION_SCHEMAS.items()
}


def env_name(key: str) -> str:
    """``kubeletDir`` -> ``HETERO_DP_KUBELET_DIR``."""
    snake = "".join("_" + c if c.isupper() else c for c in key).upper()
    return ENV_PREFIX + snake


def flag_name(key: str) -> str:
    """``kubeletDir`` -> ``--kubelet-dir``; ``metrics.address`` -> ``--metrics-address``."""
    return "--" + "".join("-" + c.lower() if c.isupper() else c for c in key).replace(".", "-")


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
    attribution: dict[str, Any] = field(default_factory=lambda: _section_defaults("attribution"))
    raw: dict[str, Any] = field(default_factory=dict)
    # backend name -> where its options were given (``file, field 'backends.x'``,
    # ``flag -o x.key``), for refusing options of a backend that is not loaded
    backend_origins: dict[str, str] = field(default_factory=dict)
    # backend name -> the dotted option keys ``-o`` set (a flag wins over the
    # environment variable an option declares)
    backend_flagged: dict[str, frozenset[str]] = field(default_factory=dict)

    # the sections each backend claims: those of the backends the caller loads
    # (load_config's ``sections``), and the installed backends' where the file needed
    # them; a backend not among them: its installed entry point's own, looked up when asked
    sections: dict[str, dict[str, str]] = field(default_factory=dict)

    def claims(self, name: str) -> dict[str, str]:
        """The config sections backend ``name`` claims (its ``config_sections`` hook)."""
        if name in self.sections:
            return dict(self.sections[name])
        return installed_claims(name)

    def backend_options(self, name: str) -> dict[str, Any]:
        """Backend ``name``'s options: the sections it claims, under ``backends.<name>``
        of the file, under ``-o`` flags."""
        claimed, _written = _claimed(self.raw, self.claims(name), self.source)
        return deep_merge(claimed, self.backends.get(name, {}))

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

    def resource_settings(self, name: str) -> dict[str, Any]:
        return dict(self.resources.get(name, {}))


def _under(rest: str, keys: Iterable[Any]) -> str | None:
    """The longest of ``keys`` that the field ``rest`` is, or lies under (``plugin`` for
    ``plugin.x`` or ``plugin[0]``); None when none."""
    found = [k for k in map(str, keys) if rest == k or rest.startswith((f"{k}.", f"{k}["))]
    return max(found, key=len, default=None)


def _section_defaults(section: str) -> dict[str, Any]:
    return _as_dict(SECTION_SCHEMAS[section]())


def _as_dict(value: Any) -> dict[str, Any]:
    """A section's dataclass as the mapping the daemon reads (config keys)."""
    return {camel(f.name): getattr(value, f.name) for f in dataclasses.fields(value)}


def _check_paths(cfg: Config, sources: Mapping[str, str]) -> None:
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
    """Build a Config from a file, the environment and flag overrides (camelCase keys).

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
    cfg = Config(source=source, raw=dict(raw))

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
    for f in dataclasses.fields(CoreSettings):
        value = getattr(read, f.name)
        setattr(cfg, f.name, Path(value) if f.name.endswith("_dir") else value)
    _check_paths(cfg, sources)
    cfg.sharing = sharing_config(read.sharing or SharingSection(), source)
    cfg.sections = claims
    cfg.backends, cfg.backend_origins = _backends(raw, flags, source)
    cfg.backend_flagged = {
        str(name): frozenset(_dotted(options))
        for name, options in _mapping(flags.get("backends"), "backends", "flag -o").items()
    }
    taken = {k.split(".", 1)[1] for c in claims.values() for k in c if k.startswith("resources.")}
    cfg.resources = _resources(raw.get("resources"), source, taken)
    for section in SECTION_SCHEMAS:
        setattr(cfg, section, _as_dict(getattr(read, section)))
    return cfg


def _layered(
    raw: Mapping[str, Any], env: Mapping[str, str], flags: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The core's keys with flags > env > file (the file's sections as written, a flag's
    keys over them), and where each value not from the file came from (dotted key ->
    ``env HETERO_DP_X`` or ``flag --x``)."""
    settings: dict[str, Any] = {k: v for k, v in raw.items() if k in _FILE_KEYS}
    origins: dict[str, str] = {}
    for key in SCALARS:
        if env_name(key) in env:
            settings[key], origins[key] = env[env_name(key)], f"env {env_name(key)}"
        if flags.get(key) is not None:
            settings[key], origins[key] = flags[key], f"flag {flag_name(key)}"
    for section in SECTION_SCHEMAS:
        # flags such as --metrics-address override single keys of a section
        given = {k: v for k, v in _mapping(flags.get(section), section, "flags").items() if v}
        inner = settings.get(section)
        if given and (inner is None or isinstance(inner, Mapping)):  # else: refused as read
            settings[section] = {**(inner or {}), **given}
            origins.update({f"{section}.{k}": f"flag {flag_name(f'{section}.{k}')}" for k in given})
    return settings, origins


_FILE_KEYS = {camel(f.name) for f in dataclasses.fields(ConfigFile)}


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


def _resources(value: Any, source: str, taken: set[str]) -> dict[str, dict[str, Any]]:
    """``resources``: each entry read as :class:`ResourceSettings` (the keys given,
    typed), its delivery checked (allocation/delivery.py)."""
    out: dict[str, dict[str, Any]] = {}
    for name, settings in _mapping(value, "resources", source).items():
        if name in taken:
            continue  # a key a backend claims (no '/': no resource name)
        field = f"resources.{name}"
        validate_resource_name(name, field=field, source=source)
        read = parse_options(ResourceSettings, settings, field=field, source=source, environ={})
        given = {camel(f.name): getattr(read, f.name) for f in dataclasses.fields(read)}
        s = {k: v for k, v in given.items() if k in settings}
        try:
            parse_delivery(s, field, resource=name)
        except ConfigError as e:  # it names the field, not where the file is
            raise ConfigError(e.reason, field=e.field, source=source) from None
        out[name] = s
    return out
