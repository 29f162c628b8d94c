"""/metrics over real HTTP: values move with allocations, health flips and hook errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from hetero_dp import Device, Sample, hookimpl
from tests.core.scripted import Scripted, make_devices

from .helpers import expect_event, scrape, value, wait_ready

RES = "example.com/accel"
CONFIG = {"metrics": {"address": "127.0.0.1:0"}}


async def test_metrics_follow_allocations_and_health(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 3))
    daemon = await plugin_runner.start(backend, config=CONFIG)
    await fake_kubelet.wait_registered(RES)
    await wait_ready(daemon)
    m = await scrape(daemon)
    assert value(m, "hetero_dp_devices", resource=RES) == 3
    assert value(m, "hetero_dp_devices_healthy", resource=RES) == 3
    for dev in ("dev0", "dev1", "dev2"):  # one series per advertised device
        assert value(m, "hetero_dp_device_healthy", resource=RES, device=dev, reason="") == 1
    assert value(m, "hetero_dp_list_and_watch_streams", resource=RES) == 1
    assert value(m, "hetero_dp_resource_ready", resource=RES) == 1
    assert value(m, "hetero_dp_registrations_total", resource=RES, mode="classic") == 1
    assert value(m, "hetero_dp_allocations_total", resource=RES, code="OK") == 0

    await fake_kubelet.allocate(RES, ["dev0"])
    await fake_kubelet.allocate(RES, ["dev1", "dev2"])
    with pytest.raises(grpc.aio.AioRpcError):
        await fake_kubelet.allocate(RES, ["nope"])
    m = await scrape(daemon)
    assert value(m, "hetero_dp_allocations_total", resource=RES, code="OK") == 2
    assert value(m, "hetero_dp_allocations_total", resource=RES, code="INVALID_ARGUMENT") == 1
    assert value(m, "hetero_dp_allocation_errors_total", resource=RES, code="INVALID_ARGUMENT") == 1
    assert value(m, "hetero_dp_allocate_seconds_count", resource=RES) == 3
    assert value(m, "hetero_dp_allocate_seconds_sum", resource=RES) > 0

    assert backend.watch_started.wait(5)
    backend.sinks[0].set_health("dev1", False, "XID 79")
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev1"].healthy)
    m = await scrape(daemon)
    assert value(m, "hetero_dp_devices", resource=RES) == 3
    assert value(m, "hetero_dp_devices_healthy", resource=RES) == 2
    per_device = "hetero_dp_device_healthy"
    assert value(m, per_device, resource=RES, device="dev1", reason="XID 79") == 0
    assert (per_device, (("device", "dev1"), ("reason", ""), ("resource", RES))) not in m
    assert value(m, per_device, resource=RES, device="dev0", reason="") == 1
    transitions = "hetero_dp_health_transitions_total"
    assert value(m, transitions, resource=RES, health="unhealthy", reason="XID 79") == 1

    backend.sinks[0].set_health("dev1", True, "recovered")
    await fake_kubelet.wait_devices(RES, lambda d: d["dev1"].healthy)
    m = await scrape(daemon)
    assert value(m, "hetero_dp_devices_healthy", resource=RES) == 3
    assert value(m, transitions, resource=RES, health="healthy", reason="recovered") == 1
    assert value(m, transitions, resource=RES, health="unhealthy", reason="XID 79") == 1


async def test_hook_errors_and_kubelet_restarts_are_counted(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 2))
    daemon = await plugin_runner.start(backend, config=CONFIG)
    await fake_kubelet.wait_registered(RES)
    backend.health_error["dev0"] = RuntimeError("probe crashed")
    await daemon.poll_health()
    m = await scrape(daemon)
    assert value(m, "hetero_dp_hook_errors_total", backend="scripted", hook="check_health") == 1
    assert value(m, "hetero_dp_devices_healthy", resource=RES) == 1

    restarted = expect_event("kubelet_restart", lambda f: f["reason"] == "kubelet.sock created")
    await fake_kubelet.restart()
    await asyncio.wait_for(restarted, 10)
    await fake_kubelet.wait_registered(RES, after=1)
    await wait_ready(daemon)
    m = await scrape(daemon)
    assert value(m, "hetero_dp_kubelet_restarts_total") == 1
    assert value(m, "hetero_dp_socket_deletions_total") <= 1  # the fake deletes it, too
    assert value(m, "hetero_dp_registrations_total", resource=RES, mode="classic") == 2
    assert value(m, "hetero_dp_list_and_watch_opened_total", resource=RES) == 2


class WithSamples(Scripted):
    """Reports DCGM-style samples, one of them malformed; can be made to fail."""

    def __init__(self, devices: list[Device]) -> None:
        super().__init__(devices)
        self.fail = False
        self.temperature = 40.0

    @hookimpl
    def metrics(self, devices: list[Device]) -> list[Sample]:
        if self.fail:
            raise RuntimeError("NVML went away")
        out = [
            Sample("DCGM_FI_DEV_GPU_TEMP", self.temperature, {"gpu": str(d.index), "UUID": d.id})
            for d in devices
        ]
        out.append(Sample("bad name!", 1.0))
        out.append(Sample("hetero_dp_devices", 99.0))  # must not shadow ours
        return out


async def test_backend_samples_are_exported_fresh_on_every_scrape(fake_kubelet, plugin_runner):
    backend = WithSamples(make_devices(RES, 2))
    daemon = await plugin_runner.start(backend, config=CONFIG)
    await fake_kubelet.wait_registered(RES)
    m = await scrape(daemon)
    assert value(m, "DCGM_FI_DEV_GPU_TEMP", gpu="0", UUID="dev0") == 40.0
    assert value(m, "DCGM_FI_DEV_GPU_TEMP", gpu="1", UUID="dev1") == 40.0
    assert not any(name == "bad name!" for name, _ in m)
    assert value(m, "hetero_dp_devices", resource=RES) == 2  # not the backend's 99

    backend.temperature = 85.0
    m = await scrape(daemon)
    assert value(m, "DCGM_FI_DEV_GPU_TEMP", gpu="1", UUID="dev1") == 85.0

    backend.fail = True
    m = await scrape(daemon)  # a failing hook costs its samples, not the scrape
    assert not any(name == "DCGM_FI_DEV_GPU_TEMP" for name, _ in m)
    assert value(m, "hetero_dp_hook_errors_total", backend="scripted", hook="metrics") == 1
    assert value(m, "hetero_dp_devices", resource=RES) == 2


@pytest.mark.parametrize(("enabled", "where"), [(True, "file"), (None, "file"), (None, "relative")])
async def test_a_cdi_dir_that_can_never_work_exits_before_the_metrics_port_is_bound(
    plugin_runner, tmp_path, enabled, where
):
    """Issue #29: the metrics port was bound before a configuration error ended the
    start, and with cdi.enabled unset the dir was checked only when the first spec
    was needed. What is wrong without creating or writing anything (a relative dir, a
    file in its path) now stops start-up before any port is bound, whether or not a
    resource delivers by CDI. The test holds the port itself: had the daemon tried to
    bind it first, the error would be about the port, not about cdi.dir."""
    import socket

    from hetero_dp import ConfigError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    (tmp_path / "f").write_text("")
    cdi: dict[str, object] = {
        "dir": "relative/cdi" if where == "relative" else str(tmp_path / "f" / "cdi")
    }
    if enabled is not None:
        cdi["enabled"] = enabled
    raw = {"metrics": {"address": f"127.0.0.1:{port}"}, "cdi": cdi}
    try:
        with pytest.raises(ConfigError) as e:
            await plugin_runner.start(Scripted(make_devices(RES, 1)), config=raw)
    finally:
        holder.close()
    assert e.value.field == "cdi.dir"
    assert ("absolute" if where == "relative" else "is a file") in str(e.value)
