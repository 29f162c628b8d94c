"""Where start-up and memory go: CPU time and RSS of each layer of imports that
``python -m hetero_dp run BACKEND`` loads before it serves, in the order a start
loads them (each step is charged only what the steps before it did not load).

    python3 -m benchmarks._import_costs      # one JSON line: [[step, cpu_s, rss_mib], ...]

Run it a few times and take the least CPU of each step (machine noise only adds):
:func:`measure` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STEPS: list[tuple[str, str]] = [
    ("the floor's imports (grpc.aio, the generated messages)", "_floor"),
    ("hetero_dp's public face (pluggy, model)", "import hetero_dp"),
    ("click", "import click"),
    (
        "finding backends: the entry-point scan (hetero_dp.kits.entrypoints)",
        "import hetero_dp.kits.entrypoints as e; e.entry_points(group='hetero_dp')",
    ),
    (
        "hetero_dp's CLI, engine, kubelet side, allocation, operations",
        "import hetero_dp.cli.main, hetero_dp.engine.daemon, hetero_dp.ops.operations",
    ),
    ("simulated backend", "import hetero_dp_simulated.backend"),
    ("pynvml", "import pynvml"),
    ("nvidia backend (hetero_dp_nvidia)", "import hetero_dp_nvidia.backend"),
    ("pyudev", "import pyudev"),
    # not loaded by `run simulated` or `run nvidia` without a config file (plain -o
    # values are read without it); the udev backend's rule sets are YAML
    ("PyYAML (config files, -o values that need it, udev rule sets)", "import yaml"),
    ("udev backend (hetero_dp_udev)", "import hetero_dp_udev.backend"),
]


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child() -> None:
    sys.path.insert(0, str(ROOT))
    out = [("the interpreter itself", time.process_time(), _rss_mib())]
    scope: dict[str, object] = {}
    for name, code in STEPS:
        t, r = time.process_time(), _rss_mib()
        if code == "_floor":
            import benchmarks._floor as floor

            floor.load_pb()
            import grpc.aio  # noqa: F401
        else:
            exec(code, scope)  # our own fixed statements
        out.append((name, time.process_time() - t, _rss_mib() - r))
    print(json.dumps(out))


def measure(runs: int, env: dict[str, str]) -> list[dict[str, float | str]]:
    """Each step's least CPU seconds and median RSS MiB over ``runs`` fresh interpreters."""
    samples: list[list[tuple[str, float, float]]] = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks._import_costs"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        samples.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    result = []
    for i, (name, _, _) in enumerate(samples[0]):
        cpus = sorted(s[i][1] for s in samples)
        rss = sorted(s[i][2] for s in samples)
        result.append({"step": name, "cpu_s": cpus[0], "rss_mib": rss[len(rss) // 2]})
    return result


if __name__ == "__main__":
    os.environ.setdefault("FAKE_NVML_SCENARIO", "")
    child()
