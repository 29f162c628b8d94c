"""Issue 13, points 5, 9, 10: what a user configures and what a backend reports is
checked up front, over real sockets (FakeKubelet, PluginRunner, ``hetero-dp run``
in a subprocess)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetero_dp import Device, hookimpl
from hetero_dp.engine.config import load_config
from hetero_dp.model.wire import MAX_LIST_AND_WATCH_BYTES
from hetero_dp.ops.reload import ConfigReloader
from tests.core.scripted import Scripted, make_devices

SIM = "hetero-dp.io/sim"
A = "example.com/a"


@pytest.fixture
def kdir():
    """A short kubelet dir (unix socket paths must stay under 108 bytes)."""
    import shutil

    from hetero_dp.testing.runner import short_tempdir

    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


class LogEvent(logging.Handler):
    """Sets an asyncio event when a record whose message holds ``text`` is logged
    (in the loop's thread, where the daemon logs)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.ERROR)
        self.text = text
        self.seen = asyncio.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.records.append(record)
            self.seen.set()


@pytest.fixture
def run_env(cli_env, repo_root):
    env = dict(cli_env)
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), str(repo_root / "vendors/simulated")])
    return env


def run_cli(args, env, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "hetero_dp", "run", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


# --- point 5: bounds -------------------------------------------------------------------


def test_huge_replicas_exit_2_at_once_naming_the_field(kdir, run_env, tmp_path):
    """``replicas: 100000000`` grew the daemon to 24 GB; it is now refused before
    anything is built, with exit code 2."""
    path = tmp_path / "c.yaml"
    share = {"timeSlicing": {"resources": [{"name": SIM, "replicas": 100_000_000}]}}
    path.write_text(yaml.safe_dump({"kubeletDir": str(kdir), "sharing": share}))
    out = run_cli(["simulated", "-c", str(path)], run_env)
    assert out.returncode == 2, out.stderr
    assert "sharing.timeSlicing.resources[0].replicas" in out.stderr
    assert "at most 1024" in out.stderr and "Traceback" not in out.stderr


def test_replicas_past_the_kubelets_4_mib_exit_2_naming_the_size(kdir, run_env, tmp_path):
    """Devices x replicas whose ListAndWatch message would pass 4 MiB: the plugin
    re-registered every second forever; now start-up refuses, naming the size."""
    path = tmp_path / "c.yaml"
    share = {"timeSlicing": {"resources": [{"name": SIM, "replicas": 1024}]}}
    doc = {
        "kubeletDir": str(kdir),
        "sharing": share,
        "backends": {"simulated": {"count": 300}},
    }
    path.write_text(yaml.safe_dump(doc))
    out = run_cli(["simulated", "-c", str(path)], run_env)
    assert out.returncode == 2, out.stderr
    assert "sharing.timeSlicing.resources[0].replicas" in out.stderr
    assert f"at most {MAX_LIST_AND_WATCH_BYTES}" in out.stderr
    size = int(out.stderr.split("ListAndWatch message of hetero-dp.io/sim ")[1].split()[0])
    assert size > MAX_LIST_AND_WATCH_BYTES
    assert not [p for p in kdir.iterdir() if p.name != "kubelet.sock"]


async def test_reload_past_the_limit_keeps_the_old_config_and_the_loop_free(
    fake_kubelet, plugin_runner, tmp_path
):
    """A reload to ``replicas: 1000000`` wedged the loop and later valid reloads were
    never applied. Now it is refused ("keeping the old config"), so is one whose size
    passes 4 MiB, and the next valid one applies."""
    from tests.reliability.conftest import simulated

    path = tmp_path / "c.yaml"
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "backends": {"simulated": {"count": 300}},
    }
    path.write_text(yaml.safe_dump(doc))
    daemon = await plugin_runner.start(simulated(), config=load_config(path, env={}).raw)
    await fake_kubelet.wait_registered(SIM)
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        original = daemon.config
        for n, replicas in enumerate((1_000_000, 1024)):
            share = {"timeSlicing": {"resources": [{"name": SIM, "replicas": replicas}]}}
            path.write_text(yaml.safe_dump(dict(doc, sharing=share)))
            results = await reloader.wait_results(n + 1)
            assert results[n].startswith("rejected: "), results[n]
            assert "sharing.timeSlicing.resources[0].replicas" in results[n]
            assert daemon.config is original
            # the loop answers meanwhile: an Allocate goes through
            await fake_kubelet.allocate(SIM, ["sim0"])
        share = {"timeSlicing": {"resources": [{"name": SIM, "replicas": 4}]}}
        path.write_text(yaml.safe_dump(dict(doc, sharing=share)))
        results = await reloader.wait_results(3)
        assert results[2].startswith("applied"), results[2]
        await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 1200)
    finally:
        await reloader.stop()


