"""Replicas and renaming (time-slicing or MPS), for every backend.

The ``sharing`` block (where its schema comes from: docs/sharing.md); its
``sharing.timeSlicing`` and ``sharing.mps`` blocks have the same shape::

    sharing:
      timeSlicing:
        renameByDefault: false          # shared devices advertise as <name>.shared
        failRequestsGreaterThanOne: false
        resources:
        - name: example.com/gpu         # or a bare name part: gpu
          replicas: 4                   # 2 .. MAX_REPLICAS
          rename: gpu.shared            # optional; bare names keep the prefix
          devices: all                  # all | <count> | [IDs or indices]

A shared physical device is advertised as ``replicas`` devices ``<id>::0`` ...
``<id>::<replicas-1>`` under the shared name; devices the selection leaves out
stay whole under the original name. Replicas copy every other field of their
physical device, so its health reaches all of them on the next advertise.
Allocate maps replica IDs back with :func:`to_physical`.

Time-slicing isolates neither memory nor faults: replicas of one device share
its memory, and a fault in one workload can take down the others.

``sharing.mps`` advertises replicas exactly as time-slicing does; what makes it
MPS (the control daemon, its limits, the pipe directory a container mounts)
belongs to the backend that runs it. The core only records the strategy, refuses
to share a device carved from another (a record with a ``parent``) under MPS, and
refuses requests for more than one replica unless the block sets
``failRequestsGreaterThanOne: false`` (the default under MPS).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_dp.model.device import REPLICA_SEPARATOR, Device, is_replica, replica_base
from hetero_dp.model.errors import AllocationError, ConfigError
from hetero_dp.model.names import resource_name_problem
from hetero_dp.model.options import option, parse_options
from hetero_dp.model.shown import shown
from hetero_dp.model.wire import (
    MAX_LIST_AND_WATCH_BYTES,
    device_entry_size,
    replicas_size,
)

#: Suffix of the resource name shared devices get with ``renameByDefault``.
SHARED_SUFFIX = ".shared"
#: How replicas are picked for a request (see :mod:`hetero_dp.allocation.preferred`).
REPLICA_POLICIES = ("distributed", "packed", "spread")
DEFAULT_REPLICA_POLICY = "distributed"

TIME_SLICING = "time-slicing"
MPS = "mps"
#: Strategy -> the config block that holds it.
STRATEGY_BLOCKS = {TIME_SLICING: "sharing.timeSlicing", MPS: "sharing.mps"}
#: The most replicas of one device: far more than time-slicing is good for (the
#: schema's published examples use 2 to 10), and small enough that a typo
#: (``replicas: 100000000``) is refused before anything is built from it.
MAX_REPLICAS = 1024


# --- replica IDs -------------------------------------------------------------------------


def replica_id(device_id: str, n: int) -> str:
    """The ID of replica ``n`` of a physical device."""
    return f"{device_id}{REPLICA_SEPARATOR}{n}"


def replica_number(device_id: str) -> int:
    """The ``n`` of ``<id>::<n>``; 0 for a whole device."""
    return int(device_id.rpartition(REPLICA_SEPARATOR)[2]) if is_replica(device_id) else 0


def physical_id(device_id: str) -> str:
    """The physical device behind an advertised ID (strips ``::<n>``)."""
    return replica_base(device_id)


def to_physical(ids: Sequence[str]) -> list[str]:
    """Physical IDs behind advertised IDs, de-duplicated, first-seen order kept."""
    seen: dict[str, None] = {}
    for i in ids:
        seen.setdefault(physical_id(i), None)
    return list(seen)


# --- resource names ----------------------------------------------------------------------


def _split(name: str) -> tuple[str, str]:
    prefix, sep, part = name.rpartition("/")
    return (prefix, part) if sep else ("", name)


# --- configuration -----------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSelection:
    """Which devices of a resource are shared: all, the first ``count``, or ``refs``.

    A ref matches a device whose ID equals it, or, when the ref is a number,
    whose :attr:`Device.index` equals it. The first ``count`` devices are taken
    in index order (devices without an index after, in discovery order).
    """

    count: int | None = None
    refs: tuple[str, ...] | None = None

    @property
    def all(self) -> bool:
        return self.count is None and self.refs is None

    def select(self, devices: Sequence[Device]) -> list[Device]:
        if self.count is not None:
            ranked = sorted(
                range(len(devices)),
                key=lambda i: (devices[i].index is None, devices[i].index or 0, i),
            )
            keep = set(ranked[: self.count])
            return [d for i, d in enumerate(devices) if i in keep]
        if self.refs is not None:
            return [d for d in devices if any(_matches_ref(d, r) for r in self.refs)]
        return list(devices)


def _matches_ref(device: Device, ref: str) -> bool:
    return device.id == ref or (ref.isdigit() and device.index == int(ref))


@dataclass(frozen=True)
class ReplicatedResource:
    """One entry of ``sharing.timeSlicing.resources``.

    ``name`` and ``rename`` may be bare name parts (``gpu``):
    a bare name matches any resource with that name part, and a bare rename
    keeps the prefix of the resource it renames. ``field`` is the entry's path
    in the config, for error messages.
    """

    name: str
    replicas: int
    rename: str = ""
    devices: DeviceSelection = field(default_factory=DeviceSelection)
    field: str = ""

    def matches(self, resource: str) -> bool:
        if "/" in self.name:
            return resource == self.name
        return _split(resource)[1] == self.name


@dataclass(frozen=True)
class SharingConfig:
    """Parsed ``sharing`` block. The default shares nothing.

    ``strategy`` says which block the entries came from: ``time-slicing`` or
    ``mps`` (a backend may publish it, e.g. in a node label).
    """

    resources: tuple[ReplicatedResource, ...] = ()
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    source: str = ""
    strategy: str = TIME_SLICING

    @property
    def enabled(self) -> bool:
        return bool(self.resources)

    @property
    def block(self) -> str:
        """The config path of the block in force (``sharing.timeSlicing``, ``sharing.mps``)."""
        return STRATEGY_BLOCKS[self.strategy]

    def entry_for(self, resource: str) -> ReplicatedResource | None:
        """The entry sharing ``resource`` (a discovered resource name), if any."""
        # A full name beats a bare one, whatever the order in the file.
        exact = [e for e in self.resources if e.name == resource]
        if exact:
            return exact[0]
        return next((e for e in self.resources if e.matches(resource)), None)

    def replicas_for(self, resource: str) -> int:
        """Replicas per shared device of ``resource`` (1 when it is not shared)."""
        entry = self.entry_for(resource)
        return entry.replicas if entry else 1

    def shared_name(self, resource: str) -> str:
        """The name shared devices of ``resource`` are advertised under."""
        entry = self.entry_for(resource)
        if entry is None:
            return resource
        if entry.rename:
            if "/" in entry.rename:
                return entry.rename
            prefix = _split(resource)[0]
            return f"{prefix}/{entry.rename}" if prefix else entry.rename
        return resource + SHARED_SUFFIX if self.rename_by_default else resource

    def validate_devices(self, physical: Sequence[Device]) -> None:
        """Check this config against the discovered devices (see :func:`validate_sharing`)."""
        validate_sharing(self, physical)

    def check_request(self, resource: str, ids: Sequence[str]) -> None:
        """Raise AllocationError if the request breaks a rule (failRequestsGreaterThanOne).

        With ``failRequestsGreaterThanOne`` a container may ask for one replica at
        most; more would only time-slice one device several times over while
        the workload believes it holds several.
        """
        if not self.fail_requests_greater_than_one or len(ids) <= 1:
            return
        if any(is_replica(i) for i in ids):
            raise AllocationError(
                f"request for {len(ids)} devices of {resource} ({', '.join(ids)}) is too large: "
                f"{self.block}.failRequestsGreaterThanOne allows at most 1 device per request "
                "of a shared resource"
            )


# The block as written, declared like a backend's options (model/options.py): one reader,
# one error style (the file, the field as written, the reason, did-you-mean). Values are
# taken as typed (``strict``): ``replicas: "4"`` or ``renameByDefault: "yes"`` is
# refused, as the schema's own plugin refuses them (docs/sharing.md).


@dataclass(frozen=True)
class SharedResourceEntry:
    """One entry of a block's ``resources`` list, as written."""

    name: str = option(help="the resource name, or a bare name part (gpu)", min=1, strict=True)
    replicas: int = option(help="replicas per device", min=2, max=MAX_REPLICAS, strict=True)
    rename: str | None = option(
        None, help="the shared name; a bare one keeps the prefix", strict=True
    )
    devices: Any = option("all", help="all, a count, or a list of device IDs or indices")

    def __post_init__(self) -> None:
        _check_name(self.name, "name")
        if self.rename:
            _check_name(self.rename, "rename")
        _parse_devices(self.devices, "devices")


