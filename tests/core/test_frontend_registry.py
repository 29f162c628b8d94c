"""Front ends register themselves as backends do (the entry-point group
hetero_dp.front_ends) and ``hetero-dp run`` looks ``--mode`` up there, with one
assembly (hetero_dp.ops.assembly) for the CLI and both test runners."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_dp.engine.frontend import front_end_maker, front_end_names
from hetero_dp.model.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_both_front_ends_are_registered_and_looked_up_by_name() -> None:
    from hetero_dp.deviceplugin import frontend as dp
    from hetero_dp.dra import frontend as dra

    assert {"device-plugin", "dra"} <= set(front_end_names())
    assert front_end_maker("device-plugin") is dp.make_front_end
    assert front_end_maker("dra") is dra.make_front_end


def test_an_unknown_mode_names_the_installed_front_ends() -> None:
    with pytest.raises(ConfigError, match=r"no front end 'nope' .*device-plugin, dra") as e:
        front_end_maker("nope")
    assert e.value.field == "mode"


def test_run_exits_2_naming_the_mode(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hetero_dp", "run", "simulated", "--mode", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "no front end 'nope'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "path",
    ["hetero_dp/cli/main.py", "hetero_dp/testing/runner.py", "hetero_dp/testing/dra/runner.py"],
)
def test_callers_of_the_assembly_import_no_front_end(path: str) -> None:
    """The CLI and the runners name a mode; only the registry knows its package."""
    tree = ast.parse((ROOT / path).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert [m for m in imported if m.startswith(("hetero_dp.deviceplugin", "hetero_dp.dra"))] == []


async def test_the_kubelet_session_is_the_front_ends_not_the_engines(
    fake_kubelet, plugin_runner
) -> None:
    """Registration and ListAndWatch streams are device-plugin session state: kept
    by the device-plugin front end's endpoint, read by /readyz and metrics from
    there; the engine's Resource carries none of it."""
    from hetero_dp_simulated import SimulatedBackend

    daemon = await plugin_runner.start(SimulatedBackend(), options={"simulated": {"count": 1}})
    name = next(iter(daemon.resources))
    await fake_kubelet.wait_registered(name)
    session = daemon.front_end.session(name)
    await fake_kubelet.wait_devices(name, lambda d: len(d) == 1, timeout=30)
    assert session is daemon.front_end.endpoints[name].session
    assert session.registered and session.streams_opened >= 1
    res = daemon.resources[name]
    assert not any(hasattr(res, a) for a in ("registered", "open_streams", "streams_opened"))


def test_the_dra_front_end_calls_hooks_and_the_gate_through_the_engine() -> None:
    """hetero_dp/dra calls no backend hook (``backend.call``) and imports no container
    gate: prepare, unprepare, partitions and spec edits go through the engine's
    ClaimHooks, which judges what they return."""
    found = []
    for path in sorted((ROOT / "hetero_dp" / "dra").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if (
                isinstance(n, ast.Attribute)
                and n.attr == "call"
                and isinstance(n.value, ast.Attribute)
                and n.value.attr == "backend"
            ):
                found.append(f"{path.name}:{n.lineno} backend.call")
            if isinstance(n, ast.ImportFrom) and n.module == "hetero_dp.allocation.gate":
                found.append(f"{path.name}:{n.lineno} imports the gate")
    assert found == []


async def test_one_cache_decides_an_allocate_answer(fake_kubelet, plugin_runner) -> None:
    """The engine's resource keeps the answers (one cache, one stamp); the kubelet
    side keeps none of its own, and a repeated request gets the message built before."""
    from hetero_dp_simulated import SimulatedBackend

    from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
    from hetero_dp.deviceplugin.servicer import DevicePluginServicer

    daemon = await plugin_runner.start(SimulatedBackend(), options={"simulated": {"count": 2}})
    name = next(iter(daemon.resources))
    endpoint = daemon.front_end.endpoints[name]
    servicer = DevicePluginServicer(endpoint.resource, endpoint.session)
    ids = sorted(d.id for d in daemon.resources[name].state.devices)[:1]
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    first = await servicer.Allocate(request, None)
    assert await servicer.Allocate(request, None) is first
    assert daemon.resources[name].kept(request.SerializeToString()) is not None
    assert not [k for k, v in vars(servicer).items() if isinstance(v, dict)]
