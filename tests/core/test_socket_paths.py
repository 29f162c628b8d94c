"""Socket paths and the kubelet dir (issue #29): a 106- or 107-byte socket path
passed our check but not grpcio's, and a relative --kubelet-dir crashed with a gRPC
traceback (exit 1). Now: the limit grpcio really enforces, exit 2 naming the dir;
a relative --kubelet-dir is the shell's and made absolute."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import grpc
import pytest

from hetero_dp.model.names import KUBELET_SOCKET, MAX_UNIX_PATH
from hetero_dp.testing import short_tempdir

_BASES: list[str] = []


@pytest.fixture(autouse=True)
def _remove_bases() -> Iterator[None]:
    yield
    while _BASES:
        shutil.rmtree(_BASES.pop(), ignore_errors=True)


def _dir_for(total: int, name: str = KUBELET_SOCKET) -> str:
    """A dir under /tmp whose ``name`` inside has a path of ``total`` bytes (its base
    is removed after the test)."""
    base = str(short_tempdir("hdp"))
    _BASES.append(base)
    pad = total - len(base) - 2 - len(name)
    return os.path.join(base, "d" * pad)


@pytest.mark.parametrize(("size", "binds"), [(MAX_UNIX_PATH, True), (MAX_UNIX_PATH + 1, False)])
async def test_grpcio_binds_a_unix_socket_path_up_to_our_limit_only(size, binds):
    directory = _dir_for(size, "s.sock")
    os.makedirs(directory)
    path = os.path.join(directory, "s.sock")
    assert len(path) == size
    server = grpc.aio.server()
    try:
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        bound = os.path.exists(path)
    except RuntimeError:
        bound = False
    finally:
        await server.stop(None)
    assert bound == binds


@pytest.mark.parametrize("size", [MAX_UNIX_PATH + 1, MAX_UNIX_PATH + 2])
def test_a_kubelet_dir_too_long_for_grpcio_exits_2_naming_it(size, cli_env, hetero_dp_cmd):
    kdir = _dir_for(size)
    os.makedirs(kdir)
    proc = subprocess.run(
        [*hetero_dp_cmd, "run", "simulated", "--kubelet-dir", kdir],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "kubeletDir" in proc.stderr and "Traceback" not in proc.stderr


async def test_a_relative_kubelet_dir_is_made_absolute(fake_kubelet, cli_env, hetero_dp_cmd):
    cwd = fake_kubelet.plugin_dir.parent
    proc = await asyncio.create_subprocess_exec(
        *hetero_dp_cmd,
        "run",
        "simulated",
        "--kubelet-dir",
        fake_kubelet.plugin_dir.name,
        env=cli_env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await fake_kubelet.wait_registered("hetero-dp.io/sim", timeout=30)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
    stderr = (await proc.stderr.read()).decode()
    assert code == 0, stderr
    assert "Traceback" not in stderr


def test_a_relative_kubelet_dir_in_the_config_file_is_refused(tmp_path, cli_env, hetero_dp_cmd):
    config = tmp_path / "c.yaml"
    config.write_text("kubeletDir: var/lib/kubelet/device-plugins\n")
    proc = subprocess.run(
        [*hetero_dp_cmd, "run", "simulated", "--config", str(config)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "kubeletDir" in proc.stderr and "absolute" in proc.stderr
