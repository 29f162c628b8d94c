"""``hetero-dp doctor`` against fake node roots: each failure it knows is named with its fix."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from hetero_dp.engine.config import load_config
from hetero_dp.engine.loading import load_backends
from hetero_dp.ops import operations
from hetero_dp.ops.doctor import DoctorSettings, exit_code, render_text, run_doctor, spec_problems
from hetero_dp.testing import FakeKubelet, short_tempdir
from tests.core.scripted import Scripted, make_devices

from .helpers import wait_ready

HERE = Path(__file__).parent
FAKE_GPU = str(HERE / "backends" / "fake_nvidia.py")
RES = "example.com/accel"
DP = "var/lib/kubelet/device-plugins"
LABELS = "etc/kubernetes/node-feature-discovery/features.d"
STEPS = ["driver", "devices", "runtime", "kubelet", "daemon", "usage", "cdi", "labels"]

CONTAINERD_NVIDIA = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
"""
CONTAINERD_PLAIN = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""
GOOD_SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "example.com/accel",
    "devices": [{"name": "dev0", "containerEdits": {"deviceNodes": [{"path": "/dev/accel0"}]}}],
    "containerEdits": {"env": ["ACCEL=1"]},
}


class Root:
    """A fake node: files under a short temp dir, sockets that listen or are stale."""

    def __init__(self) -> None:
        self.path = short_tempdir("hdp-root-")
        self._sockets: list[socket.socket] = []

    def file(self, rel: str, text: str) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def socket(self, rel: str, *, listening: bool = True) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(p))
        if listening:
            s.listen(8)
            self._sockets.append(s)
        else:
            s.close()  # the file stays, nobody listens: a stale socket
        return p

    def close(self) -> None:
        for s in self._sockets:
            s.close()
        shutil.rmtree(self.path, ignore_errors=True)


@pytest.fixture
def root():
    r = Root()
    yield r
    r.close()


def doctor(root: Root, backends=(), config=None, **settings):
    """Run the chain as the CLI does, in its own thread and loop (it makes blocking calls)."""
    cfg = load_config(raw=config or {}, env={})
    loaded = load_backends(list(backends))
    try:
        findings = asyncio.run(run_doctor(cfg, loaded, DoctorSettings(root=root.path, **settings)))
    finally:
        for b in loaded:
            b.close()
    return findings


def only(findings, step, name=None):
    hits = [f for f in findings if f.step == step and (name is None or name in f.name)]
    assert len(hits) == 1, [f"{f.step} {f.name} {f.status}" for f in findings]
    return hits[0]


def gpu(root: Root, **options):
    return {"backends": {"fake_nvidia": {"root": str(root.path), **options}}}


async def test_a_healthy_node_passes_every_step(root):
    root.file("etc/containerd/config.toml", CONTAINERD_PLAIN)
    kubelet = FakeKubelet(root.path / DP)
    await kubelet.start()
    from hetero_dp.testing import PluginRunner

    runner = PluginRunner(kubelet.plugin_dir)
    config = {
        "metrics": {"address": "127.0.0.1:0"},
        "labels": {"enabled": True, "dir": str(root.path / LABELS)},
    }
    try:
        daemon = await runner.start(Scripted(make_devices(RES, 2)), config=config)
        await kubelet.wait_registered(RES)
        await wait_ready(daemon)
        doc = {
            "kubeletDir": "/" + DP,
            "labels": {"enabled": True, "dir": "/" + LABELS},
            "metrics": {"address": f"127.0.0.1:{operations.of(daemon).server.port}"},
        }
        findings = await asyncio.to_thread(doctor, root, [Scripted(make_devices(RES, 2))], doc)
    finally:
        await runner.stop_all()
        await kubelet.stop()
    text = render_text(findings)
    assert exit_code(findings) == 0, text
    assert [f.step for f in findings if f.status != "skip"] == [
        "devices",
        "runtime",
        "kubelet",
        "kubelet",
        "daemon",
        "labels",
    ], text
    assert only(findings, "devices").message == f"2 devices ({RES}: 2)"
    assert "nothing special" in only(findings, "runtime").message
    assert only(findings, "kubelet", "hetero-dp-").status == "pass"
    assert f"{RES}: ready (2 devices)" in only(findings, "daemon").message
    # the daemon answers, but no container holds a shared device: nothing to compare
    assert "no container on a shared device" in only(findings, "usage").message
    assert only(findings, "labels").message.endswith("hetero-dp-scripted: 1 labels")
    assert only(findings, "driver").status == "skip"  # Scripted offers no driver checks


