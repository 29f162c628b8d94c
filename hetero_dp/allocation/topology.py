"""Choose the best-connected subset of devices: pure code, no I/O, no records.

The problem: given a symmetric matrix of pair weights (higher is better),
choose ``size`` indices that contain ``required`` and maximise the sum of the
weights of every pair inside the set. This is the densest-k-subgraph problem,
NP-hard in general, but small at the scale of one node.

When scoring every set takes at most :data:`_ENUMERATE_WORK` pair lookups (8 free
candidates for any size), every set is scored: exact, and cheaper than what follows.
Otherwise the heuristic comes first: greedy growth (add the candidate with
the best gain towards the set so far) from ``required`` and from a few seeds
(the candidates with the best neighbourhoods; every candidate, between
:data:`EXACT_LIMIT` and :data:`SEARCH_LIMIT`), each followed by best-improvement
swaps (one member out, one candidate in) until no swap helps.

* Up to :data:`EXACT_LIMIT` free candidates (candidates not in ``required``),
  branch and bound then proves or improves that answer, so :func:`solve` is
  exact. The bound gives every undecided candidate its gain towards the devices
  chosen so far plus half of its best weights towards the other undecided
  candidates (each pair inside the new picks is counted half from each end), and
  sums the best ``need`` of those values. Branches whose bound cannot beat the
  best set found so far are cut, so equally good sets (symmetric NVSwitch
  topologies) are settled at once.
* Up to :data:`SEARCH_LIMIT`, the same search runs with a budget of
  :data:`NODE_BUDGET` nodes and replaces the answer if it finishes (``exact``
  says whether it did). Above that, the heuristic's answer stands.
* When every pair weighs the same, any set is optimal: the first candidates.

:func:`brute_force` exists to prove :func:`solve` in tests and benchmarks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Weights = Sequence[Sequence[float]]

#: Free candidates up to which :func:`solve` always searches exhaustively.
EXACT_LIMIT = 16
#: Branch-and-bound nodes allowed above :data:`EXACT_LIMIT` before the heuristic answer stands.
NODE_BUDGET = 20_000
#: Above this many free candidates no exact search is tried (its set-up alone grows as m^3).
SEARCH_LIMIT = 64
# Multi-start greedy costs seeds * need * candidates; beyond this much work use one start.
_SEED_WORK_LIMIT = 2_000_000
# Seeds tried before an exact search, and for candidate sets too large to seed from each.
_SMALL_SEEDS = 3
_LARGE_SEEDS = 8
# Above this many candidates, ranking seeds costs too much: one start only.
_SEED_SCAN_LIMIT = 256
# Up to this many pair lookups in all, every set is scored outright (8 candidates with
# 2, 4 or 6 wanted: 28, 420 or 420): exact, and cheaper than the heuristic's and the
# search's set-up, which cost 0.6 ms for 8 candidates (benchmarks/bench_backends.py).
_ENUMERATE_WORK = 1_000
# Swap evaluations allowed (each pass costs picks * candidates).
_SWAP_EVALS = 2_000_000
_NEG = float("-inf")


@dataclass(frozen=True)
class Solution:
    """A chosen set: ``members`` (sorted indices), its ``score``, whether it is
    proven optimal (``exact``) and how many search nodes the proof took."""

    members: tuple[int, ...]
    score: float
    exact: bool
    nodes: int = 0


def subset_score(weights: Weights, members: Sequence[int]) -> float:
    """Sum of the weights of every pair inside ``members``."""
    total: float = 0
    for a, b in itertools.combinations(members, 2):
        total += weights[a][b]
    return total


def _check(weights: Weights, size: int, required: Sequence[int]) -> None:
    n = len(weights)
    if any(len(row) != n for row in weights):
        raise ValueError("weights must be a square matrix")
    if len(set(required)) != len(required):
        raise ValueError(f"required indices repeat: {list(required)}")
    if any(not 0 <= r < n for r in required):
        raise ValueError(f"required indices out of range 0..{n - 1}: {list(required)}")
    if not len(required) <= size <= n:
        raise ValueError(f"size {size} must lie between {len(required)} and {n}")


def brute_force(weights: Weights, size: int, required: Sequence[int] = ()) -> Solution:
    """Try every set (reference for tests; exponential)."""
    _check(weights, size, required)
    req = tuple(required)
    free = [i for i in range(len(weights)) if i not in set(req)]
    best: tuple[int, ...] | None = None
    best_score: float = 0
    count = 0
    for combo in itertools.combinations(free, size - len(req)):
        count += 1
        members = req + combo
        score = subset_score(weights, members)
        if best is None or score > best_score:
            best, best_score = members, score
    assert best is not None  # size is in range, so at least one combination exists
    return Solution(tuple(sorted(best)), best_score, True, count)


def solve(
    weights: Weights,
    size: int,
    required: Sequence[int] = (),
    *,
    exact_limit: int = EXACT_LIMIT,
    node_budget: int = NODE_BUDGET,
) -> Solution:
    """The set of ``size`` indices containing ``required`` with the highest score.

    Exact when at most ``exact_limit`` candidates are free; otherwise the
    heuristic's answer, improved by a budgeted exact search (see the module doc).
    Raises ValueError for a size out of range or bad ``required`` indices.
    """
    _check(weights, size, required)
    n = len(weights)
    req = list(required)
    req_set = set(req)
    free = [i for i in range(n) if i not in req_set]
    need = size - len(req)
    base_score = subset_score(weights, req)
    if need == 0 or need == len(free):
        members = req if need == 0 else req + free
        return Solution(tuple(sorted(members)), subset_score(weights, members), True)

    # gain[i]: weight from free candidate i to the required devices.
    gain = {i: sum(weights[i][q] for q in req) for i in free}
    if len(free) <= SEARCH_LIMIT and _uniform(weights, free) and len(set(gain.values())) == 1:
        # Every choice scores the same (no links at all, or one NVSwitch): take the first.
        members = req + free[:need]
        return Solution(tuple(sorted(members)), subset_score(weights, members), True)
    if math.comb(len(free), need) * need * (need + 1) // 2 <= _ENUMERATE_WORK:
        return _enumerate(weights, free, gain, need, req, base_score)
    picked, score = _heuristic(weights, free, gain, need, exact_limit)
    score += base_score
    if len(free) > max(exact_limit, SEARCH_LIMIT):
        return Solution(tuple(sorted(req + picked)), score, False)
    budget = None if len(free) <= exact_limit else node_budget
    found, nodes, complete = _branch_and_bound(
        weights, free, gain, need, score - base_score, budget
    )
    if found is not None:
        picked = found
        score = base_score + subset_score_with_gain(weights, found, gain)
    return Solution(tuple(sorted(req + list(picked))), score, complete, nodes)


def _enumerate(
    weights: Weights,
    free: list[int],
    gain: dict[int, float],
    need: int,
    req: list[int],
    base_score: float,
) -> Solution:
    """Score every set of ``need`` free candidates. Between equal scores the set closer
    to the required devices wins (as the heuristic, which grows from them, finds it),
    then the first in candidate order (as the uniform case takes the first)."""
    best: tuple[int, ...] = ()
    best_score = _NEG
    best_gain = _NEG
    count = 0
    for combo in itertools.combinations(free, need):
        count += 1
        score = 0.0  # subset_score_with_gain, inlined: this loop is the whole cost
        towards = 0.0
        for x, a in enumerate(combo):
            row = weights[a]
            towards += gain[a]
            for b in combo[x + 1 :]:
                score += row[b]
        score += towards
        if score > best_score or (score == best_score and towards > best_gain):
            best, best_score, best_gain = combo, score, towards
    return Solution(tuple(sorted(req + list(best))), base_score + best_score, True, count)


def subset_score_with_gain(
    weights: Weights, picked: Sequence[int], gain: dict[int, float]
) -> float:
    """Score of ``picked`` plus each member's gain towards the required devices."""
    return subset_score(weights, picked) + sum(gain[i] for i in picked)


