"""``hetero-dp run --mode dra`` as a real process: a claim prepared by one process is
unprepared by the next, after the first was killed."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import pytest

from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, make_claim

from .backend import DRIVER

PLUGIN = Path(__file__).with_name("npu_plugin.py")


def spawn(
    dra, hetero_dp_cmd, cli_env, *extra: str, backend: str = str(PLUGIN), env=None
) -> subprocess.Popen[bytes]:
    """``hetero-dp run BACKEND --mode dra`` in ``dra``'s layout against its API server;
    ``extra`` arguments go after the others, ``env`` adds to the environment."""
    cfg = dra.root / "config.yaml"
    cfg.write_text(f"healthInterval: 0\nrediscoverInterval: 0\ncdi:\n  dir: {dra.cdi_dir}\n")
    return subprocess.Popen(
        [
            *hetero_dp_cmd,
            "run",
            backend,
            "--mode",
            "dra",
            "-c",
            str(cfg),
            "--kubelet-dir",
            str(dra.root / "dp"),
            "--plugins-registry-dir",
            str(dra.registry_dir),
            "--dra-plugins-dir",
            str(dra.plugins_dir),
            "--api-server",
            dra.api.url,
            *extra,
        ],
        env={**cli_env, "NODE_NAME": "node-a", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 20) -> tuple[int, str]:
    out, _ = await asyncio.to_thread(proc.communicate, timeout=timeout)
    return proc.returncode, out.decode()


async def test_unprepare_after_the_preparing_process_was_killed(
    dra, kubelet, api_server, hetero_dp_cmd, cli_env
):
    first = spawn(dra, hetero_dp_cmd, cli_env)
    try:
        await kubelet.wait_registered(DRIVER, timeout=30)
        await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)
        ref = ClaimRef.of(
            api_server.add_claim(
                make_claim("c", [("npu", device_name("NPU-0001"))], driver=DRIVER, pool="node-a")
            )
        )
        entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
        assert entry.error == "" and entry.devices[0].cdi_device_ids
        assert list(dra.cdi_dir.glob("*.json"))
    finally:
        first.kill()  # no clean shutdown: slices, sockets and the spec stay behind
        await wait_exit(first)
    second = spawn(dra, hetero_dp_cmd, cli_env)
    try:
        await kubelet.wait_registered(DRIVER, after=1, timeout=30)
        response = await kubelet.node_unprepare(DRIVER, [ref])
        assert response.claims[ref.uid].error == ""
        assert list(dra.cdi_dir.glob("*.json")) == []
        assert len(api_server.devices_of(DRIVER)) == 2
    finally:
        second.send_signal(signal.SIGTERM)
        code, out = await wait_exit(second)
    assert code == 0, out
    assert api_server.slices_of(DRIVER) == [], out  # clean shutdown removed the pool


async def test_without_a_node_name_the_cli_explains(dra, hetero_dp_cmd, cli_env):
    env = {k: v for k, v in cli_env.items() if k != "NODE_NAME"}
    proc = subprocess.Popen(
        [*hetero_dp_cmd, "run", str(PLUGIN), "--mode", "dra", "--api-server", dra.api.url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    code, out = await wait_exit(proc)
    assert code == 2, out
    assert "--node-name" in out and "NODE_NAME" in out


async def test_a_relative_dra_plugins_dir_is_the_shells(
    dra, kubelet, hetero_dp_cmd, cli_env, monkeypatch
):
    """As --kubelet-dir: a relative --dra-plugins-dir is taken from the working dir
    (it crashed in gRPC's bind with a traceback, exit 1)."""
    monkeypatch.chdir(dra.root)
    proc = spawn(dra, hetero_dp_cmd, cli_env, "--dra-plugins-dir", "rel-plugins")
    try:
        await kubelet.wait_registered(DRIVER, timeout=30)
        assert (dra.root / "rel-plugins" / DRIVER / "dra.sock").is_socket()
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out = await wait_exit(proc)
    assert code == 0, out


def test_a_registry_socket_too_long_names_the_registry_dir(tmp_path):
    """The registration socket sits in pluginsRegistryDir: its length is blamed on that
    setting, not on pluginsDir (whose advice named --kubelet-dir)."""
    from hetero_dp.dra.driver import DRADriver, DriverSettings
    from hetero_dp.model.errors import ConfigError

    deep = tmp_path / ("r" * 120)
    settings = DriverSettings(
        driver=DRIVER,
        node="node-a",
        plugins_dir=Path("/p"),
        registry_dir=deep,
        cdi_dir=tmp_path,
    )
    with pytest.raises(ConfigError) as e:
        DRADriver(settings, api_client=None)
    assert e.value.field == "pluginsRegistryDir"
    assert "--plugins-registry-dir" in str(e.value) and "--kubelet-dir" not in str(e.value)
    settings.registry_dir, settings.plugins_dir = Path("/r"), deep
    with pytest.raises(ConfigError) as e:
        DRADriver(settings, api_client=None)
    assert e.value.field == "pluginsDir" and "--dra-plugins-dir" in str(e.value)


def test_a_dra_plugins_dir_that_cannot_be_a_path_is_refused():
    from hetero_dp.dra.frontend import DRAOptions
    from hetero_dp.model.errors import ConfigError

    for bad in ("relative/dir", "/a\0b"):
        with pytest.raises(ConfigError) as e:
            DRAOptions.from_flags(node_name="n", plugins_dir=bad, env={})
        assert e.value.field == "pluginsDir"


async def test_the_dra_options_from_the_config_file(
    dra, kubelet, api_server, hetero_dp_cmd, cli_env
):
    """The DRA options are settings like every other (a ``dra`` section, env vars,
    flags): a config file naming the node, the plugins dir, the API server and the
    driver name serves without one DRA flag and without NODE_NAME."""
    cfg = dra.root / "dra-config.yaml"
    cfg.write_text(
        "healthInterval: 0\nrediscoverInterval: 0\n"
        f"cdi: {{dir: {dra.cdi_dir}}}\n"
        f"dra: {{nodeName: node-a, pluginsDir: {dra.plugins_dir}, apiServer: {dra.api.url}, "
        f"driverNames: {{acme.example.com/npu: {DRIVER}}}}}\n"
    )
    env = {k: v for k, v in cli_env.items() if k not in ("NODE_NAME", "HETERO_DP_NODE_NAME")}
    proc = subprocess.Popen(
        [
            *hetero_dp_cmd,
            "run",
            str(PLUGIN),
            "--mode",
            "dra",
            "-c",
            str(cfg),
            "--kubelet-dir",
            str(dra.root / "dp"),
            "--plugins-registry-dir",
            str(dra.registry_dir),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        await kubelet.wait_registered(DRIVER, timeout=30)
        await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out = await wait_exit(proc)
    assert code == 0, out