def test_no_driver_is_the_first_failure_with_its_fix(root):
    findings = doctor(root, [FAKE_GPU], gpu(root, library=str(root.path / "no/libnvidia-ml.so.1")))
    first = next(f for f in findings if f.status == "fail")
    assert (first.step, first.name) == ("driver", "fake_nvidia: nvml")
    assert "libnvidia-ml.so.1 does not load" in first.message
    assert "install the NVIDIA driver" in first.fix
    assert only(findings, "devices").status == "fail"  # and so no devices
    assert "found no devices" in only(findings, "devices").message
    assert exit_code(findings) == 1
    assert "Start with the first failure (driver: fake_nvidia: nvml)" in render_text(findings)


def test_driver_library_version_mismatch(root):
    root.file(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n",
    )
    root.file("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.90.07", "")
    findings = doctor(root, [FAKE_GPU], gpu(root, library="libc.so.6", count=1))
    f = only(findings, "driver")
    assert f.status == "fail"
    assert "Driver/library version mismatch" in f.message and "550.54.15" in f.message
    assert f.fix.startswith("reload the module or reboot")


def test_backend_doctor_that_crashes_is_a_failure(root):
    class Crashing(Scripted):
        from hetero_dp import hookimpl

        @hookimpl
        def doctor(self, options):
            raise RuntimeError("segfault in vendor SDK")

    findings = doctor(root, [Crashing(make_devices(RES, 1))])
    f = only(findings, "driver")
    assert f.status == "fail" and "segfault in vendor SDK" in f.message


@pytest.mark.parametrize(
    ("files", "status", "message", "fix"),
    [
        (
            {"etc/containerd/config.toml": CONTAINERD_PLAIN},
            "fail",
            "no nvidia runtime and no CDI delivery",
            "nvidia-ctk runtime configure --runtime=containerd --set-as-default",
        ),
        (
            {"etc/containerd/config.toml": CONTAINERD_PLAIN.replace('"runc"', '"nvidia"', 1)},
            "fail",
            "the default runtime is nvidia but no runtime named nvidia is defined",
            "nvidia-ctk runtime configure",
        ),
        (
            {"etc/docker/daemon.json": json.dumps({"default-runtime": "nvidia"})},
            "fail",
            '"Unknown runtime specified nvidia" (Docker)',
            "--runtime=docker",
        ),
        (
            {"etc/containerd/config.toml": CONTAINERD_NVIDIA},
            "fail",
            "points at /usr/bin/nvidia-container-runtime, which does not exist",
            "nvidia-container-toolkit",
        ),
        (
            {
                "etc/containerd/config.toml": CONTAINERD_NVIDIA,
                "usr/bin/nvidia-container-runtime": "",
            },
            "pass",
            "nvidia is the default runtime",
            "",
        ),
        (
            {
                "etc/containerd/config.toml": CONTAINERD_NVIDIA.replace(
                    'default_runtime_name = "nvidia"', 'default_runtime_name = "runc"'
                ),
                "usr/bin/nvidia-container-runtime": "",
            },
            "warn",
            "runtimeClassName: nvidia",
            "RuntimeClass",
        ),
        ({"etc/containerd/config.toml": "version = [broken"}, "fail", "cannot be read", "syntax"),
    ],
)
def test_container_runtime_for_gpus(root, files, status, message, fix):
    for rel, text in files.items():
        root.file(rel, text)
    findings = doctor(root, [FAKE_GPU], gpu(root, library="libc.so.6", count=2))
    f = only(findings, "runtime")
    assert f.status == status, f
    assert message in f.message
    assert fix in f.fix
    if status == "fail" and "nvidia runtime and no CDI" in f.message:
        assert "Unknown runtime specified nvidia" in f.message  # the error users search for


