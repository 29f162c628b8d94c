"""The Allocate handler in a tight loop, in process: calls per second of
``DevicePluginServicer.Allocate`` for the bundled ``simulated`` backend (no allocate
hook) and ``nvidia`` (an ``async def`` hook; real pynvml on the fake
``libnvidia-ml.so.1``, built here with gcc, scenario ``h100-8x.scn``), 2 of 8 devices,
as in bench_backends. No gRPC: what the handler itself costs per call, a steadier
signal on a loaded machine than a round trip (compare two trees in alternation)::

    python3 -m benchmarks._handler [CALLS]
    PYTHONPATH=/other/tree python3 -m benchmarks._handler   # the same for another tree

Not a bench_ module: its figures are a development aid, not for docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import sys
import time
from typing import Any

from benchmarks import ROOT

REPEATS = 5


async def rate(servicer: Any, request: Any, calls: int) -> float:
    """The best of REPEATS rounds, in calls per second."""
    for _ in range(calls // 10):  # warm-up
        await servicer.Allocate(request, None)
    best = 0.0
    for _ in range(REPEATS):
        t = time.perf_counter()
        for _ in range(calls):
            await servicer.Allocate(request, None)
        best = max(best, calls / (time.perf_counter() - t))
    return best


async def measure(calls: int) -> dict[str, float]:
    from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
    from hetero_dp.deviceplugin.servicer import DevicePluginServicer
    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    root = short_tempdir("hdp-handler-")
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    out: dict[str, float] = {}
    runner = PluginRunner(root / "dp")
    try:
        cases: list[tuple[str, Any, dict[str, Any]]] = [
            ("simulated", "simulated", {"simulated": {"count": 8}})
        ]
        if shutil.which("gcc"):
            from tests.nvidia.support import build_fake, make_node

            lib = ctypes.CDLL(str(build_fake(root / "lib")), mode=ctypes.RTLD_GLOBAL)
            fake = make_node(lib, root / "nv", "h100-8x.scn")
            os.environ["FAKE_NVML_SCENARIO"] = str(fake.scenario)
            cases.append(("nvidia", "nvidia", {"nvidia": fake.options}))
        for name, backend, options in cases:
            daemon = await runner.start(backend, options=options)
            res = next(iter(daemon.resources.values()))
            ids = sorted(d.id for d in res.state.devices)[:2]
            request = pb.AllocateRequest.FromString(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
                ).SerializeToString()
            )
            out[name] = await rate(
                DevicePluginServicer(res, daemon.front_end.session(res.name)), request, calls
            )
    finally:
        await runner.stop_all()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    sys.path.insert(0, str(ROOT))
    for name, per_s in asyncio.run(measure(calls)).items():
        print(f"{name}: {per_s:,.0f} calls/s ({1e6 / per_s:.1f} us per call)")


if __name__ == "__main__":
    main()
