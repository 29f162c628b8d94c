"""Shared dirs hold anything (issue #36 point 2): the CDI dir, the label dir and the
kubelet's dirs are written by others, so whatever sits there (a FIFO or a socket named
``*.json``, a symlink loop, a link to a device, a directory, a file of gigabytes, JSON
nested 50,000 deep, an alias bomb in YAML) is read without blocking, in bounded memory
and stack, costs at most one log line per file however often the dir is read, and
never stops the daemon or ``hetero-dp doctor``.

An unreadable file cannot be made here: the suite runs as root, and root reads a
``chmod 000`` file (CAP_DAC_OVERRIDE); such a file is read as any other and its
content judged (test below), which is what the runtime, also root, does."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero_dp.engine.cdi_publisher import CDIWriter
from hetero_dp.engine.config import load_config
from hetero_dp.kits.foreign import ForeignFileError, load_foreign
from hetero_dp.ops.doctor.cdi import check_cdi_specs
from hetero_dp.ops.doctor.findings import DoctorSettings
from hetero_dp.ops.doctor.labels import check_labels
from tests.cdi.test_cdi_e2e import RES, Acme, start
from tests.fuzz.test_yaml_bounds import alias_bomb

KIND = RES  # the kind of the specs the daemon writes: acme.com/accel


def hostile(d: Path, suffix: str = ".json") -> dict[str, str]:
    """Fill ``d`` with what another writer could leave; name -> the reason expected."""
    d.mkdir(parents=True, exist_ok=True)
    os.mkfifo(d / f"fifo{suffix}")
    with socket.socket(socket.AF_UNIX) as s:  # the file outlives the socket
        s.bind(str(d / f"socket{suffix}"))
    (d / f"loop{suffix}").symlink_to(f"loop{suffix}")
    (d / f"null{suffix}").symlink_to("/dev/null")
    (d / f"dir{suffix}").mkdir()
    (d / f"deep{suffix}").write_text("[" * 50_000 + "]" * 50_000)
    with open(d / f"huge{suffix}", "wb") as f:
        f.truncate(8 * 1024**3)  # sparse: 8 GiB that must not be read
    (d / f"bomb{suffix}").write_text(alias_bomb(key="devices"))
    return {
        f"fifo{suffix}": "a FIFO, not a regular file",
        f"socket{suffix}": "a socket, not a regular file",
        f"loop{suffix}": "a symlink loop",
        f"null{suffix}": "a character device, not a regular file",
        f"dir{suffix}": "a directory, not a regular file",
        f"deep{suffix}": "nested deeper than 64 levels",
        f"huge{suffix}": "8589934592 bytes, more than the",
        f"bomb{suffix}": "not JSON" if suffix == ".json" else "stands for more than",
    }


def in_time(call, timeout: float = 20.0):
    """``call()`` in a thread: a blocked open() of a FIFO would hang the test for ever."""
    out: list[object] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:
            failed.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"{call} blocked"
    if failed:
        raise failed[0]
    return out[0]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_each_kind_of_file_is_refused_with_its_reason(tmp_path: Path, suffix: str) -> None:
    expected = hostile(tmp_path, suffix)

    def read_all() -> dict[str, str]:
        reasons = {}
        for name in expected:
            try:
                load_foreign(tmp_path / name, follow=True)
            except ForeignFileError as e:
                reasons[name] = str(e)
        return reasons

    reasons = in_time(read_all)
    assert isinstance(reasons, dict)
    for name, reason in expected.items():
        assert reason in reasons.get(name, "(read)"), (name, reasons.get(name))


def test_a_symlink_is_refused_where_none_is_expected(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to("real.json")
    assert load_foreign(tmp_path / "link.json", follow=True) == {}
    with pytest.raises(ForeignFileError, match="a symlink"):
        load_foreign(tmp_path / "link.json")


def test_a_file_root_cannot_be_denied_is_read_and_judged(tmp_path: Path) -> None:
    path = tmp_path / "locked.json"
    path.write_text('{"kind": "x"}')
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ForeignFileError, match="Permission denied"):
            load_foreign(path)
    else:  # root: CAP_DAC_OVERRIDE reads it, as the runtime would
        assert load_foreign(path) == {"kind": "x"}


@pytest.fixture
def spec() -> dict:
    return {"cdiVersion": "0.5.0", "kind": KIND, "devices": [{"name": "accel0"}]}


def test_setting_conflicts_aside_reads_each_file_once_a_line(
    tmp_path: Path, spec: dict, caplog: pytest.LogCaptureFixture
) -> None:
    expected = hostile(tmp_path)
    (tmp_path / "other.json").write_text(json.dumps(spec))  # a real conflict still moves
    writer = CDIWriter(tmp_path)
    with caplog.at_level(logging.INFO, logger="hetero_dp.engine.cdi_publisher"):
        moved = in_time(lambda: [writer.set_aside_conflicts(KIND, spec) for _ in range(3)])
    assert moved == [[tmp_path / "other.json.hetero-dp-superseded"], [], []]
    for name, reason in expected.items():
        lines = [r.getMessage() for r in caplog.records if f"/{name}" in r.getMessage()]
        assert len(lines) == 1 and reason in lines[0], (name, lines)


async def test_the_daemon_registers_beside_them_and_says_each_once(
    fake_kubelet, plugin_runner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The FIFO hung start-up for ever; the deep spec logged a traceback and 'publisher
    <...> failed' at every publish. Three discoveries: each file one line in all."""
    cdi_dir = tmp_path / "cdi"
    expected = hostile(cdi_dir)
    backend = Acme(2)
    caplog.set_level(logging.INFO)
    daemon = await start(plugin_runner, backend, cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_registered(RES, timeout=20)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    for n in (3, 1):  # two more publishes that rewrite the spec, reading the dir again
        backend.devices = backend.devices[:1] if n == 1 else Acme(3).devices
        await daemon.rediscover()
        await fake_kubelet.wait_devices(RES, lambda d, n=n: len(d) == n)
    response = await fake_kubelet.allocate(RES, ["accel0"])
    assert [c.name for c in response.cdi_devices] == [f"{RES}=accel0"]
    messages = [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    for name, reason in expected.items():
        lines = [m for m in messages if f"/{name}" in m]
        assert len(lines) == 1 and reason in lines[0], (name, lines)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    cdi, labels = tmp_path / "cdi", tmp_path / "features.d"
    hostile(cdi)
    hostile(cdi, ".yaml")
    labels.mkdir()
    os.mkfifo(labels / "hetero-dp-acme")
    (labels / "hetero-dp-big").symlink_to("/dev/zero")
    yield cdi, labels


def test_doctor_finishes_and_fails_each_file_with_its_reason(shared) -> None:
    cdi, labels = shared
    cfg = load_config(raw={"labels": {"enabled": True, "dir": str(labels)}}, env={})
    settings = DoctorSettings(cdi_dirs=[str(cdi)])
    findings = in_time(lambda: check_cdi_specs(cfg, settings, set()))
    assert isinstance(findings, list)
    failed = {f.name: f.message for f in findings if f.status == "fail"}
    assert len(failed) == 16, sorted(failed)
    assert "a FIFO, not a regular file" in failed["fifo.json"]
    assert "nested deeper than 64" in failed["deep.yaml"]
    labelled = in_time(lambda: check_labels(cfg, settings, []))
    assert isinstance(labelled, list)
    assert {f.name: f.status for f in labelled} == {
        "hetero-dp-acme": "fail",
        "hetero-dp-big": "fail",
    }
    assert "a FIFO" in labelled[0].message and "a symlink" in labelled[1].message


def test_doctor_command_finishes_on_them(shared, tmp_path: Path, cli_env, hetero_dp_cmd) -> None:
    cdi, labels = shared
    where = ["--cdi-dir", str(cdi), "--labels-dir", str(labels), "--kubelet-dir", str(tmp_path)]
    proc = subprocess.run(
        [*hetero_dp_cmd, "doctor", "--root", "/", *where, "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr  # findings fail; the command does not
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert "fifo.json" in json.dumps(report) and "deep.json" in json.dumps(report)


def test_a_dra_checkpoint_replaced_by_a_fifo_or_nested_deep_is_refused(tmp_path: Path) -> None:
    from hetero_dp.dra.checkpoint import Checkpoint, CheckpointError

    os.mkfifo(tmp_path / "checkpoint.json")  # the kubelet's plugin dir is shared too
    with pytest.raises(CheckpointError, match="a FIFO"):
        in_time(Checkpoint(tmp_path / "checkpoint.json").load)
    (tmp_path / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(CheckpointError, match="nested deeper"):
        Checkpoint(tmp_path / "deep.json").load()
    missing = Checkpoint(tmp_path / "none.json")
    missing.load()
    assert missing.claims == {}


def test_the_runtime_config_and_a_topology_file_are_read_the_same_way(tmp_path: Path) -> None:
    from hetero_dp.cli.topo_report import load_topology
    from hetero_dp.kits.runtimeconf import runtime_cdi_off
    from hetero_dp.model.errors import ConfigError

    (tmp_path / "etc/containerd").mkdir(parents=True)
    os.mkfifo(tmp_path / "etc/containerd/config.toml")  # cdi.runtimeConfig, mounted
    (tmp_path / "daemon.json").write_text('{"features": ' * 50_000)
    assert in_time(lambda: runtime_cdi_off(tmp_path / "etc/containerd/config.toml")) is None
    assert runtime_cdi_off(tmp_path / "daemon.json") is None  # logged; nothing assumed
    (tmp_path / "topo.yaml").write_text(alias_bomb(key="devices"))
    with pytest.raises(ConfigError, match="stands for more than"):
        load_topology(tmp_path / "topo.yaml")
    with pytest.raises(ConfigError, match="a FIFO"):
        in_time(lambda: load_topology(tmp_path / "etc/containerd/config.toml"))


async def test_a_label_file_that_cannot_be_written_is_said_once(
    fake_kubelet, plugin_runner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory (anyone's) where the label file goes: one error line, not one per
    publish; the daemon serves on."""
    labels = tmp_path / "features.d"
    (labels / "hetero-dp-acme" / "x").mkdir(parents=True)  # rename() cannot replace it
    backend = Acme(2)
    caplog.set_level(logging.INFO)
    raw = {"labels": {"enabled": True, "dir": str(labels)}}
    daemon = await plugin_runner.start(backend, config=raw)
    await fake_kubelet.wait_registered(RES, timeout=20)
    for n in (3, 1):
        backend.devices = Acme(n).devices
        await daemon.rediscover()
        await fake_kubelet.wait_devices(RES, lambda d, n=n: len(d) == n)
    lines = [r.getMessage() for r in caplog.records if "node label file" in r.getMessage()]
    assert len(lines) == 1 and "hetero-dp-acme" in lines[0], lines


def test_a_udev_rules_file_is_read_the_same_way(tmp_path: Path) -> None:
    rules = pytest.importorskip("hetero_dp_udev.rules")
    from hetero_dp.model.errors import ConfigError

    os.mkfifo(tmp_path / "fifo.yaml")  # the rules ConfigMap's file replaced by a FIFO
    with pytest.raises(ConfigError, match="a FIFO"):
        in_time(lambda: rules.load_rules(str(tmp_path / "fifo.yaml")))
    (tmp_path / "bomb.yaml").write_text(alias_bomb(key="resources"))
    with pytest.raises(ConfigError, match="stands for more than"):
        rules.load_rules(str(tmp_path / "bomb.yaml"))
    (tmp_path / "twice.yaml").write_text("version: 1\nresources: []\nversion: 1\n")
    with pytest.raises(ConfigError, match="given twice"):
        rules.load_rules(str(tmp_path / "twice.yaml"))


def test_a_kubeconfig_is_read_the_same_way(tmp_path: Path) -> None:
    from hetero_dp.dra.kubeconfig import ClusterConfig

    os.mkfifo(tmp_path / "config")
    with pytest.raises(ValueError, match="a FIFO"):
        in_time(lambda: ClusterConfig.from_kubeconfig(str(tmp_path / "config")))
    (tmp_path / "bomb").write_text(alias_bomb(key="clusters"))
    with pytest.raises(ValueError, match="stands for more than"):
        ClusterConfig.from_kubeconfig(str(tmp_path / "bomb"))
