"""The exact solver against brute force, and the heuristic's guarantees."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_dp.allocation import topology
from hetero_dp.allocation.topology import brute_force, solve, subset_score

# Scores as backends give them: NVIDIA's PCIe ladder and NVLink multiples, plus zeros.
LEVELS = [0, 10, 20, 30, 40, 50, 60, 100, 200, 300, 400]


@st.composite
def problems(draw: st.DrawFn, max_n: int = 10) -> tuple[list[list[int]], int, list[int]]:
    n = draw(st.integers(1, max_n))
    weights = [[0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            weights[a][b] = weights[b][a] = draw(st.sampled_from(LEVELS))
    size = draw(st.integers(1, n))
    required = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=size))
    return weights, size, required


@given(problems())
@settings(max_examples=400, deadline=None)
def test_exact_matches_brute_force_up_to_10(
    problem: tuple[list[list[int]], int, list[int]],
) -> None:
    weights, size, required = problem
    got = solve(weights, size, required)
    best = brute_force(weights, size, required)
    assert len(got.members) == size
    assert len(set(got.members)) == size
    assert set(required) <= set(got.members)
    assert got.exact
    assert got.score == best.score
    assert subset_score(weights, got.members) == got.score


@pytest.mark.parametrize("seed", range(6))
def test_exact_matches_brute_force_at_16(seed: int) -> None:
    rng = random.Random(seed)
    n = 16
    weights = [[0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            weights[a][b] = weights[b][a] = rng.choice(LEVELS)
    size = rng.randint(4, 10)
    required = rng.sample(range(n), rng.randint(0, 2))
    got = solve(weights, size, required)
    assert got.exact
    assert got.score == brute_force(weights, size, required).score


@given(problems(max_n=12), st.integers(0, 3))
@settings(max_examples=150, deadline=None)
def test_heuristic_and_budgeted_search_stay_valid(
    problem: tuple[list[list[int]], int, list[int]], limit: int
) -> None:
    # Forcing the above-the-limit path on small problems: answers stay well formed and
    # never claim exactness they lack; an unfinished search keeps the heuristic's set.
    weights, size, required = problem
    got = solve(weights, size, required, exact_limit=limit, node_budget=5)
    assert len(set(got.members)) == size and set(required) <= set(got.members)
    assert subset_score(weights, got.members) == got.score
    best = brute_force(weights, size, required).score
    assert got.score <= best
    if got.exact:
        assert got.score == best


def test_heuristic_above_search_limit_is_valid_and_good() -> None:
    # Two cliques of strong links in 80 devices: the heuristic must find one of them.
    rng = random.Random(7)
    n = 80
    weights = [[rng.choice([10, 20]) for _ in range(n)] for _ in range(n)]
    clique = rng.sample(range(n), 6)
    for a in clique:
        for b in clique:
            weights[a][b] = 200
    for i in range(n):
        weights[i][i] = 0
        for j in range(i):
            weights[i][j] = weights[j][i]
    got = solve(weights, 6)
    assert not got.exact
    assert sorted(got.members) == sorted(clique)


def test_uniform_weights_take_the_first_candidates() -> None:
    weights = [[0 if a == b else 100 for b in range(8)] for a in range(8)]
    got = solve(weights, 3, [5])
    assert got.members == (0, 1, 5) and got.exact and got.score == 300


@pytest.mark.parametrize(
    ("size", "required", "message"),
    [
        (5, [], "size 5"),
        (0, [1], "size 0"),
        (2, [1, 1], "repeat"),
        (2, [9], "out of range"),
    ],
)
def test_bad_input_raises_value_error(size: int, required: list[int], message: str) -> None:
    weights = [[0] * 4 for _ in range(4)]
    with pytest.raises(ValueError, match=message):
        solve(weights, size, required)


def test_exact_limit_constant_covers_sixteen() -> None:
    assert topology.EXACT_LIMIT >= 16


@given(problems(max_n=11))
@settings(max_examples=300, deadline=None)
def test_branch_and_bound_alone_finds_the_optimum(
    problem: tuple[list[list[int]], int, list[int]],
) -> None:
    # The heuristic is usually right on small problems, so solve() rarely needs the search
    # to find a set; started from nothing, the search must find the optimum by itself.
    weights, size, required = problem
    free = [i for i in range(len(weights)) if i not in required]
    need = size - len(required)
    if need == 0 or need == len(free):
        return
    gain = {i: sum(weights[i][q] for q in required) for i in free}
    found, _nodes, complete = topology._branch_and_bound(weights, free, gain, need, -1, None)
    assert complete and found is not None and len(set(found)) == need
    members = list(required) + found
    assert subset_score(weights, members) == brute_force(weights, size, required).score


def test_one_start_above_the_seed_scan_limit_still_finds_a_planted_clique() -> None:
    rng = random.Random(3)
    n = 300
    weights = [[0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            weights[a][b] = weights[b][a] = rng.choice([10, 20])
    clique = rng.sample(range(n), 5)
    for a in clique:
        for b in clique:
            if a != b:
                weights[a][b] = 300
    got = solve(weights, 5)
    assert sorted(got.members) == sorted(clique) and not got.exact
    # With a required member the greedy grows from it.
    got = solve(weights, 5, [clique[2]])
    assert sorted(got.members) == sorted(clique)


@st.composite
def symmetric_problems(draw: st.DrawFn) -> tuple[list[list[int]], int, list[int]]:
    # Devices of a few kinds whose pair weights depend only on the kinds: many twins
    # (interchangeable candidates), as on NVSwitch nodes split over NUMA nodes.
    n = draw(st.integers(2, 11))
    kinds = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    table = {(a, b): draw(st.sampled_from(LEVELS)) for a in range(3) for b in range(a, 3)}
    weights = [
        [0 if i == j else table[tuple(sorted((kinds[i], kinds[j])))] for j in range(n)]
        for i in range(n)
    ]
    size = draw(st.integers(1, n))
    required = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=size))
    return weights, size, required


@given(symmetric_problems())
@settings(max_examples=300, deadline=None)
def test_twin_pruning_keeps_the_search_exact(
    problem: tuple[list[list[int]], int, list[int]],
) -> None:
    weights, size, required = problem
    best = brute_force(weights, size, required).score
    assert solve(weights, size, required).score == best
    free = [i for i in range(len(weights)) if i not in required]
    need = size - len(required)
    if 0 < need < len(free):
        gain = {i: sum(weights[i][q] for q in required) for i in free}
        found, _nodes, complete = topology._branch_and_bound(weights, free, gain, need, -1, None)
        assert complete and found is not None
        assert subset_score(weights, list(required) + found) == best
