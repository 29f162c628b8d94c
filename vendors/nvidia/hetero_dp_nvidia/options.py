"""NVIDIA's plugin options (config file ``flags`` in schema ``version: v1``) and env vars.

Option names are NVIDIA's, so a config file written for NVIDIA's plugin is read
as is. Nested (``plugin: {passDeviceSpecs: true}``) and dotted
(``plugin.passDeviceSpecs``) spellings are both accepted. NVIDIA's environment
variables win over the file, as they do in NVIDIA's plugin. Anything we do not
support is rejected by name, never silently ignored.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Literal

from hetero_dp import ConfigError, SharingConfig, option, parse_sharing
from hetero_dp import parse_options as read_schema

from .flags import (
    CDI_HOOK_NAMES,
    COMMAND_LINE,
    DEFAULT_CDI_HOOK_PATH,
    DEFAULT_CONTAINER_DRIVER_ROOT,
    DEFAULT_IGNORED_XIDS,
    FLAGS,
    LIST_STRATEGIES,
    OURS,
    SECTIONS,
    SLICES,
    Flag,
    parse_command_line,
)
from .mps import MpsSettings, parse_mps_settings

# also read from here by older imports (tests, command.py)
__all__ = [
    "COMMAND_LINE",
    "DEFAULT_IGNORED_XIDS",
    "FLAGS",
    "HealthSettings",
    "NvidiaFlags",
    "Options",
    "parse_command_line",
    "parse_options",
]

log = logging.getLogger("hetero_dp_nvidia")


@dataclass(frozen=True)
class HealthSettings:
    """Which health events count (NVIDIA's DP_DISABLE/ENABLE_HEALTHCHECKS semantics)."""

    disabled: bool = False  # DP_DISABLE_HEALTHCHECKS=all: no event loop at all
    xids_disabled: bool = False  # DP_DISABLE_HEALTHCHECKS=xids: ignore every XID
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recovery_quiet_s: float = 60.0  # <= 0: never recover (NVIDIA's behaviour)

    def counts(self, xid: int) -> bool:
        return not self.disabled and not self.xids_disabled and xid not in self.ignored_xids


@dataclass(frozen=True)
class Options:
    mig_strategy: str = "none"
    dynamic_mig: bool = False  # DRA: MIG placements published, instances made on prepare
    fail_on_init_error: bool = True
    driver_root: str = "/"
    dev_root: str = ""  # defaults to driver_root, as in NVIDIA's plugin
    container_driver_root: str = ""  # where driver_root is visible to us; see visible_driver_root
    pass_device_specs: bool = False
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    cdi_hook_path: str = DEFAULT_CDI_HOOK_PATH
    cdi_disabled_hooks: frozenset[str] = frozenset()
    gdrcopy: bool = False
    gds: bool = False
    mofed: bool = False
    allocation_policy: str = "distributed"
    renames: Renames = field(default_factory=lambda: Renames())
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    health: HealthSettings = field(default_factory=HealthSettings)
    # The config's sharing block (the core advertises the replicas; MPS is ours to run).
    sharing: SharingConfig = field(default_factory=SharingConfig)
    mps: MpsSettings = field(default_factory=MpsSettings)

    @property
    def uses_mps(self) -> bool:
        return self.sharing.enabled and self.sharing.strategy == "mps"

    @property
    def host_dev_root(self) -> str:
        return self.dev_root or self.driver_root

    @property
    def visible_driver_root(self) -> str:
        """Where the host's driver root is visible to us (NVIDIA's DRIVER_ROOT_CTR_PATH).

        NVIDIA's default ``/driver-root`` counts only when that dir exists here;
        otherwise the driver root is read in place (a plugin running on the host,
        or a container that mounts the root at the same path).
        """
        ctr = self.container_driver_root
        if ctr and (ctr != DEFAULT_CONTAINER_DRIVER_ROOT or os.path.isdir(ctr)):
            return ctr
        return self.driver_root

    @property
    def visible_dev_root(self) -> str:
        """Where we look for device nodes (the host dev root as mounted into our container)."""
        if not self.dev_root or self.dev_root == self.driver_root:
            return self.visible_driver_root
        return self.dev_root

    @property
    def uses_env(self) -> bool:
        return any(s in self.device_list_strategy for s in ("envvar", "volume-mounts"))

    @property
    def uses_cdi(self) -> bool:
        return any(s.startswith("cdi-") for s in self.device_list_strategy)

    @property
    def extra_env(self) -> dict[str, str]:
        """What NVIDIA's --gdrcopy/gds/mofed-enabled add to every container's env."""
        env = {}
        for on, var in ((self.gdrcopy, "NVIDIA_GDRCOPY"), (self.gds, "NVIDIA_GDS")):
            if on:
                env[var] = "enabled"
        if self.mofed:
            env["NVIDIA_MOFED"] = "enabled"
        return env


def _hint(flag: Flag) -> Any:
    """The type an option is declared with; NVIDIA's own checks (choices of a list,
    default-only values) run on top in :func:`parse_options`."""
    if flag.key in SLICES:
        return str | tuple[str, ...]
    if flag.kind is list:
        return tuple[str, ...]
    if isinstance(flag.kind, tuple):
        return Literal[flag.kind]  # type: ignore[valid-type]
    return flag.kind


def _flag_help(flag: Flag) -> str:
    where = [f"env {', '.join(flag.env)}"] if flag.env else []
    where += [", ".join(f"--{n}" for n in flag.flags)] if flag.flags else []
    return f"{flag.help} ({'; '.join(where)})" if where else flag.help


def _check_read(flags: Any) -> None:
    """NVIDIA's checks beyond the declared types, run by the options reader as it builds
    the options from the file and ``-o`` (the ``__post_init__`` of :data:`NvidiaFlags`):
    a refusal names the option (``plugin.deviceListStrategy``) and the reader names the
    file or the flag that gave it, and the field as written there."""
    values = {flag.key: _check_value(flag, flag.key, _value(flags, flag.key), "") for flag in FLAGS}
    for name, (_var, kind, _default, _help) in OURS.items():
        _convert(name, kind, getattr(flags, name), "")
    _renames(flags.resources, "")
    _disabled_hooks(values["cdiDisableHooks"], "cdiDisableHooks", "")
    parse_mps_settings(flags.mps, str(flags.mpsRoot or ""))
    _check_dynamic_mig(flags.dynamicMig, flags.migStrategy, "")


def _schema() -> type:
    """NVIDIA's options as a typed options dataclass (``hetero-dp list --options
    nvidia``): its ``flags`` keys with ``plugin`` and ``imex`` as nested sections, ours,
    and the sections read whole. Built from :data:`FLAGS`, the one table of them."""
    fields: dict[str, list[tuple[str, Any, Any]]] = {"": [], "plugin": [], "imex": []}
    for flag in FLAGS:
        head, _, name = flag.key.rpartition(".")
        fields[head].append((name, _hint(flag), option(flag.default, help=_flag_help(flag))))
    for name, (var, kind, default, text) in OURS.items():
        text += f" (env {var})" if var else ""
        fields[""].append((name, kind, option(default, help=text)))
    for name, text in SECTIONS.items():
        fields[""].append((name, Any, option(None, help=text)))
    fields[""].append((COMMAND_LINE, Any, option(None, internal=True)))
    # A docstring each: without one, dataclass() computes a signature for it.
    plugin = make_dataclass(
        "PluginFlags", fields["plugin"], frozen=True, namespace={"__doc__": "flags.plugin"}
    )
    imex = make_dataclass(
        "ImexFlags", fields["imex"], frozen=True, namespace={"__doc__": "flags.imex"}
    )
    fields[""] += [
        ("plugin", plugin, field(default_factory=plugin)),
        ("imex", imex, field(default_factory=imex)),
    ]
    doc = "The NVIDIA backend's options: NVIDIA's plugin flags, and ours."
    namespace = {"__doc__": doc, "__post_init__": _check_read}
    schema = make_dataclass("NvidiaFlags", fields[""], frozen=True, namespace=namespace)
    for cls in (plugin, imex, schema):
        cls.__module__ = __name__
    return schema


NvidiaFlags = _schema()


def _value(flags: Any, key: str) -> Any:
    """A dotted key's value of an :data:`NvidiaFlags` instance."""
    head, _, name = key.rpartition(".")
    return getattr(getattr(flags, head) if head else flags, name)


# Config-file keys that come from other sections of NVIDIA's file (see config.py).
def parse_xid_list(text: str, var: str) -> tuple[str, set[int]]:
    """Parse a DP_*_HEALTHCHECKS value: ("all" | "xids" | "", explicit XIDs)."""
    word = ""
    xids: set[int] = set()
    for item in (t.strip().lower() for t in text.split(",")):
        if not item:
            continue
        if item in ("all", "xids"):
            word = "all" if "all" in (word, item) else item
            continue
        try:
            xids.add(int(item))
        except ValueError:
            raise ConfigError(
                f"expected 'all', 'xids' or a comma-separated list of XID numbers, got {item!r}",
                field=var,
                source=f"env {var}",
            ) from None
    return word, xids


@dataclass(frozen=True)
class Rename:
    """One entry of NVIDIA's ``resources.gpus`` / ``resources.mig``."""

    pattern: str  # a wildcard (``*``) over the GPU product name or the MIG profile
    name: str  # the full resource name (``nvidia.com/`` added when missing)

    def matches(self, text: str) -> bool:
        # NVIDIA's ResourcePattern: '*' is the only wildcard, the rest is literal.
        return fnmatch.fnmatchcase(text, self.pattern.replace("[", "[[]").replace("?", "[?]"))


@dataclass(frozen=True)
class Renames:
    gpus: tuple[Rename, ...] = ()
    mig: tuple[Rename, ...] = ()

    def gpu(self, product: str, default: str) -> str:
        return next((r.name for r in self.gpus if r.matches(product)), default)

    def mig_device(self, profile: str, default: str) -> str:
        return next((r.name for r in self.mig if r.matches(profile)), default)


_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class RenameEntry:
    """One entry of NVIDIA's ``resources.gpus`` / ``resources.mig``."""

    pattern: str = option(help="the product name or MIG profile; '*' is the wildcard")
    name: str = option(help="the resource name ('nvidia.com/' is added when missing)")


@dataclass(frozen=True)
class RenameSection:
    """NVIDIA's ``resources`` section: renames by pattern."""

    gpus: list[RenameEntry] = option([], help="full GPUs")
    mig: list[RenameEntry] = option([], help="MIG devices")


def _renames(value: Any, source: str) -> Renames:
    """NVIDIA's ``resources: {gpus: [{pattern, name}], mig: [...]}``, read by the options
    reader (a key set to null is left empty), each name checked as NVIDIA's plugin does."""
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if v is not None}
    read = read_schema(RenameSection, value, field="resources", source=source, environ={})
    out: dict[str, tuple[Rename, ...]] = {}
    for part in ("gpus", "mig"):
        renames = []
        for i, item in enumerate(getattr(read, part)):
            full = item.name if item.name.startswith("nvidia.com/") else f"nvidia.com/{item.name}"
            short = full.partition("/")[2]
            # NVIDIA's NewResourceName: at most 63 characters in all, a DNS subdomain after /.
            if len(full) > 63 or not _RESOURCE_NAME.match(short):
                raise ConfigError(
                    f"resource name {full!r} must be at most 63 characters, a lowercase DNS "
                    "name after 'nvidia.com/'",
                    field=f"resources.{part}[{i}].name",
                    source=source,
                )
            renames.append(Rename(item.pattern, full))
        out[part] = tuple(renames)
    return Renames(gpus=out["gpus"], mig=out["mig"])


