"""``list`` and ``topo`` check what ``run`` checks before it starts (the tutorial sends
authors to ``list`` first): options for a backend that is not loaded (a misspelled name
in ``-o`` or a config section), and resource names the kubelet would refuse. Same exit
code 2, same message: the three commands share one code path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

NO_DOMAIN = """
from hetero_dp import Device, hookimpl


@hookimpl
def discover():
    return [Device("c0", "card")]
"""

MIXED = """
from hetero_dp import Device, hookimpl


@hookimpl
def discover():
    return [Device("c0", "card"), Device("n0", "acme.example.com/npu")]
"""


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def hetero_dp(cmd, env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=120)


def run_args(tmp_path: Path) -> list[str]:
    kdir = tmp_path / "kubelet"
    kdir.mkdir(exist_ok=True)
    return ["--kubelet-dir", str(kdir), "--health-interval", "0"]


@pytest.mark.parametrize(
    "how",
    ["flag", "config"],
)
def test_a_misspelled_backend_is_refused_by_list_and_topo_as_by_run(
    tmp_path: Path, cli_env, hetero_dp_cmd, how: str
):
    if how == "flag":
        extra = ["-o", "tenstorent.deviceGlob=/dev/tt*"]
    else:
        config = tmp_path / "config.yaml"
        config.write_text("backends:\n  tenstorent:\n    deviceGlob: /dev/tt*\n")
        extra = ["--config", str(config)]
    ran = hetero_dp(hetero_dp_cmd, cli_env, "run", "simulated", *extra, *run_args(tmp_path))
    listed = hetero_dp(hetero_dp_cmd, cli_env, "list", "simulated", *extra)
    topo = hetero_dp(hetero_dp_cmd, cli_env, "topo", "simulated", *extra)
    assert ran.returncode == 2, ran.stderr
    assert "options for backend 'tenstorent', which is not loaded" in ran.stderr
    for other in (listed, topo):
        assert other.returncode == 2, other.stdout + other.stderr
        assert last_line(other.stderr) == last_line(ran.stderr)


def test_a_resource_without_a_vendor_domain_is_refused_by_list_and_topo_as_by_run(
    tmp_path: Path, cli_env, hetero_dp_cmd
):
    plugin = tmp_path / "nodomain.py"
    plugin.write_text(NO_DOMAIN)
    ran = hetero_dp(hetero_dp_cmd, cli_env, "run", str(plugin), *run_args(tmp_path))
    listed = hetero_dp(hetero_dp_cmd, cli_env, "list", str(plugin))
    topo = hetero_dp(hetero_dp_cmd, cli_env, "topo", str(plugin))
    assert ran.returncode == 2, ran.stderr
    assert "device 'c0'" in last_line(ran.stderr) and "'card'" in last_line(ran.stderr)
    for other in (ran, listed, topo):
        assert other.returncode == 2, other.stdout + other.stderr
        assert last_line(other.stderr) == last_line(ran.stderr)
        assert "Healthy" not in other.stdout
        # one sentence for the one cause: no 'refused: ...; the other resources are
        # served' line first (there are none), the error alone
        assert other.stderr.count("'card' has no vendor prefix") == 1, other.stderr
        assert "other resources" not in other.stderr


def test_list_shows_a_refused_resource_unhealthy_beside_the_served_ones(
    tmp_path: Path, cli_env, hetero_dp_cmd
):
    """As ``run``: the other resources are served, the refusal is logged; ``list``
    also shows the refused device, Unhealthy with the reason."""
    plugin = tmp_path / "mixed.py"
    plugin.write_text(MIXED)
    listed = hetero_dp(hetero_dp_cmd, cli_env, "list", str(plugin))
    assert listed.returncode == 0, listed.stderr
    rows = {ln.split()[0]: ln for ln in listed.stdout.splitlines()[1:]}
    assert "Unhealthy (refused:" in rows["c0"] and "'card'" in rows["c0"]
    assert "Healthy" in rows["n0"] and "Unhealthy" not in rows["n0"]
    assert "refused: backend mixed" in listed.stderr
    topo = hetero_dp(hetero_dp_cmd, cli_env, "topo", str(plugin))
    assert topo.returncode == 0, topo.stderr
    assert "Resource: acme.example.com/npu" in topo.stdout and "c0" not in topo.stdout
