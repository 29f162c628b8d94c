"""End to end: ``hetero-dp run`` in a subprocess with --metrics-address and a config
file, against the fake kubelet: probes, metrics, labels and a reload by file change."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys

import yaml

from .helpers import http_get

SIM = "hetero-dp.io/sim"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Logs:
    """The daemon's JSON log lines, read as they come."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.lines: list[dict] = []

    async def wait(self, predicate, timeout: float = 20.0) -> dict:
        async def read() -> dict:
            for line in self.lines:
                if predicate(line):
                    return line
            while True:
                raw = await self.stream.readline()
                if not raw:
                    raise AssertionError(f"daemon exited; log: {self.lines}")
                try:
                    line = json.loads(raw)
                except ValueError:
                    line = {"msg": raw.decode()}
                self.lines.append(line)
                if predicate(line):
                    return line

        return await asyncio.wait_for(read(), timeout)


async def test_run_serves_probes_and_reloads_its_config_file(
    fake_kubelet, tmp_path, repo_root, cli_env
):
    port = free_port()
    label_dir = tmp_path / "features.d"
    path = tmp_path / "config.yaml"
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "logFormat": "json",
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "backends": {"simulated": {"count": 2}},
    }
    path.write_text(yaml.safe_dump(doc))
    env = dict(cli_env)
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), str(repo_root / "vendors/simulated")])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hetero_dp", "run", "simulated", "-c", str(path),
        "--metrics-address", f"127.0.0.1:{port}", "--labels-dir", str(label_dir),
        env=env, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    logs = Logs(proc.stderr)
    try:
        await logs.wait(lambda r: r.get("resource") == SIM and "registered" in r["msg"])
        await logs.wait(lambda r: r.get("resource") == SIM and "ListAndWatch opened" in r["msg"])
        await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 2)
        status, body = await http_get(port, "/readyz")
        assert status == 200, body
        status, text = await http_get(port, "/metrics")
        assert f'hetero_dp_devices{{resource="{SIM}"}} 2.0' in text
        assert (label_dir / "hetero-dp-simulated").read_text().startswith(f"{SIM}.count=2\n")

        doc["backends"]["simulated"]["count"] = 3
        path.write_text(yaml.safe_dump(doc))
        await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 3, timeout=20)
        assert fake_kubelet.registration_count(SIM) == 1  # no restart for a device-set change

        doc["backends"]["simulated"]["count"] = "many"
        path.write_text(yaml.safe_dump(doc))
        line = await logs.wait(lambda r: "config reload rejected" in r["msg"])
        assert "backends.simulated.count" in line["msg"]
        assert (await http_get(port, "/readyz"))[0] == 200
        assert len(fake_kubelet.resources[SIM].devices) == 3

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert not (label_dir / "hetero-dp-simulated").exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
