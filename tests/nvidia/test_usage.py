"""The NVIDIA ``usage`` hook: per-process memory and SM share of whole GPUs, MIG devices
and replicas, through real pynvml against the fake driver (tests/fakenvml)."""

from __future__ import annotations

from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp import ProcessUsage
from hetero_dp.allocation.sharing import advertise

MIB = 1 << 20


def started(node, sharing=None, **options):
    b = NvidiaBackend(environ={})
    b.configure({**node.options, **options, "sharing": sharing})
    physical = b.discover()
    return b, advertise(physical, b.options.sharing)


def time_slicing(replicas: int = 4) -> dict[str, object]:
    return {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}


def by_pid(records):
    return {r.pid: r for r in records}


def test_a_whole_gpu_and_mig_devices(fake_node):
    node = fake_node(
        "a100-mig-mixed.scn",
        "proc gpu=3 pid=10 used=100 sm=40 memutil=7",  # GPU 3 is whole
        "proc gpu=1 pid=20 used=200 gi=1 ci=0",  # GPU 1: 2x 3g.40gb, GPU instances 1, 2
        "proc gpu=1 pid=21 used=300 gi=2 ci=0",
    )
    b, advertised = started(node, migStrategy="mixed")
    records = by_pid(b.usage(advertised))
    b.shutdown()
    assert records[10] == ProcessUsage(node.uuid(3), 10, 100 * MIB, 0.4)
    first, second = node.mig_uuids(1)
    # each process on the MIG device its GPU/compute instance names; no per-process
    # utilization on MIG (NOT_SUPPORTED): unknown, not 0
    assert records[20] == ProcessUsage(first, 20, 200 * MIB, None)
    assert records[21] == ProcessUsage(second, 21, 300 * MIB, None)
    assert set(records) == {10, 20, 21}


def test_two_processes_on_a_time_sliced_gpu_each_their_own(fake_node):
    node = fake_node(
        "v100-2x-pcie.scn",
        "proc gpu=0 pid=4242 used=600 sm=70",
        "proc gpu=0 pid=4343 used=-1 sm=20",  # memory not available: unknown
        "proc gpu=1 pid=5000 used=50",  # busy with nothing lately: no sample
    )
    b, advertised = started(node, time_slicing())
    assert {d.id for d in advertised} >= {f"{node.uuid(0)}::0", f"{node.uuid(0)}::3"}
    records = by_pid(b.usage(advertised))
    b.shutdown()
    # the device is the GPU, never a replica: the framework finds the replica held
    assert records[4242] == ProcessUsage(node.uuid(0), 4242, 600 * MIB, 0.7)
    assert records[4343] == ProcessUsage(node.uuid(0), 4343, None, 0.2)
    # GPU 1 answered NOT_FOUND (no sample since 0): its process's share is unknown
    assert records[5000] == ProcessUsage(node.uuid(1), 5000, 50 * MIB, None)


def test_utilization_is_what_is_new_since_the_last_call(fake_node):
    node = fake_node(
        "v100-2x-pcie.scn",
        "proc gpu=0 pid=1 used=10 sm=55",
        "proc gpu=0 pid=2 used=10 sm=5",
    )
    b, advertised = started(node)
    first = by_pid(b.usage(advertised))
    assert (first[1].utilization, first[2].utilization) == (0.55, 0.05)
    # nothing newer (NOT_FOUND) right after: the last shares are held, so a scrape and
    # hetero-dp top close together both see them
    again = by_pid(b.usage(advertised))
    assert (again[1].utilization, again[2].utilization) == (0.55, 0.05)
    # held no longer (hold 0): nothing new is unknown, not a stale copy
    b.usage_reader.hold_s = 0
    gone = by_pid(b.usage(advertised))
    assert (gone[1].utilization, gone[2].utilization) == (None, None)
    # a new sample of pid 2 only: pid 1 had no non-zero utilization in that period
    assert node.lib.fake_nvml_set_proc_util(0, 2, 90, 0) == 1
    later = by_pid(b.usage(advertised))
    b.shutdown()
    assert (later[1].utilization, later[2].utilization) == (0.0, 0.9)


def test_mps_clients_are_counted(fake_node):
    node = fake_node(
        "v100-2x-pcie.scn",
        "proc gpu=0 pid=7 used=32 mps=1",
        "proc gpu=0 pid=8 used=64",
    )
    b, advertised = started(node)
    records = by_pid(b.usage(advertised))
    b.shutdown()
    assert (records[7].memory_bytes, records[8].memory_bytes) == (32 * MIB, 64 * MIB)


def test_a_parent_that_refuses_is_asked_per_mig_device(fake_node):
    node = fake_node(
        "a100-mig-mixed.scn",
        "proc gpu=1 pid=20 used=200 gi=1 ci=0",
        "proc gpu=1 pid=21 used=300 gi=2 ci=0",
        # NO_PERMISSION on the GPU's own handle only (nvml.h: aggregate information in
        # MIG mode "only if the caller has appropriate privileges")
        "fault fn=nvmlDeviceGetComputeRunningProcesses_v3 dev=1 migdev=-2 err=4",
    )
    b, advertised = started(node, migStrategy="mixed")
    records = by_pid(b.usage(advertised))
    b.shutdown()
    first, second = node.mig_uuids(1)
    assert (records[20].device, records[21].device) == (first, second)


def test_only_the_devices_asked_about(fake_node):
    node = fake_node("v100-2x-pcie.scn", "proc gpu=0 pid=1 used=1", "proc gpu=1 pid=2 used=2")
    b, advertised = started(node)
    records = b.usage([d for d in advertised if d.id == node.uuid(1)])
    b.shutdown()
    assert [(r.device, r.pid) for r in records] == [(node.uuid(1), 2)]


def test_a_lost_gpu_costs_its_own_records_only(fake_node):
    node = fake_node("v100-2x-pcie.scn", "proc gpu=0 pid=1 used=1", "proc gpu=1 pid=2 used=2")
    b, advertised = started(node)
    node.lib.fake_nvml_set_lost(0, 1)
    records = b.usage(advertised)
    b.shutdown()
    assert [(r.device, r.pid) for r in records] == [(node.uuid(1), 2)]
