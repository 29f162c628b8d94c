"""The memory guard of shared GPUs: metrics per GPU and per process, a log line and a
doctor warning when a time-sliced GPU is over 90 % used. NVML is the fake driver
(tests/fakenvml), read through real pynvml."""

from __future__ import annotations

import logging

from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp.allocation.sharing import advertise
from tests.ops.helpers import scrape

GPU = "nvidia.com/gpu"
MIB = 1 << 20
# tests/fakenvml/scenarios/v100-2x-pcie.scn: 16384 MiB each, 881 and 304 MiB used
PROCS = ("proc gpu=0 pid=4242 used=600", "proc gpu=0 pid=4343 used=-1")


def time_slicing(replicas: int = 4, devices: object = "all") -> dict[str, object]:
    entry = {"name": GPU, "replicas": replicas, "devices": devices}
    return {"timeSlicing": {"resources": [entry]}}


def started(node, sharing):
    b = NvidiaBackend(environ={})
    b.configure({**node.options, "sharing": sharing})
    physical = b.discover()
    return b, advertise(physical, b.options.sharing)


def by_name(samples):
    out: dict[str, list] = {}
    for s in samples:
        out.setdefault(s.name, []).append(s)
    return out


def test_shared_gpus_report_used_total_fair_share_and_processes(fake_node):
    node = fake_node("v100-2x-pcie.scn", *PROCS)
    b, advertised = started(node, time_slicing(devices=[0]))  # only GPU 0 is shared
    samples = by_name(b.metrics(advertised))
    b.shutdown()
    labels = {"gpu": "0", "UUID": node.uuid(0), "sharing_strategy": "time-slicing"}
    (used,) = samples["hetero_dp_shared_memory_used_bytes"]
    assert (dict(used.labels), used.value) == (labels, 881 * MIB)
    (total,) = samples["hetero_dp_shared_memory_total_bytes"]
    assert total.value == 16384 * MIB
    (fair,) = samples["hetero_dp_shared_memory_fair_share_bytes"]
    assert (fair.value, fair.labels["replicas"]) == (4096 * MIB, "4")
    # per process where NVML can tell: pid 4343's memory is "not available", left out
    procs = samples["hetero_dp_shared_memory_process_used_bytes"]
    assert [(p.labels["pid"], p.value) for p in procs] == [("4242", 600 * MIB)]
    # the process and its GPU, for the framework to add the process's pod
    assert [(p.pid, p.device_id) for p in procs] == [(4242, node.uuid(0))]


def test_unshared_gpus_have_no_guard_samples(fake_node):
    node = fake_node("v100-2x-pcie.scn", *PROCS)
    b, advertised = started(node, None)
    names = {s.name for s in b.metrics(advertised)}
    b.shutdown()
    assert not {n for n in names if n.startswith("hetero_dp_shared_memory")}
    assert "DCGM_FI_DEV_FB_USED" in names


def test_a_full_time_sliced_gpu_is_logged_once_and_its_recovery_too(fake_node, caplog):
    node = fake_node("v100-2x-pcie.scn")
    b, _ = started(node, time_slicing())
    gpu0 = next(d for d in b.discover() if d.id == node.uuid(0))
    caplog.set_level(logging.INFO, logger="hetero_dp_nvidia.memory")
    assert b.check_health(gpu0) is True
    assert not caplog.records
    node.lib.fake_nvml_set_value(0, b"used", 15000)  # 92 % of 16384 MiB
    assert b.check_health(gpu0) is True  # a warning, not a health verdict
    assert b.check_health(gpu0) is True
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (
        f"GPU 0 ({node.uuid(0)}) under time-slicing is 92 % used (15000 of 16384 MiB; "
        "4 replicas, a fair share is 4096 MiB each): its pods may fail to allocate memory"
    )
    node.lib.fake_nvml_set_value(0, b"used", 2000)
    b.check_health(gpu0)
    b.shutdown()
    assert len(caplog.records) == 2 and "back below 90 % used" in caplog.records[1].getMessage()


def test_doctor_warns_about_a_full_time_sliced_gpu(fake_node):
    node = fake_node("v100-2x-pcie.scn")
    node.lib.fake_nvml_reset()
    node.scenario.write_text(node.scenario.read_text().replace("used=881", "used=15500"))
    checks = {
        c.name: c
        for c in NvidiaBackend(environ={}).doctor({**node.options, "sharing": time_slicing()})
    }
    assert checks["gpu 0 shared memory"].status == "warn"
    assert "95 % used" in checks["gpu 0 shared memory"].message
    assert "MPS" in checks["gpu 0 shared memory"].fix
    assert checks["gpu 1 shared memory"].status == "pass"


def test_doctor_does_not_warn_under_mps(fake_node):
    node = fake_node("v100-2x-pcie.scn")
    node.lib.fake_nvml_reset()
    node.scenario.write_text(node.scenario.read_text().replace("used=881", "used=15500"))
    mps = {"mps": {"resources": [{"name": GPU, "replicas": 2}]}}
    checks = {c.name: c for c in NvidiaBackend(environ={}).doctor({**node.options, "sharing": mps})}
    assert checks["gpu 0 shared memory"].status == "pass"
    assert "mps replicas" in checks["gpu 0 shared memory"].message


async def test_guard_metrics_reach_the_metrics_endpoint(fake_kubelet, plugin_runner, fake_node):
    node = fake_node("v100-2x-pcie.scn", *PROCS)
    daemon = await plugin_runner.start(
        NvidiaBackend(environ={}),
        config={"sharing": time_slicing(2), "metrics": {"address": "127.0.0.1:0"}},
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 4)
    m = await scrape(daemon)
    labels = (("UUID", node.uuid(1)), ("gpu", "1"), ("sharing_strategy", "time-slicing"))
    assert m[("hetero_dp_shared_memory_used_bytes", labels)] == 304 * MIB
    gpu0 = (("UUID", node.uuid(0)), ("gpu", "0"), ("pid", "4242"))
    key = ("hetero_dp_shared_memory_process_used_bytes", (*gpu0, labels[2]))
    assert m[key] == 600 * MIB


def test_a_driver_without_the_v3_process_call_loses_only_the_per_process_view(fake_node):
    # pynvml resolves nvmlDeviceGetComputeRunningProcesses_v3 on first use and, for a
    # driver without that symbol, raises NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND = 13)
    # (pynvml _nvmlGetFunctionPointer), which its unversioned wrapper turns into
    # NVMLLibraryMismatchError (pynvml throwOnVersionMismatch) - not an NVMLError. The
    # fault makes the fake driver answer with that code, so the same exception arises.
    node = fake_node(
        "v100-2x-pcie.scn", *PROCS, "fault fn=nvmlDeviceGetComputeRunningProcesses_v3 err=13"
    )
    b, advertised = started(node, time_slicing(devices=[0]))
    samples = by_name(b.metrics(advertised))
    b.shutdown()
    assert samples["hetero_dp_shared_memory_used_bytes"][0].value == 881 * MIB
    assert "hetero_dp_shared_memory_fair_share_bytes" in samples
    assert "hetero_dp_shared_memory_process_used_bytes" not in samples
