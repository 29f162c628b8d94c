"""DRA mode: how fast a wiped pool is back, and what a sync that changes nothing sends.

A DRA daemon (two devices, the default 30 s periodic check) publishes to the
stand-in API server of ``hetero_dp.testing.dra`` over real HTTP and watches its
slices. The node's slices are then deleted as a starting kubelet deletes them
(``FakeAPIServer.wipe_node``); the clock runs from the deletion until the
server holds the whole pool again. Goal (issue 19): under 1 s; the periodic
check alone repairs after 15 s on average (30 s at worst), which is what a
real 1.36 cluster showed (5-28 s without devices after each kubelet restart).

Then 100 resyncs with nothing changed: the slice writes they send (goal 0; a
literal comparison of ``16384Mi`` with the stored ``16Gi`` sent one PUT each).

Run: ``python benchmarks/bench_dra_repair.py``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import median, percentile  # noqa: E402
from benchmarks._npus import RES, Npus  # noqa: E402

WIPES = 30
RESYNCS = 100
GOAL_MS = 1000.0


async def measure(wipes: int, resyncs: int) -> dict[str, Any]:
    from hetero_dp.testing import short_tempdir
    from hetero_dp.testing.dra import DRARunner, FakeAPIServer

    driver_name = "npu.acme.example.com"
    root = short_tempdir("hdra-bench-")
    with FakeAPIServer() as api:
        runner = DRARunner(root, api)
        try:
            daemon = await runner.start(Npus(2), resync_interval=30.0)
            await api.wait_for(lambda: api.watches >= 1)
            times: list[float] = []
            mark = len(api.requests)
            for _ in range(wipes):
                t0 = time.perf_counter()
                api.wipe_node("node-a")
                await api.wait_for(lambda: len(api.devices_of(driver_name)) == 2, timeout=60)
                times.append((time.perf_counter() - t0) * 1000)
            # the last repair's requests are recorded just after the store changed
            await api.wait_for(lambda: api.verbs(mark).get("CREATE", 0) >= wipes, timeout=10)
            during = api.verbs(mark)
            driver = daemon.front_end.drivers[RES]
            before = len(api.writes())
            for _ in range(resyncs):
                await driver.resync()
            writes = len(api.writes()) - before
        finally:
            await runner.stop_all()
            shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "DRA: kubelet wipes the node's slices -> pool back on the API server",
        "wipes": wipes,
        "repair / median_ms": round(median(times), 2),
        "repair / p99_ms": round(percentile(times, 99), 2),
        "repair / max_ms": round(max(times), 2),
        "goal_max_ms": GOAL_MS,
        "baseline": "the 30 s periodic check alone: 15 000 ms on average, 30 000 ms at worst",
        f"slice writes in {resyncs} no-change resyncs": writes,
        "goal_no_change_writes": 0,
        "requests per repair": ", ".join(f"{k} {v / wipes:g}" for k, v in sorted(during.items())),
        "notes": [
            "A wipe reaches the driver as the watch's DELETED event; the sync compares with "
            "the watch's cache and sends one CREATE, no LIST (issue 31).",
            "Run on a 2-core machine shared with other work: the milliseconds move with the "
            "load from run to run (2026-12-02, three runs at load 1.9-2.1: median 54-55 ms, "
            "max 66-76 ms; 2026-12-01, before the issue 31 changes, at load 0.45: median "
            "101 ms, max 176 ms); the goal is met by a wide margin in each.",
        ],
    }


def run(wipes: int = WIPES, resyncs: int = RESYNCS) -> dict[str, Any]:
    return asyncio.run(measure(wipes, resyncs))


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
