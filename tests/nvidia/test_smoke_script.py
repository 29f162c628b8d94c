"""scripts/gpu-smoke.py, run as on a GPU machine but with the fake driver in its place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .driver_root import VERSION, make_driver_root
from .support import install_fake_mps_control, make_node

REPO = Path(__file__).resolve().parents[2]


def run_smoke(fake_nvml_lib, node, *args):
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(Path(fake_nvml_lib.path).parent),
        "FAKE_NVML_SCENARIO": str(node.scenario),
        "PYTHONPATH": f"{REPO}:{REPO / 'vendors/nvidia'}",
    }
    opts = [f"-o{k}={v}" for k, v in node.options.items()]
    return subprocess.run(
        [sys.executable, str(REPO / "scripts/gpu-smoke.py"), *opts, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_smoke_script_passes_on_a_mig_node(fake_nvml_lib, tmp_path):
    node = make_node(fake_nvml_lib, tmp_path, "a100-8x-nvlink.scn")
    make_driver_root(node.root / "driver")  # the driver's files, for the CDI step
    control = install_fake_mps_control(node.root / "driver")  # for the MPS step
    out = run_smoke(fake_nvml_lib, node, "-omigStrategy=mixed", f"-omps.controlPath={control}")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "PASS" in text
    assert "CDI spec carries the driver" in text
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}" in text
    assert "nvidia-device-plugin: 8 GPU(s)" in text  # MIG strategy none by default there
    assert "8 GPU(s)" in text
    assert "nvidia.com/mig-1g.5gb" in text and node.uuid(3) in text
    assert "NVIDIA_VISIBLE_DEVICES" in text
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB" in text
    assert "NV4 score 450" in text
    assert "[pass] nvml" in text
    # MPS on the first whole GPU (GPU 0 is in MIG mode): an A100-40GB's quarter
    assert "MPS: sharing.mps, GPU 1 x 4 replicas" in text
    assert "MPS daemon up: threads '25.0', pinned limit '10240M' (quarter 10240M)" in text
    assert "CUDA_MPS_PIPE_DIRECTORY': '/mps/nvidia.com/gpu/pipe'" in text
    assert "MPS: client check skipped, no libcuda.so.1" in text  # the fake has no CUDA


def test_smoke_script_fails_clearly_without_a_driver(fake_nvml_lib, tmp_path):
    node = make_node(fake_nvml_lib, tmp_path, "h100-8x.scn", ("init_error 18",))
    out = run_smoke(fake_nvml_lib, node)
    assert out.returncode != 0
    assert "version mismatch" in out.stdout + out.stderr
