"""GetPreferredAllocation for every backend: topology for whole devices, policies for replicas.

Whole devices
    The set of ``size`` devices that contains ``must_include`` and maximises the
    total pair score from the backend's :func:`~hetero_dp.hookspecs.links`
    (exact up to 16 candidates, see :mod:`hetero_dp.allocation.topology`). NUMA locality
    breaks ties: among sets with the same score, the one with the most pairs
    sharing a NUMA node wins; then the earlier devices in ``available``.
Replicas and slices
    When a candidate is a replica (``<id>::<n>``) or a slice of a parent device
    (MIG), candidates are grouped by physical device and chosen one at a time by
    the replica policy: ``distributed`` (default: the physical device with the
    fewest replicas in use), ``packed`` (the most in use, so devices fill up) or
    ``spread`` (the fewest picked by this request, so it spans devices). Ties go
    to the device best linked to the request's other devices, then NUMA, then
    the order in ``available``.

Bad input (a size out of range, IDs repeated, ``must_include`` outside
``available``, IDs the resource does not advertise) raises AllocationError,
which the servicer turns into INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hetero_dp.allocation import topology
from hetero_dp.allocation.sharing import (
    DEFAULT_REPLICA_POLICY,
    REPLICA_POLICIES,
    is_replica,
    physical_id,
    replica_number,
)
from hetero_dp.model.device import Device, Link
from hetero_dp.model.errors import AllocationError

Scores = Mapping[tuple[str, str], float]


@dataclass(frozen=True)
class Choice:
    """What the engine chose and why (``hetero-dp topo`` prints it).

    ``score`` is the total link score over the pairs of distinct physical
    devices in the set; ``exact`` says whether the set is proven best (always
    true up to 16 whole-device candidates); ``mode`` is ``topology`` or the
    replica policy used.
    """

    ids: tuple[str, ...]
    score: float
    exact: bool
    mode: str


def link_scores(links: Iterable[Link]) -> dict[tuple[str, str], float]:
    """The ``links`` hook's answer as a pair map with both orders present.

    A pair reported twice (once per direction, say) keeps its best score:
    summing would double count.
    """
    scores: dict[tuple[str, str], float] = {}
    for link in links:
        if link.a == link.b:
            continue
        for key in ((link.a, link.b), (link.b, link.a)):
            if key not in scores or link.score > scores[key]:
                scores[key] = link.score
    return scores


def scoring_id(device: Device) -> str:
    """The physical device whose links score ``device``: the parent of a slice,
    the device behind a replica."""
    return device.parent or physical_id(device.id)


def choose_preferred(
    available: Sequence[Device],
    must_include: Sequence[Device],
    size: int,
    links: Scores | None = None,
    policy: str = DEFAULT_REPLICA_POLICY,
    *,
    advertised: Sequence[Device] | None = None,
) -> list[str]:
    """Pick ``size`` IDs from ``available`` that contain ``must_include``.

    ``links`` maps pairs of *physical* device IDs (both orders present) to a
    higher-is-better score. ``advertised`` (optional) is every device the
    resource advertises now: with it, replicas in use are counted exactly and
    unknown IDs are refused; without it, the replica count per device is taken
    as the highest replica number seen plus one. Raises AllocationError
    (INVALID_ARGUMENT) for bad input; see the module doc for the rules.
    """
    return list(explain_preferred(available, must_include, size, links, policy, advertised).ids)


def explain_preferred(
    available: Sequence[Device],
    must_include: Sequence[Device],
    size: int,
    links: Scores | None = None,
    policy: str = DEFAULT_REPLICA_POLICY,
    advertised: Sequence[Device] | None = None,
) -> Choice:
    """Like :func:`choose_preferred`, but says the score and how the set was found."""
    _validate(available, must_include, size, policy, advertised)
    scores = links or {}
    if any(is_replica(d.id) or d.parent for d in available):
        return _choose_replicas(available, must_include, size, scores, policy, advertised)
    return _choose_whole(available, must_include, size, scores)


_LISTED = 16  # IDs named in one message; a thousand replicas would drown the point


def _ids(devices: Iterable[Device | str]) -> str:
    ids = [d if isinstance(d, str) else d.id for d in devices]
    more = f" (and {len(ids) - _LISTED} more)" if len(ids) > _LISTED else ""
    return ", ".join(ids[:_LISTED]) + more


def _validate(
    available: Sequence[Device],
    must_include: Sequence[Device],
    size: int,
    policy: str,
    advertised: Sequence[Device] | None,
) -> None:
    if policy not in REPLICA_POLICIES:
        raise AllocationError(
            f"unknown replica policy {policy!r}; use one of {', '.join(REPLICA_POLICIES)}"
        )
    for what, devices in (("available", available), ("must_include", must_include)):
        counts: dict[str, int] = {}
        for d in devices:
            counts[d.id] = counts.get(d.id, 0) + 1
        repeated = [i for i, c in counts.items() if c > 1]
        if repeated:
            raise AllocationError(f"{what} device IDs repeat: {_ids(repeated)}")
    if advertised is not None:
        known = {d.id for d in advertised}
        unknown = [d.id for d in [*available, *must_include] if d.id not in known]
        if unknown:
            raise AllocationError(f"unknown device IDs: {_ids(dict.fromkeys(unknown))}")
    have = {d.id for d in available}
    outside = [d for d in must_include if d.id not in have]
    if outside:
        raise AllocationError(f"must_include devices not in available: {_ids(outside)}")
    if size <= 0:
        raise AllocationError(f"allocation_size {size} must be positive")
    if size > len(available):
        raise AllocationError(
            f"allocation_size {size} exceeds the {len(available)} available devices: "
            f"{_ids(available)}"
        )
    if size < len(must_include):
        raise AllocationError(
            f"allocation_size {size} is smaller than the {len(must_include)} must_include "
            f"devices: {_ids(must_include)}"
        )


def _numa_share(a: Device, b: Device) -> bool:
    return bool(set(a.numa_nodes) & set(b.numa_nodes))


def pair_score(scores: Scores, a: Device, b: Device) -> float:
    """The link score between two devices' physical devices (0 for the same one)."""
    pa, pb = scoring_id(a), scoring_id(b)
    return 0 if pa == pb else scores.get((pa, pb), 0)


