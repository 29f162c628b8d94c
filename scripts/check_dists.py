#!/usr/bin/env python3
"""Build every distribution and run it as a user who has nothing but those files would.

1. ``python -m build`` makes an sdist and a wheel (the wheel built from the sdist, so a
   file missing from the sdist fails here) for hetero-dp and each package in vendors/.
2. Each wheel's metadata is checked: its version is hetero_dp's ``__version__``, and
   a vendor package pins ``hetero-dp~=`` that version.
3. A fresh virtual environment (no system site-packages) gets the wheels, by file name,
   with their third-party dependencies from the configured index; the repository is on
   no path (the commands run in an empty directory, PYTHONPATH unset).
4. There: ``hetero-dp demo``; ``hetero-dp list`` of each backend (simulated; udev with
   its shipped rule sets; nvidia against the fake libnvidia-ml.so.1 built from
   tests/fakenvml, the only part of the repository used, and only as a C source); and
   ``hetero-dp new`` from the installed template.

    python scripts/check_dists.py [--dist DIR] [--build-only] [--no-isolation]

Exit status 0 when every step worked; otherwise the failing command and its output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = [ROOT, *sorted(p.parent for p in (ROOT / "vendors").glob("*/pyproject.toml"))]
SCENARIO = ROOT / "tests" / "fakenvml" / "scenarios" / "v100-2x-pcie.scn"


def say(msg: str) -> None:
    print(f"check_dists: {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        sys.exit(
            f"check_dists: FAILED ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"{proc.stdout}{proc.stderr}"
        )
    say(f"ok {time.monotonic() - started:5.1f}s  {' '.join(map(str, cmd))}")
    return proc


def version() -> str:
    text = (ROOT / "hetero_dp" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    assert match, "hetero_dp/__init__.py has no __version__"
    return match.group(1)


def build(dist: Path, isolation: bool) -> list[Path]:
    dist.mkdir(parents=True, exist_ok=True)
    for old in [*dist.glob("hetero_dp*.whl"), *dist.glob("hetero_dp*.tar.gz")]:
        old.unlink()
    for project in PROJECTS:
        flags = [] if isolation else ["--no-isolation"]
        run([sys.executable, "-m", "build", "-q", *flags, "--outdir", str(dist), str(project)])
    wheels = sorted(dist.glob("hetero_dp*.whl"))
    sdists = sorted(dist.glob("hetero_dp*.tar.gz"))
    if len(wheels) != len(PROJECTS) or len(sdists) != len(PROJECTS):
        sys.exit(f"check_dists: expected {len(PROJECTS)} wheels and sdists in {dist}")
    return wheels


def check_metadata(wheels: list[Path], want: str) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(z.read(name).decode())
        if meta["Version"] != want:
            sys.exit(f"check_dists: {wheel.name} has version {meta['Version']}, not {want}")
        if meta["Name"] != "hetero-dp":
            pins = [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("hetero-dp")]
            if pins != [f"hetero-dp~={want}"]:
                sys.exit(f"check_dists: {wheel.name} requires {pins}, not hetero-dp~={want}")
    say(f"metadata ok: {', '.join(w.name for w in wheels)}")


def smoke(wheels: list[Path], work: Path) -> None:
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python, bindir = venv / "bin" / "python", venv / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETERO_DP_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    cwd = work / "empty"
    cwd.mkdir()
    kw = {"env": env, "cwd": cwd, "timeout": 600}
    run([str(python), "-m", "pip", "install", "-q", *map(str, wheels)], **kw)

    where = run(
        [str(python), "-c", "import hetero_dp, hetero_dp_udev; print(hetero_dp.__file__)"], **kw
    ).stdout.strip()
    if not Path(where).is_relative_to(venv):
        sys.exit(f"check_dists: hetero_dp imported from {where}, not from {venv}")
    got = run([str(bindir / "hetero-dp"), "--version"], **kw).stdout
    if version() not in got:
        sys.exit(f"check_dists: hetero-dp --version said {got!r}")

    run([str(bindir / "hetero-dp"), "demo"], **kw)

    listed = run([str(bindir / "hetero-dp"), "list", "simulated", "--json"], **kw).stdout
    if not json.loads(listed):
        sys.exit("check_dists: the simulated backend discovered nothing")

    # Every shipped rule set parses (package data made it into the wheel); discovery on
    # this machine finds what it finds (no accelerator is expected here).
    rules = "from hetero_dp_udev.rules import shipped_rule_sets as s; print(sorted(s()))"
    sets = run([str(python), "-c", rules], **kw).stdout
    for name in ("amd-gpu", "ascend-npu", "gaudi", "xilinx-fpga", "dev-glob"):
        if name not in sets:
            sys.exit(f"check_dists: rule set {name} is missing from the udev wheel: {sets}")
    run([str(bindir / "hetero-dp"), "list", "udev", "-o", "udev.rules=dev-glob"], **kw)

    smoke_nvidia(bindir, work, kw)

    new = [str(bindir / "hetero-dp"), "new", "--vendor-domain", "acme.example.com"]
    run([*new, "--resource", "npu", "--device-glob", "/dev/acme*", "--output", "proj"], **kw)
    pyproject = (cwd / "proj" / "pyproject.toml").read_text()
    if f'"hetero-dp~={version()}"' not in pyproject:
        sys.exit("check_dists: the generated project does not pin hetero-dp~=" + version())


def smoke_nvidia(bindir: Path, work: Path, kw: dict) -> None:
    if shutil.which("gcc") is None:
        say("SKIPPED the nvidia smoke: gcc is needed to build the fake libnvidia-ml.so.1")
        return
    lib = work / "fakenvml"
    lib.mkdir()
    run(
        [
            "gcc", "-shared", "-fPIC", "-O2", "-pthread", "-Wl,-soname,libnvidia-ml.so.1",
            "-o", str(lib / "libnvidia-ml.so.1"), str(ROOT / "tests/fakenvml/fake_nvml.c"),
        ]
    )  # fmt: skip
    # The host trees the backend reads besides NVML: /dev nodes under the driver root and
    # the PCI devices' numa_node (as tests/nvidia/support.py lays them out).
    node = work / "node"
    (node / "driver" / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1"):
        (node / "driver" / "dev" / name).touch()
    for bus, numa in (("0000:07:00.0", "0"), ("0000:87:00.0", "1")):
        (node / "sys/bus/pci/devices" / bus).mkdir(parents=True)
        (node / "sys/bus/pci/devices" / bus / "numa_node").write_text(numa + "\n")
    env = dict(kw["env"], LD_LIBRARY_PATH=str(lib), FAKE_NVML_SCENARIO=str(SCENARIO))
    opts = [f"nvidiaDriverRoot={node}/driver", f"sysfsRoot={node}/sys", f"procRoot={node}/proc"]
    cmd = [str(bindir / "hetero-dp"), "list", "nvidia", "--json"]
    listed = run([*cmd, *(a for o in opts for a in ("-o", f"nvidia.{o}"))], **dict(kw, env=env))
    ids = [d.get("id") for d in json.loads(listed.stdout)]
    if len(ids) != 2:
        sys.exit(f"check_dists: the nvidia backend found {ids}, not the scenario's 2 GPUs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output dir [dist]")
    parser.add_argument("--build-only", action="store_true", help="build and check metadata")
    parser.add_argument(
        "--no-isolation", action="store_true", help="build with this environment's setuptools"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    wheels = build(args.dist.resolve(), not args.no_isolation)
    check_metadata(wheels, version())
    if not args.build_only:
        with tempfile.TemporaryDirectory(prefix="hetero-dp-dists-") as tmp:
            smoke(wheels, Path(tmp))
    say(f"all ok in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
