"""Bad inputs cost attribution of that item only, with one log line each: the
pod-resources socket missing, slow, answering garbage or RESOURCE_EXHAUSTED; the
checkpoint unusable; PIDs that vanished. Against the fake kubelet's real
pod-resources server on a unix socket and real files."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time

import pytest

from hetero_dp import Device, ProcessUsage
from hetero_dp.testing.fake_kubelet.podresources import PodResourcesServer
from hetero_dp.testing.fake_kubelet.pods import FakeContainer, FakePod, write_checkpoint
from hetero_dp.testing.runner import short_tempdir
from hetero_dp.usage.attribution import Attribution, Settings
from hetero_dp.usage.view import Inventory

from .test_attribution import put_process

RES = "example.com/acme"
GPU = Device("acme0", RES, attributes={"memoryMiB": 1024})
INV = Inventory({RES: {"acme0::0": GPU, "acme0::1": GPU}})


def pod(name: str, device: str) -> FakePod:
    return FakePod(name, containers=[FakeContainer("c", {RES: [device]})])


class Node:
    """A pod-resources server, a checkpoint and a /proc in one short temp dir."""

    def __init__(self) -> None:
        self.root = short_tempdir()
        self.pods = [pod("a", "acme0::0"), pod("b", "acme0::1")]
        self.server = PodResourcesServer(
            self.root / "pr" / "kubelet.sock", lambda: list(self.pods), lambda: {}
        )
        self.proc = self.root / "proc"
        self.checkpoint = self.root / "kubelet_internal_checkpoint"
        write_checkpoint(self.root, self.pods, {RES: ["acme0::0", "acme0::1"]})
        for n, p in enumerate(self.pods):
            put_process(self.proc, 100 + n, p.uid)

    def attribution(self, deadline: float = 2.0) -> Attribution:
        a = Attribution(Settings(str(self.server.path), str(self.proc), str(self.checkpoint)))
        a.client.deadline = deadline
        return a


USAGE = [ProcessUsage("acme0", 100, 600 << 20), ProcessUsage("acme0", 101, 100 << 20)]


@pytest.fixture
async def node():
    n = Node()
    try:
        await n.server.start()
        yield n
    finally:
        await n.server.stop()
        shutil.rmtree(n.root, ignore_errors=True)


def lines(caplog, level=logging.INFO):
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


async def test_one_list_per_refresh_and_none_while_nothing_changed(node):
    a = node.attribution()
    for _ in range(20):
        view = await a.refresh(INV, USAGE)
        assert view is not None and len(view.uses) == 2
    assert node.server.calls == 1  # within a second, the checkpoint unchanged
    node.pods.pop()  # pod b leaves: the kubelet rewrites the checkpoint
    write_checkpoint(node.root, node.pods, {})
    view = await a.refresh(INV, USAGE)
    assert node.server.calls == 2
    assert [h.owner.pod for h in view.holders] == ["a"]


async def test_socket_missing_then_back(node, caplog):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    a = node.attribution()
    await node.server.stop()
    assert await a.refresh(INV, USAGE) is None
    a.client.min_gap = 0
    assert await a.refresh(INV, USAGE) is None
    off = [m for m in lines(caplog) if "attribution off" in m]
    assert len(off) == 1 and "no pod-resources socket at" in off[0]
    await node.server.start()
    assert (await a.refresh(INV, USAGE)) is not None
    assert sum("attribution on" in m for m in lines(caplog)) == 1


async def test_a_slow_kubelet_costs_that_scrape_only(node, caplog):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    node.server.hold = asyncio.Event()
    a = node.attribution(deadline=0.3)
    started = time.monotonic()
    assert await a.refresh(INV, USAGE) is None
    assert time.monotonic() - started < 5
    assert any("DEADLINE_EXCEEDED" in m for m in lines(caplog))
    node.server.hold.set()
    a.client.min_gap = 0
    assert await a.refresh(INV, USAGE) is not None


async def test_garbage_from_the_socket_turns_attribution_off_with_one_line(node, caplog):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    node.server.garbage = True
    a = node.attribution()
    a.client.min_gap = 0
    assert await a.refresh(INV, USAGE) is None
    assert await a.refresh(INV, USAGE) is None
    off = [m for m in lines(caplog) if "attribution off" in m]
    assert len(off) == 1 and "no ListPodResourcesResponse" in off[0]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_resource_exhausted_answers_from_a_recent_list_or_not_at_all(node, caplog):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    a = node.attribution()
    a.client.min_gap = 0
    assert await a.refresh(INV, USAGE) is not None
    node.server.bucket.rate, node.server.bucket.tokens = 0.0, 0.0  # another client's burst
    view = await a.refresh(INV, USAGE)
    assert view is not None and len(view.holders) == 2  # the list of a moment ago
    assert node.server.refused == 1
    fresh = node.attribution()
    assert await fresh.refresh(INV, USAGE) is None
    assert any("RESOURCE_EXHAUSTED" in m for m in lines(caplog))


@pytest.mark.parametrize("bad", ["missing", "truncated", "huge", "other shape"])
async def test_an_unusable_checkpoint_costs_the_usage_not_the_holders(node, caplog, bad):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    good = node.checkpoint.read_bytes()
    if bad == "missing":
        node.checkpoint.unlink()
    elif bad == "truncated":
        node.checkpoint.write_bytes(good[: len(good) // 2])
    elif bad == "huge":
        with open(node.checkpoint, "ab") as f:
            f.truncate(9 * 1024 * 1024)
    else:
        node.checkpoint.write_text('{"Data": {"PodDeviceEntries": {"v2": []}}}')
    a = node.attribution()
    a.client.min_gap = 0
    for _ in range(2):
        view = await a.refresh(INV, USAGE)
        assert view is not None and len(view.holders) == 2 and view.uses == []
        assert view.unattributed == 2
    warned = [m for m in lines(caplog, logging.WARNING) if "checkpoint" in m]
    assert len(warned) == 1, warned
    node.checkpoint.write_bytes(good)
    view = await a.refresh(INV, USAGE)
    assert len(view.uses) == 2
    assert any("reads again" in m for m in lines(caplog))


async def test_a_vanished_pid_costs_its_own_usage(node, caplog):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    a = node.attribution()
    usage = [*USAGE, ProcessUsage("acme0", 999, 1 << 20)]  # gone before /proc was read
    view = await a.refresh(INV, usage)
    assert {u.owner.pod for u in view.uses} == {"a", "b"}
    assert view.unattributed == 1
    a.client.min_gap = 0
    await a.refresh(INV, usage)
    gone = [m for m in lines(caplog) if "ended before" in m]
    assert len(gone) == 1 and "999" in gone[0]


async def test_anything_unforeseen_costs_the_refresh_not_the_scrape(node, caplog):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    a = node.attribution()
    a.client.min_gap = 0
    broken = Inventory(INV.records)
    broken.replicas = None  # type: ignore[assignment]  # a state nothing expects
    for _ in range(2):
        assert await a.refresh(broken, USAGE) is None
    errors = [m for m in lines(caplog, logging.ERROR) if "attribution failed" in m]
    assert len(errors) == 1, errors
    assert (await a.refresh(INV, USAGE)) is not None


async def test_two_scrapes_at_once_refresh_one_after_the_other(node):
    a = node.attribution()
    views = await asyncio.gather(*(a.refresh(INV, USAGE) for _ in range(5)))
    assert all(v is not None and len(v.uses) == 2 for v in views)
    assert node.server.calls == 1