def set_score(devices: Sequence[Device], scores: Scores) -> float:
    """Total link score over the pairs of distinct physical devices in ``devices``."""
    keys = list(dict.fromkeys(scoring_id(d) for d in devices))
    if len(scores) <= len(keys) * len(keys):
        # Fewer links than pairs: walk the links (each unordered pair once).
        inside = set(keys)
        pairs: dict[tuple[str, str], float] = {}
        for (a, b), score in scores.items():
            if a != b and a in inside and b in inside:
                pairs[(a, b) if a < b else (b, a)] = score
        return sum(pairs.values())
    return sum(
        scores.get((a, b), scores.get((b, a), 0)) for i, a in enumerate(keys) for b in keys[i + 1 :]
    )


def _choose_whole(
    available: Sequence[Device], must_include: Sequence[Device], size: int, scores: Scores
) -> Choice:
    n = len(available)
    # NUMA sharing enters as a second digit below every link score: the weight of a
    # pair is score * tie + shared, and the whole set has fewer than `tie` pairs, so
    # NUMA never outweighs a link point but decides between equal scores.
    tie = n * n + 1
    weights = _pair_weights(available, scores, tie)
    position = {d.id: i for i, d in enumerate(available)}
    required = [position[d.id] for d in must_include]
    solution = topology.solve(weights, size, required)
    chosen = [available[i] for i in solution.members]
    return Choice(
        tuple(d.id for d in chosen), set_score(chosen, scores), solution.exact, "topology"
    )


def _pair_weights(available: Sequence[Device], scores: Scores, tie: int) -> list[list[float]]:
    """``score * tie + shares-a-NUMA-node`` for every pair, diagonal 0.

    Filled from the link map and the NUMA groups rather than pair by pair, so a
    thousand candidates cost milliseconds, not seconds.
    """
    n = len(available)
    weights = [[0.0] * n for _ in range(n)]
    at: dict[str, list[int]] = {}
    for i, d in enumerate(available):
        at.setdefault(scoring_id(d), []).append(i)
    if len(scores) < n * n:
        for (a, b), score in scores.items():
            if a != b and a in at and b in at:
                # Both orders, so a map holding only one of them still gives a symmetric matrix.
                for i in at[a]:
                    for j in at[b]:
                        weights[i][j] = weights[j][i] = score * tie
    else:
        keys = [scoring_id(d) for d in available]
        for i in range(n):
            row = weights[i]
            for j in range(n):
                if keys[i] != keys[j]:
                    row[j] = scores.get((keys[i], keys[j]), 0) * tie
    by_node: dict[int, list[int]] = {}
    for i, d in enumerate(available):
        for node in d.numa_nodes:
            by_node.setdefault(node, []).append(i)
    shares = [set[int]() for _ in range(n)]
    for members in by_node.values():
        for i in members:
            shares[i].update(members)
    for i in range(n):
        row = weights[i]
        for j in shares[i]:
            if j != i:
                row[j] += 1
    return weights


