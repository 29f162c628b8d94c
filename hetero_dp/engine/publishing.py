"""What a publish of one backend's devices sends where: the plan per physical
resource (its devices, and what each advertised name gets after sharing), and the
health transitions it logs and emits."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from hetero_dp.allocation.sharing import SharingConfig, advertise
from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.kits import observe
from hetero_dp.model.device import Device
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import device_id_problem, resource_name_problem
from hetero_dp.model.wire import MAX_LIST_AND_WATCH_BYTES, list_and_watch_size

log = logging.getLogger("hetero_dp.engine.daemon")  # transitions read as the daemon's

LISTED = 8  # bad IDs named in one log line

# physical resource -> (its devices by ID, advertised name -> the devices it advertises)
Plan = dict[str, tuple[dict[str, Device], dict[str, list[Device]]]]


def check_names(
    discovered: Mapping[str, Iterable[Device]], sharing: SharingConfig
) -> dict[str, str]:
    """The start-up check of what backends discovered, the same for ``hetero-dp run``,
    ``list`` and ``topo``: a resource name the kubelet would refuse costs only its own
    devices (logged, one line per name); ConfigError when such names leave nothing to
    serve (the first one raised, not also logged); then the sharing config is checked
    against the devices that remain.

    ``discovered``: backend name -> its devices. Returns refused device ID -> why."""
    refused: list[ConfigError] = []
    physical: list[Device] = []
    reasons: dict[str, str] = {}
    for backend, devices in discovered.items():
        bad: dict[str, str] = {}
        for d in devices:
            problem = resource_name_problem(d.resource)
            if problem is None:
                physical.append(d)
                continue
            reasons[d.id] = problem
            bad.setdefault(d.resource, f"device {d.id!r}: {problem}")
        refused += [
            ConfigError(r, field="resource", source=f"backend {backend}") for r in bad.values()
        ]
    if refused and not physical:
        # Nothing left to serve: the error says it once (the others, if any, logged).
        for e in refused[1:]:
            log.error("refused: %s", e)
        raise refused[0]
    for e in refused:
        log.error("refused: %s; the other resources are served", e)
    check = getattr(sharing, "validate_devices", None)
    if check is not None:
        check(physical)
    return reasons


def plan(
    rt: BackendRuntime, effective: list[Device], sharing: SharingConfig
) -> tuple[Plan, list[Device]]:
    """Per physical resource: its devices by ID and what each advertised name gets;
    and the devices left out for an invalid resource name."""
    by_resource: dict[str, list[Device]] = {}
    invalid = []
    bad_ids: list[str] = []
    for d in effective:
        problem = device_id_problem(d.id)
        if problem:
            bad_ids.append(f"{d.id!r}: {problem}")
        elif resource_name_problem(d.resource):
            invalid.append(d)
        else:
            by_resource.setdefault(d.resource, []).append(d)
    for phys in set(rt.resources) - set(by_resource):
        by_resource[phys] = []
    out: Plan = {}
    for phys, devices in by_resource.items():
        grouped: dict[str, list[Device]] = {}
        for d in advertise(devices, sharing):
            grouped.setdefault(d.resource, []).append(d)
        out[phys] = ({d.id: d for d in devices}, grouped)
    if bad_ids:
        log.error(
            "backend %r: %d devices left out for IDs the kubelet cannot take: %s",
            rt.backend.name,
            len(bad_ids),
            "; ".join(bad_ids[:LISTED]) + ("; ..." if len(bad_ids) > LISTED else ""),
            extra={"backend": rt.backend.name},
        )
    return out, invalid


def log_transitions(rt: BackendRuntime, effective: Iterable[Device]) -> None:
    """Log and emit each device whose health differs from what was published last, and
    say why of each device first advertised Unhealthy (refused by the container gate,
    its CDI entry not written, a first health check that failed, a backend that
    discovered it so): one line per reason, naming the devices, so an operator who sees
    fewer allocatable devices has a line to grep."""
    born_unhealthy: dict[str, list[Device]] = {}
    for d in effective:
        old = rt.published.get(d.id)
        if old is None and not d.healthy:
            born_unhealthy.setdefault(str(d.reason), []).append(d)
        if old is not None and old.healthy != d.healthy:
            level = logging.INFO if d.healthy else logging.WARNING
            log.log(
                level,
                "device %s is now %s%s",
                d.id,
                d.health,
                f": {d.reason}" if d.reason else "",
                extra={"resource": d.resource, "device": d.id, "reason": d.reason},
            )
            observe.emit(
                "health_transition",
                resource=d.resource,
                device=d.id,
                healthy=d.healthy,
                reason=d.reason,
            )
    for reason, devices in born_unhealthy.items():
        ids = [d.id for d in devices]
        log.warning(
            "%s %s advertised Unhealthy: %s",
            "device" if len(ids) == 1 else f"{len(ids)} devices",
            ", ".join(ids[:LISTED]) + (", ..." if len(ids) > LISTED else ""),
            reason or "no reason given",
            extra={"resource": devices[0].resource, "device": ids[0], "reason": reason},
        )


def oversized(grouped: Mapping[str, Sequence[Device]]) -> dict[str, int]:
    """Advertised names whose ListAndWatch message would pass the kubelet's 4 MiB
    receive limit (counted with every device Unhealthy), with the size it would be."""
    sizes = {name: list_and_watch_size(devices) for name, devices in grouped.items()}
    return {name: size for name, size in sizes.items() if size > MAX_LIST_AND_WATCH_BYTES}


def too_large(name: str, devices: Sequence[Device], size: int) -> str:
    """What an oversized advertised name is told, naming its size and the fix."""
    longest = max((len(d.id.encode()) for d in devices), default=0)
    return (
        f"{len(devices)} devices with IDs of up to {longest} bytes would make the "
        f"ListAndWatch message of {name} {size} bytes; the kubelet receives at most "
        f"{MAX_LIST_AND_WATCH_BYTES} (4 MiB): advertise fewer devices or shorter IDs"
    )


class OversizeHold:
    """Advertised names whose device set would pass the kubelet's 4 MiB limit:
    ConfigError at start-up; afterwards (a rediscovery or a reload that grew the set)
    the names keep the devices advertised before, and the log says why."""

    def __init__(self) -> None:
        self.held: set[str] = set()  # names whose device set grew past the limit

    def check(
        self,
        rt: BackendRuntime,
        grouped: dict[str, list[Device]],
        ids_changed: bool,
        started: bool,
    ) -> set[str]:
        """The names held now. Counted only when the IDs changed or a name is held: a
        health change keeps the size."""
        if not (ids_changed or self.held & grouped.keys()):
            return set()
        big = oversized(grouped)
        for name, size in big.items():
            reason = too_large(name, grouped[name], size)
            if not started:
                raise ConfigError(reason, field="devices", source=f"backend {rt.backend.name}")
            if ids_changed:
                log.error(
                    "%s; keeping the devices advertised before",
                    reason,
                    extra={"resource": name, "backend": rt.backend.name},
                )
        self.held = (self.held - grouped.keys()) | big.keys()
        return set(big)
