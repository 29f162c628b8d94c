"""Tests for the udev backend against real libudev under umockdev.

umockdev's preload library must be in LD_PRELOAD when a process starts, so the
tests marked ``umockdev`` cannot run in an ordinary pytest process. Outside the
preload each such test is replaced by a proxy item (same node ID and markers, no
fixtures); the first proxy to run starts ONE child pytest under
``umockdev-wrapper`` with every selected ``umockdev`` test, and each proxy then
reports the child's outcome for its node ID (failure text included). Under the preload
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
CHILD_TIMEOUT_S = 600  # generous: on a loaded 2-core machine the child run can take minutes

_child: dict[str, Any] = {}


class UmockdevProxy(pytest.Item):
    """Stands in, outside the preload, for a ``umockdev`` test: no fixtures run here;
    it reports what the test did in the child run."""

    def runtest(self) -> None:
        if "results" not in _child:
            _child["results"] = _run_child(self.config, self.session)
        results = _child["results"]
        outcome = results.get(self.nodeid)
        if outcome is None:
            pytest.fail(
                "the umockdev child run reported nothing for this test:\n" + results["__output__"],
                pytrace=False,
            )
        if outcome["outcome"] == "skipped":
            pytest.skip(outcome["text"])
        if outcome["outcome"] != "passed":
            pytest.fail(f"under umockdev-wrapper:\n{outcome['text']}", pytrace=False)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name  # a line is needed to report a skip


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for n, item in enumerate(items):
        if not item.get_closest_marker("umockdev"):
            continue
        if MISSING is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs umockdev: {MISSING}"))
        elif not UNDER_PRELOAD:
            assert item.parent is not None
            proxy = UmockdevProxy.from_parent(item.parent, name=item.name)
            proxy.own_markers = list(item.own_markers)
            proxy.keywords.update(item.keywords)
            items[n] = proxy


def _plugin_args(config: pytest.Config) -> list[str]:
    """The parent's ``-p`` options (plugins loaded or disabled), for the child."""
    args = [str(a) for a in config.invocation_params.args]
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "-p" and i + 1 < len(args):
            out += ["-p", args[i + 1]]
        elif arg.startswith("-p") and len(arg) > 2:
            out.append(arg)
    return out


def _run_child(config: pytest.Config, session: pytest.Session) -> dict[str, Any]:
    ids = [item.nodeid for item in session.items if isinstance(item, UmockdevProxy)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        env = dict(os.environ, **{RESULTS_ENV: str(out)})
        cmd = ["umockdev-wrapper", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        proc = subprocess.run(
            [*cmd, *_plugin_args(config), *ids],
            cwd=config.rootpath,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
        results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    results["__output__"] = proc.stdout[-4000:] + proc.stderr[-4000:]
    return results


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
def testbed() -> Iterator[testing.Testbed]:
    """An empty umockdev testbed."""
    with testing.Testbed() as bed:
        yield bed


@pytest.fixture
def data() -> Path:
    return DATA