class _Group:
    """One physical device's candidates during a replica pick."""

    __slots__ = ("affinity", "candidates", "key", "load", "order", "taken", "template")

    def __init__(self, key: str, order: int, template: Device) -> None:
        self.key = key
        self.order = order
        self.template = template
        self.candidates: list[Device] = []
        self.load = 0  # replicas in use: allocated before plus taken by this request
        self.taken = 0  # taken by this request (must_include included)
        self.affinity = 0.0  # link score and NUMA towards the request's devices


def _choose_replicas(
    available: Sequence[Device],
    must_include: Sequence[Device],
    size: int,
    scores: Scores,
    policy: str,
    advertised: Sequence[Device] | None,
) -> Choice:
    groups: dict[str, _Group] = {}
    for d in available:
        key = _group_key(d)
        if key not in groups:
            groups[key] = _Group(key, len(groups), d)
        groups[key].candidates.append(d)
    in_use = _in_use(available, advertised, groups)
    for key, group in groups.items():
        group.load = in_use.get(key, 0)

    must = {d.id for d in must_include}
    chosen: list[Device] = list(must_include)
    touched: list[_Group] = []

    def take(group: _Group) -> None:
        group.taken += 1
        group.load += 1
        if group.taken == 1:
            touched.append(group)
            for other in groups.values():
                if other is not group:
                    other.affinity += _affinity(scores, group.template, other.template)

    for d in must_include:
        take(groups[_group_key(d)])
    for group in groups.values():
        group.candidates = sorted(
            (d for d in group.candidates if d.id not in must),
            key=lambda d: replica_number(d.id),
            reverse=True,  # popped from the end: lowest replica number first
        )
    open_groups = [g for g in groups.values() if g.candidates]
    rank = _RANKS[policy]
    for _ in range(size - len(chosen)):
        best = min(open_groups, key=rank)
        chosen.append(best.candidates.pop())
        take(best)
        if not best.candidates:
            open_groups.remove(best)
    return Choice(tuple(d.id for d in chosen), set_score(chosen, scores), True, policy)


def _group_key(device: Device) -> str:
    # Replicas group by the device they replicate; slices by their parent.
    return device.parent or physical_id(device.id)


def _affinity(scores: Scores, a: Device, b: Device) -> float:
    # Link score first; NUMA only as a fraction below one link point.
    return pair_score(scores, a, b) + (0.5 if _numa_share(a, b) else 0.0)


def _in_use(
    available: Sequence[Device], advertised: Sequence[Device] | None, groups: Mapping[str, _Group]
) -> dict[str, int]:
    """Replicas (or slices) of each physical device that are allocated already."""
    free: dict[str, int] = {key: len(g.candidates) for key, g in groups.items()}
    total: dict[str, int] = {}
    if advertised is not None:
        for d in advertised:
            key = _group_key(d)
            total[key] = total.get(key, 0) + 1
    else:
        # Every replica of a resource has the same count, so the highest replica
        # number seen is a fair estimate of it; slices are counted as seen.
        numbers = [replica_number(d.id) for d in available if is_replica(d.id)]
        per_device = max(numbers) + 1 if numbers else 0
        for key, group in groups.items():
            replicas = sum(1 for d in group.candidates if is_replica(d.id))
            total[key] = free[key] - replicas + max(per_device, replicas)
    return {key: max(total.get(key, 0) - free[key], 0) for key in groups}


def _rank_distributed(g: _Group) -> tuple[float, ...]:
    return (g.load, g.taken, -g.affinity, g.order)


def _rank_packed(g: _Group) -> tuple[float, ...]:
    # Among equally used devices, the one this request already holds: a pod stays together.
    return (-g.load, -g.taken, -g.affinity, g.order)


def _rank_spread(g: _Group) -> tuple[float, ...]:
    return (g.taken, g.load, -g.affinity, g.order)


_RANKS = {"distributed": _rank_distributed, "packed": _rank_packed, "spread": _rank_spread}
