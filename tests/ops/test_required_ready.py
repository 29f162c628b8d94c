"""Readiness held back while a resource a backend requires (its ``required_resources``
hook) has no device: /readyz over real HTTP, the ready file, the log line; ready once
a device of it is found (a watch event asking for rediscovery, or a rediscovery). A
resource no backend requires never holds readiness back.

Why (issue 37, seen on a real node): a new pod with no devices counted as ready, so a
surge roll of a rules typo stopped the working pod and left the node at allocatable 0.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from hetero_dp import hookimpl
from hetero_dp.ops import operations
from tests.core.scripted import Scripted, make_devices

from .helpers import http_get, port_of, scrape, value, wait_until

A = "example.com/a"  # required, absent at first
B = "example.com/b"  # served all along
C = "example.com/c"  # not required, never found

REASON = f"{A}: not ready: no device found, and backend 'scripted' requires one: the test needs it"


class Requiring(Scripted):
    required: object = {A: "the test needs it"}

    @hookimpl
    def required_resources(self) -> object:
        return self.required


def _config(tmp_path: Path) -> dict[str, object]:
    return {"metrics": {"address": "127.0.0.1:0", "readyFile": str(tmp_path / "ready")}}


async def _served(fake_kubelet, daemon, resource: str) -> None:
    """``resource`` is registered and its stream open: the front end's part is ready."""
    await fake_kubelet.wait_registered(resource)
    await wait_until(daemon, lambda: daemon.front_end.readiness()[0])


async def test_a_required_resource_without_devices_holds_readiness_until_one_appears(
    fake_kubelet, plugin_runner, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="hetero_dp.engine.daemon")
    backend = Requiring(make_devices(B, 2, prefix="b"))
    daemon = await plugin_runner.start(backend, config=_config(tmp_path))
    ready_file = Path(daemon.config.metrics.ready_file)
    await _served(fake_kubelet, daemon, B)

    status, body = await http_get(port_of(daemon), "/readyz")
    assert status == 503, body
    assert REASON in body and f"{B}: ready (2 devices)" in body
    ops = operations.of(daemon)
    assert ops is not None and ops.ready_file is not None
    assert ops.ready_file.update() is False and not ready_file.exists()
    said = [r for r in caplog.records if A in r.getMessage()]
    assert [(r.levelno, r.getMessage().split(";")[0]) for r in said] == [
        (logging.WARNING, REASON)
    ], said  # one line, however often the probes ask
    samples = await scrape(daemon)  # what the HeteroDPResourceNotReady alert reads
    assert value(samples, "hetero_dp_resource_ready", resource=A) == 0
    assert ("hetero_dp_resource_ready", (("resource", A),)) in samples
    assert ("hetero_dp_devices", (("resource", A),)) in samples
    assert value(samples, "hetero_dp_resource_ready", resource=B) == 1

    # hotplug: the backend's watch asks for a rediscovery, which finds the device
    backend.devices = backend.devices + make_devices(A, 1, prefix="a")
    assert await asyncio.to_thread(backend.watch_started.wait, 10), "the watch hook runs"
    backend.sinks[0].rediscover()
    await wait_until(daemon, ready_file.exists)
    status, body = await http_get(port_of(daemon), "/readyz")
    assert status == 200, body
    assert f"{A}: ready (1 devices)" in body and "not ready" not in body
    assert value(await scrape(daemon), "hetero_dp_resource_ready", resource=A) == 1
    found = [r.getMessage() for r in caplog.records if A in r.getMessage()][1:]
    assert found == [f"{A}: a device is found now; no longer holds readiness back"]

    # gone again (unplugged): not ready, said once more; back with a rediscovery
    backend.devices = make_devices(B, 2, prefix="b")
    await daemon.rediscover("scripted")
    assert daemon.readiness() == (False, [f"{B}: ready (2 devices)", REASON])
    await wait_until(daemon, lambda: not ready_file.exists())
    backend.devices = backend.devices + make_devices(A, 1, prefix="a")
    daemon.request_rediscover("scripted")
    await wait_until(daemon, ready_file.exists)
    assert daemon.readiness()[0]


async def test_an_unhealthy_device_counts(fake_kubelet, plugin_runner, tmp_path):
    """A device that fails its check still satisfies the requirement: a broken device
    must not stall rolling out a fix (its reason is in the log and in list)."""
    backend = Requiring(make_devices(A, 1))
    backend.unhealthy = {"dev0": "fan failed"}
    daemon = await plugin_runner.start(backend, config=_config(tmp_path))
    await _served(fake_kubelet, daemon, A)
    await daemon.poll_health()
    assert daemon.devices(A)[0].healthy is False
    assert daemon.readiness()[0], daemon.readiness()


async def test_a_resource_not_required_does_not_hold_readiness(
    fake_kubelet, plugin_runner, tmp_path
):
    """Only what the hook names counts: a backend requiring B (present) is ready
    though it never found C; one requiring nothing is ready with no device at all
    (the old behaviour, for backends without the hook)."""
    backend = Requiring(make_devices(B, 1, prefix="b"))
    backend.required = [B]  # names only: the reason has no "why"
    daemon = await plugin_runner.start(backend, config=_config(tmp_path))
    await _served(fake_kubelet, daemon, B)
    assert daemon.readiness() == (True, [f"{B}: ready (1 devices)"])
    assert C not in daemon.resources
    await wait_until(daemon, Path(daemon.config.metrics.ready_file).exists)
    await plugin_runner.stop(daemon)

    nothing = Requiring([])
    nothing.required = None
    daemon = await plugin_runner.start(nothing, config=_config(tmp_path))
    status, body = await http_get(port_of(daemon), "/readyz")
    assert (status, body) == (200, "no resources: no backend found devices\n")


async def test_a_bad_answer_stops_start_up_naming_the_hook(fake_kubelet, plugin_runner):
    import pytest

    from hetero_dp.model.errors import ConfigError

    backend = Requiring(make_devices(A, 1))
    backend.required = A  # a string, not a list of them
    with pytest.raises(ConfigError, match="required_resources returned str"):
        await plugin_runner.start(backend)


class Configured(Scripted):
    """Requires what its options say (``requires``), as the udev backend's expect."""

    requires: list[str] = []

    @hookimpl
    def configure(self, options: dict) -> None:
        self.requires = list(options.get("requires", []))

    @hookimpl
    def required_resources(self) -> list[str]:
        return self.requires


async def test_a_reload_that_requires_a_missing_resource_makes_it_unready_and_back(
    fake_kubelet, plugin_runner, caplog
):
    from hetero_dp.engine.config import load_config

    caplog.set_level(logging.INFO, logger="hetero_dp.engine.daemon")
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "backends": {"scripted": {"requires": [B]}},
    }
    daemon = await plugin_runner.start(Configured(make_devices(B, 1, prefix="b")), config=doc)
    await _served(fake_kubelet, daemon, B)
    assert daemon.readiness()[0]

    doc["backends"]["scripted"]["requires"] = [B, A]
    await daemon.apply_config(load_config(raw=doc, env={}))
    why = f"{A}: not ready: no device found, and backend 'scripted' requires one"
    assert daemon.readiness() == (False, [f"{B}: ready (1 devices)", why])

    doc["backends"]["scripted"]["requires"] = [B]
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert daemon.readiness() == (True, [f"{B}: ready (1 devices)"])
    said = [(r.levelno, r.getMessage()) for r in caplog.records if A in r.getMessage()]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO], said
    assert said[1][1] == f"{A}: no longer required; no longer holds readiness back"
