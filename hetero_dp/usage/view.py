"""The join: who holds each device, and which container each process belongs to.

Pure functions over what the other modules read. For a process: its host PID ->
the pod UID in its cgroup (:mod:`.cgroups`) -> the containers of that pod in the
kubelet's checkpoint (:mod:`.checkpoint`) holding the device the process uses ->
the pod's name and namespace from the pod-resources ``List``
(:mod:`.podresources`), which has no UID, so the checkpoint's entries and the list's
are joined on (resource, device IDs, container name). Where the process's pod has two
containers holding the same device, the kubelet's log link naming the process's
container ID (:mod:`.containerlogs`) says which; without one, and where the chain
cannot name the pod or container, the process is attributed to no one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hetero_dp.model.device import Device, replica_base
from hetero_dp.model.usage import ProcessUsage
from hetero_dp.usage.cgroups import ContainerRef
from hetero_dp.usage.checkpoint import Entry
from hetero_dp.usage.podresources import ContainerDevices

MIB = 1024 * 1024
#: Where a device record says its memory, in MiB (the DRA slices read the same keys).
MEMORY_KEYS = ("memoryMiB", "memory")


@dataclass(frozen=True)
class Owner:
    """A container, as an operator names it."""

    pod: str
    namespace: str
    container: str


@dataclass(frozen=True)
class Holder:
    """One advertised device a container holds."""

    resource: str
    device: str  # the ID as advertised (a replica's, on a shared device)
    owner: Owner


@dataclass(frozen=True)
class ClaimHolder:
    """DRA: one device of a claim this node prepared, and one pod it is reserved for
    (``pod`` empty when none was listed)."""

    driver: str
    pool: str
    device: str
    namespace: str
    claim: str
    pod: str


@dataclass
class ContainerUse:
    """What one container's processes use of one device (the backend's device ID)."""

    resource: str
    device: str  # the first (sorted) ID the container holds of it
    owner: Owner
    physical: str
    held: int  # how many of the device's replicas the container holds
    memory_bytes: int | None = None
    utilization: float | None = None
    fair_share_bytes: int | None = None
    pids: list[int] = field(default_factory=list)


class Inventory:
    """The devices a daemon advertises: per resource, advertised ID -> its record.
    Per record ID, how many advertised IDs stand for it (2 or more: shared) and its
    memory in bytes where the record says it, worked out once."""

    def __init__(self, records: Mapping[str, Mapping[str, Device]]) -> None:
        self.records = records
        self.replicas: dict[str, int] = {}
        self.memory: dict[tuple[str, str], int] = {}
        for resource, ids in records.items():
            for advertised, record in ids.items():
                base = replica_base(advertised)
                self.replicas[base] = self.replicas.get(base, 0) + 1
                if (resource, base) not in self.memory:
                    memory = _memory_bytes(record)
                    if memory is not None:
                        self.memory[(resource, base)] = memory


def _memory_bytes(record: Device) -> int | None:
    for key in MEMORY_KEYS:
        v = record.attributes.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return int(v * MIB)
    return None


@dataclass
class View:
    """Everything attribution knows after one refresh."""

    holders: list[Holder] = field(default_factory=list)
    uses: list[ContainerUse] = field(default_factory=list)
    #: record ID -> the one container holding that device whole (every replica of it)
    sole: dict[str, Owner] = field(default_factory=dict)
    #: pid -> its container, for the processes the backends named
    by_pid: dict[int, Owner] = field(default_factory=dict)
    unattributed: int = 0  # processes attributed to no one


@dataclass
class Pod:
    owner_of: dict[str, Owner] = field(default_factory=dict)  # container -> owner
    #: record ID -> (owner, resource, the advertised IDs of it held) per container
    by_device: dict[str, list[tuple[Owner, str, tuple[str, ...]]]] = field(default_factory=dict)


def pods_by_uid(listed: Iterable[ContainerDevices], entries: Iterable[Entry]) -> dict[str, Pod]:
    """The pods of ``listed`` by UID: the checkpoint's entry with the same resource,
    device IDs and container name gives each its UID (listed items without one
    are left out)."""
    uid_of: dict[tuple[str, frozenset[str], str], str | None] = {}
    for e in entries:
        key = (e.resource, frozenset(e.device_ids), e.container)
        uid_of[key] = None if key in uid_of and uid_of[key] != e.pod_uid else e.pod_uid
    pods: dict[str, Pod] = {}
    for c in listed:
        uid = uid_of.get((c.resource, frozenset(c.device_ids), c.container))
        if uid is None:
            continue
        pod = pods.setdefault(uid, Pod())
        owner = pod.owner_of[c.container] = Owner(c.pod, c.namespace, c.container)
        held: dict[str, list[str]] = {}
        for i in c.device_ids:
            held.setdefault(replica_base(i), []).append(i)
        for base, ids in held.items():
            pod.by_device.setdefault(base, []).append((owner, c.resource, tuple(sorted(ids))))
    return pods


def build(
    inventory: Inventory,
    listed: Iterable[ContainerDevices],
    entries: Iterable[Entry],
    usages: Iterable[ProcessUsage],
    refs: Mapping[int, ContainerRef | None],
    names: Mapping[str, Owner] | None = None,
) -> View:
    """The view from one refresh's readings (``refs``: each PID's cgroup, None where
    it names no container or the process vanished; ``names``: container ID -> its
    container, where the kubelet's log links say it)."""
    ours = [c for c in listed if c.resource in inventory.records]
    view = View()
    replicas = inventory.replicas
    holders_of: dict[str, list[Owner]] = {}
    for c in ours:
        owner = Owner(c.pod, c.namespace, c.container)
        for device in c.device_ids:
            view.holders.append(Holder(c.resource, device, owner))
            holders_of.setdefault(replica_base(device), []).append(owner)
    for physical, owners in holders_of.items():
        # whole: every advertised ID of the device held, all by the same container
        if len(owners) == replicas.get(physical, 1) and len(set(owners)) == 1:
            view.sole[physical] = owners[0]
    pods = pods_by_uid(ours, entries)
    uses: dict[tuple[Owner, str, str], ContainerUse] = {}
    for u in usages:
        found = _container_of(pods, refs.get(u.pid), u.device, names)
        if found is None:
            view.unattributed += 1
            continue
        owner, resource, ids = found
        use = uses.get((owner, resource, u.device))
        if use is None:
            use = uses[(owner, resource, u.device)] = ContainerUse(
                resource, min(ids), owner, u.device, len(ids)
            )
        use.pids.append(u.pid)
        if u.memory_bytes is not None:
            use.memory_bytes = (use.memory_bytes or 0) + u.memory_bytes
        if u.utilization is not None:
            use.utilization = min(1.0, (use.utilization or 0.0) + u.utilization)
        view.by_pid[u.pid] = owner
    for use in uses.values():
        n = replicas.get(use.physical, 1)
        memory = inventory.memory.get((use.resource, use.physical)) if n > 1 else None
        if memory is not None:
            use.fair_share_bytes = memory * use.held // n
    view.uses = sorted(uses.values(), key=lambda x: (x.resource, x.device, x.owner.pod))
    return view


