"""Who uses which GPU, end to end: the NVIDIA backend under a daemon, NVML answered by the
fake driver (per-process memory and utilization), the fake kubelet's pod-resources API on
a real unix socket and its device checkpoint, a fake host /proc; then ``hetero-dp top``
and ``hetero-dp doctor`` read the same daemon."""

from __future__ import annotations

import asyncio

from click.testing import CliRunner
from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp.cli import main
from hetero_dp.engine.config import load_config
from hetero_dp.ops.doctor import DoctorSettings, run_doctor
from tests.ops.helpers import port_of, scrape

GPU = "nvidia.com/gpu"
MIB = 1 << 20
UUID = "GPU-872c92ea-6b84-48c8-9098-72a750a64652"
# one Tesla V100-PCIE-16GB (tests/fakenvml/scenarios/v100-2x-pcie.scn's first GPU)
ONE_GPU = (
    f'gpu uuid={UUID} name="Tesla V100-PCIE-16GB" minor=0 mem=16384 used=7000 cc=7.0 '
    "pci=00000000:07:00.0 pciid=0x1db410de numa=0 mig=0 migcap=0 sms=80 util=83"
)
HELD = "hetero_dp_device_allocation_info"
USED = "hetero_dp_container_memory_used_bytes"
UTIL = "hetero_dp_container_utilization_ratio"
FAIR = "hetero_dp_container_memory_fair_share_bytes"


def put_process(proc, pid: int, pod_uid: str, container_id: str) -> None:
    """A process of a pod in a fake host /proc: the cgroup v1 lines of the kubelet's
    cgroupfs driver, ``/kubepods/<qos>/pod<uid>/<container id>`` on every line
    (Kubernetes, "Configuring a cgroup driver"; proc(5), /proc/<pid>/cgroup)."""
    path = f"/kubepods/besteffort/pod{pod_uid}/{container_id}"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(
        f"12:memory:{path}\n11:devices:{path}\n1:name=systemd:{path}\n"
    )


async def serve(fake_kubelet, plugin_runner, node, proc, flags=None, **config):
    await fake_kubelet.serve_pod_resources()
    backend = NvidiaBackend(environ={})
    daemon = await plugin_runner.start(
        backend,
        config={
            "metrics": {"address": "127.0.0.1:0"},
            "attribution": {"procRoot": str(proc)},
            **config,
        },
        options={"nvidia": {**node.options, **(flags or {})}},
    )
    backend.monitor.wait_ms = 200
    return daemon


def per_pod(m, name):
    out = {}
    for (n, labels), v in m.items():
        if n == name:
            out[(dict(labels)["pod"], dict(labels)["device"])] = v
    return out