def _as_bool(name: str, value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ConfigError(f"expected true or false, got {value!r}", field=name, source=source)


def _convert(name: str, kind: object, value: Any, source: str) -> Any:
    if kind is bool:
        return _as_bool(name, value, source)
    if kind is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"expected a number of seconds, got {value!r}", field=name, source=source
            ) from None
    if kind is list:
        items = value.split(",") if isinstance(value, str) else list(value or [])
        items = [str(i).strip() for i in items if str(i).strip()]
        bad = [i for i in items if i not in LIST_STRATEGIES]
        if bad or not items:
            raise ConfigError(
                f"unsupported device list strategy {', '.join(bad) or '(empty)'}; "
                f"choose from {', '.join(LIST_STRATEGIES)}",
                field=name,
                source=source,
            )
        if "envvar" in items and "volume-mounts" in items:
            raise ConfigError(
                "envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES; choose one",
                field=name,
                source=source,
            )
        return tuple(dict.fromkeys(items))
    if isinstance(kind, tuple):
        text = str(value).strip()
        if text not in kind:
            raise ConfigError(
                f"unsupported value {value!r}; choose from {', '.join(kind)}",
                field=name,
                source=source,
            )
        return text
    if isinstance(value, list | tuple):  # a string slice given as a list
        return ",".join(str(v) for v in value)
    return str(value)


