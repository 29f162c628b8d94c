"""Every error a user meets gives one clear log line (or error) that names the fix."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hetero_dp_nvidia import nvml
from hetero_dp_nvidia.backend import NvidiaBackend
from hetero_dp_nvidia.nvml import NvmlUnavailable

from .support import build_fake, make_node

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_log_once():
    nvml.forget_logged()
    yield
    nvml.forget_logged()


def lines(caplog, needle):
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


PROBE = """
import json, logging, os
from hetero_dp_nvidia.backend import NvidiaBackend
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
b = NvidiaBackend(environ={"MIG_STRATEGY": "mixed", "FAIL_ON_INIT_ERROR": os.environ["FOIE"]})
try:
    b.configure(json.loads(os.environ["OPTS"]))
    devs = b.discover()
    print("RESULT", json.dumps([[d.id, d.resource] for d in devs]))
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


def run_probe(ld_path: str, opts: dict, fail_on_init: str = "true", scenario: str = "") -> str:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{REPO}:{REPO / 'vendors/nvidia'}",
        "LD_LIBRARY_PATH": ld_path,
        "FOIE": fail_on_init,
        "OPTS": json.dumps(opts),
        "FAKE_NVML_SCENARIO": scenario,
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    return out.stdout + out.stderr


def test_library_not_found(tmp_path):
    out = run_probe(str(tmp_path), {})
    assert "ERROR NvmlUnavailable NVML library libnvidia-ml.so.1 not found" in out
    assert "fix: install the NVIDIA driver" in out


def test_library_not_found_with_fail_on_init_error_false_serves_zero(tmp_path):
    out = run_probe(str(tmp_path), {}, fail_on_init="false")
    assert "RESULT []" in out
    warnings = [line for line in out.splitlines() if "libnvidia-ml.so.1 not found" in line]
    assert len(warnings) == 1 and "failOnInitError=false" in warnings[0]


def test_older_driver_without_mig_symbols(tmp_path):
    """A real missing symbol (library built without the MIG functions)."""
    lib = build_fake(tmp_path / "old", ("-DFAKE_NO_MIG",))
    node = make_node(None, tmp_path / "node", "a100-8x-nvlink.scn")  # type: ignore[arg-type]
    out = run_probe(str(lib.parent), node.options, scenario=str(node.scenario))
    assert "RESULT" in out, out
    result = json.loads(out.split("RESULT", 1)[1].splitlines()[0])
    assert len(result) == 8 and {r[1] for r in result} == {"nvidia.com/gpu"}
    missing = [line for line in out.splitlines() if "MIG mode is missing" in line]
    assert len(missing) == 1 and "upgrade the NVIDIA driver" in missing[0]


def test_version_mismatch_names_the_fix(fake_node, caplog):
    node = fake_node("h100-8x.scn", "init_error 18")
    b = NvidiaBackend(environ={})
    with pytest.raises(NvmlUnavailable) as info:
        b.configure(node.options)
    assert "driver/library version mismatch" in str(info.value)
    assert info.value.fix == "reload the nvidia kernel module or reboot the node"
    # not logged too: the caller that reports the failed hook says it, once (issue #30:
    # `hetero-dp list nvidia` printed the same sentence three times)
    assert lines(caplog, "version mismatch") == []


def test_version_mismatch_with_fail_on_init_error_false(fake_node, caplog):
    node = fake_node("h100-8x.scn", "init_error 18")
    b = NvidiaBackend(environ={"FAIL_ON_INIT_ERROR": "false"})
    b.configure(node.options)
    assert b.discover() == []
    assert b.discover() == []
    assert b.metrics([]) == [] and b.links([]) == []
    msgs = lines(caplog, "version mismatch")
    assert len(msgs) == 1 and "reload the nvidia kernel module or reboot" in msgs[0]


def test_driver_not_loaded(fake_node):
    node = fake_node("h100-8x.scn", "init_error 9")
    with pytest.raises(NvmlUnavailable, match="kernel driver is not loaded; fix: load it"):
        NvidiaBackend(environ={}).configure(node.options)


def test_gpu_lost_after_n_calls_is_advertised_unhealthy(fake_node, fake_nvml_lib, caplog):
    node = fake_node("h100-8x.scn")
    b = NvidiaBackend(environ={})
    b.configure(node.options)
    calls = fake_nvml_lib.fake_nvml_call_count(3)
    b.shutdown()
    # same scenario, GPU 3 lost a few calls into the second discovery
    node = fake_node("h100-8x.scn", *[])
    text = node.scenario.read_text().replace(
        f"uuid={node.uuid(3)}", f"uuid={node.uuid(3)} lost_after={calls + 3}"
    )
    node.scenario.write_text(text)
    b = NvidiaBackend(environ={})
    b.configure(node.options)
    devices = b.discover()
    b.shutdown()
    d3 = next(d for d in devices if d.id == node.uuid(3))
    assert not d3.healthy
    assert "is lost (fell off the bus); fix: drain the node" in d3.reason
    assert all(d.healthy for d in devices if d is not d3)
    assert len(lines(caplog, f"GPU {node.uuid(3)} is lost")) == 1


def test_missing_function_reported_by_the_driver(fake_node, caplog):
    node = fake_node("a100-8x-nvlink.scn", "fault fn=nvmlDeviceGetMigMode err=13")
    b = NvidiaBackend(environ={"MIG_STRATEGY": "mixed"})
    b.configure(node.options)
    devices = b.discover()
    b.discover()
    b.shutdown()
    assert len(devices) == 8 and all(d.resource == "nvidia.com/gpu" for d in devices)
    msgs = lines(caplog, "MIG mode is missing")
    assert len(msgs) == 1 and "upgrade the NVIDIA driver" in msgs[0]


def test_not_supported_on_mig_handle_skips_that_slice_loudly(fake_node, caplog):
    node = fake_node(
        "a100-8x-nvlink.scn", "fault fn=nvmlDeviceGetAttributes_v2 dev=0 migdev=1 err=3"
    )
    b = NvidiaBackend(environ={"MIG_STRATEGY": "mixed"})
    b.configure(node.options)
    ids = [d.id for d in b.discover()]
    b.shutdown()
    migs = node.mig_uuids(0)
    assert migs[1] not in ids and migs[0] in ids and migs[2] in ids
    msgs = lines(caplog, migs[1])
    assert len(msgs) == 1
    assert "NOT_SUPPORTED on MIG handles" in msgs[0] and "is not advertised" in msgs[0]


def test_not_supported_metrics_on_mig_are_skipped_quietly(fake_node, caplog):
    node = fake_node("a100-8x-nvlink.scn")
    b = NvidiaBackend(environ={"MIG_STRATEGY": "mixed"})
    b.configure(node.options)
    b.discover()
    samples = b.metrics([])
    b.shutdown()
    mig_samples = [s for s in samples if "GPU_I_ID" in s.labels]
    assert {s.name for s in mig_samples} == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_transient_fault_during_discovery_marks_only_that_gpu(fake_node):
    node = fake_node(
        "h100-8x.scn", "fault fn=nvmlDeviceGetMemoryInfo dev=6 err=999 after=1 times=1"
    )
    b = NvidiaBackend(environ={})
    b.configure(node.options)  # reads GPU 6 once (after=1 lets that pass)
    first = {d.id: d for d in b.discover()}
    second = {d.id: d for d in b.discover()}
    b.shutdown()
    assert not first[node.uuid(6)].healthy and "Unknown Error" in first[node.uuid(6)].reason
    assert all(d.healthy for d in second.values())