def test_cdi_delivery_needs_cdi_in_the_runtime(root):
    root.file("etc/containerd/config.toml", CONTAINERD_PLAIN)  # containerd 1.7: CDI off
    findings = doctor(root, config={"cdi": {"enabled": True}})
    f = only(findings, "runtime")
    assert f.status == "fail" and "CDI off" in f.message and "enable_cdi = true" in f.fix
    root.file("etc/containerd/config.toml", "version = 3\n")  # containerd 2.x: on by default
    assert only(doctor(root, config={"cdi": {"enabled": True}}), "runtime").status == "pass"
    # drop-in files (nvidia-ctk writes them) are merged in
    root.file(
        "etc/containerd/config.toml", 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    )
    root.file(
        "etc/containerd/conf.d/99-cdi.toml",
        '[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n',
    )
    assert only(doctor(root, config={"cdi": {"enabled": True}}), "runtime").status == "pass"


def test_no_kubelet_sock(root):
    (root.path / DP).mkdir(parents=True)
    f = only(doctor(root), "kubelet", "kubelet.sock")
    assert f.status == "fail" and "no kubelet.sock in" in f.message
    assert "systemctl status kubelet" in f.fix
    shutil.rmtree(root.path / "var")
    f = only(doctor(root), "kubelet")
    assert f.status == "fail" and "does not exist" in f.message and "hostPath" in f.fix


def test_stale_plugin_socket_and_stale_kubelet_sock(root):
    root.socket(f"{DP}/kubelet.sock")
    stale = root.socket(f"{DP}/hetero-dp-example.com_accel.sock", listening=False)
    live = root.socket(f"{DP}/hetero-dp-example.com_other.sock")
    findings = doctor(root)
    assert only(findings, "kubelet", "kubelet.sock").status == "pass"
    f = only(findings, "kubelet", stale.name)
    assert f.status == "fail" and "stale plugin socket" in f.message
    assert f"rm {stale}" in f.fix
    assert only(findings, "kubelet", live.name).status == "pass"

    (root.path / DP / "kubelet.sock").unlink()
    root.socket(f"{DP}/kubelet.sock", listening=False)
    f = only(doctor(root), "kubelet", "kubelet.sock")
    assert f.status == "fail" and "nobody listens" in f.message and "restart kubelet" in f.fix


def test_no_plugin_socket_is_a_warning(root):
    root.socket(f"{DP}/kubelet.sock")
    f = only(doctor(root), "kubelet", "plugin sockets")
    assert f.status == "warn" and "socketPrefix" in f.fix


def test_invalid_and_broken_cdi_specs(root):
    root.file("dev/accel0", "")  # the good spec's device node exists
    root.file("var/run/cdi/good.json", json.dumps(GOOD_SPEC))
    bad = dict(GOOD_SPEC, kind="Example.com", devices=[{"name": "dev 0"}])
    root.file("var/run/cdi/bad.json", json.dumps(bad))
    root.file("etc/cdi/broken.yaml", "cdiVersion: [\n")
    findings = doctor(root)
    f = only(findings, "cdi", "bad.json")
    assert f.status == "fail" and "bad.json is not a valid CDI spec" in f.message
    assert "'Example.com'" in f.message and "'dev 0'" in f.message
    assert "containerEdits must not be empty" in f.message and "regenerate" in f.fix
    assert "does not parse" in only(findings, "cdi", "broken.yaml").message
    ok = only(findings, "cdi", "cdi specs")
    assert ok.status == "pass" and "good.json (example.com/accel, 1 devices)" in ok.message


def test_cdi_spec_rules():
    assert spec_problems(GOOD_SPEC) == []
    assert "cdiVersion" in spec_problems(dict(GOOD_SPEC, cdiVersion="latest"))[0]
    twice = dict(GOOD_SPEC, devices=GOOD_SPEC["devices"] * 2)
    assert "defined twice" in spec_problems(twice)[0]
    assert "not KEY=VALUE" in spec_problems(dict(GOOD_SPEC, containerEdits={"env": ["X"]}))[0]


def test_cdi_on_without_specs_fails(root):
    root.file("etc/docker/daemon.json", json.dumps({"features": {"cdi": True}}))
    f = only(doctor(root, config={"cdi": {"enabled": True}}), "cdi")
    assert f.status == "fail" and "no spec in" in f.message


def test_label_file_missing_or_invalid(root):
    config = {"labels": {"enabled": True, "dir": "/" + LABELS}}
    f = only(doctor(root, config=config), "labels")
    assert f.status == "fail" and "no hetero-dp-* label file" in f.message
    assert "labels.enabled" in f.fix
    root.file(f"{LABELS}/hetero-dp-acme", "example.com/accel.count=2\nbroken line\nx/y=has space\n")
    f = only(doctor(root, config=config), "labels")
    assert f.status == "fail" and "line 2: not key=value" in f.message
    assert "line 3" in f.message