@dataclass(frozen=True)
class SharingBlock:
    """``sharing.timeSlicing`` or ``sharing.mps``, as written (a key left out or null
    takes its default; ``failRequestsGreaterThanOne`` defaults by strategy)."""

    rename_by_default: bool | None = option(
        None, help="shared devices advertise as <name>.shared", strict=True
    )
    fail_requests_greater_than_one: bool | None = option(
        None,
        help="refuse requests for more than one replica (default: true under mps)",
        strict=True,
    )
    resources: list[SharedResourceEntry] | None = option(
        None, help="the resources to share", strict=True
    )
    strategy: str | None = option(
        None, help="reserved by the schema; leave it out", strict=True, internal=True
    )

    def __post_init__(self) -> None:
        if self.strategy not in (None, ""):
            # The schema's first version reserved this key and accepted only the empty
            # value (docs/sharing.md).
            raise ConfigError("unknown sharing strategy; leave it out", field="strategy")


@dataclass(frozen=True)
class SharingSection:
    """The ``sharing`` block as written: one of its two blocks may hold resources."""

    time_slicing: SharingBlock | None = option(None, help="time-slicing (docs/sharing.md)")
    mps: SharingBlock | None = option(None, help="MPS (docs/sharing.md)")


def parse_sharing(raw: Mapping[str, Any] | None, source: str = "") -> SharingConfig:
    """Parse and validate the ``sharing`` block; ConfigError names the field.

    ``raw`` is the value of the config's ``sharing`` key (``None`` shares
    nothing). ``timeSlicing`` and ``mps`` have the same schema; only one of them
    may hold resources (the mix is refused rather than one block silently winning).
    """
    if raw is None:
        return SharingConfig(source=source)
    if not isinstance(raw, Mapping):  # the reader takes a falsy value as no options
        raise ConfigError(f"expected a mapping, got {shown(raw)}", field="sharing", source=source)
    read = parse_options(SharingSection, raw, field="sharing", source=source, environ={})
    return sharing_config(read, source)


