"""Run every benchmark module and write docs/benchmarks.md.

    python3 -m benchmarks                  # all modules, writes docs/benchmarks.md
    python3 -m benchmarks bench_core       # only the named modules
    python3 -m benchmarks --output FILE    # write elsewhere (``-`` prints only)
    python3 -m benchmarks --quick ...      # short runs (HDP_BENCH_QUICK=1): a smoke
                                           # test; prints, writes docs only with --output

Each module runs in its own subprocess (a clean interpreter for each, so one
module's servers and memory never colour another's figures).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import inspect
import json
import math
import os
import pkgutil
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import ROOT, subprocess_env

MODULE_TIMEOUT = 480.0  # bench_backends takes ~2 min on a quiet 2-core machine


def discover() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))


def _child(name: str, out: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    run = getattr(module, "run", None)
    if run is None:
        result: Any = {"skipped": "no run() in module"}
    else:
        result = run()
        if inspect.iscoroutine(result):  # async def run()
            result = asyncio.run(result)
    Path(out).write_text(json.dumps(result, default=str))


def run_module(name: str) -> tuple[dict[str, Any] | None, str, float]:
    """(result or None, error text, seconds) for one module, run in a subprocess."""
    with tempfile.TemporaryDirectory(prefix="hdp-bench-") as tmp:
        out = Path(tmp) / "result.json"
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks", "--child", name, "--result", str(out)],
                cwd=ROOT,
                env=subprocess_env(),
                capture_output=True,
                text=True,
                timeout=MODULE_TIMEOUT,
            )
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")[-2000:]
            text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            return None, f"timed out after {MODULE_TIMEOUT:.0f}s\n{text}", MODULE_TIMEOUT
        seconds = time.monotonic() - start
        if proc.returncode != 0 or not out.exists():
            return None, f"exit status {proc.returncode}\n{proc.stderr[-3000:]}", seconds
        return json.loads(out.read_text()), "", seconds


# --- the machine ---------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    return {
        "CPU": _cpu_model(),
        "Cores": str(os.cpu_count()),
        "Kernel": f"{platform.system()} {platform.release()}",
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        # others' work on the machine colours absolute figures (ratios much less)
        "Load average at start (1, 5 min)": "{:.2f}, {:.2f}".format(*os.getloadavg()[:2]),
    }


# --- the report ------------------------------------------------------------


def _num(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _met(ok: Any) -> str:
    return {True: "yes", False: "**no**"}.get(ok, "-")


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out += _flatten(v, f"{prefix} / {k}" if prefix else str(k))
        return out
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return [(prefix, f"{len(value)} entries (raw data: run the module)")]
    return [(prefix, value)]


def _footer(name: str, seconds: float, started: str) -> str:
    return f"_Module `{name}` took {seconds:.0f} s ({started})._"


def section(
    name: str, result: dict[str, Any] | None, error: str, seconds: float, started: str = ""
) -> list[str]:
    if result is None:
        return [
            f"## {name}",
            "",
            f"Failed ({seconds:.0f} s):",
            "",
            "```",
            error.strip(),
            "```",
            "",
            _footer(name, seconds, started),
            "",
        ]
    lines = [f"## {result.get('title', name)}", ""]
    rows = result.get("rows")
    if isinstance(rows, list):
        lines += [
            "| Figure | Measured | Floor | Ratio | Goal | Met |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            unit = r.get("unit", "")
            label = r.get("name", "?") + (f" ({r['note']})" if r.get("note") else "")
            lines.append(
                f"| {label} | {_num(r.get('value'), unit)} | {_num(r.get('floor'), unit)} "
                f"| {_ratio(r.get('ratio'))} | {r.get('goal', '')} | {_met(r.get('ok'))} |"
            )
    else:  # a plain (possibly nested) mapping of figures
        lines += ["| Figure | Value |", "|---|---|"]
        plain = {k: v for k, v in result.items() if k not in ("title", "notes")}
        lines += [f"| {k} | {_num(v)} |" for k, v in _flatten(plain)]
    notes = result.get("notes") or []
    if notes:
        lines.append("")
        lines += [f"- {n}" for n in notes]
    lines += ["", _footer(name, seconds, started), ""]
    return lines


RELIABILITY = [
    "## Reliability",
    "",
    "Never losing capacity is tested rather than timed, in `tests/reliability/`",
    '(`pytest tests/reliability`; `-m "not slow"` skips the 200-restart storm):',
    "",
    "- kubelet restart storms (25, and 200 under `slow`; classic and watcher mode) and",
    "  stream-drop storms: each re-registers; fds, threads, RSS and tasks stay flat;",
    "- kubelet restarts with 0 to 5 s of downtime (Register refused meanwhile, sockets",
    "  wiped, kubelet.sock bound), landing in the plugin's registration backoff, in both",
    "  modes and on Python 3.10-3.13 (`make test-matrix`); SIGTERM at any moment of such",
    "  a restart ends the process with 0 within 5 s;",
    "- the plugin SIGKILLed and started again: the stale socket is replaced;",
    "- the DaemonSet rolled in both orders for every bundled backend, with a kubelet",
    "  that disconnects the current client when an old stream ends (kubelet 1.32):",
    "  no admission fails outside the dip, each instance keeps its own socket, and in",
    "  surge order the one dip ends with an immediate re-registration (under 0.5 s even",
    "  on a loaded machine; a hand-over that waited 1 s fails); udev's pods, and one",
    "  simulated rollout, in the host network as the udev DaemonSet runs them (one",
    "  metrics port for both, each pod's ready file as its readiness probe); SIGTERM ends",
    "  an idle process at once (exit 0, no interpreter finalization, socket gone);",
    "- a kubelet that never opens ListAndWatch, or drops it: the plugin re-registers;",
    "- kubelet outages, and the socket deleted at every point of a plugin restart;",
    "- 50 concurrent Allocates while health flips: each answer matches the device set",
    "  of its moment;",
    "- hypothesis fuzzing of every RPC (IDs, sizes, unicode, huge lists, raw bytes) and",
    "  of the config parser: clean gRPC errors or ConfigErrors only;",
    "- backend hooks that raise, hang past `hookTimeout` or return garbage: contained,",
    "  reported, the devices Unhealthy with the reason, everything else served;",
    "- hook calls that never return: only their device or request suffers, the stuck",
    "  thread is replaced, past 8 stuck calls the backend is Unhealthy, and a call that",
    "  returns late has its device judged again;",
    "- bounds: replicas, device counts and ID lengths against the kubelet's 4 MiB",
    "  ListAndWatch limit, at start-up and on reload; log lines stay under a few KB.",
    "",
]


Result = tuple[str, dict[str, Any] | None, str, float, str]


def splice(old: str, results: list[Result]) -> str:
    """``old`` (a report) with the sections of the modules in ``results`` replaced
    (or added before Reliability); every other section stays as it was measured."""
    chunks = re.split(r"(?m)^(?=## )", old)
    head, body = chunks[0], chunks[1:]
    for name, result, error, seconds, started in results:
        new = "\n".join(section(name, result, error, seconds, started)) + "\n"
        mark = f"_Module `{name}` took"
        at = next((i for i, c in enumerate(body) if mark in c), None)
        if at is None:
            at = next((i for i, c in enumerate(body) if c.startswith("## Reliability")), len(body))
            body.insert(at, new)
        else:
            body[at] = new
    return (head + "".join(body)).rstrip() + "\n"


def report(results: list[Result], box: dict[str, str]) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        "Written by `python3 -m benchmarks` (or `make bench`); do not edit by hand.",
        "Each figure is measured in the same run as its floor, the same work done without",
        "hetero-dp, where one exists: the ratio is the figure to compare across machines.",
        "`python3 -m benchmarks MODULE...` rewrites only those modules' sections; each",
        "section ends with when it ran and the load average (1, 5 min) at its start.",
        "",
        f"Run on {now}.",
        "",
        "| Machine | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in box.items()]
    lines.append("")
    for name, result, error, seconds, started in results:
        lines += section(name, result, error, seconds, started)
    lines += RELIABILITY
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks", description=__doc__)
    parser.add_argument("modules", nargs="*", help="bench_* modules to run (default: all)")
    parser.add_argument("--output", default=None, help="default: docs/benchmarks.md")
    parser.add_argument(
        "--quick", action="store_true", help="short runs for development and CI (not for docs)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.result)
        return 0
    if args.output is None:
        args.output = "-" if args.quick else str(ROOT / "docs" / "benchmarks.md")
    if args.quick:
        os.environ["HDP_BENCH_QUICK"] = "1"  # the children read it
    box = machine()  # before the benchmarks load it
    names = args.modules or discover()
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        parser.error(f"no such benchmark module: {', '.join(unknown)}")
    results = []
    failed = False
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        load = "{:.2f}, {:.2f}".format(*os.getloadavg()[:2])
        started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        started = f"{started}, load average {load}"
        result, error, seconds = run_module(name)
        failed |= result is None
        if result is None:
            print(f"  {name} failed: {error.strip().splitlines()[-1:]}", file=sys.stderr)
        else:
            for r in result.get("rows", []) if isinstance(result.get("rows"), list) else []:
                print(
                    f"  {r.get('name')}: {_num(r.get('value'), r.get('unit', ''))}"
                    f" (floor {_num(r.get('floor'), r.get('unit', ''))},"
                    f" {_ratio(r.get('ratio'))}) met={_met(r.get('ok'))}",
                    file=sys.stderr,
                )
        results.append((name, result, error, seconds, started))
    existing = Path(args.output) if args.output != "-" else None
    if args.modules and existing is not None and existing.exists():
        text = splice(existing.read_text(), results)  # the other sections stay
    else:
        text = report(results, box)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out)  # atomic: a reader never sees half a report
        print(f"wrote {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