def test_daemon_not_answering(root):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    findings = doctor(root, config={"metrics": {"address": f":{port}"}})
    f = only(findings, "daemon")
    assert (
        f.status == "fail" and f"no daemon answers at http://127.0.0.1:{port}/readyz" in f.message
    )
    # the fair-share step reads the same daemon: it skips, once, without a second failure
    usage = only(findings, "usage")
    assert usage.status == "skip"
    assert f"no daemon answers at http://127.0.0.1:{port}/metrics" in usage.message


def test_no_metrics_address_skips_the_fair_share_step(root):
    f = only(doctor(root), "usage")
    assert (f.status, f.message) == ("skip", "no metrics.address configured: no usage to read")


async def test_daemon_not_ready_names_the_resource(fake_kubelet, plugin_runner, root):
    daemon = await plugin_runner.start(
        Scripted(make_devices(RES, 1)), config={"metrics": {"address": "127.0.0.1:0"}}
    )
    await wait_ready(daemon)
    await fake_kubelet.stop()  # streams drop; no kubelet to re-register with
    await fake_kubelet.wait_for(lambda: not fake_kubelet.resources[RES].stream_open)
    await asyncio.wait_for(_until_not_ready(daemon), 10)
    f = only(
        await asyncio.to_thread(
            doctor, root, (), {}, daemon_address=f"127.0.0.1:{operations.of(daemon).server.port}"
        ),
        "daemon",
    )
    assert f.status == "fail" and "answers 503" in f.message and f"{RES}: not ready" in f.message


async def _until_not_ready(daemon):
    from .helpers import wait_until

    await wait_until(daemon, lambda: not daemon.front_end.session(RES).ready)


