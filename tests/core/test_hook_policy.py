"""The one table of hook policy (hetero_dp.hookspecs.POLICY): a row for every hook
specification and none more, each naming a result check that exists, and the hook
runner doing what each row says (the threads, the timeout, what passes through, the
check of the result), so adding a hook is its specification and its row."""

from __future__ import annotations

import inspect
import threading

import pytest

from hetero_dp import Device, hookimpl, hookspecs
from hetero_dp.engine.hookrunner import HookRunner, hook_impls
from hetero_dp.engine.loading import new_manager
from hetero_dp.engine.results import CHECKS
from hetero_dp.model.errors import AllocationError, BackendError


def _specs() -> list[str]:
    found = [
        (inspect.getsourcelines(fn)[1], name)
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if getattr(fn, "hetero_dp_spec", None) is not None
    ]
    return [name for _, name in sorted(found)]


def test_every_hook_has_one_row_in_the_order_of_the_specs() -> None:
    assert list(hookspecs.POLICY) == _specs()


def test_every_row_names_a_check_that_exists() -> None:
    for hook, row in hookspecs.POLICY.items():
        assert row.result in ("", "caller") or row.result in CHECKS, hook
        assert row.runs in ("worker", "request", "thread", "loop", "start-up"), hook
        assert row.timeout in ("hookTimeout", "none") or row.timeout > 0, hook
        assert all(issubclass(e, Exception) for e in row.passes), hook


class Plain:
    """Plain (blocking) hooks: where each runs and what it raises follow its row."""

    def __init__(self) -> None:
        self.threads: dict[str, str] = {}

    @hookimpl
    def discover(self):
        self.threads["discover"] = threading.current_thread().name
        return [Device(id="d0", resource="example.com/x")]

    @hookimpl
    def allocate(self, devices, response):
        self.threads["allocate"] = threading.current_thread().name
        raise AllocationError("refused as documented")

    @hookimpl
    def labels(self, devices):
        raise AllocationError("not a refusal this hook may make")

    @hookimpl
    def links(self, devices):
        return 3  # not an iterable of Link


def _runner(plugin: object) -> HookRunner:
    pm = new_manager()
    pm.register(plugin, name="t")
    return HookRunner("t", hook_impls(plugin, pm), timeout=5)


async def test_the_runner_does_what_each_row_says() -> None:
    hooks = Plain()
    runner = _runner(hooks)
    try:
        assert await runner.call("discover") == [Device(id="d0", resource="example.com/x")]
        with pytest.raises(AllocationError, match="refused as documented"):
            await runner.call("allocate", devices=[], response=None)
        # "request" and "worker" rows: the kubelet's hooks have threads of their own
        assert hooks.threads["allocate"].startswith("hdp-t-req")
        assert (
            hooks.threads["discover"].startswith("hdp-t")
            and "req" not in (hooks.threads["discover"])
        )
        # passes: AllocationError passes for allocate, not for labels (row: nothing)
        with pytest.raises(BackendError, match="hook labels raised AllocationError"):
            await runner.call("labels", devices=[])
        # result: the row's check, naming where the hook is defined
        with pytest.raises(BackendError, match=r"links returned int 3.*\(hook links defined at"):
            await runner.call("links", devices=[])
        # a hook not implemented answers as its check reads None
        assert await runner.call("metrics", devices=[]) == []
        assert await runner.call("cdi_spec_edits", kind="k", devices=[]) == {}
        # timeouts: the row's seconds, else hookTimeout
        assert runner.limit("pre_start_container") == 30
        assert runner.limit("shutdown") == 5
        assert runner.limit("discover") == 5
        runner.timeout = 2
        assert runner.limit("discover") == 2
    finally:
        runner.close()
