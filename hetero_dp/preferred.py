"""Default GetPreferredAllocation: the seam the topology engine plugs into.

PLACEHOLDER on main until the topology branch lands (it owns this file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .device import Device
from .errors import AllocationError


def choose_preferred(
    available: Sequence[Device],
    must_include: Sequence[Device],
    size: int,
    links: Mapping[tuple[str, str], int] | None = None,
    policy: str = "distributed",
) -> list[str]:
    """Pick ``size`` IDs from ``available`` that contain ``must_include``.

    ``links`` maps pairs of *physical* device IDs (both orders present) to a
    higher-is-better score. Raises AllocationError (INVALID_ARGUMENT) for a
    size out of range or a must_include ID outside available.
    """
    ids = [d.id for d in available]
    missing = [d.id for d in must_include if d.id not in ids]
    if missing:
        raise AllocationError(f"must_include devices not in available: {', '.join(missing)}")
    if size > len(ids) or size < len(must_include) or size <= 0:
        raise AllocationError(
            f"allocation_size {size} cannot be met from {len(ids)} available devices "
            f"with {len(must_include)} required"
        )
    chosen = [d.id for d in must_include]
    numa = {n for d in must_include for n in d.numa_nodes}
    rest = sorted(
        (d for d in available if d.id not in chosen),
        key=lambda d: (not (set(d.numa_nodes) & numa) if numa else False, ids.index(d.id)),
    )
    for d in rest[: size - len(chosen)]:
        chosen.append(d.id)
    return chosen