def _container_of(
    pods: Mapping[str, Pod],
    ref: ContainerRef | None,
    device: str,
    names: Mapping[str, Owner] | None = None,
) -> tuple[Owner, str, tuple[str, ...]] | None:
    """The container of ``ref``'s pod holding ``device`` (a record ID): its owner,
    resource and the advertised IDs of that device it holds. The only one, or, where
    several of the pod's containers hold it, the one ``names`` gives for the
    process's container ID."""
    pod = pods.get(ref.pod_uid) if ref is not None else None
    found = pod.by_device.get(device, []) if pod is not None else []
    if len(found) == 1:
        return found[0]
    named = (names or {}).get(ref.container_id) if ref is not None else None
    if named is None:
        return None
    same = [f for f in found if f[0] == named]
    return same[0] if len(same) == 1 else None


def owner_of_pid(
    view: View,
    pods: Mapping[str, Pod],
    pid: int,
    ref: ContainerRef | None,
    device: str,
    names: Mapping[str, Owner] | None = None,
) -> Owner | None:
    """A process's container for a sample that names it (and maybe its device):
    the usage hook's answer first, else the pod's container holding the device, else
    the pod's only container holding any of our devices."""
    if pid in view.by_pid:
        return view.by_pid[pid]
    if device:
        found = _container_of(pods, ref, device, names)
        return found[0] if found else None
    pod = pods.get(ref.pod_uid) if ref is not None else None
    if pod is None:
        return None
    if len(pod.owner_of) == 1:
        return next(iter(pod.owner_of.values()))
    named = (names or {}).get(ref.container_id) if ref is not None else None
    return named if named in pod.owner_of.values() else None