async def test_two_pods_on_one_time_sliced_gpu_show_their_own_usage(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    node = fake_node(
        "",
        ONE_GPU,
        "proc gpu=0 pid=4242 used=6000 sm=70",  # pod a: over its 4096 MiB share
        "proc gpu=0 pid=4343 used=1000 sm=20",  # pod b
        "proc gpu=0 pid=999 used=9 sm=1",  # a process of no pod the kubelet knows
    )
    proc = tmp_path / "proc"
    sharing = {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}}
    daemon = await serve(fake_kubelet, plugin_runner, node, proc, sharing=sharing)
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 4)
    a = await fake_kubelet.admit_pod("a", {"main": {GPU: 1}}, namespace="ml")
    b = await fake_kubelet.admit_pod("b", {"main": {GPU: 1}}, namespace="ml")
    put_process(proc, 4242, a.uid, "a" * 64)
    put_process(proc, 4343, b.uid, "b" * 64)
    (ra,), (rb,) = a.device_ids(), b.device_ids()
    assert {ra, rb} <= {f"{UUID}::{i}" for i in range(4)} and ra != rb

    m = await scrape(daemon)
    assert per_pod(m, HELD) == {("a", ra): 1, ("b", rb): 1}
    # each its own, not the GPU's total (7000 MiB) twice, and nobody gets pid 999's
    assert per_pod(m, USED) == {("a", ra): 6000 * MIB, ("b", rb): 1000 * MIB}
    assert per_pod(m, UTIL) == {("a", ra): 0.7, ("b", rb): 0.2}
    assert per_pod(m, FAIR) == {("a", ra): 4096 * MIB, ("b", rb): 4096 * MIB}
    # the memory guard's per-process series carry the process's pod (its Sample.pid)
    procs = {
        dict(labels)["pid"]: dict(labels).get("pod")
        for (n, labels), _ in m.items()
        if n == "hetero_dp_shared_memory_process_used_bytes"
    }
    assert procs == {"4242": "a", "4343": "b", "999": None}
    # the GPU is shared: its device-wide samples name no pod
    assert all(
        "pod" not in dict(labels) for (n, labels), _ in m.items() if n.startswith("DCGM_FI_DEV")
    )

    url = f"127.0.0.1:{port_of(daemon)}"
    result = await asyncio.to_thread(CliRunner().invoke, main, ["top", "--once", "--url", url])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split()[:5] == [GPU, UUID, "(4", "replicas)", "Healthy"]
    assert lines[1].split()[5:] == ["ml/a/main", "5.9", "GiB", "!", "70%"]
    assert lines[2].split() == ["ml/b/main", "1000.0", "MiB", "20%"]

    cfg = load_config(raw={"metrics": {"address": url}}, env={})
    findings = await asyncio.to_thread(
        lambda: asyncio.run(run_doctor(cfg, [], DoctorSettings(root=tmp_path)))
    )
    usage = [f for f in findings if f.step == "usage"]
    assert [(f.name, f.status) for f in usage] == [("ml/a", "warn")]  # b is not named
    assert f"container main uses 6000 MiB of {GPU} {ra}" in usage[0].message
    assert "fair share of 4096 MiB" in usage[0].message


async def test_the_holder_of_a_mig_device_gets_its_processes(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    node = fake_node(
        "a100-mig-mixed.scn",
        "proc gpu=1 pid=20 used=2048 gi=1 ci=0",  # GPU 1: 2x 3g.40gb, GPU instances 1, 2
        "proc gpu=1 pid=21 used=4096 gi=2 ci=0",
    )
    proc = tmp_path / "proc"
    daemon = await serve(fake_kubelet, plugin_runner, node, proc, flags={"migStrategy": "mixed"})
    res = "nvidia.com/mig-3g.40gb"
    await fake_kubelet.wait_devices(res, lambda d: len(d) == 2)
    pod = await fake_kubelet.admit_pod("m", {"cuda": {res: 1}}, namespace="ci")
    (held,) = pod.device_ids()
    gi = next(int(m["gi"]) for m in node.migs if m["uuid"] == held)
    pid = 20 if gi == 1 else 21
    put_process(proc, pid, pod.uid, "c" * 64)
    put_process(proc, 41 - pid, "0000-not-a-pod-the-kubelet-knows", "d" * 64)

    m = await scrape(daemon)
    assert per_pod(m, HELD) == {("m", held): 1}
    assert per_pod(m, USED) == {("m", held): (2048 if pid == 20 else 4096) * MIB}
    assert per_pod(m, UTIL) == {}  # NVML has no per-process utilization on MIG
    assert per_pod(m, FAIR) == {}  # a MIG device is not shared
    # dcgm-exporter's labels where they are true: the held MIG device's samples name
    # its holder, the free one's do not; so do a whole GPU's once a container holds it
    mig = {
        dict(labels)["MIG_UUID"]: dict(labels).get("pod")
        for (n, labels), _ in m.items()
        if n == "DCGM_FI_DEV_FB_USED" and "MIG_UUID" in dict(labels)
    }
    assert mig[held] == "m" and {mig[u] for u in node.mig_uuids(1) if u != held} == {None}
    whole = await fake_kubelet.admit_pod("w", {"main": {GPU: 1}}, namespace="ci")
    assert whole.device_ids() == [node.uuid(3)]
    m = await scrape(daemon)
    util = {
        dict(labels)["UUID"]: (dict(labels).get("pod"), dict(labels).get("container"))
        for (n, labels), _ in m.items()
        if n == "DCGM_FI_DEV_GPU_UTIL"
    }
    assert util[node.uuid(3)] == ("w", "main")