def _is_set(value: Any) -> bool:
    return value not in (None, "", [], False)


def _env_value(env: Mapping[str, str], flag: Flag) -> tuple[str, str] | None:
    """The first of the flag's env vars that is set (NVIDIA's order), with its value."""
    for var in flag.env:
        if env.get(var, "") != "":
            return var, env[var]
    return None


def parse_options(options: Any, environ: Mapping[str, str] | None = None) -> Options:
    """Build :class:`Options` from the options (an :data:`NvidiaFlags` instance, as the
    framework hands it to ``configure``, or a mapping, checked here the same way), env
    vars and command-line flags.

    Precedence as in NVIDIA's plugin: flags > env > config file > defaults.
    Command-line flags arrive as ``commandLine`` (env var -> value, from
    :func:`parse_command_line`). NVIDIA options we do not implement are accepted with
    a warning naming each; values we cannot honour are refused.
    """
    flags = options
    if not isinstance(options, NvidiaFlags):
        flags = read_schema(NvidiaFlags, options or {}, field="", source="config", environ={})
    command_line = getattr(flags, COMMAND_LINE) or {}
    env = {**(os.environ if environ is None else environ), **command_line}
    renames = _renames(flags.resources, "config")
    sharing = parse_sharing(flags.sharing, "config")
    mps_raw = flags.mps
    if env.get("MPS_CONTROL_DAEMON"):  # ours, set by the chart (mps.controlDaemon)
        mps_raw = {**(mps_raw or {}), "controlDaemon": env["MPS_CONTROL_DAEMON"]}
    if flags.gfd:
        log.debug("flags.gfd is for GPU feature discovery; the device plugin ignores it")
    # option key -> where its value came from: the options (the file or -o, checked with
    # that source as they were read), NVIDIA's env vars or its command-line flags
    origin: dict[str, str] = {}
    values: dict[str, Any] = {
        flag.key: _take(flag, flag.key, _value(flags, flag.key), "config") for flag in FLAGS
    }
    for name, (_var, kind, _default, _help) in OURS.items():
        values[name] = _convert(name, kind, getattr(flags, name), "config")
    for flag in FLAGS:
        found = _env_value(env, flag)
        if found:
            var, text = found
            where = f"flag --{flag.flags[0]}" if var in command_line else f"env {var}"
            values[flag.key], origin[flag.key] = _take(flag, flag.key, text, where), where
    for name, (var, kind, _default, _help) in OURS.items():
        if var and env.get(var, "") != "":
            origin[name] = f"env {var}"
            values[name] = _convert(name, kind, env[var], origin[name])

    where = origin.get("cdiDisableHooks", "config")
    hooks = _disabled_hooks(values["cdiDisableHooks"], "cdiDisableHooks", where)
    # Every flag and every option of ours has a value here (the schema's default when
    # nothing set it), so the defaults live in one place: FLAGS and OURS.
    health = _health(env, values["recoveryQuietPeriod"])
    where = origin.get("dynamicMig") or origin.get("migStrategy") or "config"
    _check_dynamic_mig(values["dynamicMig"], values["migStrategy"], where)
    return Options(
        dynamic_mig=values["dynamicMig"],
        mig_strategy=values["migStrategy"],
        fail_on_init_error=values["failOnInitError"],
        driver_root=values["nvidiaDriverRoot"] or "/",
        dev_root=values["nvidiaDevRoot"],
        container_driver_root=values["plugin.containerDriverRoot"],
        pass_device_specs=values["plugin.passDeviceSpecs"],
        device_list_strategy=values["plugin.deviceListStrategy"],
        device_id_strategy=values["plugin.deviceIDStrategy"],
        cdi_annotation_prefix=values["plugin.cdiAnnotationPrefix"],
        cdi_hook_path=values["plugin.nvidiaCTKPath"] or DEFAULT_CDI_HOOK_PATH,
        cdi_disabled_hooks=frozenset(hooks),
        gdrcopy=values["gdrcopyEnabled"],
        gds=values["gdsEnabled"],
        mofed=values["mofedEnabled"],
        allocation_policy=values["plugin.sharedDevicesAllocationPolicy"],
        renames=renames,
        sysfs_root=values["sysfsRoot"],
        proc_root=values["procRoot"],
        health=health,
        sharing=sharing,
        mps=_mps(mps_raw, values["mpsRoot"], env),
    )


