"""``hetero-dp demo``: a whole simulated node in one process.

A fake kubelet, the bundled ``simulated`` backend, registration, the device
table as the kubelet sees it, a health flip and its recovery, a preferred
allocation and an Allocate. Every step waits on an event with a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from typing import Any

from hetero_dp.model.errors import ConfigError
from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir
from hetero_dp.testing.fake_kubelet import FakeDevice

STEP_TIMEOUT = 10.0


def _table(devices: dict[str, FakeDevice]) -> str:
    lines = [f"    {'ID':<8} {'HEALTH':<10} NUMA"]
    for d in devices.values():
        numa = ",".join(str(n) for n in d.numa_nodes) or "-"
        lines.append(f"    {d.id:<8} {d.health:<10} {numa}")
    return "\n".join(lines)


async def run_demo(count: int = 4, echo: Callable[[str], Any] = print) -> int:
    logging.basicConfig(level=logging.ERROR)
    root = short_tempdir("hdp-demo-")
    kubelet = FakeKubelet(root / "device-plugins")
    runner = PluginRunner(kubelet.plugin_dir)
    try:
        await kubelet.start()
        echo(f"fake kubelet serving {kubelet.socket_path}")
        try:
            daemon = await runner.start("simulated", options={"simulated": {"count": count}})
        except ConfigError as e:
            echo(f"cannot start the simulated backend: {e}")
            echo("install it with: pip install -e vendors/simulated")
            return 1
        (resource,) = daemon.resources
        backend: Any = daemon.backends[0].plugin
        res = await kubelet.wait_registered(resource, timeout=STEP_TIMEOUT)
        echo(f"registered {resource} (options: {res.options})".replace("\n", " "))
        await kubelet.wait_devices(resource, lambda d: len(d) == count, STEP_TIMEOUT)
        echo(f"\nkubelet sees {res.capacity} devices, {res.allocatable} allocatable:")
        echo(_table(res.devices))

        victim = "sim1"
        backend.set_health(victim, False, "simulated XID 79: GPU has fallen off the bus")
        await kubelet.wait_devices(resource, lambda d: not d[victim].healthy, STEP_TIMEOUT)
        echo(f"\nhealth flip: {victim} reported unhealthy -> allocatable {res.allocatable}/{count}")
        echo(_table(res.devices))
        backend.set_health(victim, True, "recovered")
        await kubelet.wait_devices(resource, lambda d: d[victim].healthy, STEP_TIMEOUT)
        echo(f"recovery: {victim} healthy again -> allocatable {res.allocatable}/{count}")

        ids = list(res.devices)
        chosen = await kubelet.preferred_allocation(resource, ids, [ids[0]], 2)
        echo(f"\npreferred allocation of 2 containing {ids[0]}: {chosen}")
        alloc = await kubelet.allocate(resource, chosen)
        echo(f"allocated {chosen}:")
        echo(f"    env: {dict(alloc.envs)}")
        for spec in alloc.devices:
            echo(f"    device: {spec.host_path} -> {spec.container_path} ({spec.permissions})")
        echo("\ndemo finished: registration, streaming, health flip, recovery and allocation work")
        return 0
    except (TimeoutError, asyncio.TimeoutError) as e:  # two classes on 3.10, one from 3.11
        echo(f"demo step timed out: {e!r}")
        return 1
    finally:
        await runner.stop_all()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
