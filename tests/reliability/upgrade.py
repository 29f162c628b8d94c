"""Rolling a DaemonSet of the plugin, as the kubelet sees it: shared by the upgrade
tests of every bundled backend.

Two orders, as a DaemonSet's rolling update does them:

- ``default`` (``maxUnavailable: 1``): the old pod is stopped, then the new one
  started;
- ``surge`` (``maxSurge: 1, maxUnavailable: 0``): the new pod starts beside the old
  one, and the old one is stopped once the new one is ready.

Each instance is a real daemon serving over real unix sockets to the FakeKubelet,
which behaves as the kubelet 1.32 device manager does for a second registration and
for the end of an old stream (see hetero_dp/testing/fake_kubelet/clients.py). What is
checked is what the kubelet saw, as events: which healthy counts it went through,
which Registers it got, which pods it admitted. How long a dip lasts is measured in
benchmarks/bench_upgrade.py; here a surge dip is only bounded (HANDOVER_BOUND), so
that a hand-over that waits (the earlier 1 s lost-stream timer) fails.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_dp.kits import observe
from hetero_dp.ops import operations
from hetero_dp.testing import AdmissionError, FakeKubelet, PluginRunner
from tests.ops.helpers import wait_until

ORDERS = ("default", "surge")
HANDOVER_BOUND = 0.5  # seconds: the longest surge dip a test accepts (goal: 50 ms)


@dataclass
class Rollout:
    order: str
    old_socket: Path
    new_socket: Path
    counts: list[int]  # healthy counts the kubelet went through from the start
    capacities: list[int]
    failed_admissions: list[str]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    old: Any = None  # the daemons
    new: Any = None
    since: float = 0.0  # when the rollout began (the kubelet's monotonic clock)

    def registered(self, socket: Path) -> list[dict[str, Any]]:
        """The ``registered`` events of the instance serving ``socket``."""
        return [f for e, f in self.events if e == "registered" and f.get("socket") == str(socket)]


def _serving(kubelet: FakeKubelet, resource: str, socket: Path, count: int) -> bool:
    res = kubelet.resources.get(resource)
    return (
        res is not None
        and res.endpoint == str(socket)
        and res.current
        and res.stream_open
        and res.messages > 0
        and res.allocatable == count
    )


async def roll(
    kubelet: FakeKubelet,
    runner: PluginRunner,
    start: Callable[[], Awaitable[Any]],
    resource: str,
    count: int,
    order: str,
    ready: Callable[[Any], bool] | None = None,
) -> Rollout:
    """Start an old instance, roll it to a new one in ``order``, and report what the
    kubelet saw. Pods are admitted before, between and after the steps. ``ready`` is
    the new pod's readiness probe (default: its /readyz, ``daemon.readiness()``)."""
    events: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = observe.subscribe(lambda e, f: events.append((e, dict(f))))
    failed: list[str] = []

    async def admit() -> None:
        try:
            ids = await kubelet.admit(resource)
            kubelet.release(ids)
        except AdmissionError as e:
            failed.append(str(e))

    try:
        old = await start()
        old_socket = old.front_end.endpoints[resource].socket_path
        await kubelet.wait_for(lambda: _serving(kubelet, resource, old_socket, count), 30)
        await admit()
        since = time.monotonic()
        capacities: list[int] = []
        if order == "surge":
            new = await start()  # beside the old one
            new_socket = new.front_end.endpoints[resource].socket_path
            await kubelet.wait_for(lambda: _serving(kubelet, resource, new_socket, count), 30)
            # the new pod's readiness probe passes (registered and advertising): only
            # now does a surge rollout stop the old one
            if ready is None:
                passed, lines = new.readiness()
                assert passed, lines
            else:
                await wait_until(new, lambda: ready(new), timeout=10)
            await admit()
            capacities.append(kubelet.resources[resource].capacity)
            await runner.stop(old)
        else:
            await runner.stop(old)
            capacities.append(kubelet.resources[resource].capacity)
            new = await start()
            new_socket = new.front_end.endpoints[resource].socket_path
        await kubelet.wait_for(lambda: _serving(kubelet, resource, new_socket, count), 30)
        await admit()
        capacities.append(kubelet.resources[resource].capacity)
        return Rollout(
            order,
            old_socket,
            new_socket,
            kubelet.healthy_counts(resource, since),
            capacities,
            failed,
            events,
            old,
            new,
            since,
        )
    finally:
        unsubscribe()


def check(rollout: Rollout, kubelet: FakeKubelet, resource: str, count: int) -> None:
    """What every rollout must show, whatever the backend."""
    assert rollout.failed_admissions == [], rollout.failed_admissions
    assert rollout.old_socket != rollout.new_socket, "each instance has its own socket"
    assert rollout.new_socket.exists(), "the old instance's exit removed the new one's socket"
    assert not rollout.old_socket.exists(), "the old instance left its socket behind"
    assert rollout.capacities == [count] * len(rollout.capacities)
    assert rollout.counts[-1] == count
    zeros = [i for i, n in enumerate(rollout.counts) if n == 0]
    if rollout.order == "surge":
        # kubelet 1.32: the old stream's end disconnects the new (current) client,
        # once; the new instance registers again at once (a hand-over), not after
        # its lost-stream timer and not through a restart of its server
        assert len(zeros) <= 1, rollout.counts
        if zeros:
            assert kubelet.disconnects[-1] == (
                resource,
                str(rollout.old_socket),
                str(rollout.new_socket),
            )
            reasons = [f["reason"] for f in rollout.registered(rollout.new_socket)]
            assert reasons == ["start", "handover"], reasons
            # at once: ~25 ms (benchmarks/bench_upgrade.py); a 1 s lost-stream timer, or
            # a first hand-over that waits, shows here (0.5 s: room for a loaded machine)
            windows = kubelet.zero_windows(resource, rollout.since)
            assert max(windows) < HANDOVER_BOUND, windows
    else:
        # the old stream's end takes the resource to zero until the new one registers
        assert len(zeros) == 1, rollout.counts
        assert [f["reason"] for f in rollout.registered(rollout.new_socket)] == ["start"]


class HostNetwork:
    """Pods in the host network, as the udev DaemonSet runs them: every instance binds
    the same metrics port (``waitForPort``: the new pod's is held by the old one until
    it exits), and a pod's readiness probe reads its own ready file (an exec probe),
    since /readyz on the shared port answers for whichever instance holds it."""

    def __init__(self, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.tmp = tmp
        self.pods = 0

    def config(self) -> dict[str, Any]:
        """The config of the next pod (its own emptyDir for the ready file)."""
        self.pods += 1
        ready = self.tmp / f"pod-{self.pods}" / "ready"
        address = f"127.0.0.1:{self.port}"
        return {"metrics": {"address": address, "waitForPort": True, "readyFile": str(ready)}}

    @staticmethod
    def ready_file(daemon: Any) -> Path:
        return Path(daemon.config.metrics.ready_file)

    def ready(self, daemon: Any) -> bool:
        return self.ready_file(daemon).exists()

    async def check(self, rollout: Rollout) -> None:
        """The new instance serves the shared port once the old one is gone, and only
        its ready file is left."""
        server = operations.of(rollout.new).server
        assert server is not None
        await wait_until(rollout.new, lambda: server.serving, timeout=10)
        assert server.port == self.port
        assert self.ready(rollout.new)
        assert not self.ready(rollout.old)