class LongIds(Scripted):
    pass


def long_ids(count: int, start: int = 0) -> list[Device]:
    """Devices whose IDs are 247 bytes each: about 17,000 of them pass 4 MiB."""
    return [
        Device(id=f"{i:06d}-" + "x" * 240, resource=A, numa_nodes=(0,))
        for i in range(start, start + count)
    ]


async def test_a_backend_past_4_mib_at_start_up_is_refused_naming_the_size(plugin_runner):
    """A backend whose own devices (no sharing) make a ListAndWatch message beyond
    4 MiB: the kubelet would never receive it and the plugin would re-register in a
    loop. Start-up refuses it, naming the backend, the count and the size."""
    from hetero_dp import ConfigError

    with pytest.raises(ConfigError) as caught:
        await plugin_runner.start(LongIds(long_ids(17_000)))
    e = caught.value
    assert e.field == "devices" and e.source == "backend scripted"
    assert "17000 devices with IDs of up to 247 bytes" in e.reason
    size = int(e.reason.split(f"ListAndWatch message of {A} ")[1].split()[0])
    assert size > MAX_LIST_AND_WATCH_BYTES
    assert f"at most {MAX_LIST_AND_WATCH_BYTES}" in e.reason


async def test_a_rediscovery_past_4_mib_keeps_the_old_devices_and_says_why(
    fake_kubelet, plugin_runner
):
    """A rediscovery that grows a resource past 4 MiB: the kubelet keeps receiving
    the devices it had (with their health), the log names the size; once the set
    fits again it is advertised whole."""
    backend = LongIds(long_ids(100))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 100)
    handler = LogEvent("keeping the devices advertised before")
    logger = logging.getLogger("hetero_dp.engine.daemon")
    logger.addHandler(handler)
    try:
        backend.devices = long_ids(17_000)
        backend.unhealthy[backend.devices[0].id] = "ecc"
        await daemon.rediscover()
        await daemon.poll_health()
        await asyncio.wait_for(handler.seen.wait(), 10)
    finally:
        logger.removeHandler(handler)
    record = handler.records[0]
    assert record.resource == A and "17000 devices" in record.getMessage()
    assert len(handler.records) == 1  # the health poll did not log it again
    seen = await fake_kubelet.wait_devices(
        A, lambda d: len(d) == 100 and not d[backend.devices[0].id].healthy
    )
    assert set(seen) == {d.id for d in long_ids(100)}
    backend.devices = long_ids(150)
    await daemon.rediscover()
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 150)


# --- point 9: validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        (["--health-interval", "inf"], "healthInterval", "finite"),
        (["--rediscover-interval", "1e12"], "rediscoverInterval", "86400"),
        (["-o", "nosuch.key=1"], "backends.nosuch", "loaded: simulated"),
    ],
)
def test_bad_flags_exit_2_naming_the_field(kdir, run_env, args, field, words):
    out = run_cli(["simulated", "--kubelet-dir", str(kdir), *args], run_env)
    assert out.returncode == 2, out.stderr
    assert repr(field) in out.stderr and words in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        ({"socketPrefix": "../../evil"}, "socketPrefix", "socket file name"),
        ({"hookTimeout": 0}, "hookTimeout", "0.01"),
        ({"streamTimeout": ".inf"}, "streamTimeout", "finite"),
        ({"kubeletDir": 5}, "kubeletDir", "string"),
        ({"kubeletDir": "/" + "d" * 120}, "kubeletDir", "too long"),
        ({"backends": {"simulatd": {"count": 2}}}, "backends.simulatd", "loaded: simulated"),
    ],
)
def test_bad_config_fields_exit_2_naming_the_field(kdir, tmp_path, run_env, doc, field, words):
    path = tmp_path / "c.yaml"
    text = yaml.safe_dump({"kubeletDir": str(kdir), **doc})
    path.write_text(text.replace("'.inf'", ".inf"))
    out = run_cli(["simulated", "-c", str(path)], run_env)
    assert out.returncode == 2, out.stderr
    assert repr(field) in out.stderr and words in out.stderr, out.stderr
    assert [p.name for p in kdir.iterdir()] == []  # nothing written anywhere near


POD_UID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
SOCKET = f"hetero-dp-hetero-dp.io_sim-{POD_UID.replace('-', '')[:12]}.sock"


def test_a_regular_file_at_the_socket_path_is_refused_clearly(kdir, run_env):
    run_env["POD_UID"] = POD_UID  # the socket is named after the pod
    blocker = kdir / SOCKET
    blocker.write_text("not a socket")
    out = run_cli(["simulated", "--kubelet-dir", str(kdir)], run_env)
    assert out.returncode == 2, out.stderr
    assert "is not a socket" in out.stderr and "Traceback" not in out.stderr
    assert blocker.read_text() == "not a socket"  # left alone


