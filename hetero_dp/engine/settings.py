"""Every core setting, declared once: its type, default, limits, environment variable,
flag of ``hetero-dp run``, help and what a config reload does with a change.

The config file's top-level keys are :class:`CoreSettings`; its sections the core reads
itself are the fields of :class:`CoreSections` (``cdi``, ``labels``, ``metrics``,
``attribution``, ``dra``), each
a dataclass of :func:`~hetero_dp.model.options.option` fields like a backend's options.
Everything else is derived from these declarations: the reader
(:func:`hetero_dp.engine.config.load_config`), the environment variables it reads, the
flags of ``hetero-dp run`` (:mod:`hetero_dp.cli.settings`), which changes a reload
refuses (:mod:`hetero_dp.engine.reconfigure.fixed`) and the settings table of
docs/configuration.md (``scripts/gen_config_docs.py``). Adding a core setting is one
field here and the code that uses it (docs/contributing.md shows one).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hetero_dp.allocation.delivery import Delivery, check_default_kind, parse_delivery
from hetero_dp.allocation.sharing import DEFAULT_REPLICA_POLICY, SharingSection
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import DEFAULT_DEVICE_PLUGIN_DIR, DEFAULT_PLUGINS_REGISTRY_DIR
from hetero_dp.model.options import Declared, camel, declared, option, parse_options

ENV_PREFIX = "HETERO_DP_"

# where sockets live: a reload cannot move them (restart the daemon)
_SOCKETS = "refused"


@dataclass(frozen=True)
class CoreSettings:
    """The top-level keys of the config file. Intervals and timeouts are in seconds: the
    largest values are a day for a loop and an hour for one wait, beyond that a value is
    a typo (or ``.inf``) rather than a choice."""

    kubelet_dir: Path = option(
        Path(DEFAULT_DEVICE_PLUGIN_DIR),
        help="the kubelet's device-plugin dir: kubelet.sock and the plugin sockets; "
        "`hetero-dp run` stops (exit 2) when it does not exist, unless "
        "`--create-kubelet-dir`, or when this user cannot write it",
        env="HETERO_DP_KUBELET_DIR",
        flag="--kubelet-dir",
        reload=_SOCKETS,
        min=1,
        strict=True,
        path=True,
    )
    plugins_registry_dir: Path = option(
        Path(DEFAULT_PLUGINS_REGISTRY_DIR),
        help="where watcher-mode registration sockets go (the kubelet's plugin registry; "
        "checked as kubeletDir in watcher mode)",
        env="HETERO_DP_PLUGINS_REGISTRY_DIR",
        flag="--plugins-registry-dir",
        reload=_SOCKETS,
        min=1,
        strict=True,
        path=True,
    )
    registration: Literal["classic", "watcher"] = option(
        "classic",
        help="classic: call Register on kubelet.sock; watcher: serve a registration "
        "socket in pluginsRegistryDir",
        env="HETERO_DP_REGISTRATION",
        flag="--registration",
        reload=_SOCKETS,
    )
    socket_prefix: str = option(
        "hetero-dp",
        help="plugin socket names: `<prefix>-<vendor.com>_<name>-<pod>.sock`, `<pod>` from "
        "POD_UID (12 hex digits) or POD_NAME, else random; letters, digits, `-`, `_`, `.`, "
        "starting with a letter or digit (it can never leave its dir)",
        env="HETERO_DP_SOCKET_PREFIX",
        reload=_SOCKETS,
        min=1,
        strict=True,
    )
    health_interval: float = option(
        10.0,
        help="seconds between `check_health` polls",
        env="HETERO_DP_HEALTH_INTERVAL",
        flag="--health-interval",
        min=0.01,
        max=86_400.0,
        off=0,
    )
    rediscover_interval: float = option(
        60.0,
        help="seconds between rediscoveries (events from `watch` still work when off)",
        env="HETERO_DP_REDISCOVER_INTERVAL",
        flag="--rediscover-interval",
        min=0.01,
        max=86_400.0,
        off=0,
    )
    hook_timeout: float = option(
        10.0,
        help="seconds a hook may take before it counts as failed",
        env="HETERO_DP_HOOK_TIMEOUT",
        min=0.01,
        max=3_600.0,
    )
    stream_timeout: float = option(
        30.0,
        help="seconds to wait for the kubelet to open (or reopen) `ListAndWatch` after "
        "registering, before registering again",
        env="HETERO_DP_STREAM_TIMEOUT",
        min=0.01,
        max=3_600.0,
    )
    log_level: Literal["debug", "info", "warning", "error"] = option(
        "info", help="the log level", env="HETERO_DP_LOG_LEVEL", flag="--log-level"
    )
    log_format: Literal["text", "json"] = option(
        "text",
        help="text, or json (one object per line)",
        env="HETERO_DP_LOG_FORMAT",
        flag="--log-format",
    )


@dataclass(frozen=True)
class CdiSection:
    """``cdi``: CDI specs for the resources that deliver through CDI (docs/cdi.md)."""

    enabled: bool | None = option(
        None,
        help="unset: write CDI specs for the resources that deliver through CDI (a relative "
        "dir or a file in its path is refused at start-up; the dir is created and written "
        "when first needed); true: the same, the dir checked at start-up; false: never",
    )
    dir: str = option(
        "/var/run/cdi",
        help="where CDI spec files go (DRA claims' specs too)",
        min=1,
        strict=True,
        path=True,
    )
    runtime_config: str = option(
        "",
        strict=True,
        path=True,
        help="the node's container runtime config (containerd's config.toml or dockerd's "
        "daemon.json, mounted read-only); where it says CDI is off, a CDI delivery falls "
        "back to device specs with a warning",
        env="HETERO_DP_CDI_RUNTIME_CONFIG",
        flag="--cdi-runtime-config",
    )


@dataclass(frozen=True)
class LabelsSection:
    """``labels``: the node label file for Node Feature Discovery."""

    enabled: bool = option(False, help="write node labels for Node Feature Discovery")
    dir: str = option(
        "/etc/kubernetes/node-feature-discovery/features.d",
        help="where the labels file goes: Node Feature Discovery's features.d (the flag "
        "and the environment variable also turn labels.enabled on)",
        env="HETERO_DP_LABELS_DIR",
        flag="--labels-dir",
        also={"enabled": True},
        min=1,
        strict=True,
        path=True,
    )


@dataclass(frozen=True)
class MetricsSection:
    """``metrics``: the Prometheus endpoint, /healthz and /readyz."""

    address: str = option(
        "",
        help="HOST:PORT or :PORT to serve /metrics, /healthz and /readyz on ('' = off)",
        env="HETERO_DP_METRICS_ADDRESS",
        flag="--metrics-address",
        strict=True,
    )
    wait_for_port: bool = option(
        False,
        help="when the port is taken (the old pod of a surge rollout in the host network), "
        "start anyway and serve once it is free, instead of refusing to start",
        reload="next start",  # a start-up choice: a reload to a taken port is refused
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
        help="the kubelet's pod-resources API: attribution of devices to pods is on while "
        "it exists",
        env="HETERO_DP_POD_RESOURCES_SOCKET",
        flag="--pod-resources-socket",
        min=1,
        strict=True,
        path=True,
    )
    proc_root: str = option(
        "/proc",
        help="the host's /proc, where the PIDs the driver reports are read (mounted "
        "read-only, /host/proc in the DaemonSets)",
        env="HETERO_DP_PROC_ROOT",
        flag="--proc-root",
        min=1,
        strict=True,
        path=True,
    )
    container_logs_dir: str = option(
        "/var/log/containers",
        help="the kubelet's container log links, whose names tie a container ID to its "
        "pod and container: which container a process is in where two of a pod's "
        "containers hold the same device ('' = not read; mounted read-only)",
        env="HETERO_DP_CONTAINER_LOGS_DIR",
        strict=True,
        path=True,
    )
    interval: float = option(
        30.0,
        help="seconds between attribution refreshes of its own, so that the noisy-neighbour "
        "WARNING comes with no one scraping /metrics (0 = only on scrapes; a scrape "
        "within the interval counts as one)",
        env="HETERO_DP_ATTRIBUTION_INTERVAL",
        flag="--attribution-interval",
        min=0.01,
        max=86_400.0,
        off=0,
    )


@dataclass(frozen=True)
class DraSection:
    """``dra``: the DRA front end (``hetero-dp run --mode dra``, docs/dra.md). Each is read
    when the drivers are made: a reload that changes one says it waits for a restart."""

    node_name: str = option(
        "",
        help="DRA: this node's name (NODE_NAME from the downward API also sets it)",
        env="HETERO_DP_NODE_NAME",
        flag="--node-name",
        strict=True,
        reload="next start",
    )
    driver_names: dict[str, str] = option(
        {},
        help="DRA: the driver name per resource (`[RESOURCE=]NAME` on the command line; "
        "a name without a resource fits a daemon serving one); default from the "
        "resource: npu.acme.example.com for acme.example.com/npu",
        flag="--driver-name",
        reload="next start",
    )
    plugins_dir: Path = option(
        Path("/var/lib/kubelet/plugins"),
        help="DRA: the dir of the drivers' sockets",
        flag="--dra-plugins-dir",
        min=1,
        strict=True,
        path=True,
        reload="next start",
    )
    api_server: str = option(
        "",
        help="DRA: the API server's URL (default: in-cluster, or the kubeconfig)",
        flag="--api-server",
        strict=True,
        reload="next start",
    )
    kubeconfig: str = option(
        "",
        help="DRA: a kubeconfig file",
        env="KUBECONFIG",
        flag="--kubeconfig",
        strict=True,
        reload="next start",
    )


@dataclass(frozen=True)
class CoreSections:
    """The sections of the config file the core reads itself, each typed: the loaded
    :class:`~hetero_dp.engine.config.Config` has them as these dataclasses."""

    cdi: CdiSection = option(CdiSection(), help="CDI specs (docs/cdi.md)")
    labels: LabelsSection = option(LabelsSection(), help="the node label file")
    metrics: MetricsSection = option(MetricsSection(), help="metrics and probes")
    attribution: AttributionSection = option(
        AttributionSection(), help="which container holds and uses each device"
    )
    dra: DraSection = option(DraSection(), help="the DRA front end (docs/dra.md)")


@dataclass(frozen=True)
class ResourceSettings:
    """``resources.<name>``: one resource's settings (docs/configuration.md), as the
    config file gives them and as a backend's ``resource_defaults`` hook does, read by
    the same reader. A key left out (or null) is None: it keeps the backend's default
    (:meth:`over`), then the built-in one (:attr:`delivery`, :attr:`policy`,
    :attr:`preferred`). ``deliver``, ``cdiKind`` and ``cdiAnnotationPrefix`` are
    checked together once read, into :attr:`delivery` (allocation/delivery.py);
    ``deliver`` is kept as the strategies given (a tuple)."""

    deliver: Any = option(
        None,
        help="how `Allocate` delivers the devices, a list of `device-specs` (unset: this "
        "alone), `cdi-cri` (the `cdi_devices` field), `cdi-annotations`, combinable "
        "(docs/cdi.md)",
    )
    cdi_kind: str | None = option(
        None,
        help="the CDI kind (`vendor.com/class`) of the resource's CDI names (unset: the "
        "resource name)",
        strict=True,
    )
    cdi_annotation_prefix: str | None = option(
        None,
        help="the prefix of CDI annotation keys, for runtimes that read annotations "
        "(unset: `cdi.k8s.io/`)",
        strict=True,
    )
    replica_policy: Literal["distributed", "packed", "spread"] | None = option(
        None,
        help="where replicas of shared devices are taken from: `distributed` (unset: "
        "this; least-used physical devices first), `packed` (fill one physical device "
        "first) or `spread` (docs/sharing.md)",
    )
    preferred_allocation: bool | None = option(
        None,
        help="whether the kubelet is told to ask for a preferred allocation (unset: true)",
    )
    #: the delivery these settings give (the built-in defaults for the keys left out),
    #: parsed once here: what the resource's Allocate and the CDI specs follow
    delivery: Delivery = dataclasses.field(
        init=False, compare=False, repr=False, default=Delivery()
    )

    def __post_init__(self) -> None:
        given = {camel(k): v for k, v in self.given().items()}
        delivery = parse_delivery(given)  # ConfigError naming the key (``deliver``)
        if self.deliver is not None:
            object.__setattr__(self, "deliver", delivery.strategies)
        object.__setattr__(self, "delivery", delivery)

    def given(self) -> dict[str, Any]:
        """The settings given (field name -> value), those left out not."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.init and getattr(self, f.name) is not None
        }

    def over(self, defaults: ResourceSettings | None) -> ResourceSettings:
        """These settings over ``defaults`` (a backend's): a key given here wins. Both
        were parsed when read: the merged delivery is made of their parts, not parsed
        again."""
        if defaults is None or not defaults.given():
            return self
        given = self.given()
        if not given:
            return defaults
        merged = copy.copy(defaults)
        for name, value in given.items():
            object.__setattr__(merged, name, value)
        mine, theirs = self.delivery, defaults.delivery
        delivery = Delivery(
            mine.strategies if self.deliver is not None else theirs.strategies,
            merged.cdi_kind,
            mine.annotation_prefix if self.cdi_annotation_prefix else theirs.annotation_prefix,
        )
        object.__setattr__(merged, "delivery", delivery)
        return merged

    def check_kind(self, resource: str) -> None:
        """With a CDI delivery and no ``cdiKind``, the kind is ``resource``'s name:
        ConfigError (field ``cdiKind``) where that is no CDI kind."""
        check_default_kind(self.delivery, resource)

    @property
    def policy(self) -> str:
        """The replica policy (``distributed`` unless given)."""
        return self.replica_policy or DEFAULT_REPLICA_POLICY

    @property
    def preferred(self) -> bool:
        """Whether GetPreferredAllocation is answered (yes unless turned off)."""
        return self.preferred_allocation is not False


