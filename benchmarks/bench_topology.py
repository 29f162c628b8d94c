"""Preferred-allocation engine: solve time and score against the optimum.

Whole devices on DGX-like topologies with 8 and 16 GPUs (NVLink scores 100
per link, NVIDIA's PCIe ladder 60/50/40/30/20/10 below), every request size,
with and without a must-include device and with part of the node already
taken; above 16 candidates (32 to 1,024 GPUs as DGX-1 islands) the heuristic
against the best set inside one island; replicas with 64 and 1,024 advertised
units under each policy.

The optimum comes from exhaustive search (not timed). Goals: 16 candidates
under 10 ms, 1,024 replicas under 20 ms, optimal on every whole-device case.
Times are medians of repeated runs, wall clock and CPU time of this process;
the goals are judged on CPU time, which other work on a shared machine does not
inflate (the summary records the load average beside them).

Run: ``PYTHONPATH=. python3 benchmarks/bench_topology.py`` (prints a table and JSON).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from hetero_dp import Device, Link
from hetero_dp.allocation.preferred import choose_preferred, link_scores, set_score
from hetero_dp.allocation.sharing import advertise, parse_sharing
from hetero_dp.allocation.topology import brute_force

RES = "nvidia.com/gpu"
NVLINK = 100
PIX, PXB, PHB, NODE, SYS = 50, 40, 30, 20, 10
REPEATS = 15

# DGX-1 (V100) hybrid cube-mesh: NVLink counts per pair.
DGX1_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip


def _devices(n: int, numa: Sequence[int]) -> list[Device]:
    return [Device(f"GPU-{i:02d}-{'0' * 8}", RES, index=i, numa_nodes=(numa[i],)) for i in range(n)]


def _pcie(a: int, b: int, numa: Sequence[int], switch: Callable[[int], int]) -> tuple[int, str]:
    if switch(a) == switch(b):
        return PIX, "PIX"
    if numa[a] == numa[b]:
        return NODE, "NODE"
    return SYS, "SYS"


def dgx1(base: int = 0) -> tuple[dict[tuple[int, int], int], list[int]]:
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    return {(a + base, b + base): c for (a, b), c in DGX1_NVLINKS.items()}, numa


def topology_dgx1() -> tuple[list[Device], list[Link]]:
    nv, numa = dgx1()
    return _build(8, nv, numa, lambda i: i // 2)


def topology_dgx_a100() -> tuple[list[Device], list[Link]]:
    # Eight A100s on NVSwitch (12 links each way); NPS4 NUMA affinities of the host.
    numa = [3, 3, 1, 1, 7, 7, 5, 5]
    nv = {(a, b): 12 for a, b in itertools.combinations(range(8), 2)}
    return _build(8, nv, numa, lambda i: i // 2)


def topology_dgx_h100() -> tuple[list[Device], list[Link]]:
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    nv = {(a, b): 18 for a, b in itertools.combinations(range(8), 2)}
    return _build(8, nv, numa, lambda i: i // 2)


def topology_pcie8() -> tuple[list[Device], list[Link]]:
    # No NVLink: two PCIe switches per CPU, two GPUs per switch.
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    return _build(8, {}, numa, lambda i: i // 2)


def topology_two_dgx1() -> tuple[list[Device], list[Link]]:
    # Sixteen V100s as two hybrid cube-meshes (one per CPU pair), PCIe across.
    nv_a, _ = dgx1(0)
    nv_b, _ = dgx1(8)
    numa = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    return _build(16, {**nv_a, **nv_b}, numa, lambda i: i // 2)


def topology_dgx2() -> tuple[list[Device], list[Link]]:
    # DGX-2: sixteen V100s all-to-all through NVSwitch (6 links each).
    numa = [0] * 8 + [1] * 8
    nv = {(a, b): 6 for a, b in itertools.combinations(range(16), 2)}
    return _build(16, nv, numa, lambda i: i // 2)


def topology_irregular16(seed: int) -> tuple[list[Device], list[Link]]:
    # A partial NVLink mesh (1-4 links on a third of the pairs) over PCIe: no symmetry to exploit.
    rng = random.Random(seed)
    numa = [i // 4 for i in range(16)]
    nv = {
        (a, b): rng.randint(1, 4)
        for a, b in itertools.combinations(range(16), 2)
        if rng.random() < 0.33
    }
    return _build(16, nv, numa, lambda i: i // 2)


def _build(
    n: int, nv: dict[tuple[int, int], int], numa: Sequence[int], switch: Callable[[int], int]
) -> tuple[list[Device], list[Link]]:
    devices = _devices(n, numa)
    links = []
    for a, b in itertools.combinations(range(n), 2):
        count = nv.get((a, b)) or nv.get((b, a))
        if count:
            score, kind = NVLINK * count, f"NV{count}"
        else:
            score, kind = _pcie(a, b, numa, switch)
        links.append(Link(devices[a].id, devices[b].id, score, kind))
    return devices, links


def _time(fn: Callable[[], object], repeats: int = REPEATS) -> tuple[dict[str, float], object]:
    """Wall-clock median and maximum, and the median CPU time of this process, in ms."""
    wall, cpu = [], []
    result: object = None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    timing = {
        "median_ms": round(statistics.median(wall), 3),
        "max_ms": round(max(wall), 3),
        "cpu_median_ms": round(statistics.median(cpu), 3),
    }
    return timing, result


def _optimum(
    available: Sequence[Device], must: Sequence[Device], size: int, scores: dict[Any, float]
) -> float:
    matrix = [[0 if a is b else scores.get((a.id, b.id), 0) for b in available] for a in available]
    position = {d.id: i for i, d in enumerate(available)}
    return brute_force(matrix, size, [position[d.id] for d in must]).score


def whole_cases() -> list[dict[str, Any]]:
    topologies: list[tuple[str, tuple[list[Device], list[Link]]]] = [
        ("dgx1-v100", topology_dgx1()),
        ("dgx-a100", topology_dgx_a100()),
        ("dgx-h100", topology_dgx_h100()),
        ("pcie-8", topology_pcie8()),
        ("2x-dgx1-16", topology_two_dgx1()),
        ("dgx2-16", topology_dgx2()),
        ("irregular-16a", topology_irregular16(1)),
        ("irregular-16b", topology_irregular16(2)),
    ]
    rng = random.Random(42)
    rows = []
    for name, (devices, links) in topologies:
        scores = link_scores(links)
        n = len(devices)
        scenarios: list[tuple[str, list[Device]]] = [("idle", devices)]
        # Part of the node taken by other pods: a quarter of the devices gone.
        scenarios.append(("busy", sorted(rng.sample(devices, n - n // 4), key=lambda d: d.index)))
        for state, available in scenarios:
            for size in range(2, len(available)):
                for must in ([], [available[len(available) // 2]]):
                    timing, ids = _time(
                        lambda a=available, m=must, s=size, sc=scores: choose_preferred(a, m, s, sc)
                    )
                    assert isinstance(ids, list)
                    by_id = {d.id: d for d in available}
                    got = set_score([by_id[i] for i in ids], scores)
                    best = _optimum(available, must, size, scores)
                    rows.append(
                        {
                            "topology": name,
                            "state": state,
                            "candidates": len(available),
                            "size": size,
                            "must": len(must),
                            **timing,
                            "score": got,
                            "optimum": best,
                            "ratio": round(got / best, 6) if best else 1.0,
                        }
                    )
    return rows


def topology_islands(n: int) -> tuple[list[Device], list[Link]]:
    # n GPUs as n/8 DGX-1 islands (NVLink inside an island), two islands per NUMA node,
    # PCIe links inside a node, none across nodes (pairs left out score 0).
    devices = _devices(n, [i // 16 for i in range(n)])
    links = []
    for a, b in itertools.combinations(range(n), 2):
        if a // 8 == b // 8:
            count = DGX1_NVLINKS.get((a % 8, b % 8), 0)
            score, kind = (NVLINK * count, f"NV{count}") if count else (NODE, "NODE")
        elif a // 16 == b // 16:
            score, kind = PHB, "PHB"
        else:
            continue
        links.append(Link(devices[a].id, devices[b].id, score, kind))
    return devices, links


def large_cases() -> list[dict[str, Any]]:
    """Above 16 candidates: the heuristic, against the best set inside one island.

    Every island is alike and a set spread over islands loses NVLink pairs, so the
    best set inside one island (found exhaustively) is the reference.
    """
    rows = []
    for n in (32, 64, 256, 1024):
        devices, links = topology_islands(n)
        scores = link_scores(links)
        island = devices[:8]
        for size in (2, 4, 8):
            timing, ids = _time(
                lambda d=devices, s=size, sc=scores: choose_preferred(d, [], s, sc), repeats=5
            )
            assert isinstance(ids, list)
            by_id = {d.id: d for d in devices}
            got = set_score([by_id[i] for i in ids], scores)
            best = _optimum(island, [], size, scores)
            rows.append(
                {
                    "candidates": n,
                    "size": size,
                    **timing,
                    "score": got,
                    "planted_optimum": best,
                    "ratio": round(got / best, 6),
                }
            )
    return rows


def replica_cases() -> list[dict[str, Any]]:
    rng = random.Random(7)
    rows = []
    for gpus, replicas in ((8, 8), (16, 64)):
        devices, links = topology_dgx1() if gpus == 8 else topology_two_dgx1()
        scores = link_scores(links)
        config = parse_sharing(
            {"timeSlicing": {"resources": [{"name": RES, "replicas": replicas}]}}
        )
        adv_timing, advertised = _time(lambda d=devices, c=config: advertise(d, c))
        assert isinstance(advertised, list)
        # A third of the replicas already handed out, unevenly.
        taken = set(rng.sample(range(len(advertised)), len(advertised) // 3))
        available = [d for i, d in enumerate(advertised) if i not in taken]
        for policy in ("distributed", "packed", "spread"):
            for size in (1, 4, 16, min(64, len(available))):
                timing, ids = _time(
                    lambda a=available, s=size, p=policy, adv=advertised, sc=scores: (
                        choose_preferred(a, [], s, sc, p, advertised=adv)
                    )
                )
                assert isinstance(ids, list) and len(ids) == size
                rows.append(
                    {
                        "replicas": len(advertised),
                        "available": len(available),
                        "policy": policy,
                        "size": size,
                        **timing,
                        "advertise_ms": adv_timing["median_ms"],
                        "advertise_cpu_ms": adv_timing["cpu_median_ms"],
                    }
                )
    return rows


def run() -> dict[str, Any]:
    """Measure every case; returns rows plus a summary against the goals."""
    whole = whole_cases()
    large = large_cases()
    replicas = replica_cases()
    w16 = [r for r in whole if r["candidates"] > 8]
    w8 = [r for r in whole if r["candidates"] <= 8]
    r1024 = [r for r in replicas if r["replicas"] >= 1024]
    r64 = [r for r in replicas if r["replicas"] < 1024]
    summary = {
        "whole_cases": len(whole),
        "worst_median_ms_up_to_8": max(r["median_ms"] for r in w8),
        "worst_median_ms_9_to_16": max(r["median_ms"] for r in w16),
        "worst_cpu_median_ms_9_to_16": max(r["cpu_median_ms"] for r in w16),
        "worst_max_ms_9_to_16": max(r["max_ms"] for r in w16),
        "min_ratio": min(r["ratio"] for r in whole),
        "optimal_cases": sum(1 for r in whole if r["ratio"] == 1.0),
        "worst_median_ms_64_replicas": max(r["median_ms"] for r in r64),
        "worst_median_ms_1024_replicas": max(r["median_ms"] for r in r1024),
        "worst_cpu_median_ms_1024_replicas": max(r["cpu_median_ms"] for r in r1024),
        "worst_max_ms_1024_replicas": max(r["max_ms"] for r in r1024),
        "advertise_ms_1024_replicas": r1024[0]["advertise_ms"],
        "worst_median_ms_1024_whole": max(r["median_ms"] for r in large),
        "min_ratio_above_16": min(r["ratio"] for r in large),
        # Other work on a shared machine stretches wall-clock times; the load says how much.
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    # The goals are judged on CPU time, which other processes do not inflate; on an idle
    # node it equals the wall-clock time the kubelet waits (single-threaded code).
    goals = {
        "16_candidates_under_10ms": summary["worst_cpu_median_ms_9_to_16"] < 10,
        "1024_replicas_under_20ms": summary["worst_cpu_median_ms_1024_replicas"] < 20,
        "optimal_every_case": summary["optimal_cases"] == len(whole),
    }
    return {
        "summary": summary,
        "goals": goals,
        "whole": whole,
        "large": large,
        "replicas": replicas,
    }


def main() -> int:
    result = run()
    print(f"{'topology':<14} {'state':<5} {'n':>3} {'size':>4} {'must':>4} "
          f"{'med ms':>7} {'max ms':>7} {'cpu ms':>7} {'ratio':>6}")  # fmt: skip
    for r in result["whole"]:
        print(
            f"{r['topology']:<14} {r['state']:<5} {r['candidates']:>3} {r['size']:>4} "
            f"{r['must']:>4} {r['median_ms']:>7.3f} {r['max_ms']:>7.3f} "
            f"{r['cpu_median_ms']:>7.3f} {r['ratio']:>6.3f}"
        )
    print()
    print(f"{'n':>5} {'size':>4} {'med ms':>8} {'max ms':>8} {'cpu ms':>8} {'ratio':>6}")
    for r in result["large"]:
        print(
            f"{r['candidates']:>5} {r['size']:>4} {r['median_ms']:>8.3f} {r['max_ms']:>8.3f} "
            f"{r['cpu_median_ms']:>8.3f} {r['ratio']:>6.3f}"
        )
    print()
    print(
        f"{'replicas':>8} {'avail':>5} {'policy':<11} {'size':>4} "
        f"{'med ms':>7} {'max ms':>7} {'cpu ms':>7}"
    )
    for r in result["replicas"]:
        print(
            f"{r['replicas']:>8} {r['available']:>5} {r['policy']:<11} {r['size']:>4} "
            f"{r['median_ms']:>7.3f} {r['max_ms']:>7.3f} {r['cpu_median_ms']:>7.3f}"
        )
    print()
    print(json.dumps({"summary": result["summary"], "goals": result["goals"]}, indent=2))
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
