"""``hetero-dp cleanup``: hetero-dp's own files go, everyone else's stay (real files,
real sockets, in a tmp dir standing in for the node's dirs)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetero_dp.allocation import cdi
from hetero_dp.cli import main
from hetero_dp.cli.cleanup import DRA_SPEC_PREFIX, SPEC_FILE_PREFIX, SUPERSEDED_SUFFIX
from hetero_dp.dra import claimspec
from hetero_dp.engine.cdi_publisher import CDIWriter
from hetero_dp.testing import short_tempdir
from tests.cdi import samples

NVIDIA_SPEC = "k8s.device-plugin.nvidia.com-gpu.json"  # what NVIDIA's plugin writes


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Short: unix socket paths stay under 108 bytes."""
    d = short_tempdir("hdp-clean-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def node(tmp_path: Path) -> tuple[Path, Path, Path]:
    cdi_dir, kubelet, labels = (tmp_path / n for n in ("cdi", "device-plugins", "features.d"))
    for d in (cdi_dir, kubelet, labels):
        d.mkdir()
    return cdi_dir, kubelet, labels


def run(cdi_dir: Path, kubelet: Path, labels: Path, *extra: str):
    args = ["cleanup", "--cdi-dir", str(cdi_dir), "--kubelet-dir", str(kubelet)]
    return CliRunner().invoke(main, [*args, "--labels-dir", str(labels), *extra])


def listening(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen()
    return s


def stale(path: Path) -> None:
    """A socket file nobody listens on any more (an instance that was killed)."""
    listening(path).close()


def test_removes_hetero_dps_files_and_leaves_everyone_elses(tmp_path: Path):
    cdi_dir, kubelet, labels = node(tmp_path)
    ours = CDIWriter(cdi_dir).write("nvidia.com/gpu", samples.accel_glob(2))
    assert ours is not None and ours.name == "hetero-dp_nvidia.com_gpu.json"
    dra = claimspec.spec_path(cdi_dir, "gpu.example.com", "1234")
    dra.write_text("{}")
    temp = cdi_dir / ".hetero-dp_nvidia.com_gpu.json.x1y2.tmp"  # a killed atomic write
    temp.write_text("{")
    foreign = {
        cdi_dir / NVIDIA_SPEC: json.dumps({"kind": "k8s.device-plugin.nvidia.com/gpu"}),
        cdi_dir / "hetero-dp_looks-like-ours.yaml": "{}",  # we write only .json
        cdi_dir / "vendor-hetero-dp_x.json": "{}",
        cdi_dir / (NVIDIA_SPEC + cdi.SUPERSEDED_SUFFIX): "{}",  # kept unless asked
        labels / "gfd": "nvidia.com/gpu.count=8\n",
        kubelet / "kubelet_internal_checkpoint": "{}",
    }
    for path, text in foreign.items():
        path.write_text(text)
    (cdi_dir / "hetero-dp_link.json").symlink_to(cdi_dir / NVIDIA_SPEC)
    os.mkfifo(cdi_dir / "hetero-dp_fifo.json")  # never opened, so never blocks
    label = labels / "hetero-dp-nvidia"
    label.write_text("nvidia.com/gpu.count=8\n")
    stale(kubelet / "hetero-dp-nvidia.com-gpu-1a2b.sock")
    other_plugin = listening(kubelet / "nvidia-gpu.sock")  # NVIDIA's own, alive
    try:
        result = run(cdi_dir, kubelet, labels)
    finally:
        other_plugin.close()
    assert result.exit_code == 0, result.output
    for gone in (ours, dra, temp, label, kubelet / "hetero-dp-nvidia.com-gpu-1a2b.sock"):
        assert not os.path.lexists(gone), gone
        assert f"removed {gone}" in result.output
    for path, text in foreign.items():
        assert path.read_text() == text, path
    assert (cdi_dir / "hetero-dp_link.json").is_symlink()
    assert (cdi_dir / "hetero-dp_fifo.json").exists()
    assert "hetero-dp_fifo.json: not a regular file, left alone" in result.output
    assert (kubelet / "nvidia-gpu.sock").exists()


def test_refuses_while_an_instance_runs_and_removes_nothing(tmp_path: Path):
    cdi_dir, kubelet, labels = node(tmp_path)
    spec = CDIWriter(cdi_dir).write("acme.com/accel", samples.accel_glob(1))
    assert spec is not None
    live = listening(kubelet / "hetero-dp-acme.com-accel-9f8e.sock")
    try:
        result = run(cdi_dir, kubelet, labels)
    finally:
        live.close()
    assert result.exit_code == 1
    assert "still running" in result.output and "hetero-dp-acme.com-accel-9f8e.sock" in (
        result.output
    )
    assert spec.exists()


def test_waits_for_a_stopping_instance(tmp_path: Path):
    cdi_dir, kubelet, labels = node(tmp_path)
    spec = CDIWriter(cdi_dir).write("acme.com/accel", samples.accel_glob(1))
    live = listening(kubelet / "hetero-dp-acme.com-accel-9f8e.sock")
    stopper = threading.Timer(0.3, live.close)  # the instance stops while we wait
    stopper.start()
    try:
        result = run(cdi_dir, kubelet, labels, "--wait", "30")
    finally:
        stopper.cancel()
        live.close()
    assert result.exit_code == 0, result.output
    assert spec is not None and not spec.exists()


def test_restore_superseded_gives_the_other_plugin_its_spec_back(tmp_path: Path):
    cdi_dir, kubelet, labels = node(tmp_path)
    set_aside = cdi_dir / (NVIDIA_SPEC + cdi.SUPERSEDED_SUFFIX)
    set_aside.write_text('{"kind": "k8s.device-plugin.nvidia.com/gpu"}')
    taken = cdi_dir / ("other.json" + cdi.SUPERSEDED_SUFFIX)
    taken.write_text("old")
    (cdi_dir / "other.json").write_text("new")  # written again since: not overwritten
    result = run(cdi_dir, kubelet, labels, "--restore-superseded")
    assert result.exit_code == 0, result.output
    assert (cdi_dir / NVIDIA_SPEC).read_text() == '{"kind": "k8s.device-plugin.nvidia.com/gpu"}'
    assert not set_aside.exists()
    assert (cdi_dir / "other.json").read_text() == "new" and taken.exists()


def test_dry_run_removes_nothing(tmp_path: Path):
    cdi_dir, kubelet, labels = node(tmp_path)
    spec = CDIWriter(cdi_dir).write("acme.com/accel", samples.accel_glob(1))
    result = run(cdi_dir, kubelet, labels, "--dry-run")
    assert result.exit_code == 0 and f"would remove {spec}" in result.output
    assert spec is not None and spec.exists()


def test_the_names_are_the_writers_names():
    assert SPEC_FILE_PREFIX == cdi.SPEC_FILE_PREFIX
    assert SUPERSEDED_SUFFIX == cdi.SUPERSEDED_SUFFIX
    assert DRA_SPEC_PREFIX == claimspec.SPEC_PREFIX


def test_a_dir_that_is_a_file_is_reported_not_a_traceback(tmp_path: Path):
    cdi_dir, _kubelet, labels = node(tmp_path)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = run(cdi_dir, not_a_dir, labels)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert f"failed {not_a_dir}: Not a directory" in result.output
