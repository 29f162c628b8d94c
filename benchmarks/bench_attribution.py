"""Attribution's cost per scrape: 100 pods and 1,000 processes (issue #34 point 8).

A daemon serving the simulated backend (50 devices time-sliced into 2 replicas each:
100 replicas) to the fake kubelet, which admits 100 pods of one replica each through
Allocate, serves its pod-resources API on a real unix socket and writes its device
checkpoint; the backend's ``usage`` hook reports 10 processes per pod (1,000), each
with a cgroup file in a fake /proc (systemd driver, cgroup v2 lines). Each scrape is a
real HTTP GET of /metrics. Scrapes with attribution on (a pod-resources List on every
scrape: the client's one-second reuse is turned off, the worst case) alternate in
batches with scrapes where the socket is gone (attribution off, everything else the
same, the usage hook included), so both see the same machine noise. Goal: the
difference of the medians at most 50 ms. Then 20 scrapes in a row with the default
client: the pod-resources calls they make (goal 1: the kubelet's limit is 100/s).

Run: ``python benchmarks/bench_attribution.py``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import median, percentile  # noqa: E402

PODS = 100
PROCESSES_PER_POD = 10
ROUNDS = 6  # batches of each kind
BATCH = 5
GOAL_MS = 50.0
RES = "hetero-dp.io/sim"


def _get(port: int) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        body = r.read()
    assert b"hetero_dp_devices" in body
    return (time.perf_counter() - t0) * 1000


async def measure(rounds: int) -> dict[str, Any]:
    from hetero_dp_simulated.backend import plugin as simulated

    from hetero_dp import ProcessUsage
    from hetero_dp.ops import operations
    from hetero_dp.testing import short_tempdir
    from hetero_dp.testing.fake_kubelet import FakeKubelet
    from hetero_dp.testing.runner import PluginRunner

    root = short_tempdir("hattr-bench-")
    proc = root / "proc"
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    runner = PluginRunner(root / "dp", scratch_dir=root)
    try:
        config = {
            "metrics": {"address": "127.0.0.1:0"},
            "attribution": {"procRoot": str(proc)},
            "backends": {"simulated": {"count": PODS // 2, "numaNodes": 0}},
            "sharing": {"timeSlicing": {"resources": [{"name": RES, "replicas": 2}]}},
        }
        daemon = await runner.start("simulated", config=config)
        await kubelet.wait_devices(RES, lambda d: len(d) == PODS)
        await kubelet.serve_pod_resources()
        usage = []
        pid = 1000
        for i in range(PODS):
            pod = await kubelet.admit_pod(f"p{i}", {"c": {RES: 1}}, namespace="bench")
            device = pod.device_ids()[0].partition("::")[0]
            for _ in range(PROCESSES_PER_POD):
                pid += 1
                (proc / str(pid)).mkdir(parents=True)
                slice_ = f"kubepods-burstable-pod{pod.uid.replace('-', '_')}.slice"
                (proc / str(pid) / "cgroup").write_text(
                    f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/"
                    f"cri-containerd-{pid:064x}.scope\n"
                )
                usage.append(ProcessUsage(device, pid, 100 << 20, 0.01))
        simulated.set_processes(usage)
        ops = operations.of(daemon)
        assert ops is not None and ops.server is not None and ops.metrics is not None
        port = ops.server.port
        await asyncio.to_thread(_get, port)  # the first scrape makes the attribution
        attribution = ops.metrics.attribution
        assert attribution is not None and attribution.view is not None
        assert len(attribution.view.uses) == PODS
        assert attribution.view.unattributed == 0
        attribution.client.min_gap = 0  # a List on every scrape
        on: list[float] = []
        off: list[float] = []
        for _ in range(rounds):
            for _ in range(BATCH):
                on.append(await asyncio.to_thread(_get, port))
            await kubelet.stop_pod_resources()
            for _ in range(BATCH):
                off.append(await asyncio.to_thread(_get, port))
            await kubelet.serve_pod_resources()
        attribution.client.min_gap = 1.0  # the default
        server = kubelet.pod_life.server
        assert server is not None
        before = server.calls
        t0 = time.perf_counter()
        for _ in range(20):
            await asyncio.to_thread(_get, port)
        calls, row_s = server.calls - before, time.perf_counter() - t0
        assert attribution.view is not None and len(attribution.view.uses) == PODS
    finally:
        simulated.set_processes([])
        await runner.stop_all()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    added = median(on) - median(off)
    return {
        "benchmark": f"a /metrics scrape with {PODS} pods and "
        f"{PODS * PROCESSES_PER_POD} processes: attribution on vs off",
        "scrapes each": len(on),
        "on / median_ms": round(median(on), 2),
        "on / p99_ms": round(percentile(on, 99), 2),
        "off / median_ms": round(median(off), 2),
        "off / p99_ms": round(percentile(off, 99), 2),
        "added / median_ms": round(added, 2),
        "goal_added_ms": GOAL_MS,
        "met": added <= GOAL_MS,
        "pod-resources calls in 20 scrapes in a row": f"{calls} in {row_s:.2f} s",
        "goal_calls": "at most 1 per second (the kubelet allows 100/s, burst 10)",
        "notes": [
            "Off: the pod-resources socket removed, so attribution is off and the scrape is "
            "what it was before attribution; the usage hook still runs in both.",
            "On: a List on every scrape (the client's reuse within 1 s turned off); the "
            "checkpoint is parsed once (it does not change), the 1,000 cgroup files are read "
            "on the first scrape in one worker thread, later ones stat /proc/<pid> and read only "
            "new processes' files. The fake /proc is a plain dir: a real /proc's cgroup file "
            "costs more to read (about 90 us here under load, a stat about 10 us).",
            "Allocate is not on this path: no module under hetero_dp/engine or "
            "hetero_dp/deviceplugin imports hetero_dp/usage (the layer order that "
            "tests/core/test_architecture.py checks).",
        ],
    }


def run(rounds: int = ROUNDS) -> dict[str, Any]:
    return asyncio.run(measure(rounds))


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