def sharing_config(section: SharingSection, source: str = "") -> SharingConfig:
    """The :class:`SharingConfig` of a ``sharing`` block the options reader has read:
    the checks across entries and blocks (the same resource shared twice, both blocks
    holding resources) name the field as written."""
    parsed = [
        _config(block, strategy, source)
        for block, strategy in ((section.time_slicing, TIME_SLICING), (section.mps, MPS))
    ]
    used = [p for p in parsed if p.enabled]
    if len(used) > 1:
        raise ConfigError(
            "both timeSlicing and mps share resources; a node uses one sharing strategy: "
            "keep one block",
            field="sharing.mps",
            source=source,
        )
    return used[0] if used else SharingConfig(source=source)


def _config(block: SharingBlock | None, strategy: str, source: str) -> SharingConfig:
    where = STRATEGY_BLOCKS[strategy]
    if block is None:
        return SharingConfig(source=source, strategy=strategy)
    entries: list[ReplicatedResource] = []
    for i, item in enumerate(block.resources or ()):
        entry = ReplicatedResource(
            item.name,
            item.replicas,
            item.rename or "",
            _parse_devices(item.devices, "devices"),
            f"{where}.resources[{i}]",
        )
        clash = next((e for e in entries if e.name == entry.name), None)
        if clash is not None:
            raise ConfigError(
                f"{entry.name} is already shared by {clash.field}",
                field=f"{entry.field}.name",
                source=source,
            )
        entries.append(entry)
    # MPS refuses requests for several replicas unless told otherwise (the schema's
    # "historical MPS behavior": docs/sharing.md).
    fail_more = block.fail_requests_greater_than_one
    return SharingConfig(
        resources=tuple(entries),
        rename_by_default=bool(block.rename_by_default),
        fail_requests_greater_than_one=strategy == MPS if fail_more is None else fail_more,
        source=source,
        strategy=strategy,
    )


