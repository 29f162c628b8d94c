"""MPS sharing in the NVIDIA backend: the daemon plan and limits, the manager against
the fake ``nvidia-cuda-mps-control`` (tests/nvidia/fake_mps_control.py), Allocate."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from hetero_dp_nvidia.backend import NvidiaBackend
from hetero_dp_nvidia.mps import Limits, MpsSettings, parse_mps_settings, plan_mps
from hetero_dp_nvidia.mps_daemon import MpsManager

from hetero_dp import ConfigError, ContainerResponse
from hetero_dp.allocation.sharing import advertise
from hetero_dp.testing import short_tempdir
from tests.nvidia.support import install_fake_mps_control, kill_fake_mps_daemons

GPU = "nvidia.com/gpu"
V100_MIB = 16384  # tests/fakenvml/scenarios/v100-2x-pcie.scn: mem=16384


def mps_sharing(replicas: int = 4, **extra: object) -> dict[str, object]:
    return {"mps": {"resources": [{"name": GPU, "replicas": replicas, **extra}]}}


@pytest.fixture
def mps_root() -> Iterator[Path]:
    # Asked for before plugin_runner by the tests that use both, so that it is removed
    # after the daemons stop (a stopping MPS manager writes there).
    # Short: the daemon's socket lives in <root>/<resource>/pipe, and unix socket
    # paths end at 108 bytes (pytest's tmp_path is too long for that).
    root = short_tempdir("mps")
    yield root
    kill_fake_mps_daemons(root)
    shutil.rmtree(root, ignore_errors=True)


def fast(control: Path) -> dict[str, object]:
    """Quick checks and retries; the fake control program, never a real one on PATH."""
    return {"checkInterval": 0.05, "backoff": 0.05, "maxBackoff": 0.2, "controlPath": str(control)}


def backend_for(node, mps_root: Path, sharing=None, **mps: object) -> NvidiaBackend:
    control = install_fake_mps_control(node.root / "driver")
    b = NvidiaBackend(environ={})
    b.configure(
        {
            **node.options,
            "mpsRoot": str(mps_root),
            "sharing": sharing or mps_sharing(),
            "mps": {**fast(control), **mps},
        }
    )
    return b


def commands(mps_root: Path, resource: str = GPU) -> list[str]:
    log = mps_root / resource / "log" / "fake-commands.log"
    return log.read_text().splitlines() if log.exists() else []


def daemon_pid(mps_root: Path, resource: str = GPU) -> int | None:
    pidfile = mps_root / resource / "pipe" / "fake-mps.pid"
    try:
        return int(pidfile.read_text())
    except (FileNotFoundError, ValueError):
        return None


# --- the plan ---------------------------------------------------------------------------


def test_limits_default_to_a_replicas_share_of_memory_and_threads(fake_node, mps_root):
    node = fake_node("v100-2x-pcie.scn")
    b = backend_for(node, mps_root)
    devices = b.discover()
    (plan,) = plan_mps(advertise(devices, b.options.sharing), b.options.mps)
    b.shutdown()
    assert plan.name == GPU and plan.replicas == 4
    assert [g.uuid for g in plan.gpus] == [node.uuid(0), node.uuid(1)]
    quarter = V100_MIB // 4
    assert plan.commands() == [
        f"set_default_device_pinned_mem_limit 0 {quarter}M",
        f"set_default_device_pinned_mem_limit 1 {quarter}M",
        "set_default_active_thread_percentage 25",
    ]


def test_limits_can_be_overridden_per_resource(fake_node, mps_root):
    node = fake_node("v100-2x-pcie.scn")
    over = {GPU: {"pinnedDeviceMemoryLimit": "2Gi", "activeThreadPercentage": 40}}
    b = backend_for(node, mps_root, resources=over)
    (plan,) = plan_mps(advertise(b.discover(), b.options.sharing), b.options.mps)
    b.shutdown()
    assert plan.limits == Limits(2048, 40)
    assert plan.commands()[-1] == "set_default_active_thread_percentage 40"
    assert plan.pinned_limits_mib() == {0: 2048, 1: 2048}


@pytest.mark.parametrize(
    ("raw", "field", "reason"),
    [
        ({"controlDaemon": "sidecar"}, "mps.controlDaemon", "managed, external"),
        ({"checkInterval": 0}, "mps.checkInterval", "must be at least 0.001, got 0"),
        ({"resources": {GPU: {"activeThreadPercentage": 0}}}, "activeThreadPercentage", "least 1"),
        ({"resources": {GPU: {"pinnedDeviceMemoryLimit": True}}}, "pinnedDevice", "integer or"),
        ({"controlDemon": "external"}, "mps.controlDemon", "did you mean 'controlDaemon'?"),
        ({"resources": {GPU: {"pinnedDeviceMemoryLimit": "lots"}}}, "pinnedDevice", "4096M"),
        ({"resources": {GPU: {"threads": 1}}}, f"mps.resources.{GPU}.threads", "unknown"),
        ({"root": "/x"}, "mps.root", "unknown key"),
    ],
)
def test_bad_mps_settings_name_the_field(raw, field, reason):
    with pytest.raises(ConfigError) as err:
        parse_mps_settings(raw, "")
    assert field in str(err.value.field) and reason in str(err.value)


def test_more_replicas_than_mps_clients_are_refused(fake_node, mps_root):
    node = fake_node("v100-2x-pcie.scn")  # compute 7.0: 48 clients per GPU
    b = backend_for(node, mps_root, sharing=mps_sharing(49))
    with pytest.raises(ConfigError, match=r"49 MPS replicas of GPU 0 .* exceed the 48 clients"):
        b.discover()
    b.shutdown()


# --- the manager against the fake control program ---------------------------------------


def _run(manager: MpsManager) -> tuple[object, list[tuple[list[str], str]]]:
    import threading

    changes: list[tuple[list[str], str]] = []
    thread = threading.Thread(target=manager.run, args=(lambda u, r: changes.append((list(u), r)),))
    thread.start()
    return thread, changes


def test_managed_daemon_starts_with_limits_restarts_when_killed(fake_node, mps_root):
    node = fake_node("v100-2x-pcie.scn")
    b = backend_for(node, mps_root)
    b.discover()
    manager = b.mps
    assert manager is not None
    assert manager.reason(node.uuid(0)).startswith("MPS (nvidia.com/gpu): ")  # not started yet
    thread, changes = _run(manager)
    try:
        assert manager.wait_for(lambda s: s == {GPU: ""}, 10)
        quarter = V100_MIB // 4
        assert commands(mps_root)[:3] == [
            f"set_default_device_pinned_mem_limit 0 {quarter}M",
            f"set_default_device_pinned_mem_limit 1 {quarter}M",
            "set_default_active_thread_percentage 25",
        ]
        assert (mps_root / GPU / ".started").exists()
        assert changes[-1] == ([node.uuid(0), node.uuid(1)], "")

        first = daemon_pid(mps_root)
        assert first is not None
        os.kill(first, signal.SIGKILL)  # the daemon dies ...
        limits_set = "set_default_active_thread_percentage 25"
        # ... the GPUs go Unhealthy, and it is started again, limits and all
        assert manager.wait_for(
            lambda s: s == {GPU: ""} and commands(mps_root).count(limits_set) == 2, 10
        )
        lost = [(u, r) for u, r in changes if "does not answer" in r]
        assert lost and lost[0][0] == [node.uuid(0), node.uuid(1)]
        assert "Cannot find MPS control daemon" in lost[0][1]
        assert changes[-1] == ([node.uuid(0), node.uuid(1)], "")
        assert daemon_pid(mps_root) not in (None, first)
        # NVIDIA's daemon puts the GPUs in EXCLUSIVE_PROCESS: only the MPS server there
        modes = [pynvml.nvmlDeviceGetComputeMode(g.handle) for g in b.node.gpus]
        assert modes == [pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS] * 2
    finally:
        manager.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert commands(mps_root)[-1] == "quit"  # a managed daemon is told to quit at the end
    assert not (mps_root / GPU / ".started").exists()
    modes = [pynvml.nvmlDeviceGetComputeMode(g.handle) for g in b.node.gpus]
    assert modes == [pynvml.NVML_COMPUTEMODE_DEFAULT] * 2  # and given back
    b.shutdown()


def test_without_permission_for_the_compute_mode_the_daemon_runs_anyway(
    fake_node, mps_root, caplog
):
    node = fake_node("v100-2x-pcie.scn", "fault fn=nvmlDeviceSetComputeMode err=4")
    b = backend_for(node, mps_root)
    b.discover()
    manager = b.mps
    assert manager is not None
    manager.reconcile(lambda _u, _r: None)
    assert manager.status() == {GPU: ""}
    assert manager.mode_errors[GPU].startswith(f"setting the compute mode on {node.uuid(0)} failed")
    assert any("EXCLUSIVE_PROCESS" in r.getMessage() for r in caplog.records)
    manager.stop()
    manager.run(lambda _u, _r: None)  # returns at once, quitting the daemon it started
    assert commands(mps_root)[-1] == "quit"
    b.shutdown()


def test_a_daemon_that_cannot_start_backs_off_exponentially(tmp_path):
    from hetero_dp_nvidia.mps import MpsGpu, MpsResource

    broken = tmp_path / "nvidia-cuda-mps-control"
    broken.write_text("#!/bin/sh\necho 'cannot open the GPU' >&2\nexit 1\n")
    broken.chmod(0o755)
    now = [0.0]
    settings = MpsSettings(root=str(tmp_path / "mps"), backoff_s=1, max_backoff_s=4)
    manager = MpsManager(settings, str(broken), clock=lambda: now[0])
    manager.want([MpsResource(GPU, 2, (MpsGpu("GPU-a", 0, 1024),))])
    changes: list[str] = []

    def step(t: float) -> str:
        now[0] = t
        manager.reconcile(lambda _u, r: changes.append(r))
        return manager.status()[GPU]

    assert "cannot open the GPU" in step(0) and "try 1, next in 1 s" in step(0)
    assert "try 1" in step(0.9)  # not yet
    assert "try 2, next in 2 s" in step(1.0)
    assert "try 3, next in 4 s" in step(3.0)
    assert "try 4, next in 4 s" in step(7.0)  # capped at maxBackoff
    assert len(changes) == 4


def test_external_daemon_is_only_checked(fake_node, mps_root):
    node = fake_node("v100-2x-pcie.scn")
    b = backend_for(node, mps_root, controlDaemon="external")
    b.discover()
    manager = b.mps
    assert manager is not None
    thread, _ = _run(manager)
    try:
        assert manager.wait_for(lambda s: "does not answer" in s[GPU], 10)
        assert daemon_pid(mps_root) is None  # nothing started by us
        assert "Cannot find MPS control daemon" in b.check_health(b.discover()[0])
    finally:
        manager.stop()
        thread.join(10)
        b.shutdown()


def test_the_control_program_is_found_on_path_then_under_the_driver_root(fake_node, monkeypatch):
    from hetero_dp_nvidia.mps_daemon import find_control

    node = fake_node("v100-2x-pcie.scn")
    monkeypatch.setenv("PATH", str(node.root))  # nothing there
    driver = node.root / "driver"
    assert find_control(MpsSettings(), str(driver)) is None
    installed = install_fake_mps_control(driver)
    assert find_control(MpsSettings(), str(driver)) == str(installed)
    monkeypatch.setenv("PATH", str(installed.parent))
    assert find_control(MpsSettings(), "/nowhere") == str(installed)
    assert find_control(MpsSettings(control_path="/x/ctl"), str(driver)) == "/x/ctl"


def test_without_the_control_program_the_reason_says_so(fake_node, mps_root, monkeypatch):
    node = fake_node("v100-2x-pcie.scn")
    monkeypatch.setenv("PATH", str(mps_root))  # nothing there, nor under the driver root
    b = NvidiaBackend(environ={})
    b.configure({**node.options, "mpsRoot": str(mps_root), "sharing": mps_sharing()})
    b.discover()
    assert b.mps is not None and b.mps.control is None
    b.mps.reconcile(lambda _u, _r: None)
    reason = b.mps.reason(node.uuid(0))
    assert "nvidia-cuda-mps-control not found" in reason and "controlPath" in reason
    assert b.check_health(b.discover()[0]) == reason
    b.shutdown()


# --- Allocate -----------------------------------------------------------------------------


async def test_allocate_mounts_the_pipe_dir_and_shm_and_sets_the_pipe_env(fake_node, mps_root):
    node = fake_node("v100-2x-pcie.scn")
    b = backend_for(node, mps_root)
    physical = {d.id: d for d in b.discover()}
    gpu1 = physical[node.uuid(1)]
    response = ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": node.uuid(1)})
    await b.allocate([gpu1], response)
    b.shutdown()
    assert response.envs == {
        "NVIDIA_VISIBLE_DEVICES": node.uuid(1),  # only the replica's GPU
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
    }
    assert [(m.host_path, m.container_path, m.read_only) for m in response.mounts] == [
        (f"{mps_root}/nvidia.com/gpu/pipe", "/mps/nvidia.com/gpu/pipe", False),
        (f"{mps_root}/shm", "/dev/shm", False),
    ]


async def test_allocate_without_mps_adds_nothing(fake_node, mps_root):
    node = fake_node("v100-2x-pcie.scn")
    ts = {"timeSlicing": {"resources": [{"name": GPU, "replicas": 2}]}}
    b = backend_for(node, mps_root, sharing=ts)
    assert b.mps is None
    response = ContainerResponse()
    await b.allocate(b.discover()[:1], response)
    b.shutdown()
    assert response.envs == {} and response.mounts == []


# --- end to end: the fake kubelet, real sockets, the fake driver and control program -----


async def test_kubelet_gets_mps_replicas_limits_and_health(
    mps_root, fake_kubelet, plugin_runner, fake_node
):
    import asyncio

    import grpc

    node = fake_node("v100-2x-pcie.scn")
    control = install_fake_mps_control(node.root / "driver")
    options = {**node.options, "mpsRoot": str(mps_root), "mps": fast(control)}
    backend = NvidiaBackend(environ={})
    await plugin_runner.start(
        backend, config={"sharing": mps_sharing(4)}, options={"nvidia": options}
    )
    backend.monitor.wait_ms = 200
    ids = [f"{node.uuid(g)}::{n}" for g in range(2) for n in range(4)]
    devices = await fake_kubelet.wait_devices(
        GPU, lambda d: list(d) == ids and all(x.healthy for x in d.values())
    )
    # The daemon runs with a quarter of each GPU's memory per client.
    quarter = V100_MIB // 4
    assert f"set_default_device_pinned_mem_limit 1 {quarter}M" in commands(mps_root)

    resp = await fake_kubelet.allocate(GPU, [ids[5]])
    assert dict(resp.envs) == {
        "NVIDIA_VISIBLE_DEVICES": node.uuid(1),
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
    }
    assert {(m.host_path, m.container_path) for m in resp.mounts} == {
        (f"{mps_root}/nvidia.com/gpu/pipe", "/mps/nvidia.com/gpu/pipe"),
        (f"{mps_root}/shm", "/dev/shm"),
    }
    # Two replicas in one container: refused, as NVIDIA's plugin does under MPS.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fake_kubelet.allocate(GPU, [ids[0], ids[1]])
    assert "sharing.mps.failRequestsGreaterThanOne" in info.value.details()

    # The daemon dies: every replica goes Unhealthy, then comes back once restarted.
    manager = backend.mps
    assert manager is not None
    pid = daemon_pid(mps_root)
    assert pid is not None
    seen_down = asyncio.Event()

    def all_down(d):
        if not any(x.healthy for x in d.values()):
            seen_down.set()
        return seen_down.is_set()

    os.kill(pid, signal.SIGKILL)
    watch = asyncio.ensure_future(fake_kubelet.wait_devices(GPU, all_down))
    devices = await fake_kubelet.wait_devices(
        GPU, lambda d: seen_down.is_set() and all(x.healthy for x in d.values())
    )
    watch.cancel()
    assert daemon_pid(mps_root) not in (None, pid)
    assert len(devices) == 8


def test_doctor_checks_the_control_program_and_the_shared_shm(fake_node, mps_root, monkeypatch):
    from hetero_dp_nvidia.mps_daemon import mps_checks

    node = fake_node("v100-2x-pcie.scn")
    monkeypatch.setenv("PATH", str(mps_root))
    opts = {**node.options, "mpsRoot": str(mps_root), "sharing": mps_sharing()}
    checks = {c.name: c for c in NvidiaBackend(environ={}).doctor(opts)}
    assert checks["mps control"].status == "fail" and "controlPath" in checks["mps control"].fix
    assert checks["mps shm"].status == "warn"  # this process's /dev/shm is not <root>/shm
    # As the chart mounts it: <root>/shm is the daemon's /dev/shm.
    control = install_fake_mps_control(node.root / "driver")
    (mps_root / "shm").mkdir()
    settings = parse_mps_settings({"controlPath": str(control)}, str(mps_root))
    good = {c.name: c.status for c in mps_checks(settings, "/", shm=str(mps_root / "shm"))}
    assert good == {"mps control": "pass", "mps shm": "pass"}


def test_the_charts_env_vars_set_the_root_and_the_control_mode():
    from hetero_dp_nvidia.options import parse_options

    opts = parse_options(
        {"sharing": mps_sharing(), "mps": {"checkInterval": 5}},
        {"MPS_ROOT": "/var/mps", "MPS_CONTROL_DAEMON": "external"},
    )
    assert opts.uses_mps
    assert (opts.mps.root, opts.mps.control, opts.mps.check_interval_s) == (
        "/var/mps",
        "external",
        5.0,
    )
    assert parse_options({}, {}).mps.root == "/run/nvidia/mps"  # NVIDIA's chart default


async def test_a_reload_with_other_replicas_restarts_the_daemon_with_new_limits(
    mps_root, fake_kubelet, plugin_runner, fake_node
):
    from hetero_dp.engine.config import load_config

    node = fake_node("v100-2x-pcie.scn")
    control = install_fake_mps_control(node.root / "driver")
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "flags": {**node.options, "mpsRoot": str(mps_root)},
        "backends": {"nvidia": {"mps": fast(control)}},
        "sharing": mps_sharing(4),
    }
    backend = NvidiaBackend(environ={})
    daemon = await plugin_runner.start(backend, config=doc)
    await fake_kubelet.wait_devices(
        GPU, lambda d: len(d) == 8 and all(x.healthy for x in d.values())
    )
    doc["sharing"] = mps_sharing(2)
    await daemon.apply_config(load_config(raw=doc, env={}))
    ids = [f"{node.uuid(g)}::{n}" for g in range(2) for n in range(2)]
    await fake_kubelet.wait_devices(
        GPU, lambda d: list(d) == ids and all(x.healthy for x in d.values())
    )
    manager = backend.mps
    assert manager is not None
    half = f"set_default_device_pinned_mem_limit 0 {V100_MIB // 2}M"
    assert manager.wait_for(lambda s: s == {GPU: ""} and half in commands(mps_root), 10)
    sent = commands(mps_root)
    assert sent.index("quit") < sent.index(half)  # the old daemon was told to quit first
    assert "set_default_active_thread_percentage 50" in sent[sent.index(half) :]


@pytest.mark.parametrize(
    ("value", "mib"), [(4096, 4096), ("4096", 4096), ("4096M", 4096), ("8Gi", 8192), ("1G", 1024)]
)
def test_memory_limit_sizes(value, mib):
    settings = parse_mps_settings({"resources": {GPU: {"pinnedDeviceMemoryLimit": value}}}, "")
    assert settings.limits[GPU].pinned_memory_mib == mib


# --- hostile driver output (issue #29) -------------------------------------------------


def _control(tmp_path: Path, body: str) -> Path:
    program = tmp_path / "nvidia-cuda-mps-control"
    program.write_text("#!/bin/sh\n" + body)
    program.chmod(0o755)
    return program


def test_non_utf8_output_of_the_control_program_is_a_reason_not_a_dead_monitor(tmp_path):
    from hetero_dp_nvidia.mps import MpsGpu, MpsResource

    # an answer with a byte that is not UTF-8 (\377), then a failing status
    control = _control(tmp_path, "printf 'daemon \\377 gone\\n' >&2\nexit 1\n")
    settings = MpsSettings(root=str(tmp_path / "mps"), control="external")
    manager = MpsManager(settings, str(control))
    manager.want([MpsResource(GPU, 2, (MpsGpu("GPU-a", 0, 1024),))])
    changes: list[tuple[list[str], str]] = []
    manager.reconcile(lambda u, r: changes.append((list(u), r)))
    assert changes and changes[-1][0] == ["GPU-a"]
    assert "daemon \ufffd gone" in changes[-1][1]


def test_a_reconcile_that_raises_marks_the_gpus_unhealthy_and_the_monitor_goes_on(tmp_path):
    import threading
    import time

    from hetero_dp_nvidia.mps import MpsGpu, MpsResource

    control = _control(tmp_path, "echo 50.0\n")
    broken = threading.Event()

    def clock() -> float:
        if broken.is_set():
            broken.clear()
            raise RuntimeError("clock went away")
        return time.monotonic()

    settings = MpsSettings(root=str(tmp_path / "mps"), control="external", check_interval_s=0.02)
    manager = MpsManager(settings, str(control), clock=clock)
    manager.want([MpsResource(GPU, 2, (MpsGpu("GPU-a", 0, 1024),))])
    reasons: list[str] = []
    seen = threading.Condition()

    def on_change(_uuids: object, reason: str) -> None:
        with seen:
            reasons.append(reason)
            seen.notify_all()

    thread = threading.Thread(target=manager.run, args=(on_change,), daemon=True)
    thread.start()
    try:
        broken.set()
        with seen:
            assert seen.wait_for(lambda: any("clock went away" in r for r in reasons), 10)
            # it keeps running: the next check finds the daemon answering again
            assert seen.wait_for(lambda: reasons[-1] == "", 10)
        assert thread.is_alive()
    finally:
        manager.stop()
        thread.join(10)


async def test_a_refused_reload_that_turns_mps_off_leaves_the_daemon_running(
    mps_root, fake_kubelet, plugin_runner, fake_node, tmp_path
):
    """A file that turns MPS off and carries a probe address the daemon refuses: the
    reload is rejected before the backend's configure runs. Before, configure ran with
    the new options (the manager stopped, its daemon told to quit) and then with the
    old ones (a new manager, a new daemon): a reload that changed nothing flipped MPS."""
    import yaml

    from hetero_dp.engine.config import load_config
    from hetero_dp.ops.reload import ConfigReloader

    node = fake_node("v100-2x-pcie.scn")
    control = install_fake_mps_control(node.root / "driver")
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "flags": {**node.options, "mpsRoot": str(mps_root)},
        "backends": {"nvidia": {"mps": fast(control)}},
        "sharing": mps_sharing(4),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    backend = NvidiaBackend(environ={})
    daemon = await plugin_runner.start(backend, config=doc)
    await fake_kubelet.wait_devices(
        GPU, lambda d: len(d) == 8 and all(x.healthy for x in d.values())
    )
    manager = backend.mps
    assert manager is not None and manager.wait_for(lambda s: s == {GPU: ""}, 10)
    pid = daemon_pid(mps_root)
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        off = {k: v for k, v in doc.items() if k != "sharing"}
        path.write_text(yaml.safe_dump(dict(off, metrics={"address": "no-port-here"})))
        results = await reloader.wait_results(1)
        assert results[0].startswith("rejected: ") and "metrics.address" in results[0]
        assert backend.mps is manager and not manager.stopped
        assert "quit" not in commands(mps_root) and daemon_pid(mps_root) == pid
    finally:
        await reloader.stop()
