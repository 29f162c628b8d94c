"""A backend with 10,000 devices whose health is polled: for bench_health_scale.

The count comes from HDP_BENCH_MANY (default 10,000). check_health does a little
work (a dict lookup and a string compare) as a sysfs read would, and always
answers healthy, so every poll is a full poll that changes nothing.
"""

from __future__ import annotations

import os

from hetero_dp import Device, hookimpl

COUNT = int(os.environ.get("HDP_BENCH_MANY", "10000"))
STATE = {f"many{i}": "ok" for i in range(COUNT)}


@hookimpl
def discover():
    return [Device(id=f"many{i}", resource="bench.example.com/many") for i in range(COUNT)]


@hookimpl
def check_health(device):
    return STATE.get(device.id) == "ok" or "state file says broken"
