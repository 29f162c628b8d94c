"""What ``hetero-dp run`` imports before its first registration (issue 35 point 7).

A real ``python -X importtime -m hetero_dp run simulated`` against the fake kubelet;
the modules it wrote before the kubelet saw it registered must not include those
that only other commands, other settings or later work need. Each was loaded by
every start before it was deferred (benchmarks/bench_startup.py measures the cost;
docs/benchmarks.md has the figures)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

from benchmarks import ROOT, subprocess_env
from benchmarks.bench_startup import imports
from hetero_dp.testing import FakeKubelet, short_tempdir

RESOURCE = "hetero-dp.io/sim"

# module: what needs it (none of it is a plain `run simulated` before it registers)
DEFERRED = {
    "json": "`list --json`, JSON logs, CDI spec files, JSON runtime configs",
    "secrets": "nothing: os.urandom gives the same random hex",
    "hmac": "secrets",
    "sysconfig": "nothing: the stdlib dir is where os.py is",
    "hetero_dp.ops.reload": "a config file (hot reload)",
    "hetero_dp.cli.top": "`hetero-dp top`",
    "hetero_dp.cli.cleanup": "`hetero-dp cleanup`",
    "yaml": "config files, -o values that need it",
    "prometheus_client": "metrics.address",
    "hetero_dp.dra": "--mode dra",
    "hetero_dp.ops.doctor": "`hetero-dp doctor`",
    "http.client": "DRA's API client",
    "email": "http.client",
}


async def _imported_before_registration() -> dict[str, int]:
    root = short_tempdir("hdp-ti-")
    try:
        return await _profile(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _profile(root: Path) -> dict[str, int]:
    async with FakeKubelet(root / "dp") as kubelet:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "hetero_dp",
            "run",
            "simulated",
            "--kubelet-dir",
            str(kubelet.plugin_dir),
            "-o",
            "simulated.count=2",
            cwd=ROOT,
            env=subprocess_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        lines: list[str] = []
        registered = asyncio.ensure_future(kubelet.wait_registered(RESOURCE, timeout=60))
        try:
            while not registered.done():
                read = asyncio.ensure_future(proc.stderr.readline())
                done, _ = await asyncio.wait({read, registered}, return_when="FIRST_COMPLETED")
                if read not in done:
                    read.cancel()
                    break
                line = read.result()
                if not line:  # exited before registering
                    break
                lines.append(line.decode(errors="replace"))
            await registered
        finally:
            proc.terminate()
            await proc.communicate()
    return imports(lines)


def test_run_registers_without_what_it_does_not_need() -> None:
    loaded = asyncio.run(_imported_before_registration())
    assert "hetero_dp_simulated.backend" in loaded  # the profile holds the start itself
    early = {m: why for m, why in DEFERRED.items() if m in loaded}
    assert not early, f"imported before the first registration: {early}"