def read_defaults(
    given: Mapping[str, Any] | None, resource: str, backend: str, entry: ResourceSettings
) -> ResourceSettings:
    """A backend's ``resource_defaults`` answer for ``resource``, read as the file's
    entries are (ConfigError naming ``backend <name>`` and the field
    ``resource_defaults(<resource>).<key>``); ``entry`` (the file's, which wins) is
    checked with them for a CDI kind the resource name cannot be."""
    where, source = f"resource_defaults({resource})", f"backend {backend}"
    defaults: ResourceSettings = parse_options(
        ResourceSettings, given, field=where, source=source, environ={}
    )
    try:
        entry.over(defaults).check_kind(resource)
    except ConfigError as e:
        raise ConfigError(e.reason, field=f"{where}.{e.field}", source=source) from None
    return defaults


@dataclass(frozen=True)
class ConfigFile(CoreSettings, CoreSections):
    """The whole file as the core reads it: the top-level settings, the core's own
    sections, and the sections read by other parts (``backends`` by each backend's
    options, ``sharing`` as declared in allocation/sharing.py, ``resources`` entry by
    entry as :class:`ResourceSettings`, keyed by resource name)."""

    version: Literal["v1"] = option("v1", help="the schema version (optional; only v1)")
    backends: Any = option(None, help="each backend's options, under its name")
    sharing: SharingSection | None = option(None, help="time-slicing and MPS (docs/sharing.md)")
    resources: Any = option(None, help="settings per resource name")


