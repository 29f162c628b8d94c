"""The three jobs of a Backend, each without a daemon: running hooks (HookRunner),
checking what they return (results), binding options (OptionBinder)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest

from hetero_dp import Device, Link, hookimpl, option
from hetero_dp.engine import results
from hetero_dp.engine.binding import OptionBinder
from hetero_dp.engine.hookrunner import HookRunner, hook_impls
from hetero_dp.engine.loading import new_manager
from hetero_dp.model.errors import AllocationError, BackendError, ConfigError


def runner_for(plugin: object, timeout: float = 5.0) -> HookRunner:
    pm = new_manager()
    pm.register(plugin, name="t")
    return HookRunner("t", hook_impls(plugin, pm), timeout=timeout)


class Hooks:
    def __init__(self) -> None:
        self.threads: dict[str, int] = {}
        self.release = threading.Event()

    @hookimpl
    async def allocate(self, devices, response) -> None:
        self.threads["allocate"] = threading.get_ident()
        if devices == ["refuse"]:
            raise AllocationError("no")

    @hookimpl
    def discover(self):
        self.threads["discover"] = threading.get_ident()
        yield Device(id="d0", resource="example.com/x")

    @hookimpl
    def check_health(self, device):
        self.release.wait(10)
        return True

    @hookimpl
    async def labels(self, devices):
        await asyncio.Event().wait()  # never returns


async def test_async_hook_runs_on_the_loop_and_a_blocking_one_in_a_thread() -> None:
    hooks = Hooks()
    runner = runner_for(hooks)
    try:
        await runner.call("allocate", devices=[], response=None)
        assert await runner.call("discover") == [Device(id="d0", resource="example.com/x")]
        assert hooks.threads["allocate"] == threading.get_ident()  # no thread hop
        assert hooks.threads["discover"] != threading.get_ident()
        with pytest.raises(AllocationError):  # a refusal of the kubelet's hook passes as is
            await runner.call("allocate", devices=["refuse"], response=None)
    finally:
        runner.close()


async def test_async_hook_is_under_the_same_timeout() -> None:
    runner = runner_for(Hooks(), timeout=0.05)
    try:
        with pytest.raises(BackendError, match=r"hook labels timed out after 0\.05s"):
            await runner.call("labels", devices=[])
    finally:
        runner.close()


async def test_a_stuck_blocking_call_is_not_started_again_for_its_key() -> None:
    hooks = Hooks()
    runner = runner_for(hooks, timeout=0.05)
    returned = threading.Event()
    runner.on_returned = lambda hook, key: returned.set()
    try:
        with pytest.raises(BackendError, match="timed out"):
            await runner.call("check_health", key="d0", device=None)
        with pytest.raises(BackendError, match="check_health for d0 has not returned"):
            await runner.call("check_health", key="d0", device=None)
        hooks.release.set()
        assert await asyncio.to_thread(returned.wait, 10)
        assert runner.still_stuck("check_health", "d0", 0.05) is None
    finally:
        hooks.release.set()
        runner.close()


def test_results_name_the_backend_and_what_came_back() -> None:
    d = Device(id="a", resource="example.com/x")
    assert results.devices("b", "discover", None) == []
    with pytest.raises(BackendError, match=r"discover returned duplicate IDs: \['a'\]"):
        results.devices("b", "discover", [d, d])
    with pytest.raises(BackendError, match="items that are not Device: str 'a'"):
        results.devices("b", "discover", ["a"])
    with pytest.raises(BackendError, match=r"returned one Device \('a'\); expected an iterable"):
        results.devices("b", "discover", d)
    assert results.health_verdict("b", "check_health", (False, 3)) == (False, "3")
    assert results.health_verdict("b", "check_health", "gone") == (False, "gone")
    with pytest.raises(BackendError, match="check_health returned 7"):
        results.health_verdict("b", "check_health", 7)
    assert results.links("b", "links", [Link("a", "b", 1)]) == [Link("a", "b", 1)]
    with pytest.raises(BackendError, match="labels returned list"):
        results.labels("b", "labels", [])
    with pytest.raises(BackendError, match="cdi_spec_edits returned str"):
        results.mapping("b", "cdi_spec_edits", "x")
    with pytest.raises(ConfigError, match="parse_args returned int"):
        results.parsed_args("b", "parse_args", 1)


@dataclass(frozen=True)
class Opts:
    device_glob: str = option("/dev/x*", help="nodes")


def test_binder_reads_declared_options_and_names_the_field() -> None:
    def configure(options: Opts) -> None: ...

    binder = OptionBinder("acme", configure)
    assert binder.read({"deviceGlob": "/dev/y*"}) == Opts("/dev/y*")
    with pytest.raises(ConfigError) as e:
        binder.read({"deviceGlb": "/dev/y*"}, source="/etc/hdp.yaml")
    assert e.value.field == "backends.acme.deviceGlb" and e.value.source == "/etc/hdp.yaml"
    assert "did you mean 'deviceGlob'?" in str(e.value)


def test_binder_refuses_options_for_a_backend_that_takes_none() -> None:
    binder = OptionBinder("acme", None)
    assert binder.read({}) == {}
    with pytest.raises(ConfigError, match="takes no options") as e:
        binder.read({"x": 1})
    assert e.value.field == "backends.acme.x"


async def test_run_eagerly_returns_a_hook_that_never_waits_without_a_loop_turn() -> None:
    from hetero_dp.engine.hookrunner import run_eagerly

    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.ensure_future(count_turns())
    await asyncio.sleep(0)
    before = turns

    async def quick() -> str:
        return "done"

    assert await run_eagerly(quick(), 1.0) == "done"
    assert turns == before  # the loop did not turn: no task, no timer
    runner = runner_for(Hooks())  # and so does an async def hook called by the runner
    try:
        await runner.call("allocate", devices=[], response=None)
        assert turns == before
    finally:
        runner.close()
    counter.cancel()


async def test_run_eagerly_goes_on_under_the_timeout_once_the_hook_waits() -> None:
    from hetero_dp.engine.hookrunner import run_eagerly

    cleaned = asyncio.Event()

    async def waits(gate: asyncio.Event) -> str:
        await asyncio.sleep(0)
        await gate.wait()
        return "after"

    async def hangs() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()  # cancelled at the timeout, and unwound before the error

    async def raises() -> None:
        await asyncio.sleep(0)
        raise ValueError("refused")

    gate = asyncio.Event()
    asyncio.get_running_loop().call_soon(gate.set)
    assert await run_eagerly(waits(gate), 5.0) == "after"
    with pytest.raises(asyncio.TimeoutError):
        await run_eagerly(hangs(), 0.05)
    assert cleaned.is_set()
    with pytest.raises(ValueError, match="refused"):
        await run_eagerly(raises(), 5.0)


def test_an_entry_point_naming_a_module_gets_its_plugin_instance(tmp_path, monkeypatch) -> None:
    # metadata installed before the bundled backends named their instances
    # (udev = "hetero_dp_udev.backend") still loads the backend, not a hookless module
    pytest.importorskip("hetero_dp_udev")
    from hetero_dp_udev import backend as udev_module

    from hetero_dp.engine.loading import resolve

    dist = tmp_path / "stale_udev-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Name: stale-udev\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hetero_dp]\nstale_udev = hetero_dp_udev.backend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    name, plugin = resolve("stale_udev")
    assert name == "stale_udev" and plugin is udev_module.plugin
