"""The pieces of benchmarks/bench_backends.py that its figures rest on: the floor
registers like a plugin and answers the bytes it was given; the udev benchmark's
grown tree is one the udev backend really sees as 8 healthy GPUs."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import ROOT, subprocess_env
from benchmarks import _udev_tree as udev_tree
from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.testing import FakeKubelet, short_tempdir


def test_grown_tree_has_eight_distinct_devices() -> None:
    text = udev_tree.tree_text()
    records = [r for r in re.split(r"\n\s*\n", text) if r.strip()]
    paths = [r.splitlines()[0] for r in records]
    assert len(paths) == len(set(paths)), "every syspath once"
    gpus = [r for r in records if f"E: DRIVER={udev_tree.DRIVER}" in r.splitlines()]
    assert len(gpus) == udev_tree.DEVICES
    nodes = re.findall(r"^N: (\S+)$", text, flags=re.M)
    assert len(nodes) == len(set(nodes)), "every /dev node once"
    minors = re.findall(r"^A: dev=(\d+:\d+)$", text, flags=re.M)
    assert len(minors) == len(set(minors)), "every device number once"


def test_growing_keeps_a_tree_that_is_big_enough() -> None:
    text = udev_tree.tree_text()
    assert udev_tree.grow(text) == text


@pytest.mark.skipif(
    subprocess.run(["which", "umockdev-wrapper"], capture_output=True).returncode != 0,
    reason="umockdev is not installed (apt-get install umockdev libumockdev0)",
)
def test_udev_backend_sees_eight_healthy_gpus(tmp_path: Path) -> None:
    tree = tmp_path / "node.umockdev"
    tree.write_text(udev_tree.tree_text())
    # the listing runs inside the helper's testbed, as the benchmark's daemon does
    script = (
        f"import subprocess, sys; sys.argv = ['x', {str(tree)!r}]\n"
        "from hetero_dp_udev.testing import Testbed\n"
        "with Testbed() as bed:\n"
        "    bed.add_file(sys.argv[1])\n"
        "    out = subprocess.run([sys.executable, '-m', 'hetero_dp', 'list', 'udev', '-o',"
        f" 'udev.rules=[{udev_tree.RULES}]'], capture_output=True, text=True)\n"
        "    print(out.stdout + out.stderr)\n"
    )
    out = subprocess.run(
        ["umockdev-wrapper", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=ROOT,
        timeout=60,
    ).stdout
    rows = [line for line in out.splitlines() if udev_tree.RESOURCE in line]
    assert len(rows) == udev_tree.DEVICES, out
    assert all(" Healthy " in line for line in rows), out


def test_floor_registers_and_answers_the_given_bytes() -> None:
    root = short_tempdir("hdp-tf-")

    async def scenario() -> None:
        answer = pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse(envs={"A": "1"})]
        )
        preferred = pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=["x"])]
        )
        (root / "a").write_bytes(answer.SerializeToString())
        (root / "p").write_bytes(preferred.SerializeToString())
        async with FakeKubelet(root / "dp") as kubelet:
            sock = kubelet.plugin_dir / "floor.sock"
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(ROOT / "benchmarks" / "_floor.py"),
                str(sock),
                str(root / "a"),
                str(root / "p"),
                "--register",
                str(kubelet.socket_path),
                "bench.floor/x",
                env=subprocess_env(),
                stdout=asyncio.subprocess.DEVNULL,
            )
            try:
                await kubelet.wait_registered("bench.floor/x", timeout=30)
                got = await kubelet.allocate("bench.floor/x", ["floor0"])
                assert got == answer.container_responses[0]
                assert await kubelet.preferred_allocation("bench.floor/x", ["x", "y"]) == ["x"]
            finally:
                proc.terminate()
                await proc.wait()

    try:
        asyncio.run(scenario())
    finally:
        shutil.rmtree(root, ignore_errors=True)