#: every core setting (the top-level keys and the core's sections), dotted key first
SETTINGS: tuple[Declared, ...] = (*declared(CoreSettings), *declared(CoreSections))
BY_KEY = {s.key: s for s in SETTINGS}
#: top-level key -> (type, default), for docs and tests
SCALARS: dict[str, tuple[type, Any]] = {
    s.key: (float if s.hint is float else str, s.default) for s in declared(CoreSettings)
}
#: the core's sections: section -> {key: (type, default)}
SECTION_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {
    camel(f.name): {
        s.key.split(".", 1)[1]: (s.hint, s.default) for s in SETTINGS if s.path[0] == f.name
    }
    for f in dataclasses.fields(CoreSections)
}
SECTIONS = ("backends", "sharing", "resources", *SECTION_KEYS)
RESOURCE_KEYS = {camel(f.name) for f in dataclasses.fields(ResourceSettings) if f.init}
#: keys a reload cannot change (restart the daemon), and keys read only at start-up
REFUSED = tuple(s.key for s in SETTINGS if s.info.reload == "refused")
NEXT_START = tuple(s.key for s in SETTINGS if s.info.reload == "next start")


def env_name(key: str) -> str:
    """The environment variable of a core setting (``kubeletDir`` ->
    ``HETERO_DP_KUBELET_DIR``); for a key that declares none, the one it would have."""
    declared_env = BY_KEY[key].info.env if key in BY_KEY else None
    if declared_env:
        return declared_env
    snake = "".join("_" + c if c.isupper() else c for c in key.replace(".", "_")).upper()
    return ENV_PREFIX + snake


def flag_name(key: str) -> str:
    """The flag of a core setting (``metrics.address`` -> ``--metrics-address``); for a
    key that declares none, the one it would have."""
    declared_flag = BY_KEY[key].info.flag if key in BY_KEY else None
    if declared_flag:
        return declared_flag
    return "--" + "".join("-" + c.lower() if c.isupper() else c for c in key).replace(".", "-")


def value_at(obj: Any, path: tuple[str, ...]) -> Any:
    """``obj.metrics.address`` for ``("metrics", "address")``."""
    for name in path:
        obj = getattr(obj, name)
    return obj