def _uniform(weights: Weights, free: list[int]) -> bool:
    if len(free) < 2:
        return True
    first = weights[free[0]][free[1]]
    return all(weights[a][b] == first for a, b in itertools.combinations(free, 2))


def _greedy(
    weights: Weights, base: list[float], blocked: list[bool], need: int, seed: int | None
) -> list[int]:
    """Grow a set from ``seed``: each step adds the candidate with the best gain."""
    # h[i]: gain of candidate i towards the required devices and the picks so far;
    # -inf marks what cannot be picked (required, blocked, picked), and stays -inf.
    h = [_NEG if blocked[i] else base[i] for i in range(len(base))]
    picked: list[int] = []
    nxt = seed
    while len(picked) < need:
        if nxt is None:
            top = max(h)
            nxt = h.index(top)  # the lowest index among equals: stable answers
        picked.append(nxt)
        h = [a + b for a, b in zip(h, weights[nxt])]
        h[nxt] = _NEG
        nxt = None
    return picked


def _improve(
    weights: Weights, base: list[float], blocked: list[bool], picked: list[int]
) -> tuple[list[int], float]:
    """Best-improvement swaps until none helps; returns the set and its score (w/o base)."""
    n = len(base)
    inside = [False] * n
    for p in picked:
        inside[p] = True
    members = list(picked)
    # g[i]: weight from i to the required devices plus to the current members.
    g = list(base)
    for p in members:
        g = [a + b for a, b in zip(g, weights[p])]
    score = sum(base[p] for p in members) + subset_score(weights, members)
    # Each swap strictly improves, so this ends; the cap bounds the time on large sets.
    passes = max(1, _SWAP_EVALS // max(1, len(members) * n))
    for _ in range(passes):
        h = [_NEG if blocked[v] or inside[v] else g[v] for v in range(n)]
        best_delta: float = 0
        best_swap: tuple[int, int] | None = None
        for k, u in enumerate(members):
            row = weights[u]
            # Swapping u for v gains g[v] - w[u][v] and loses u's own gain.
            d = [a - b for a, b in zip(h, row)]
            top = max(d)
            delta = top - (g[u] - row[u])
            if delta > best_delta:
                best_delta, best_swap = delta, (k, d.index(top))
        if best_swap is None:
            break
        k, v = best_swap
        u = members[k]
        members[k] = v
        inside[u], inside[v] = False, True
        score += best_delta
        g = [a + b - c for a, b, c in zip(g, weights[v], weights[u])]
    return sorted(members), score


def _ranked(free: list[int], key: Callable[[int], float], count: int) -> list[int]:
    return heapq.nlargest(count, free, key=key)


def _heuristic(
    weights: Weights, free: list[int], gain: dict[int, float], need: int, exact_limit: int
) -> tuple[list[int], float]:
    n = len(weights)
    blocked = [True] * n
    base = [0.0] * n
    for i in free:
        blocked[i] = False
        base[i] = gain[i]
    m = len(free)

    def potential(i: int) -> float:
        row = weights[i]
        return gain[i] + sum(heapq.nlargest(need - 1, (row[j] for j in free if j != i)))

    first: int | None = None
    if m == n:
        # Nothing required, so every gain is 0: start from an end of the heaviest pair.
        tops = []
        for i in range(n):
            row = list(weights[i])
            row[i] = _NEG
            tops.append(max(row))
        first = tops.index(max(tops))
    seeds: list[int | None] = [first]
    if m <= exact_limit:
        # The exact search follows; a good start is all it needs from here.
        seeds.extend(_ranked(free, potential, _SMALL_SEEDS))
    elif m <= SEARCH_LIMIT and m * m * need <= _SEED_WORK_LIMIT:
        seeds.extend(free)
    elif m <= _SEED_SCAN_LIMIT:
        # Too many to try each: start from the candidates with the best neighbourhoods.
        seeds.extend(_ranked(free, potential, _LARGE_SEEDS))
    best: list[int] = []
    best_score: float | None = None
    tried: set[tuple[int, ...]] = set()
    for seed in seeds:
        start = _greedy(weights, base, blocked, need, seed)
        key = tuple(sorted(start))
        if key in tried:
            continue
        tried.add(key)
        picked, score = _improve(weights, base, blocked, start)
        if best_score is None or score > best_score:
            best, best_score = picked, score
    assert best_score is not None
    return best, best_score


def _twin_classes(w: list[list[float]], gain: list[float], ranked: list[list[float]]) -> list[int]:
    """Class number per candidate; candidates alike towards everyone share one."""
    m = len(w)
    twin = list(range(m))
    buckets: dict[tuple[float, tuple[float, ...]], list[int]] = {}
    for k in range(m):
        # Twins have the same multiset of weights: a cheap filter before the full test.
        buckets.setdefault((gain[k], tuple(ranked[k])), []).append(k)
    for members in buckets.values():
        for x, a in enumerate(members):
            if twin[a] != a:
                continue
            for b in members[x + 1 :]:
                if twin[b] == b and all(w[a][c] == w[b][c] for c in range(m) if c != a and c != b):
                    twin[b] = a
    return twin


def _branch_and_bound(
    weights: Weights,
    free: list[int],
    gain: dict[int, float],
    need: int,
    incumbent: float,
    budget: int | None,
) -> tuple[list[int] | None, int, bool]:
    """Search for a set of ``need`` free candidates scoring above ``incumbent``.

    Returns (the better set or None, nodes visited, whether the search finished).
    Scores here leave out the weights among required devices (a constant).
    """
    m = len(free)

    w_all = [[float(weights[a][b]) for b in free] for a in free]
    # Each candidate's weights to the others, best first, sorted once.
    ranked = [
        sorted((row[j] for j in range(m) if j != k), reverse=True) for k, row in enumerate(w_all)
    ]
    twin = _twin_classes(w_all, [gain[i] for i in free], ranked)
    # Order: most promising first, so good sets are found early and cut the rest;
    # twins side by side.
    potential = [gain[free[k]] + sum(ranked[k][: need - 1]) for k in range(m)]
    perm = sorted(range(m), key=lambda k: (-potential[k], twin[k], free[k]))
    order = [free[k] for k in perm]
    w = [[w_all[a][b] for b in perm] for a in perm]
    # Twins (same weights to every other candidate, same gain) are interchangeable, so
    # some best set takes the earliest ones of each class: leaving one out leaves out
    # the rest of its class too. This settles NVSwitch-like nodes in a few steps.
    skip = [m] * m
    for q in range(m - 1, -1, -1):
        same = q + 1 < m and twin[perm[q + 1]] == twin[perm[q]]
        skip[q] = skip[q + 1] if same else q + 1
    by_weight = [sorted(((w[k][j], j) for j in range(m) if j != k), reverse=True) for k in range(m)]
    # tops[p][k][t]: sum of the t best weights from order[k] to the candidates at
    # positions >= p other than itself (the ones still undecided at depth p).
    # Built on first use: a search that is cut early never needs the deep levels.
    tops: dict[int, list[list[float]]] = {}

    def level_at(p: int) -> list[list[float]]:
        level = tops.get(p)
        if level is None:
            level = []
            for k in range(m):
                sums = [0.0]
                if k >= p:
                    for v, j in by_weight[k]:
                        if j >= p:
                            sums.append(sums[-1] + v)
                            if len(sums) == need:
                                break
                level.append(sums)
            tops[p] = level
        return level

    best_score = float(incumbent)
    best_set: list[int] | None = None
    nodes = 0
    complete = True
    chosen: list[int] = []

    def dfs(pos: int, score: float, g: list[float]) -> None:
        nonlocal best_score, best_set, nodes, complete
        left = need - len(chosen)
        if left == 0:
            if score > best_score:
                best_score, best_set = score, [order[k] for k in chosen]
            return
        if m - pos < left:
            return
        nodes += 1
        if budget is not None and nodes > budget:
            complete = False
            return
        level = level_at(pos)
        t = left - 1
        # Twice the bound, to keep integer weights exact (the half-counted pairs).
        vals = sorted((2 * g[k] + level[k][t] for k in range(pos, m)), reverse=True)
        if 2 * score + sum(vals[:left]) <= 2 * best_score:
            return
        # Take order[pos] ...
        row = w[pos]
        chosen.append(pos)
        dfs(pos + 1, score + g[pos], [g[k] + row[k] for k in range(m)])
        chosen.pop()
        if not complete:
            return
        # ... or leave it out, with its later twins.
        dfs(skip[pos], score, g)

    dfs(0, 0.0, [float(gain[i]) for i in order])
    return best_set, nodes, complete
