"""NVIDIA's plugin flags, one table: each option's config key (``flags`` in NVIDIA's
config file), command-line flags and env vars, default and help, and whether we
implement it; the options of ours beside them; and NVIDIA's command line read into
env var values (:func:`parse_command_line`). :mod:`.options` reads them into
:class:`~.options.Options`; :mod:`.command` maps the same table onto NVIDIA's commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_dp import ConfigError

MIG_STRATEGIES = ("none", "single", "mixed")
LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
ID_STRATEGIES = ("uuid", "index")
# NVIDIA's default list of application XIDs: user-program faults, not GPU faults.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_CDI_HOOK_PATH = "/usr/bin/nvidia-ctk"  # NVIDIA's DefaultNvidiaCTKPath
DEFAULT_CONTAINER_DRIVER_ROOT = "/driver-root"  # NVIDIA's DefaultContainerDriverRoot
CDI_HOOK_NAMES = (
    "create-symlinks",
    "enable-cuda-compat",
    "update-ldcache",
    "disable-device-node-modification",
)


@dataclass(frozen=True)
class Flag:
    """One option of NVIDIA's plugin: config key, command-line flags, env vars.

    ``status``: ``"ours"`` (implemented), ``"warn"`` (NVIDIA has it, we do not
    implement it: accepted with a warning naming it), ``"default-only"`` (accepted
    at ``allowed`` values, refused otherwise, naming it), ``"core"`` (taken by the
    ``hetero-dp run`` command itself). ``default`` and ``help`` are NVIDIA's.
    """

    key: str
    flags: tuple[str, ...]
    env: tuple[str, ...]
    kind: object
    status: str = "ours"
    allowed: tuple[str, ...] = ()
    note: str = ""
    default: Any = ""
    help: str = ""


# NVIDIA's k8s-device-plugin v0.20 (cmd/nvidia-device-plugin/main.go and
# api/config/v1/flags.go): every flag, its aliases, env vars and default, in its order.
FLAGS: tuple[Flag, ...] = (
    Flag(
        "migStrategy",
        ("mig-strategy",),
        ("MIG_STRATEGY",),
        MIG_STRATEGIES,
        default="none",
        help="how MIG devices are advertised: none (whole GPUs), single or mixed",
    ),
    Flag(
        "failOnInitError",
        ("fail-on-init-error",),
        ("FAIL_ON_INIT_ERROR",),
        bool,
        default=True,
        help="stop start-up when NVML cannot start; false serves no GPUs instead",
    ),
    Flag(
        "nvidiaDriverRoot",
        ("driver-root", "nvidia-driver-root"),
        ("NVIDIA_DRIVER_ROOT",),
        str,
        default="/",
        help="the root of the driver installation on the host",
    ),
    Flag(
        "nvidiaDevRoot",
        ("dev-root", "nvidia-dev-root"),
        ("NVIDIA_DEV_ROOT",),
        str,
        help="the root of the /dev nodes on the host (default: the driver root)",
    ),
    Flag(
        "plugin.passDeviceSpecs",
        ("pass-device-specs",),
        ("PASS_DEVICE_SPECS",),
        bool,
        default=False,
        help="list the /dev nodes in Allocate (for the CPU manager's static policy)",
    ),
    Flag(
        "plugin.deviceListStrategy",
        ("device-list-strategy",),
        ("DEVICE_LIST_STRATEGY",),
        list,
        default=("envvar",),
        help="how devices reach the container: envvar, volume-mounts, cdi-annotations, cdi-cri",
    ),
    Flag(
        "plugin.deviceIDStrategy",
        ("device-id-strategy",),
        ("DEVICE_ID_STRATEGY",),
        ID_STRATEGIES,
        default="uuid",
        help="device IDs passed to the runtime: uuid or index",
    ),
    Flag(
        "gdrcopyEnabled",
        ("gdrcopy-enabled",),
        ("GDRCOPY_ENABLED",),
        bool,
        default=False,
        help="add the GDRCopy device nodes",
    ),
    Flag(
        "gdsEnabled",
        ("gds-enabled",),
        ("GDS_ENABLED",),
        bool,
        default=False,
        help="add the GPUDirect Storage device nodes",
    ),
    Flag(
        "mofedEnabled",
        ("mofed-enabled",),
        ("MOFED_ENABLED",),
        bool,
        default=False,
        help="add the Mellanox OFED device nodes",
    ),
    Flag(
        "plugin.cdiAnnotationPrefix",
        ("cdi-annotation-prefix",),
        ("CDI_ANNOTATION_PREFIX",),
        str,
        default="cdi.k8s.io/",
        help="the prefix of CDI annotations (cdi-annotations strategy)",
    ),
    Flag(
        "plugin.nvidiaCTKPath",
        ("nvidia-cdi-hook-path", "nvidia-ctk-path"),
        ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
        str,
        default=DEFAULT_CDI_HOOK_PATH,
        help="the nvidia-ctk (or nvidia-cdi-hook) the CDI spec's hooks run",
    ),
    Flag(
        "plugin.containerDriverRoot",
        ("driver-root-ctr-path", "container-driver-root"),
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        str,
        default=DEFAULT_CONTAINER_DRIVER_ROOT,
        help="where the driver root is mounted in the plugin's container",
    ),
    Flag(
        "mpsRoot",
        ("mps-root",),
        ("MPS_ROOT",),
        str,
        help="the host dir of the MPS control daemons' pipes and logs",
    ),
    Flag(
        "plugin.sharedDevicesAllocationPolicy",
        ("shared-devices-allocation-policy",),
        ("SHARED_DEVICES_ALLOCATION_POLICY",),
        ("distributed", "packed"),
        default="distributed",
        help="how replicas of shared GPUs are picked: distributed or packed",
    ),
    Flag(
        "deviceDiscoveryStrategy",
        ("device-discovery-strategy",),
        ("DEVICE_DISCOVERY_STRATEGY",),
        ("auto", "nvml", "tegra"),
        "default-only",
        allowed=("auto", "nvml"),
        note="only NVML discovery is implemented (no Tegra)",
        default="auto",
        help="auto or nvml (tegra is refused)",
    ),
    Flag(
        "imex.channelIDs",
        ("imex-channel-ids",),
        ("IMEX_CHANNEL_IDS",),
        str,
        "warn",
        note="IMEX channels are not implemented; no channel is injected",
        help="accepted with a warning: IMEX channels are not implemented",
    ),
    Flag(
        "imex.required",
        ("imex-required",),
        ("IMEX_REQUIRED",),
        bool,
        "warn",
        note="IMEX channels are not implemented",
        default=False,
        help="accepted with a warning: IMEX channels are not implemented",
    ),
    Flag(
        "kubeletSocket",
        ("kubelet-socket",),
        ("KUBELET_SOCKET",),
        str,
        "warn",
        note="use --kubelet-dir (HETERO_DP_KUBELET_DIR) for the device-plugin dir",
        help="accepted with a warning: use --kubelet-dir",
    ),
    Flag(
        "configFile",
        ("config-file",),
        ("CONFIG_FILE",),
        str,
        "core",
        help="read by hetero-dp run itself (-c)",
    ),
    Flag(
        "cdiFeatureFlags",
        ("cdi-feature-flags",),
        ("CDI_FEATURE_FLAGS",),
        str,
        "warn",
        note="no CDI feature flags are implemented; the spec is generated as by default",
        help="accepted with a warning: no CDI feature flags are implemented",
    ),
    Flag(
        "cdiDisableHooks",
        ("cdi-disable-hooks",),
        ("CDI_DISABLE_HOOKS",),
        str,
        help="CDI hooks left out of the spec (comma-separated, or all)",
    ),
    # config-file only (no flag, no env) in NVIDIA's plugin:
    Flag(
        "useNodeFeatureAPI",
        (),
        ("USE_NODE_FEATURE_API",),
        bool,
        "ignored",
        default=False,
        help="for GPU feature discovery; ignored",
    ),
)
FLAG_BY_KEY = {f.key: f for f in FLAGS}
FLAG_BY_NAME = {name: f for f in FLAGS for name in f.flags}
# ours, not NVIDIA's: config key -> (env var, type, default, help)
OURS: dict[str, tuple[str, object, Any, str]] = {
    "sysfsRoot": ("", str, "/sys", "where sysfs is mounted (for NUMA and PCI facts)"),
    "procRoot": ("", str, "/proc", "where procfs is mounted"),
    "recoveryQuietPeriod": (
        "DP_RECOVERY_QUIET_PERIOD",
        float,
        60.0,
        "seconds without a new event before an XID-failed GPU is healthy again (0: never)",
    ),
    "dynamicMig": (
        "DP_DYNAMIC_MIG",
        bool,
        False,
        "DRA mode: publish GPUs in MIG mode whole and with every possible MIG placement, "
        "creating the instance when a claim is prepared (needs migStrategy none)",
    ),
}
# NVIDIA's string-slice options: a list in the file is joined with commas.
SLICES = {"cdiDisableHooks", "imex.channelIDs"}
# Sections of the options that other parts read whole (see config.py and parse_options).
SECTIONS: dict[str, str] = {
    "resources": "NVIDIA's renames: resources.gpus and resources.mig, [{pattern, name}]",
    "sharing": "the sharing block (time-slicing, MPS), as in NVIDIA's config file",
    "mps": "MPS control daemon settings (see docs/sharing.md)",
    "gfd": "GPU feature discovery's section; the device plugin ignores it",
}

COMMAND_LINE = "commandLine"  # NVIDIA flags given on the command line: env var -> value


def parse_command_line(args: list[str]) -> dict[str, str]:
    """NVIDIA's command-line flags -> ``{env var: value}`` (its first env var).

    Accepts ``--flag value``, ``--flag=value``, ``-flag`` spellings, and bare
    boolean flags (``--pass-device-specs``). ``--config-file`` is not here: the
    ``run`` command takes it. Raises ConfigError naming an unknown flag.
    """
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg in ("-", "--"):
            raise ConfigError(f"unexpected argument {arg!r}", field=arg, source="command line")
        name, eq, value = arg.lstrip("-").partition("=")
        flag = FLAG_BY_NAME.get(name)
        if flag is None or flag.status == "core":
            known = ", ".join(f"--{n}" for f in FLAGS for n in f.flags if f.status != "core")
            raise ConfigError(
                f"unknown flag --{name} (NVIDIA's flags: {known})",
                field=f"--{name}",
                source="command line",
            )
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if flag.kind is bool and (nxt is None or nxt.lower() not in ("true", "false")):
                value = "true"
            elif nxt is None:
                raise ConfigError("needs a value", field=f"--{name}", source="command line")
            else:
                value = nxt
                i += 1
        var = flag.env[0]
        if flag.kind is list and var in out:  # a repeated string-slice flag adds up
            value = f"{out[var]},{value}"
        out[var] = value
        i += 1
    return out