def test_cli_json_and_exit_code(root, repo_root, cli_env, hetero_dp_cmd):
    root.socket(f"{DP}/kubelet.sock")
    root.socket(f"{DP}/hetero-dp-example.com_accel.sock", listening=False)
    env = dict(cli_env, PYTHONPATH=str(repo_root))
    out = subprocess.run(
        [*hetero_dp_cmd, "doctor", "--root", str(root.path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo_root,
        timeout=60,
    )
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is False
    assert report["first_failure"]["name"] == "hetero-dp-example.com_accel.sock"
    assert [c["step"] for c in report["checks"]] == sorted(
        (c["step"] for c in report["checks"]), key=STEPS.index
    )

    (root.path / DP / "hetero-dp-example.com_accel.sock").unlink()
    out = subprocess.run(
        [*hetero_dp_cmd, "doctor", "--root", str(root.path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo_root,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARN" in out.stdout and "no failures" in out.stdout


def test_cli_reads_the_daemonsets_env_for_labels_and_daemon(
    root, repo_root, cli_env, hetero_dp_cmd
):
    """Inside the plugin's pod doctor sees what `run` was given through the env."""
    root.socket(f"{DP}/kubelet.sock")
    env = dict(
        cli_env,
        PYTHONPATH=str(repo_root),
        HETERO_DP_LABELS_DIR=f"/{LABELS}",
        HETERO_DP_METRICS_ADDRESS="127.0.0.1:9",  # nothing listens on the discard port
    )
    out = subprocess.run(
        [*hetero_dp_cmd, "doctor", "--root", str(root.path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo_root,
        timeout=60,
    )
    checks = {c["step"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["labels"]["status"] == "fail", checks["labels"]  # no label file yet
    assert checks["daemon"]["status"] == "fail", checks["daemon"]  # asked, nobody answered
    assert "127.0.0.1:9" in json.dumps(checks["daemon"])


@pytest.mark.parametrize(
    ("default", "binary", "message"),
    [
        ("kata", "", "the default runtime is kata but no runtime of that name is defined"),
        ("runc", "/usr/bin/kata-runtime", "the kata runtime points at /usr/bin/kata-runtime"),
    ],
)
def test_runtime_problems_every_device_meets_need_no_backend_advice(root, default, binary, message):
    # a backend with no runtime_advice hook: the core's own checks of the runtime
    options = '\n    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata.options]\n'
    options += f'      BinaryName = "{binary}"\n' if binary else ""
    root.file(
        "etc/containerd/config.toml",
        CONTAINERD_PLAIN.replace('"runc"\n', f'"{default}"\n', 1)
        + ('  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]\n' + options)
        * bool(binary),
    )
    findings = doctor(root, [Scripted(make_devices(RES, 1))])
    f = only(findings, "runtime")
    assert f.status == "fail" and message in f.message, f


def test_a_spec_whose_host_paths_are_gone_fails_naming_them(root):
    """A stale spec (a test's, another host's, a removed driver's) is valid in form but
    hands containers paths that do not exist: a failure naming them, not a pass."""
    root.file("dev/accel0", "")
    spec = dict(
        GOOD_SPEC,
        devices=[
            {"name": "dev0", "containerEdits": {"deviceNodes": [{"path": "/dev/accel0"}]}},
            {
                "name": "dev1",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/accel1", "hostPath": "/gone/accel1"}]
                },
            },
        ],
        containerEdits={
            "mounts": [{"hostPath": "/usr/lib/libaccel.so.1", "containerPath": "/usr/lib/x"}]
        },
    )
    root.file("var/run/cdi/stale.json", json.dumps(spec))
    f = only(doctor(root), "cdi", "stale.json")
    assert f.status == "fail"
    assert "2 of its 3 host paths do not exist: /gone/accel1, /usr/lib/libaccel.so.1" in f.message
    assert "stale" in f.fix and "remove it" in f.fix


CANNOT_START = """
from hetero_dp import Check, Device, hookimpl


@hookimpl
def configure(options):
    raise RuntimeError("the accelerator library is missing")


@hookimpl
def discover():
    return [Device("a0", "example.com/accel")]
"""

DRIVER_FAILS = (
    CANNOT_START
    + """

@hookimpl
def doctor(options):
    return [Check("library", "fail", "the accelerator library is missing", "install it")]
"""
)


def test_a_backend_that_cannot_start_is_not_called_a_config_problem(root, tmp_path):
    path = tmp_path / "nolib.py"
    path.write_text(CANNOT_START)
    f = only(doctor(root, [str(path)]), "devices")
    assert f.status == "fail"
    assert f.message.startswith("backend 'nolib' cannot start: ")
    assert "RuntimeError('the accelerator library is missing')" in f.message
    assert f"at {path}:7" in f.message
    assert "config" not in f.fix and "backends." not in f.fix


def test_a_cause_the_driver_step_named_is_not_said_again(root, tmp_path):
    path = tmp_path / "nolib2.py"
    path.write_text(DRIVER_FAILS)
    findings = doctor(root, [str(path)])
    assert only(findings, "driver", "library").status == "fail"
    devices = only(findings, "devices")
    assert devices.message == "backend 'nolib2' cannot start: the driver check above says why"
    text = render_text(findings)
    assert text.count("the accelerator library is missing") == 1, text


def test_list_nvidia_without_a_driver_says_the_cause_once(cli_env, hetero_dp_cmd):
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver: nothing to report")
    env = {k: v for k, v in cli_env.items() if k != "LD_LIBRARY_PATH"}
    listed = subprocess.run(
        [*hetero_dp_cmd, "list", "nvidia"], env=env, capture_output=True, text=True, timeout=60
    )
    out = listed.stdout + listed.stderr
    assert listed.returncode == 2, out
    assert out.count("libnvidia-ml.so.1 not found") == 1, out
    assert "hetero-dp: cannot start: " in listed.stderr and "configuration error" not in out


def test_the_readme_usage_lines_name_each_commands_arguments(repo_root):
    """Following the README's usage line must not leave out an argument (``doctor``
    without ``BACKEND`` skips the driver and devices steps)."""
    import click

    from hetero_dp.cli.main import main

    readme = (repo_root / "README.md").read_text()
    rows = [ln for ln in readme.splitlines() if ln.startswith("| `hetero-dp ")]
    for name, command in main.commands.items():
        usage = [r.split("`")[1] for r in rows if r.startswith(f"| `hetero-dp {name} ")]
        usage += [r.split("`")[1] for r in rows if r.startswith(f"| `hetero-dp {name}`")]
        assert usage, f"no README usage line for {name}"
        for param in command.params:
            if isinstance(param, click.Argument):
                stem = param.human_readable_name.upper().removesuffix("S")
                assert all(stem in u for u in usage), (name, stem, usage)
