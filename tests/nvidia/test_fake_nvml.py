"""The fake libnvidia-ml.so.1 itself: ABI against pynvml, scenario loading, faults."""

from __future__ import annotations

import ctypes

import pynvml
import pytest


@pytest.mark.parametrize(
    ("c_name", "py_struct", "expected"),
    [
        ("nvmlPciInfo_t", pynvml.nvmlPciInfo_t, 68),
        ("nvmlMemory_t", pynvml.c_nvmlMemory_t, 24),
        ("nvmlMemory_v2_t", pynvml.c_nvmlMemory_v2_t, 40),
        ("nvmlUtilization_t", pynvml.c_nvmlUtilization_t, 8),
        ("nvmlDeviceAttributes_t", pynvml.c_nvmlDeviceAttributes, 40),
        ("nvmlEventData_t", pynvml.c_nvmlEventData_t, 32),
        ("nvmlGpuInstanceInfo_t", pynvml.c_nvmlGpuInstanceInfo_t, 24),
        ("nvmlGpuInstanceProfileInfo_t", pynvml.c_nvmlGpuInstanceProfileInfo_t, 48),
        ("nvmlProcessInfo_t", pynvml.c_nvmlProcessInfo_v3_t, 24),
        ("nvmlProcessUtilizationSample_t", pynvml.c_nvmlProcessUtilizationSample_t, 32),
    ],
)
def test_struct_sizes_match_pynvml(fake_nvml_lib, c_name, py_struct, expected):
    assert fake_nvml_lib.fake_nvml_sizeof(c_name.encode()) == ctypes.sizeof(py_struct) == expected


def test_pynvml_reads_the_scenario(fake_node):
    node = fake_node("h100-8x.scn")
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 8
        h = pynvml.nvmlDeviceGetHandleByIndex(3)
        assert pynvml.nvmlDeviceGetUUID(h) == node.uuid(3)
        assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        assert pynvml.nvmlDeviceGetPciInfo(h).busId == "00000000:4E:00.0"
        mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert mem.total == 81559 * 1024 * 1024
        assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    finally:
        pynvml.nvmlShutdown()


def test_mig_handles_answer_not_supported_like_real_nvml(fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    pynvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        assert pynvml.nvmlDeviceGetUUID(mig) == node.mig_uuids(0)[0]
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMinorNumber(mig)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(mig)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 5)
    finally:
        pynvml.nvmlShutdown()


def test_fault_after_n_calls_on_one_device(fake_node):
    fake_node("h100-8x.scn", "fault fn=nvmlDeviceGetTemperature dev=2 after=1 times=1 err=999")
    pynvml.nvmlInit()
    try:
        h2 = pynvml.nvmlDeviceGetHandleByIndex(2)
        h3 = pynvml.nvmlDeviceGetHandleByIndex(3)
        pynvml.nvmlDeviceGetTemperature(h2, 0)  # first call passes (after=1)
        pynvml.nvmlDeviceGetTemperature(h3, 0)  # another device is not affected
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetTemperature(h2, 0)
        pynvml.nvmlDeviceGetTemperature(h2, 0)  # times=1: only once
    finally:
        pynvml.nvmlShutdown()


def test_event_wait_wakes_on_injection(fake_node, fake_nvml_lib):
    fake_node("h100-8x.scn")
    pynvml.nvmlInit()
    try:
        es = pynvml.nvmlEventSetCreate()
        h = pynvml.nvmlDeviceGetHandleByIndex(5)
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        assert fake_nvml_lib.fake_nvml_inject_xid(5, 79) == 1
        assert fake_nvml_lib.fake_nvml_inject_xid(4, 79) == 0  # not registered
        data = pynvml.nvmlEventSetWait(es, 10_000)
        assert data.eventData == 79
        assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait(es, 1)
        pynvml.nvmlEventSetFree(es)
    finally:
        pynvml.nvmlShutdown()


