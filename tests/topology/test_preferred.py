"""choose_preferred: properties against brute force, replica policies, bad input."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_dp import AllocationError, Device, Link
from hetero_dp.allocation.preferred import (
    choose_preferred,
    explain_preferred,
    link_scores,
    set_score,
)
from hetero_dp.allocation.sharing import (
    SharingConfig,
    advertise,
    parse_sharing,
    physical_id,
    to_physical,
)

RES = "example.com/accel"
LEVELS = [0, 1, 2, 10, 20, 40, 60, 100, 200, 300]  # 1 and 2: NUMA must never outweigh a point


def gpus(n: int, numa: list[int] | None = None) -> list[Device]:
    return [
        Device(f"dev-{i}", RES, index=i, numa_nodes=(numa[i],) if numa else ()) for i in range(n)
    ]


def both(pairs: dict[tuple[str, str], int]) -> dict[tuple[str, str], float]:
    return link_scores(Link(a, b, s) for (a, b), s in pairs.items())


@st.composite
def whole_requests(draw: st.DrawFn, max_n: int = 10):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, max_n))
    numa = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    devices = gpus(n, numa)
    pairs = {
        (devices[a].id, devices[b].id): draw(st.sampled_from(LEVELS))
        for a, b in itertools.combinations(range(n), 2)
    }
    size = draw(st.integers(1, n))
    must = draw(st.lists(st.sampled_from(devices), max_size=size, unique_by=lambda d: d.id))
    order = draw(st.permutations(devices))
    return list(order), must, size, both(pairs)


def numa_pairs(devices: list[Device]) -> int:
    return sum(
        1 for a, b in itertools.combinations(devices, 2) if set(a.numa_nodes) & set(b.numa_nodes)
    )


def brute_best(available, must, size, scores):  # type: ignore[no-untyped-def]
    """The best (link score, NUMA-sharing pairs) over every set, NUMA only breaking ties."""
    must_ids = {d.id for d in must}
    rest = [d for d in available if d.id not in must_ids]
    return max(
        (set_score([*must, *combo], scores), numa_pairs([*must, *combo]))
        for combo in itertools.combinations(rest, size - len(must))
    )


@given(whole_requests())
@settings(max_examples=300, deadline=None)
def test_whole_devices_answer_is_valid_and_optimal(request) -> None:  # type: ignore[no-untyped-def]
    available, must, size, scores = request
    ids = choose_preferred(available, must, size, scores)
    assert len(ids) == size
    assert len(set(ids)) == size
    assert set(ids) <= {d.id for d in available}
    assert {d.id for d in must} <= set(ids)
    by_id = {d.id: d for d in available}
    chosen = [by_id[i] for i in ids]
    got = (set_score(chosen, scores), numa_pairs(chosen))
    assert got == brute_best(available, must, size, scores)


@st.composite
def replica_requests(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 5))
    replicas = draw(st.integers(2, 4))
    config = parse_sharing({"timeSlicing": {"resources": [{"name": RES, "replicas": replicas}]}})
    advertised = advertise(gpus(n), config)
    available = draw(st.lists(st.sampled_from(advertised), min_size=1, unique_by=lambda d: d.id))
    size = draw(st.integers(1, len(available)))
    must = draw(st.lists(st.sampled_from(available), max_size=size, unique_by=lambda d: d.id))
    policy = draw(st.sampled_from(["distributed", "packed", "spread"]))
    return advertised, available, must, size, policy


@given(replica_requests(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_replica_answer_is_valid(request, pass_advertised: bool) -> None:  # type: ignore[no-untyped-def]
    advertised, available, must, size, policy = request
    ids = choose_preferred(
        available, must, size, {}, policy, advertised=advertised if pass_advertised else None
    )
    assert len(ids) == size and len(set(ids)) == size
    assert set(ids) <= {d.id for d in available}
    assert {d.id for d in must} <= set(ids)


@given(replica_requests())
@settings(max_examples=200, deadline=None)
def test_distributed_never_piles_onto_a_busier_device(request) -> None:  # type: ignore[no-untyped-def]
    # Each pick goes to a least-used device, so a device the answer used ends at most one
    # replica above any device that still had a free replica left unpicked.
    advertised, available, _must, size, _policy = request
    ids = choose_preferred(available, [], size, {}, "distributed", advertised=advertised)
    offered = {d.id for d in available}
    load = {}
    for d in advertised:
        p = physical_id(d.id)
        load[p] = load.get(p, 0) + (d.id not in offered or d.id in ids)
    picked = {physical_id(i) for i in ids}
    left = {physical_id(d.id) for d in available if d.id not in ids}
    for p in picked:
        for q in left:
            assert load[p] - 1 <= load[q], (p, q, load)


@given(
    st.lists(st.sampled_from(["a", "b", "c", "a::0", "a::1", "b::0"]), max_size=5),
    st.lists(st.sampled_from(["a", "b", "z", "a::0", "a::1"]), max_size=3),
    st.integers(-2, 7),
    st.sampled_from(["distributed", "packed", "spread", "bogus"]),
)
@settings(max_examples=300, deadline=None)
def test_any_input_gives_an_answer_or_allocation_error(
    avail: list[str], must: list[str], size: int, policy: str
) -> None:
    available = [Device(i, RES) for i in avail]
    must_devices = [Device(i, RES) for i in must]
    try:
        ids = choose_preferred(available, must_devices, size, {}, policy)
    except AllocationError as e:
        assert e.code == "INVALID_ARGUMENT"
        return
    assert len(ids) == size and set(must) <= set(ids) <= set(avail)


def test_dgx1_picks_the_nvlink_quad() -> None:
    devices = gpus(8, [0, 0, 0, 0, 1, 1, 1, 1])
    nv = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
          (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
          (5, 7): 1, (6, 7): 2}  # fmt: skip
    pairs = {}
    for a, b in itertools.combinations(range(8), 2):
        pairs[(devices[a].id, devices[b].id)] = 100 * nv.get((a, b), 0) or (
            20 if a // 4 == b // 4 else 10
        )
    scores = both(pairs)
    choice = explain_preferred(devices, [devices[5]], 4, scores)
    assert set(choice.ids) == {"dev-4", "dev-5", "dev-6", "dev-7"}
    assert choice.score == 900 and choice.exact and choice.mode == "topology"
    assert choose_preferred(devices, [devices[0]], 2, scores) in (
        ["dev-0", "dev-3"],
        ["dev-0", "dev-4"],
    )


def test_numa_breaks_ties_between_equal_scores() -> None:
    # No links at all: the engine keeps the pick on must_include's NUMA node.
    devices = gpus(6, [0, 0, 0, 1, 1, 1])
    assert choose_preferred(devices, [devices[4]], 3, {}) == ["dev-3", "dev-4", "dev-5"]
    # Equal links everywhere: still NUMA, then order.
    flat = both({(a.id, b.id): 50 for a, b in itertools.combinations(devices, 2)})
    assert choose_preferred(devices, [devices[5]], 2, flat) == ["dev-3", "dev-5"]


def test_numa_never_outweighs_a_link_point() -> None:
    devices = gpus(3, [0, 0, 1])
    scores = both({("dev-0", "dev-2"): 11, ("dev-0", "dev-1"): 10})
    assert choose_preferred(devices, [devices[0]], 2, scores) == ["dev-0", "dev-2"]


def test_mig_slices_group_by_parent_and_spread() -> None:
    slices = [
        Device(f"MIG-{g}-{s}", "nvidia.com/mig-1g.5gb", parent=f"GPU-{g}")
        for g in range(2)
        for s in range(3)
    ]
    ids = choose_preferred(slices, [], 2, {})
    assert sorted(to_physical_parent(ids, slices)) == ["GPU-0", "GPU-1"]
    packed = choose_preferred(slices, [], 2, {}, "packed")
    assert to_physical_parent(packed, slices) == ["GPU-0", "GPU-0"]


def to_physical_parent(ids: list[str], devices: list[Device]) -> list[str]:
    parent = {d.id: d.parent for d in devices}
    return [parent[i] or i for i in ids]


def replicated(n: int, replicas: int) -> list[Device]:
    config = parse_sharing({"timeSlicing": {"resources": [{"name": RES, "replicas": replicas}]}})
    return advertise(gpus(n), config)


def test_distributed_takes_least_used_devices_first() -> None:
    advertised = replicated(3, 4)
    # dev-0 has two replicas in use, dev-1 one, dev-2 none.
    in_use = {"dev-0::0", "dev-0::1", "dev-1::0"}
    available = [d for d in advertised if d.id not in in_use]
    ids = choose_preferred(available, [], 3, {}, advertised=advertised)
    assert to_physical(ids) == ["dev-2", "dev-1"] and len(ids) == 3
    assert [i.split("::")[0] for i in ids] == ["dev-2", "dev-1", "dev-2"]
    # Without the advertised list the count is inferred from replica numbers: same answer.
    assert choose_preferred(available, [], 3, {}) == ids


def test_distributed_spreads_a_fresh_request_over_devices() -> None:
    ids = choose_preferred(replicated(4, 8), [], 4, {})
    assert to_physical(ids) == ["dev-0", "dev-1", "dev-2", "dev-3"]


def test_packed_fills_the_most_used_device() -> None:
    advertised = replicated(3, 4)
    available = [d for d in advertised if d.id != "dev-1::0"]
    ids = choose_preferred(available, [], 3, {}, "packed", advertised=advertised)
    assert ids == ["dev-1::1", "dev-1::2", "dev-1::3"]
    # A full device is skipped; packing continues on the next.
    ids = choose_preferred(available, [], 5, {}, "packed", advertised=advertised)
    assert to_physical(ids) == ["dev-1", "dev-0"] and len(ids) == 5


def test_spread_prefers_devices_the_request_does_not_hold() -> None:
    advertised = replicated(2, 4)
    available = [d for d in advertised if d.id not in {"dev-1::0", "dev-1::1", "dev-1::2"}]
    must = [next(d for d in available if d.id == "dev-0::0")]
    assert choose_preferred(available, must, 2, {}, "spread", advertised=advertised) == [
        "dev-0::0",
        "dev-1::3",
    ]
    # distributed would rather stay on the less used device.
    assert choose_preferred(available, must, 2, {}, advertised=advertised) == [
        "dev-0::0",
        "dev-0::1",
    ]


def test_replica_ties_go_to_linked_devices() -> None:
    advertised = replicated(4, 2)
    scores = both({("dev-0", "dev-3"): 200, ("dev-0", "dev-1"): 10})
    must = [advertised[0]]  # dev-0::0
    ids = choose_preferred(advertised, must, 2, scores, "spread")
    assert ids == ["dev-0::0", "dev-3::0"]


def test_unshared_whole_devices_mix_with_replicas() -> None:
    config = parse_sharing(
        {"timeSlicing": {"resources": [{"name": RES, "replicas": 2, "devices": [0]}]}}
    )
    advertised = advertise(gpus(2), config)
    assert [d.id for d in advertised] == ["dev-0::0", "dev-0::1", "dev-1"]
    ids = choose_preferred(advertised, [], 2, {}, advertised=advertised)
    assert sorted(to_physical(ids)) == ["dev-0", "dev-1"]


@pytest.mark.parametrize(
    ("avail", "must", "size", "needle"),
    [
        (["a", "b"], [], 3, "allocation_size 3 exceeds the 2 available devices: a, b"),
        (["a", "b"], ["a", "b"], 1, "smaller than the 2 must_include devices: a, b"),
        (["a", "b"], [], 0, "allocation_size 0 must be positive"),
        (["a", "b"], [], -1, "allocation_size -1 must be positive"),
        (["a", "b"], ["c"], 2, "must_include devices not in available: c"),
        (["a", "a", "b"], [], 2, "available device IDs repeat: a"),
        (["a", "b"], ["a", "a"], 2, "must_include device IDs repeat: a"),
    ],
)
def test_bad_requests_name_the_ids(
    avail: list[str], must: list[str], size: int, needle: str
) -> None:
    with pytest.raises(AllocationError) as err:
        choose_preferred([Device(i, RES) for i in avail], [Device(i, RES) for i in must], size)
    assert err.value.code == "INVALID_ARGUMENT"
    assert needle in str(err.value)


def test_unknown_ids_are_refused_when_the_advertised_set_is_known() -> None:
    advertised = gpus(2)
    with pytest.raises(AllocationError, match="unknown device IDs: ghost"):
        choose_preferred([*advertised, Device("ghost", RES)], [], 1, advertised=advertised)


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(AllocationError, match="unknown replica policy 'tight'"):
        choose_preferred(gpus(2), [], 1, policy="tight")


def test_link_scores_fill_both_orders_and_keep_the_best_duplicate() -> None:
    scores = link_scores([Link("a", "b", 100, "NV1"), Link("b", "a", 60, "PIX"), Link("a", "a", 5)])
    assert scores == {("a", "b"): 100, ("b", "a"): 100}


def test_default_sharing_config_shares_nothing() -> None:
    devices = gpus(3)
    assert advertise(devices, SharingConfig()) == devices


def test_many_whole_devices_stay_on_the_must_include_numa_node() -> None:
    # 400 candidates (far above the exact limit), NUMA only: the heuristic keeps the set
    # on the node of must_include.
    devices = gpus(400, [i % 4 for i in range(400)])
    ids = choose_preferred(devices, [devices[6]], 20, {})
    assert len(ids) == 20 and "dev-6" in ids
    assert all(int(i.split("-")[1]) % 4 == 2 for i in ids)
