"""Every device that is not Healthy says why in the log when it is first advertised so,
once per reason, and `hetero-dp list` shows the same verdicts: an operator who sees
fewer allocatable devices has a line to grep (issue #37: a device the container gate
refused was advertised Unhealthy without a word, and `list` showed it Healthy)."""

from __future__ import annotations

import logging
import subprocess

from hetero_dp import Device, DeviceNode, hookimpl

R = "example.com/gate"

PLUGIN = """
from hetero_dp import Device, DeviceNode, hookimpl

@hookimpl
def discover():
    yield Device(id="s0", resource="example.com/gate", nodes=[DeviceNode("/etc/shadow")])
    yield Device(id="s1", resource="example.com/gate", env={"LD_PRELOAD": "/x.so"})
    yield Device(id="s2", resource="example.com/gate")
"""


class Refusable:
    hetero_dp_name = "refusable"

    @hookimpl
    def discover(self):
        return [
            Device(id="s0", resource=R, nodes=[DeviceNode("/etc/shadow")]),
            Device(id="s1", resource=R, nodes=[DeviceNode("/etc/passwd")]),
            Device(id="s2", resource=R, env={"LD_PRELOAD": "/x.so"}),
            Device(id="s3", resource=R, healthy=False, reason="firmware too old"),
            Device(id="s4", resource=R),
        ]


async def test_devices_first_advertised_unhealthy_are_logged_once_per_reason(
    fake_kubelet, plugin_runner, caplog
):
    caplog.set_level(logging.WARNING)
    daemon = await plugin_runner.start(Refusable())
    devices = await fake_kubelet.wait_devices(R, lambda d: len(d) == 5)
    assert [i for i, d in sorted(devices.items()) if d.healthy] == ["s4"]
    lines = [r.getMessage() for r in caplog.records if "advertised Unhealthy" in r.getMessage()]
    assert any(ln.startswith("device s2 advertised Unhealthy: refused") for ln in lines), lines
    assert any("LD_PRELOAD" in ln for ln in lines)
    assert "device s3 advertised Unhealthy: firmware too old" in lines
    # s0 and s1 share a kind of refusal but not its words: one line each
    assert sum("s0" in ln for ln in lines) == 1 and sum("s1" in ln for ln in lines) == 1
    assert not any("s4" in ln for ln in lines)
    # a rediscovery of the same devices says nothing again
    caplog.clear()
    await daemon.rediscover()
    assert not [r for r in caplog.records if "advertised Unhealthy" in r.getMessage()]


def test_list_shows_the_gates_verdict(tmp_path, cli_env, hetero_dp_cmd):
    plugin = tmp_path / "gated.py"
    plugin.write_text(PLUGIN)
    out = subprocess.run(
        [*hetero_dp_cmd, "list", str(plugin)],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = {ln.split()[0]: ln for ln in out.stdout.splitlines()[1:]}
    assert "Unhealthy (refused by the container gate" in rows["s0"], out.stdout
    assert "/etc/shadow" in rows["s0"]
    assert "LD_PRELOAD" in rows["s1"]
    assert "Healthy" in rows["s2"] and "Unhealthy" not in rows["s2"]
