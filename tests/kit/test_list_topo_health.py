"""``hetero-dp list`` and ``hetero-dp topo`` run the backend's health check (under
``hookTimeout``) as the daemon would, show the reason, and ``topo`` never chooses
an unhealthy device. Real CLI processes against a plugin file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

# Four devices on two boards; each device's health file holds "ok" or a reason (the
# tutorial's pattern: a file the driver writes, here one the test writes). Pairs on a
# board score 100, across boards 10 (made up for the test).
PLUGIN = """
import os
from pathlib import Path

from hetero_dp import Device, Link, hookimpl

ROOT = Path(os.environ["BOARD_ROOT"])


@hookimpl
def discover():
    return [Device(f"npu{i}", "acme.example.com/npu", numa_nodes=(i // 2,)) for i in range(4)]


@hookimpl
def check_health(device):
    text = (ROOT / device.id).read_text().strip()
    if text == "hang":
        import threading
        threading.Event().wait(60)
    return True if text == "ok" else text


@hookimpl
def links(devices):
    return [
        Link(a.id, b.id, 100 if a.numa_nodes == b.numa_nodes else 10, "BOARD")
        for i, a in enumerate(devices)
        for b in devices[i + 1 :]
    ]
"""


def _setup(tmp_path: Path, states: dict[str, str]) -> tuple[Path, dict[str, str]]:
    board = tmp_path / "board"
    board.mkdir()
    for i in range(4):
        (board / f"npu{i}").write_text(states.get(f"npu{i}", "ok"))
    plugin = tmp_path / "boards.py"
    plugin.write_text(PLUGIN)
    return plugin, {"BOARD_ROOT": str(board)}


def _run(cmd, env, *args):
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=60)


def test_list_shows_the_health_checks_reason(tmp_path, cli_env, hetero_dp_cmd):
    plugin, extra = _setup(tmp_path, {"npu1": "ecc"})
    env = dict(cli_env, **extra)
    result = _run(hetero_dp_cmd, env, "list", str(plugin))
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("npu1"))
    assert "Unhealthy (ecc)" in row
    as_json = json.loads(_run(hetero_dp_cmd, env, "list", str(plugin), "--json").stdout)
    health = {d["id"]: (d["health"], d["reason"]) for d in as_json}
    assert health["npu1"] == ("Unhealthy", "ecc")
    assert health["npu0"] == ("Healthy", "")


def test_list_judges_a_hanging_check_unhealthy_after_the_timeout(tmp_path, cli_env, hetero_dp_cmd):
    plugin, extra = _setup(tmp_path, {"npu2": "hang"})
    env = dict(cli_env, **extra, HETERO_DP_HOOK_TIMEOUT="0.5")
    result = _run(hetero_dp_cmd, env, "list", str(plugin), "--json")
    assert result.returncode == 0, result.stderr
    health = {d["id"]: (d["health"], d["reason"]) for d in json.loads(result.stdout)}
    assert health["npu2"][0] == "Unhealthy"
    assert "timed out after 0.5s" in health["npu2"][1]
    assert health["npu3"] == ("Healthy", "")


def test_topo_shows_the_reason_and_never_chooses_an_unhealthy_device(
    tmp_path, cli_env, hetero_dp_cmd
):
    # npu0-npu1 is the best pair (one board) but npu1 has an ECC error: the only
    # healthy pair on one board is npu2-npu3.
    plugin, extra = _setup(tmp_path, {"npu1": "ecc"})
    env = dict(cli_env, **extra)
    result = _run(hetero_dp_cmd, env, "topo", str(plugin), "--size", "2")
    assert result.returncode == 0, result.stderr
    legend = next(line for line in result.stdout.splitlines() if " npu1 " in line)
    assert "1 unhealthy" in legend and "(ecc)" in legend
    ids = next(line for line in result.stdout.splitlines() if "IDs:" in line)
    assert "npu1" not in ids
    assert ids.strip() == "IDs: npu2, npu3"
