"""An author's hook that fails says where: the plugin file and line it raised at (the
traceback at debug level), what shape was expected when it returned the wrong one; a
failure that repeats on every poll is logged once, then ever more rarely."""

from __future__ import annotations

import asyncio
import inspect
import logging
import subprocess
import threading
from pathlib import Path

import pytest

from hetero_dp import Device, hookimpl
from hetero_dp.engine.loading import load_backends
from hetero_dp.kits.logs import Repeats
from hetero_dp.model.errors import BackendError

RAISES = """import json

from hetero_dp import Device, hookimpl


def read_sysfs():
    raise OSError(5, "sysfs read failed")


@hookimpl
def discover():
    read_sysfs()
    return []
"""

LIBRARY = """import json

from hetero_dp import hookimpl


@hookimpl
def discover():
    return json.loads("{")
"""

SHAPES = """from hetero_dp import Device, hookimpl


@hookimpl
def discover():
    return Device("npu0", "acme.example.com/npu")
"""

FLAKY_HEALTH = """from hetero_dp import Device, hookimpl


@hookimpl
def discover():
    return [Device("npu0", "acme.example.com/npu")]


@hookimpl
def check_health(device):
    raise RuntimeError("health register unreadable")
"""


def plugin(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


def test_list_names_the_file_and_line_a_hook_raised_at(tmp_path, cli_env, hetero_dp_cmd):
    path = plugin(tmp_path, "sysfs_reader", RAISES)
    listed = subprocess.run(
        [*hetero_dp_cmd, "list", str(path)], env=cli_env, capture_output=True, text=True
    )
    assert listed.returncode == 1, listed.stderr
    assert "hook discover raised OSError(5, 'sysfs read failed')" in listed.stderr
    assert f"at {path}:7" in listed.stderr  # the raise in read_sysfs
    assert "configuration error" not in listed.stderr


async def test_a_library_error_names_the_authors_line_that_called_it(tmp_path):
    path = plugin(tmp_path, "jsonish", LIBRARY)
    (backend,) = load_backends([str(path)])
    with pytest.raises(BackendError) as e:
        await backend.call("discover")
    assert "raised JSONDecodeError" in str(e.value)
    assert str(e.value).endswith(f"at {path}:8")  # not json/decoder.py
    backend.close()


async def test_the_traceback_is_logged_at_debug_level(tmp_path, caplog):
    path = plugin(tmp_path, "sysfs_reader2", RAISES)
    (backend,) = load_backends([str(path)])
    with caplog.at_level(logging.DEBUG, logger="hetero_dp"), pytest.raises(BackendError):
        await backend.call("discover")
    backend.close()
    [record] = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert "read_sysfs" in caplog.text and "Traceback" in caplog.text
    assert isinstance(record.exc_info[1], OSError)


async def test_a_wrong_shape_says_what_was_expected_and_where_the_hook_is(tmp_path):
    path = plugin(tmp_path, "one_device", SHAPES)
    (backend,) = load_backends([str(path)])
    with pytest.raises(BackendError) as e:
        await backend.call("discover")
    backend.close()
    message = str(e.value)
    assert "discover returned one Device ('npu0')" in message
    assert "expected an iterable of Device" in message
    assert f"(hook discover defined at {path}:4)" in message


def test_repeats_are_logged_once_then_at_a_doubling_interval():
    now = [0.0]
    repeats = Repeats(first=60, longest=240, clock=lambda: now[0])
    shown = []
    for second in range(0, 1000, 10):  # a failure every 10 s, as a health poll
        now[0] = float(second)
        ok, left_out = repeats.check(("acme", "check_health", "npu0"))
        if ok:
            shown.append((second, left_out))
    assert shown == [(0, 0), (60, 5), (180, 11), (420, 23), (660, 23), (900, 23)]
    # another device is its own failure; a failure quiet for long starts over
    assert repeats.check(("acme", "check_health", "npu1")) == (True, 0)
    now[0] = 5000.0
    assert repeats.check(("acme", "check_health", "npu0")) == (True, 0)


async def test_a_health_check_failing_on_every_poll_logs_one_error(
    tmp_path, fake_kubelet, plugin_runner, caplog
):
    path = plugin(tmp_path, "flaky_health", FLAKY_HEALTH)
    daemon = await plugin_runner.start(str(path))
    with caplog.at_level(logging.DEBUG, logger="hetero_dp"):
        for _ in range(5):
            await daemon.poll_health()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "check_health raised RuntimeError('health register unreadable')" in (
        errors[0].getMessage()
    )
    assert f"at {path}:11" in errors[0].getMessage()
    repeats = [
        r for r in caplog.records if r.levelno == logging.DEBUG and "check_health" in r.getMessage()
    ]
    assert len(repeats) >= 4
    await fake_kubelet.wait_devices(
        "acme.example.com/npu", lambda d: "npu0" in d and d["npu0"].health == "Unhealthy"
    )
    assert "health register unreadable" in str(daemon.devices("acme.example.com/npu")[0].reason)


class HungHealth:
    """check_health never returns until released: in a worker thread, or on the loop."""

    hetero_dp_name = "hung"

    def __init__(self) -> None:
        self.release = threading.Event()

    @hookimpl
    def discover(self):
        return [Device("npu0", "acme.example.com/npu")]

    @hookimpl
    def check_health(self, device):
        self.release.wait()  # the register read never returns
        return True


class HungAsyncHealth(HungHealth):
    @hookimpl
    async def check_health(self, device):
        await asyncio.Event().wait()


@pytest.mark.parametrize("kind", [HungHealth, HungAsyncHealth])
async def test_a_health_check_hanging_on_every_poll_logs_one_error_naming_the_hook(
    fake_kubelet, plugin_runner, caplog, kind
):
    backend = kind()
    daemon = await plugin_runner.start(backend, config={"hookTimeout": 0.05})
    try:
        with caplog.at_level(logging.DEBUG, logger="hetero_dp"):
            for _ in range(4):
                await daemon.poll_health()
    finally:
        backend.release.set()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    line = inspect.getsourcelines(kind.check_health)[1]
    assert errors[0] == (
        "backend 'hung' hook check_health for npu0 timed out after 0.05s "
        f"(hook check_health defined at {__file__}:{line})"
    )
    await fake_kubelet.wait_devices(
        "acme.example.com/npu", lambda d: "npu0" in d and d["npu0"].health == "Unhealthy"
    )
