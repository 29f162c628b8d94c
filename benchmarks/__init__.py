"""hetero-dp benchmarks: ``python3 -m benchmarks`` runs every ``benchmarks/bench_*.py``
module that has a ``run()`` and writes ``docs/benchmarks.md``.

The interface of a benchmark module
-----------------------------------
``run() -> dict`` (or ``async def run()``), called in a fresh subprocess, so a
module may start servers and leave the interpreter as it likes. The dict::

    {
        "title": "Core",                     # the section heading
        "rows": [row(...), ...],             # one per figure, see :func:`row`
        "notes": ["how it was measured", ...],
    }

A plain ``{name: value}`` dict is accepted too and printed as a two-column
table. Each figure is measured in the same run as its floor (the same work
without hetero-dp) where one exists, and reported as a ratio to it: ratios
travel between machines, absolute times do not.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by nearest rank: a value that was measured."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples) if samples else math.nan


def row(
    name: str,
    value: float,
    unit: str,
    *,
    floor: float | None = None,
    goal: str = "",
    ok: bool | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One figure: the value, its floor and their ratio, the goal and whether it is met."""
    ratio = value / floor if floor else None
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "floor": floor,
        "ratio": ratio,
        "goal": goal,
        "ok": ok,
        "note": note,
    }


def ensure_bytecode() -> None:
    """Compile this checkout's packages to ``__pycache__`` as pip does at install time.

    A deployed plugin starts from bytecode; a checkout run with
    ``PYTHONDONTWRITEBYTECODE`` set (or never run before) recompiles every module at
    each start, which added 56-117 ms to a 270 ms start here: a cost of the
    development setup, not of hetero-dp."""
    import compileall

    dirs = [ROOT / "hetero_dp", ROOT / "benchmarks"]
    vendors = ROOT / "vendors"
    if vendors.is_dir():
        dirs += sorted(p for v in vendors.iterdir() for p in v.glob("hetero_dp_*") if p.is_dir())
    for d in dirs:
        compileall.compile_dir(d, quiet=1)


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python that must import this checkout's hetero_dp
    (reading the bytecode that :func:`ensure_bytecode` wrote, as an installed one does)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_DP_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [str(ROOT)]
    vendors = ROOT / "vendors"
    if vendors.is_dir():  # this checkout's backends, even where others are installed
        paths += sorted(str(v) for v in vendors.iterdir() if (v / "pyproject.toml").exists())
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def python() -> str:
    return sys.executable