def _mps(raw: Any, root: str, env: Mapping[str, str]) -> MpsSettings:
    """The MPS settings; ``controlDaemon`` from ``MPS_CONTROL_DAEMON`` (the chart's
    mps.controlDaemon) is refused naming that variable (the rest was checked as read)."""
    try:
        return parse_mps_settings(raw, root)
    except ConfigError as e:
        if e.field == "mps.controlDaemon" and env.get("MPS_CONTROL_DAEMON"):
            raise ConfigError(e.reason, field=e.field, source="env MPS_CONTROL_DAEMON") from None
        raise


def _disabled_hooks(value: Any, name: str, source: str) -> frozenset[str]:
    """``cdiDisableHooks``: hook names (comma-separated), or all."""
    hooks = frozenset(h.strip() for h in str(value or "").split(",") if h.strip())
    bad = sorted(hooks - {"all", *CDI_HOOK_NAMES})
    if bad:
        raise ConfigError(
            f"unknown hook {bad[0]!r}; choose from all, {', '.join(CDI_HOOK_NAMES)}",
            field=name,
            source=source,
        )
    return hooks


def _check_dynamic_mig(dynamic: Any, strategy: Any, source: str) -> None:
    if dynamic and strategy != "none":
        raise ConfigError(
            f"dynamicMig makes MIG instances on demand, but migStrategy is "
            f"{strategy!r}, which advertises the instances that exist; "
            "fix: set migStrategy to none, or dynamicMig to false",
            field="dynamicMig",
            source=source,
        )


