"""A call given up on keeps no memory once it returns (issue #29): a hook that timed
out on 1,000,000 devices left its (idle) worker thread holding 555 MB, the last
call's arguments and result, until that thread's next call."""

from __future__ import annotations

import gc
import threading
import weakref

from hetero_dp.engine.workers import WorkerPool


class Big(list):
    """A weakref-able stand-in for a million device records."""


def test_a_stranded_call_that_returns_keeps_neither_its_arguments_nor_its_result():
    release, started = threading.Event(), threading.Event()
    pool = WorkerPool("test-mem", 1, 4)
    argument = Big(range(1000))
    seen: dict[str, weakref.ref] = {"argument": weakref.ref(argument)}

    def hook(devices: Big) -> Big:
        started.set()
        release.wait(10)
        result = Big(devices)
        seen["result"] = weakref.ref(result)
        return result

    future = pool.submit(hook, argument)
    del argument
    assert started.wait(10)
    pool.strand(future)  # given up on, as past hookTimeout
    release.set()
    assert future.result(10) is not None
    del future
    gc.collect()
    assert seen["argument"]() is None, "the idle worker still holds the call's arguments"
    assert seen["result"]() is None, "the idle worker still holds the call's result"
    pool.shutdown()