def _procs(procs):
    return sorted((p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in procs)


def test_running_processes_plain_mps_and_per_mig_instance(fake_node):
    node = fake_node(
        "a100-mig-mixed.scn",
        "proc gpu=3 pid=10 used=100",
        "proc gpu=3 pid=11 used=-1 mps=1",
        "proc gpu=1 pid=20 used=200 gi=1 ci=0",
        "proc gpu=1 pid=21 used=300 gi=2 ci=0",
    )
    mib, none = 1 << 20, 0xFFFFFFFF
    pynvml.nvmlInit()
    try:
        whole = pynvml.nvmlDeviceGetHandleByIndex(3)
        # not available (all ones) reads as None in pynvml; no MIG: instance IDs all ones
        assert _procs(pynvml.nvmlDeviceGetComputeRunningProcesses(whole)) == [
            (10, 100 * mib, none, none)
        ]
        assert _procs(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(whole)) == [
            (11, None, none, none)
        ]
        # the v2 entry point answers alike (same layout)
        assert _procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(whole)) == [
            (10, 100 * mib, none, none)
        ]
        mig_gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert _procs(pynvml.nvmlDeviceGetComputeRunningProcesses(mig_gpu)) == [
            (20, 200 * mib, 1, 0),
            (21, 300 * mib, 2, 0),
        ]
        second = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 1)
        assert pynvml.nvmlDeviceGetUUID(second) == node.mig_uuids(1)[1]
        assert _procs(pynvml.nvmlDeviceGetComputeRunningProcesses(second)) == [
            (21, 300 * mib, 2, 0)
        ]
        assert (
            pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0)) == []
        )
    finally:
        pynvml.nvmlShutdown()


def test_process_utilization_since_a_timestamp(fake_node):
    node = fake_node(
        "a100-mig-mixed.scn",
        "proc gpu=3 pid=10 used=100 sm=40 memutil=7",
        "proc gpu=3 pid=11 used=100",  # never busy: no sample
        "proc gpu=1 pid=20 used=200 gi=1 ci=0 sm=50",
    )
    pynvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(3)
        (sample,) = pynvml.nvmlDeviceGetProcessUtilization(gpu, 0)
        assert (sample.pid, sample.smUtil, sample.memUtil) == (10, 40, 7)
        assert sample.timeStamp > 1_600_000_000 * 10**6  # microseconds since the epoch
        with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer
            pynvml.nvmlDeviceGetProcessUtilization(gpu, sample.timeStamp)
        assert node.lib.fake_nvml_set_proc_util(3, 11, 90, 1) == 1
        (newer,) = pynvml.nvmlDeviceGetProcessUtilization(gpu, sample.timeStamp)
        assert (newer.pid, newer.smUtil) == (11, 90)
        assert newer.timeStamp > sample.timeStamp
        mig_gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetProcessUtilization(mig_gpu, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetProcessUtilization(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0), 0
            )
    finally:
        pynvml.nvmlShutdown()


def test_a_fault_on_the_gpu_handle_only_spares_its_mig_devices(fake_node):
    fake_node(
        "a100-mig-mixed.scn",
        "proc gpu=1 pid=20 used=200 gi=1 ci=0",
        "fault fn=nvmlDeviceGetComputeRunningProcesses_v3 dev=1 migdev=-2 err=4",
    )
    pynvml.nvmlInit()
    try:
        mig_gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_NoPermission):
            pynvml.nvmlDeviceGetComputeRunningProcesses(mig_gpu)
        first = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0)
        assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(first)] == [20]
    finally:
        pynvml.nvmlShutdown()


def test_a_buffer_too_small_answers_insufficient_size_with_the_count(fake_node):
    """The count in/out protocol of the NVML API reference, called without pynvml's
    oversizing: a buffer of 1 for 2 processes (or samples) is INSUFFICIENT_SIZE (7) and
    the count comes back as 2."""
    fake_node(
        "v100-2x-pcie.scn",
        "proc gpu=0 pid=1 used=1 sm=10",
        "proc gpu=0 pid=2 used=2 sm=20",
    )
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        lib = pynvml.nvmlLib
        count = ctypes.c_uint(1)
        procs = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
        rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), procs)
        assert (rc, count.value) == (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 2)
        count = ctypes.c_uint(1)
        samples = (pynvml.c_nvmlProcessUtilizationSample_t * 1)()
        rc = lib.nvmlDeviceGetProcessUtilization(
            handle, samples, ctypes.byref(count), ctypes.c_ulonglong(0)
        )
        assert (rc, count.value) == (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 2)
        count = ctypes.c_uint(2)
        samples = (pynvml.c_nvmlProcessUtilizationSample_t * 2)()
        rc = lib.nvmlDeviceGetProcessUtilization(
            handle, samples, ctypes.byref(count), ctypes.c_ulonglong(0)
        )
        assert (rc, count.value) == (pynvml.NVML_SUCCESS, 2)
        assert sorted((s.pid, s.smUtil) for s in samples) == [(1, 10), (2, 20)]
    finally:
        pynvml.nvmlShutdown()