_warned: set[tuple[str, str]] = set()


def _check_value(flag: Flag, name: str, value: Any, source: str) -> Any:
    """One NVIDIA option converted; refused where it cannot be honoured."""
    converted = _convert(name, flag.kind, value, source)
    if flag.status == "default-only" and converted not in flag.allowed:
        raise ConfigError(
            f"value {value!r} is not supported by the hetero-dp NVIDIA backend: {flag.note}",
            field=name,
            source=source,
        )
    return converted


def _take(flag: Flag, name: str, value: Any, source: str) -> Any:
    """Convert one NVIDIA option; warn for the unimplemented, refuse what cannot be."""
    converted = _check_value(flag, name, value, source)
    if flag.status == "warn" and _is_set(converted) and (name, str(value)) not in _warned:
        _warned.add((name, str(value)))
        log.warning(
            "NVIDIA option %s=%r (%s) is accepted but not implemented: %s",
            name,
            value,
            source,
            flag.note,
        )
    if flag.status == "ignored" and _is_set(converted):
        log.debug("%s is for GPU feature discovery; the device plugin ignores it", name)
    return converted


def _health(env: Mapping[str, str], quiet: float) -> HealthSettings:
    off, disabled = parse_xid_list(
        env.get("DP_DISABLE_HEALTHCHECKS", ""), "DP_DISABLE_HEALTHCHECKS"
    )
    on, enabled = parse_xid_list(env.get("DP_ENABLE_HEALTHCHECKS", ""), "DP_ENABLE_HEALTHCHECKS")
    # DP_ENABLE_HEALTHCHECKS=all|xids empties NVIDIA's default ignore list.
    ignored = (set() if on else set(DEFAULT_IGNORED_XIDS)) | disabled
    return HealthSettings(
        disabled=off == "all",
        xids_disabled=off == "xids",
        ignored_xids=frozenset(ignored - enabled),
        recovery_quiet_s=quiet,
    )
