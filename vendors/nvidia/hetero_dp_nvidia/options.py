"""NVIDIA's plugin options (config file ``flags`` in schema ``version: v1``) and env vars.

Option names are NVIDIA's, so a config file written for NVIDIA's plugin is read
as is. Nested (``plugin: {passDeviceSpecs: true}``) and dotted
(``plugin.passDeviceSpecs``) spellings are both accepted. NVIDIA's environment
variables win over the file, as they do in NVIDIA's plugin. Anything we do not
support is rejected by name, never silently ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetero_dp import ConfigError

MIG_STRATEGIES = ("none", "single", "mixed")
LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
ID_STRATEGIES = ("uuid", "index")
# NVIDIA's default list of application XIDs: user-program faults, not GPU faults.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


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
    fail_on_init_error: bool = True
    driver_root: str = "/"
    dev_root: str = ""  # defaults to driver_root, as in NVIDIA's plugin
    container_driver_root: str = ""  # where driver_root is visible to us; default driver_root
    pass_device_specs: bool = False
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    health: HealthSettings = field(default_factory=HealthSettings)

    @property
    def host_dev_root(self) -> str:
        return self.dev_root or self.driver_root

    @property
    def visible_dev_root(self) -> str:
        """Where we look for device nodes (the host dev root as mounted into our container)."""
        if self.container_driver_root and not self.dev_root:
            return self.container_driver_root
        return self.host_dev_root

    @property
    def uses_env(self) -> bool:
        return any(s in self.device_list_strategy for s in ("envvar", "volume-mounts"))

    @property
    def uses_cdi(self) -> bool:
        return any(s.startswith("cdi-") for s in self.device_list_strategy)


# option name -> (env var, kind); kind: str, bool, list, float or a tuple of allowed values
_SUPPORTED: dict[str, tuple[str, object]] = {
    "migStrategy": ("MIG_STRATEGY", MIG_STRATEGIES),
    "failOnInitError": ("FAIL_ON_INIT_ERROR", bool),
    "nvidiaDriverRoot": ("NVIDIA_DRIVER_ROOT", str),
    "nvidiaDevRoot": ("NVIDIA_DEV_ROOT", str),
    "plugin.passDeviceSpecs": ("PASS_DEVICE_SPECS", bool),
    "plugin.deviceListStrategy": ("DEVICE_LIST_STRATEGY", list),
    "plugin.deviceIDStrategy": ("DEVICE_ID_STRATEGY", ID_STRATEGIES),
    "plugin.cdiAnnotationPrefix": ("CDI_ANNOTATION_PREFIX", str),
    "plugin.containerDriverRoot": ("CONTAINER_DRIVER_ROOT", str),
    # ours, not NVIDIA's:
    "sysfsRoot": ("", str),
    "procRoot": ("", str),
    "recoveryQuietPeriod": ("DP_RECOVERY_QUIET_PERIOD", float),
}

# NVIDIA options accepted only at the value that means "feature off" (or any value,
# for options that have nothing to do in our design); anything else is rejected.
_ONLY_DEFAULT: dict[str, tuple[str, object]] = {
    "gdsEnabled": ("GDS_ENABLED", False),
    "mofedEnabled": ("MOFED_ENABLED", False),
    "useNodeFeatureAPI": ("USE_NODE_FEATURE_API", False),
    "mpsRoot": ("MPS_ROOT", ""),
    "deviceDiscoveryStrategy": ("DEVICE_DISCOVERY_STRATEGY", ("auto", "nvml")),
}
# Accepted and unused: we write CDI specs ourselves, so nvidia-ctk is never run.
_NOT_NEEDED = {"plugin.nvidiaCTKPath": "NVIDIA_CTK_PATH"}


def _flatten(options: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in options.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name in ("plugin", "gfd"):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


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
    return str(value)


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
                source="environment",
            ) from None
    return word, xids


def parse_options(
    options: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> Options:
    """Build :class:`Options` from config options and env vars (env wins)."""
    env = os.environ if environ is None else environ
    flat = _flatten(options or {})
    values: dict[str, Any] = {}
    for name, value in flat.items():
        if name in _SUPPORTED:
            values[name] = _convert(name, _SUPPORTED[name][1], value, "config")
        elif name in _ONLY_DEFAULT:
            _check_default(name, value, "config")
        elif name in _NOT_NEEDED:
            continue
        else:
            raise ConfigError(
                "not supported by the hetero-dp NVIDIA backend "
                "(supported: " + ", ".join(sorted(_SUPPORTED)) + ")",
                field=name,
                source="config",
            )
    for name, (var, kind) in _SUPPORTED.items():
        if var and env.get(var, "") != "":
            values[name] = _convert(var, kind, env[var], "environment")
    for var, _ in _ONLY_DEFAULT.values():
        if env.get(var, "") != "":
            _check_default(var, env[var], "environment")

    health = _health(env, values.get("recoveryQuietPeriod", 60.0))
    return Options(
        mig_strategy=values.get("migStrategy", "none"),
        fail_on_init_error=values.get("failOnInitError", True),
        driver_root=values.get("nvidiaDriverRoot", "/") or "/",
        dev_root=values.get("nvidiaDevRoot", ""),
        container_driver_root=values.get("plugin.containerDriverRoot", ""),
        pass_device_specs=values.get("plugin.passDeviceSpecs", False),
        device_list_strategy=values.get("plugin.deviceListStrategy", ("envvar",)),
        device_id_strategy=values.get("plugin.deviceIDStrategy", "uuid"),
        cdi_annotation_prefix=values.get("plugin.cdiAnnotationPrefix", "cdi.k8s.io/"),
        sysfs_root=values.get("sysfsRoot", "/sys"),
        proc_root=values.get("procRoot", "/proc"),
        health=health,
    )


def _check_default(name: str, value: Any, source: str) -> None:
    key = (
        name if name in _ONLY_DEFAULT else next(k for k, v in _ONLY_DEFAULT.items() if v[0] == name)
    )
    allowed = _ONLY_DEFAULT[key][1]
    if isinstance(allowed, bool):
        ok = _as_bool(name, value, source) is allowed
    elif isinstance(allowed, tuple):
        ok = str(value) in allowed
    else:
        ok = str(value or "") == allowed
    if not ok:
        raise ConfigError(
            f"value {value!r} is not supported by the hetero-dp NVIDIA backend "
            f"(only {allowed!r}: the feature is not implemented)",
            field=name,
            source=source,
        )


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