async def test_a_second_instance_of_the_same_pod_does_not_steal_the_first_ones_socket(
    fake_kubelet, plugin_runner, run_env, monkeypatch
):
    """Instances of different pods each have their own socket (tests/reliability/
    test_upgrade.py); two of the same pod UID (two containers of one pod, say) share
    its name, and the second one is refused."""
    from tests.reliability.conftest import simulated

    monkeypatch.setenv("POD_UID", POD_UID)
    run_env["POD_UID"] = POD_UID
    await plugin_runner.start(simulated())
    first = await fake_kubelet.wait_registered(SIM)
    sock = fake_kubelet.plugin_dir / SOCKET
    before = sock.stat().st_ino
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hetero_dp", "run", "simulated",
        "--kubelet-dir", str(fake_kubelet.plugin_dir),
        env=run_env, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, err.decode()
    assert "another running instance" in err.decode()
    assert sock.stat().st_ino == before  # the first one's socket, untouched
    assert fake_kubelet.registration_count(SIM) == 1 and first.stream_open
    await fake_kubelet.allocate(SIM, ["sim0"])  # and it still answers


async def test_sockets_get_their_mode_whatever_the_umask(fake_kubelet, plugin_runner):
    from tests.reliability.conftest import simulated

    old = os.umask(0)
    try:
        daemon = await plugin_runner.start(simulated())
    finally:
        os.umask(old)
    await fake_kubelet.wait_registered(SIM)
    sock = daemon.front_end.endpoints[SIM].socket_path
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600


class BadIds(Scripted):
    pass


async def test_bad_device_ids_are_left_out_with_a_clear_error(fake_kubelet, plugin_runner, caplog):
    good = make_devices(A, 2)
    bad = [Device(id="card/0", resource=A), Device(id="nul\x00id", resource=A)]
    caplog.set_level(logging.ERROR)
    await plugin_runner.start(BadIds([*good, *bad]))
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_devices(A, lambda d: sorted(d) == ["dev0", "dev1"])
    lines = [r.getMessage() for r in caplog.records if "cannot take" in r.getMessage()]
    assert lines and "'card/0': a device ID must not contain '/'" in lines[0]
    assert "'nul\\x00id'" in lines[0] and "control characters" in lines[0]


def _caught(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    return 0


async def test_signals_during_start_up_are_handled(fake_kubelet, run_env):
    """SIGHUP in the first moments killed the daemon (Python's default action). The
    daemon now holds TERM, INT and HUP from the first line of ``run``: a SIGHUP is
    survived, and a SIGTERM then stops it cleanly."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hetero_dp", "run", "simulated",
        "--kubelet-dir", str(fake_kubelet.plugin_dir),
        env=run_env, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    want = 1 << (signal.SIGHUP - 1) | 1 << (signal.SIGTERM - 1)

    async def handlers_installed():
        while _caught(proc.pid) & want != want:  # polls /proc; bounded by wait_for
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(handlers_installed(), 30)
        proc.send_signal(signal.SIGHUP)
        await fake_kubelet.wait_registered(SIM, timeout=30)
        assert proc.returncode is None
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, err.decode()
        assert "Traceback" not in err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# --- point 10: one bad backend ---------------------------------------------------------------


class BadName:
    hetero_dp_name = "badname"

    @hookimpl
    def discover(self):
        return [Device(id="x0", resource="no-slash")]


async def test_one_backend_with_an_invalid_resource_name_does_not_stop_the_others(
    fake_kubelet, plugin_runner, caplog
):
    caplog.set_level(logging.ERROR)
    daemon = await plugin_runner.start(Scripted(make_devices(A, 2)), BadName())
    await fake_kubelet.wait_registered(A)
    assert sorted(daemon.resources) == [A]
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert refused and "backend badname" in refused[0] and "no vendor prefix" in refused[0]


def test_exit_2_only_when_nothing_can_serve(kdir, run_env, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"kubeletDir": str(kdir)}))
    out = run_cli(["simulated", "-c", str(path), "-o", "simulated.resource=no-slash"], run_env)
    assert out.returncode == 2 and "no vendor prefix" in out.stderr, out.stderr


# --- point 11 -------------------------------------------------------------------------------


def test_the_simulated_boards_preferred_pick_is_numa_local(run_env):
    out = subprocess.run(
        [sys.executable, "-m", "hetero_dp", "topo", "simulated", "--size", "2", "-o",
         "simulated.count=8"],
        capture_output=True, text=True, env=run_env, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "Chosen for size 2: D0 D1" in out and "NUMA nodes 0\n" in out