def _check_name(value: str, where: str) -> None:
    """A resource name, or a bare name part checked under a stand-in prefix (left out of
    the message); ``where`` is relative to the entry (the reader completes it)."""
    if "/" in value:
        problem = resource_name_problem(value)
    else:
        stand_in = f"example.com/{value}"
        problem = (resource_name_problem(stand_in) or "").replace(f" of {stand_in!r}", "")
    if problem:
        raise ConfigError(f"invalid resource name {shown(value)}: {problem}", field=where)


def _parse_devices(value: Any, where: str) -> DeviceSelection:
    """``devices``: ``all`` (or null), a count, or a non-empty list of IDs or indices."""
    if value is None or value == "all":
        return DeviceSelection()
    expected = "'all', a count or a non-empty list of device IDs or indices"
    if isinstance(value, bool) or not isinstance(value, int | list):
        raise ConfigError(f"expected {expected}, got {shown(value)}", field=where)
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"a count of devices must be at least 1, got {value}", field=where)
        return DeviceSelection(count=value)
    if not value:
        raise ConfigError(f"expected {expected}, got []", field=where)
    refs: list[str] = []
    for k, ref in enumerate(value):
        if isinstance(ref, bool) or not isinstance(ref, int | str) or ref == "":
            raise ConfigError(
                f"expected a device ID or index, got {shown(ref)}", field=f"{where}[{k}]"
            )
        if isinstance(ref, int) and ref < 0:
            raise ConfigError(f"an index must not be negative, got {ref}", field=f"{where}[{k}]")
        refs.append(str(ref))
    return DeviceSelection(refs=tuple(refs))


def parse_replica_policy(value: Any, field: str = "replicaPolicy", source: str = "") -> str:
    """Validate a replica policy (how replicas are picked: docs/sharing.md)."""
    if value in (None, ""):
        return DEFAULT_REPLICA_POLICY
    if value not in REPLICA_POLICIES:
        raise ConfigError(
            f"unknown replica policy {value!r}; use one of {', '.join(REPLICA_POLICIES)}",
            field=field,
            source=source,
        )
    return str(value)


def validate_sharing(config: SharingConfig, physical: Sequence[Device]) -> None:
    """Check the config against the discovered devices; ConfigError names the field.

    Refused: a listed device ID or index that no device of the resource has, a
    count larger than the resource's devices, a shared device whose ID already
    contains ``::``, a rename that makes an invalid resource name, replicas that
    would make a ListAndWatch message larger than the kubelet receives, and under
    MPS a device carved from another (a record with a ``parent``, such as a MIG
    slice; docs/sharing.md says whose rule this is).
    """

    def fail(reason: str, where: str) -> ConfigError:
        return ConfigError(reason, field=where, source=config.source)

    by_resource = _by_resource(physical)
    for entry in config.resources:
        resources = [r for r in by_resource if config.entry_for(r) is entry]
        devices = [d for r in resources for d in by_resource[r]]
        sel = entry.devices
        if sel.refs is not None:
            for k, ref in enumerate(sel.refs):
                if not any(_matches_ref(d, ref) for d in devices):
                    raise fail(
                        f"device {ref!r} does not exist in {entry.name} "
                        f"(devices: {_describe(devices)})",
                        f"{entry.field}.devices[{k}]",
                    )
        for resource in resources:
            group = by_resource[resource]
            if sel.count is not None and sel.count > len(group):
                raise fail(
                    f"asks for {sel.count} shared devices but {resource} has {len(group)}",
                    f"{entry.field}.devices",
                )
            shared = config.shared_name(resource)
            problem = resource_name_problem(shared)
            if problem:
                where = (
                    f"{entry.field}.rename" if entry.rename else f"{config.block}.renameByDefault"
                )
                raise fail(f"shared name {shared!r} is invalid: {problem}", where)
            for d in sel.select(group):
                if config.strategy == MPS and d.parent is not None:
                    raise fail(
                        "MPS sharing is not supported for MIG devices (devices carved from "
                        f"another): {d.id} of {resource} is a slice of {d.parent}; share them "
                        "with timeSlicing, or list only whole devices in devices",
                        f"{entry.field}.devices" if not sel.all else f"{entry.field}.name",
                    )
                if REPLICA_SEPARATOR in d.id:
                    raise fail(
                        f"device ID {d.id!r} contains {REPLICA_SEPARATOR!r}, which replica "
                        "IDs use; it cannot be shared",
                        f"{entry.field}.devices",
                    )
    _check_sizes(config, by_resource, fail)


