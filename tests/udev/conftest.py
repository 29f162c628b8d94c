"""Tests for the udev backend against real libudev under umockdev.

umockdev's preload library must be in LD_PRELOAD when a process starts, so the
tests marked ``umockdev`` cannot run in an ordinary pytest process. Outside the
preload, the first such test starts ONE child pytest under ``umockdev-wrapper``
running every selected ``umockdev`` test, and each test here then reports the
child's outcome for its own node ID (failure text included). Under the preload
(``umockdev-wrapper python3 -m pytest tests/udev``) they simply run in-process.
Where umockdev is missing they skip, naming the packages to install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hetero_dp_udev import testing

DATA = Path(__file__).parent / "data"
MISSING = testing.missing()
UNDER_PRELOAD = testing.under_preload()
RESULTS_ENV = "HETERO_DP_UDEV_RESULTS"
CHILD_TIMEOUT_S = 300

_child: dict[str, Any] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if MISSING is None:
        return
    skip = pytest.mark.skip(reason=f"needs umockdev: {MISSING}")
    for item in items:
        if item.get_closest_marker("umockdev"):
            item.add_marker(skip)


def _run_child(config: pytest.Config, session: pytest.Session) -> dict[str, Any]:
    ids = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("umockdev") and item.nodeid.startswith("tests/udev/")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        env = dict(os.environ, **{RESULTS_ENV: str(out)})
        cmd = ["umockdev-wrapper", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        proc = subprocess.run(
            [*cmd, *ids],
            cwd=config.rootpath,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
        results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    results["__output__"] = proc.stdout[-4000:] + proc.stderr[-4000:]
    return results


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Outside the preload, answer a umockdev test with the child run's outcome."""
    if UNDER_PRELOAD or not pyfuncitem.get_closest_marker("umockdev"):
        return None
    if "results" not in _child:
        _child["results"] = _run_child(pyfuncitem.config, pyfuncitem.session)
    results = _child["results"]
    outcome = results.get(pyfuncitem.nodeid)
    if outcome is None:
        pytest.fail(
            "the umockdev child run reported nothing for this test:\n" + results["__output__"],
            pytrace=False,
        )
    if outcome["outcome"] == "skipped":
        pytest.skip(outcome["text"])
    if outcome["outcome"] != "passed":
        pytest.fail(f"under umockdev-wrapper:\n{outcome['text']}", pytrace=False)
    return True


# ----------------------------------------------------------------- child side

_reports: dict[str, dict[str, str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not os.environ.get(RESULTS_ENV):
        return
    entry = _reports.setdefault(report.nodeid, {"outcome": "passed", "text": ""})
    if report.skipped and entry["outcome"] == "passed":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        entry.update(outcome="skipped", text=reason)
    elif report.failed:
        entry.update(outcome="failed", text=f"[{report.when}] {report.longreprtext}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path and UNDER_PRELOAD:
        Path(path).write_text(json.dumps(_reports))


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def testbed() -> Iterator[testing.Testbed | None]:
    """An empty umockdev testbed (None outside the preload, where the test body
    does not run here)."""
    if not UNDER_PRELOAD:
        yield None
        return
    with testing.Testbed() as bed:
        yield bed


@pytest.fixture
def data() -> Path:
    return DATA
