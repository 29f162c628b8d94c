#!/usr/bin/env python3
"""Fetch Prometheus's promtool (the alert rules' checks in tests/deploy) once, into
.cache/tools/.

promtool ships in Debian's ``prometheus`` package. Installing that package would also
install and, on a systemd host, start a Prometheus server on port 9090, so this script
only downloads the package (``apt-get download``, which checks it against the archive's
signed index) and unpacks its ``promtool`` binary:

    .cache/tools/promtool-<package version>/promtool

It prints that path. A promtool already on PATH is used as it is. Where apt is missing
(not Debian or Ubuntu) it says so and exits 0, and the rules tests skip naming this
script; under CI=true it exits 1 instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".cache" / "tools"
PACKAGE = "prometheus"


def unavailable(why: str) -> int:
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    print(f"fetch_promtool: promtool unavailable: {why}", file=sys.stderr)
    if in_ci:
        print("fetch_promtool: CI=true, so this is an error", file=sys.stderr)
        return 1
    print("fetch_promtool: the alert rules tests in tests/deploy will skip", file=sys.stderr)
    return 0


def cached() -> Path | None:
    found = sorted(TOOLS.glob("promtool-*/promtool"))
    return found[-1] if found else None


def fetch() -> int:
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        return unavailable("apt-get and dpkg-deb are needed to fetch Debian's prometheus")
    TOOLS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS, prefix="fetch-") as tmp:
        work = Path(tmp)
        download = ["apt-get", "download", "-q", PACKAGE]
        proc = subprocess.run(download, capture_output=True, text=True, cwd=work)
        if proc.returncode != 0 and os.geteuid() == 0:  # a fresh machine: no package lists
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            proc = subprocess.run(download, capture_output=True, text=True, cwd=work)
        debs = list(work.glob(f"{PACKAGE}_*.deb"))
        if proc.returncode != 0 or len(debs) != 1:
            hint = " (as root, apt-get update first)" if "Unable to locate" in proc.stderr else ""
            return unavailable(f"apt-get download {PACKAGE} failed{hint}: {proc.stderr.strip()}")
        version = debs[0].name.split("_")[1].replace("%3a", "-").replace(":", "-")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(work / "x")], check=True)
        binary = work / "x" / "usr" / "bin" / "promtool"
        check = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        if check.returncode != 0:
            return unavailable(f"the unpacked promtool does not run: {check.stderr.strip()}")
        target = TOOLS / f"promtool-{version}" / "promtool"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(binary, target)
        print(f"fetch_promtool: {check.stdout.splitlines()[0]}", file=sys.stderr)
    return 0


def main() -> int:
    on_path = shutil.which("promtool")
    if on_path:
        print(on_path)
        return 0
    if cached() is None:
        code = fetch()
        if code or cached() is None:
            return code
    print(cached())
    return 0


if __name__ == "__main__":
    sys.exit(main())