def _check_sizes(
    config: SharingConfig, by_resource: Mapping[str, Sequence[Device]], fail: Any
) -> None:
    """Every advertised resource's ListAndWatch message within the kubelet's limit,
    computed from ID lengths and replica counts, before any replica is built."""
    sizes: dict[str, int] = {}
    cause: dict[str, ReplicatedResource] = {}
    for resource, group in by_resource.items():
        entry = config.entry_for(resource)
        chosen = {id(d) for d in entry.devices.select(group)} if entry else set()
        for d in group:
            if id(d) in chosen:
                assert entry is not None
                name = config.shared_name(resource)
                size = replicas_size(len(d.id.encode()), d.numa_nodes, entry.replicas)
                cause[name] = entry
            else:
                name, size = resource, device_entry_size(len(d.id.encode()), d.numa_nodes)
            sizes[name] = sizes.get(name, 0) + size
    for name, size in sorted(sizes.items()):
        entry = cause.get(name)
        if entry is not None and size > MAX_LIST_AND_WATCH_BYTES:
            raise fail(
                f"{entry.replicas} replicas would make the ListAndWatch message of {name} "
                f"{size} bytes; the kubelet receives at most {MAX_LIST_AND_WATCH_BYTES} "
                "(4 MiB): use fewer replicas or share fewer devices",
                f"{entry.field}.replicas",
            )


def _describe(devices: Sequence[Device]) -> str:
    if not devices:
        return "none discovered"
    return ", ".join(d.id if d.index is None else f"{d.id} (index {d.index})" for d in devices)


def _by_resource(physical: Sequence[Device]) -> dict[str, list[Device]]:
    groups: dict[str, list[Device]] = {}
    for d in physical:
        groups.setdefault(d.resource, []).append(d)
    return groups


def advertise(physical: Sequence[Device], config: SharingConfig) -> list[Device]:
    """The devices to advertise: replicas ``<id>::<n>`` where sharing applies.

    Replicas go under the shared name (see :meth:`SharingConfig.shared_name`)
    and copy every other field; devices not selected stay whole. Devices a
    selection names but discovery no longer finds are skipped, not an error
    (:func:`validate_sharing` checks at start-up).
    """
    if not config.enabled:
        return list(physical)
    shared: dict[int, tuple[int, str]] = {}  # id(device) -> (replicas, advertised name)
    for resource, group in _by_resource(physical).items():
        entry = config.entry_for(resource)
        if entry is not None:
            plan = (entry.replicas, config.shared_name(resource))
            shared.update((id(d), plan) for d in entry.devices.select(group))
    out: list[Device] = []
    for d in physical:
        how = shared.get(id(d))
        if how is None:
            out.append(d)
            continue
        replicas, name = how
        out.extend(_replica(d, n, name) for n in range(replicas))
    return out


def _replica(device: Device, n: int, resource: str) -> Device:
    """Replica ``n`` of ``device``: its record with another ID and resource.

    Copied field by field rather than through ``dataclasses.replace``: the record
    was validated when it was made, and a thousand replicas are rebuilt on every
    publish. The maps are shared with the physical record; records are never
    changed in place, only replaced.
    """
    replica = object.__new__(Device)
    replica.__dict__.update(device.__dict__)
    replica.__dict__["id"] = replica_id(device.id, n)
    replica.__dict__["resource"] = resource
    return replica


def advertised_resources(physical: Sequence[Device], config: SharingConfig) -> list[str]:
    """Resource names :func:`advertise` produces for ``physical``, first-seen order."""
    return list(dict.fromkeys(d.resource for d in advertise(physical, config)))
