"""The device record: the one thing a backend hands to the framework.

Every answer to the kubelet (the device list, health, topology, the Allocate
response, CDI specs, node labels, metrics, DRA slices) follows from these
records. Records are immutable; a change is a new record (``dataclasses.replace``
or :meth:`Device.with_health`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hetero_dp.model.shown import shown

AttributeValue = str | int | float | bool

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

#: Time-slicing replicas of a device are advertised as ``<id>::<n>``.
REPLICA_SEPARATOR = "::"


def is_replica(device_id: str) -> bool:
    """Whether an advertised ID names a replica (``<id>::<n>``)."""
    head, sep, tail = device_id.rpartition(REPLICA_SEPARATOR)
    return bool(sep and head and tail.isdigit())


def replica_base(device_id: str) -> str:
    """The device a replica ID stands for (strips ``::<n>``); other IDs unchanged."""
    return device_id.rpartition(REPLICA_SEPARATOR)[0] if is_replica(device_id) else device_id


def _want(ok: bool, what: str, expected: str, value: object, fix: str = "") -> None:
    """TypeError naming the field, the type expected and the value given: a record is
    checked where the backend makes it, so the traceback's last author frame is the
    line that made it (hook errors name it), and no later step meets a wrong type."""
    if not ok:
        got = f"{type(value).__name__} {shown(value)}"
        raise TypeError(f"{what} must be {expected}, got {got}" + (f": {fix}" if fix else ""))


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _str_map(value: object, what: str) -> dict[str, str]:
    _want(value is None or isinstance(value, Mapping), what, "a mapping of str to str", value)
    out = dict(value or {})  # type: ignore[call-overload]
    for k, v in out.items():
        _want(_is_str(k), f"{what} key", "a str", k)
        _want(_is_str(v), f"{what}[{k}]", "a str", v, f"write {k}={str(v)!r}")
    return out


def _sequence(value: object, what: str, kind: type) -> tuple[object, ...]:
    name = kind.__name__
    _want(
        not isinstance(value, (str, bytes, Mapping)) and isinstance(value, Iterable),
        what,
        f"a list of {name}",
        value,
        f"write [{name}({shown(value)})]" if isinstance(value, str) else "",
    )
    items: tuple[object, ...] = tuple(value)  # type: ignore[arg-type]
    for i, item in enumerate(items):
        fix = f"write {name}({item!r})" if isinstance(item, str) else ""
        _want(isinstance(item, kind), f"{what}[{i}]", f"a {name}", item, fix)
    return items


class Lost(str):
    """A health reason that also says the device is **lost**: gone until someone
    repairs it (a GPU fallen off the bus), not merely unhealthy.

    Return it from ``check_health`` (``return Lost("fell off the bus")``) or pass it
    to :meth:`EventSink.set_health` as the reason. The kubelet's device-plugin API
    has one word for both (``Unhealthy``); in DRA mode a lost device's taint is
    ``NoExecute`` instead of ``NoSchedule``, so the pods that hold it are evicted
    (KEP-5055). Anything else reads it as the plain reason text.
    """

    __slots__ = ()


@dataclass(frozen=True)
class DeviceNode:
    """A device node the container gets, e.g. ``/dev/accel0``.

    ``shared`` marks a node that every allocation of the resource gets
    whatever devices it holds (``/dev/kfd``, ``/dev/nvidiactl``); CDI puts
    such nodes in the spec-wide container edits.
    """

    host_path: str
    container_path: str = ""
    permissions: str = "rw"
    shared: bool = False

    def __post_init__(self) -> None:
        what = f"DeviceNode({shown(self.host_path)})"
        _want(
            _is_str(self.host_path),
            "a device node's host_path",
            "a str",
            self.host_path,
        )
        _want(_is_str(self.container_path), f"{what}.container_path", "a str", self.container_path)
        _want(_is_str(self.permissions), f"{what}.permissions", "a str", self.permissions)
        _want(isinstance(self.shared, bool), f"{what}.shared", "a bool", self.shared)
        if not self.container_path:
            object.__setattr__(self, "container_path", self.host_path)
        if not self.permissions or set(self.permissions) - set("rwm"):
            raise ValueError(
                f"device node {self.host_path}: permissions must be made of r, w, m, "
                f"got {shown(self.permissions)}"
            )


@dataclass(frozen=True)
class Mount:
    """A bind mount into the container."""

    host_path: str
    container_path: str = ""
    read_only: bool = True
    shared: bool = False

    def __post_init__(self) -> None:
        what = f"Mount({shown(self.host_path)})"
        _want(
            _is_str(self.host_path),
            "a mount's host_path",
            "a str",
            self.host_path,
        )
        _want(_is_str(self.container_path), f"{what}.container_path", "a str", self.container_path)
        _want(isinstance(self.read_only, bool), f"{what}.read_only", "a bool", self.read_only)
        _want(isinstance(self.shared, bool), f"{what}.shared", "a bool", self.shared)
        if not self.container_path:
            object.__setattr__(self, "container_path", self.host_path)


def _freeze_map(value: Mapping[str, object] | None) -> dict[str, object]:
    return dict(value or {})


@dataclass(frozen=True, eq=True)
class Device:
    """One allocatable unit of a resource.

    id
        The ID the kubelet sees (at most 63 characters is safe).
    resource
        Fully qualified extended resource name, ``vendor.com/name``.
    healthy, reason
        Health; the reason says why a device is unhealthy (or why it recovered).
    numa_nodes
        Host NUMA node numbers; empty means "no NUMA affinity".
    nodes, mounts, env, annotations
        What a container gets when it is allocated this device. Env values of
        several allocated devices under the same key are joined with commas
        (first-seen order, de-duplicated), the way ``*_VISIBLE_DEVICES`` works.
    parent
        ID of the physical device this one is carved from (a MIG slice's GPU);
        health events on the parent reach it, and topology uses the parent.
    index
        The vendor's index (as its own tools number the device, a card number), if any.
    attributes
        Facts about the device (product, memory in MiB, PCI address, UUID ...)
        used for labels, DRA attributes and ``hetero-dp list``.
    consumes
        DRA partitionable devices (KEP-4815): counter name -> how much of it this
        device uses. On a device with partitions (records whose ``parent`` it is)
        it is also the whole counter set, so the whole device uses all of it; on a
        partition it is its share (a MIG placement's memory slices). Counter
        names are DNS labels. Empty: the framework counts memory
        (``attributes["memoryMiB"]``) instead. Device-plugin mode ignores it.
    """

    id: str
    resource: str
    healthy: bool = True
    reason: str = ""
    numa_nodes: tuple[int, ...] = ()
    nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    parent: str | None = None
    index: int | None = None
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    consumes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"device ID must be a non-empty string, got {shown(self.id)}")
        me = f"device {shown(self.id)}"
        _want(_is_str(self.resource), f"{me}: resource", "a str", self.resource)
        _want(isinstance(self.healthy, bool), f"{me}: healthy", "a bool", self.healthy)
        _want(_is_str(self.reason), f"{me}: reason", "a str", self.reason)
        _want(
            self.parent is None or _is_str(self.parent),
            f"{me}: parent",
            "a str or None",
            self.parent,
        )
        _want(
            self.index is None
            or (isinstance(self.index, int) and not isinstance(self.index, bool)),
            f"{me}: index",
            "an int or None",
            self.index,
        )
        nodes = _sequence(self.nodes, f"{me}: nodes", DeviceNode)
        mounts = _sequence(self.mounts, f"{me}: mounts", Mount)
        env = _str_map(self.env, f"{me}: env")
        annotations = _str_map(self.annotations, f"{me}: annotations")
        _want(
            self.attributes is None or isinstance(self.attributes, Mapping),
            f"{me}: attributes",
            "a mapping",
            self.attributes,
        )
        for key, val in (self.attributes or {}).items():
            _want(_is_str(key), f"{me}: attributes key", "a str", key)
            _want(
                isinstance(val, (str, int, float, bool)),
                f"{me}: attributes[{key}]",
                "a str, int, float or bool",
                val,
            )
        numa: Iterable[int]
        if isinstance(self.numa_nodes, int):
            numa = () if self.numa_nodes < 0 else (self.numa_nodes,)
        else:
            numa = tuple(n for n in self.numa_nodes if n is not None and int(n) >= 0)
        object.__setattr__(self, "numa_nodes", tuple(int(n) for n in numa))
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "mounts", mounts)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "annotations", annotations)
        object.__setattr__(self, "attributes", _freeze_map(self.attributes))
        consumes = {str(k): v for k, v in _freeze_map(self.consumes).items()}
        for k, v in consumes.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(
                    f"device {self.id}: consumes[{k}] must be an int >= 0, got {shown(v)}"
                )
        object.__setattr__(self, "consumes", consumes)

    __hash__ = None  # type: ignore[assignment]  # records hold dicts; compare, don't hash

    @property
    def health(self) -> str:
        """The kubelet's word for the health: ``Healthy`` or ``Unhealthy``."""
        return HEALTHY if self.healthy else UNHEALTHY

    @property
    def lost(self) -> bool:
        """Unhealthy with a :class:`Lost` reason: gone until repaired."""
        return not self.healthy and isinstance(self.reason, Lost)

    @property
    def physical_id(self) -> str:
        """The ID of the physical device (the parent's, for a slice; the device
        behind it, for a replica)."""
        return self.parent or replica_base(self.id)

    def with_health(self, healthy: bool, reason: str = "") -> Device:
        """A copy with another health."""
        return dataclasses.replace(self, healthy=healthy, reason=reason)


@dataclass(frozen=True)
class Link:
    """How two devices connect, for topology-aware allocation.

    ``score`` is higher-is-better (the bundled GPU backend's: 100 per NVLink, 60 same
    board ... 10 across CPUs); ``kind`` is a short label for ``hetero-dp topo``
    (``NV4``, ``PIX``, ``SYS`` ...).
    """

    a: str
    b: str
    score: int
    kind: str = ""


@dataclass(frozen=True)
class Sample:
    """One metric value a backend reports (exported as a Prometheus gauge).

    ``name`` without a prefix of ours (``DCGM_FI_DEV_GPU_TEMP`` style names are
    kept as they are); ``labels`` identify the device (``gpu``, ``UUID`` ...).

    Two optional fields say what the sample measures, so the framework can add who
    holds it (labels ``pod``, ``namespace``, ``container``, as dcgm-exporter
    names them) where attribution is on; the backend needs to know nothing of pods:

    device_id
        The ``Device.id`` the sample is about (a GPU, a MIG device). Labelled with
        the holder only while one container holds the device whole; a shared
        device's samples are device-wide and stay unlabelled.
    pid
        The host PID the sample is about (a per-process sample); labelled with the
        process's container where the kubelet knows it.
    """

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)
    help: str = ""
    device_id: str = ""
    pid: int | None = None


@dataclass(frozen=True)
class Check:
    """One step of ``hetero-dp doctor``: ``status`` is ``pass``, ``warn`` or ``fail``;
    ``fix`` says what to do about a warn or fail."""

    name: str
    status: str
    message: str
    fix: str = ""
