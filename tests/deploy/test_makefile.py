"""Which Python the Makefile installs into (``make -n``: commands shown, none run).

The README's ``make demo`` / ``make test`` must work on a fresh machine: in an activated
venv, with an interpreter named by PYTHON=, and otherwise in ./.venv made on first use,
never the system Python (PEP 668 refuses it on Debian 12 / Ubuntu 24.04).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(*args: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON", "MAKEFLAGS")}
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_without_a_venv_it_makes_one_and_uses_it(tmp_path: Path):
    venv = tmp_path / "venv"
    out = dry_run(f"VENV={venv}", "BASE_PYTHON=python3.99", "install")
    assert f"python3.99 -m venv {venv}" in out
    assert f"{venv}/bin/python -m pip install" in out
    assert "\npython3 -m pip" not in "\n" + out


def test_an_activated_venv_is_used_as_it_is(tmp_path: Path):
    out = dry_run("install", VIRTUAL_ENV=str(tmp_path / "active"))
    assert f"{tmp_path}/active/bin/python -m pip install" in out
    assert "-m venv" not in out


def test_python_given_on_the_command_line_is_used_as_it_is():
    out = dry_run("PYTHON=/opt/py/bin/python3", "demo")
    assert "/opt/py/bin/python3 -m pip install" in out
    assert "/opt/py/bin/python3 -m hetero_dp demo" in out
    assert "-m venv" not in out


def phony_targets() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith(".PHONY:"))
    return [t for t in line.split(":", 1)[1].split() if t != "FORCE"]


#: Targets that run a [dev] tool (pytest, ruff, mkdocs, build, ...): on a fresh clone
#: they must install the dev extra before their first command.
DEV_TARGETS = ["test", "lint", "proto", "docs", "dists", "check-dists", "deploy-check", "bench"]
DEV_TARGETS += ["images", "deploy-test"]  # python -m build, pytest


def test_the_dev_targets_are_all_the_targets_that_need_the_dev_tools():
    assert set(DEV_TARGETS) | {
        "demo",
        "install",
        "system-deps",
        "test-matrix",
        "tools",
        "image-deps",
    } == set(phony_targets())


NO_VENV = {"system-deps", "image-deps", "test-matrix"}  # apt, or venvs of their own


@pytest.mark.parametrize("target", sorted(set(phony_targets()) - NO_VENV))
def test_every_target_from_a_fresh_clone_makes_the_venv_before_using_it(
    tmp_path: Path, target: str
):
    venv = tmp_path / "venv"
    lines = dry_run(f"VENV={venv}", target).splitlines()
    uses = [i for i, ln in enumerate(lines) if f"{venv}/bin/python" in ln]
    made = [i for i, ln in enumerate(lines) if f"-m venv {venv}" in ln]
    assert uses and made and made[0] < uses[0], "\n".join(lines)
    if target in DEV_TARGETS:
        install = [i for i, ln in enumerate(lines) if "pip install" in ln and "'.[dev]'" in ln]
        runs = [i for i in uses if "pip install" not in lines[i]]
        assert install and install[0] < runs[0], "\n".join(lines)


def test_the_demo_installs_every_bundled_backend(tmp_path: Path):
    """After `make demo`, `hetero-dp doctor nvidia` and `list udev` work."""
    out = dry_run(f"VENV={tmp_path / 'venv'}", "demo")
    install = next(ln for ln in out.splitlines() if "pip install" in ln)
    for vendor in ("simulated", "udev", "nvidia"):
        assert f"-e vendors/{vendor}" in install
    assert "[dev]" not in install  # the demo stays light


def test_a_second_run_does_not_install_again(tmp_path: Path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".hetero-dp-installed-dev").touch()
    out = dry_run(f"VENV={venv}", "docs")
    assert "pip install" not in out and "-m venv" not in out
    assert f"{venv}/bin/python -m mkdocs build" in out
    # ... and `make install` always installs, and the demo takes the dev install
    assert "pip install" in dry_run(f"VENV={venv}", "install")
    assert "pip install" not in dry_run(f"VENV={venv}", "demo")


def test_a_python_given_by_name_gets_pip_every_time():
    """No environment of ours to put a stamp in: pip decides what is missing."""
    out = dry_run("PYTHON=/opt/py/bin/python3", "docs")
    assert "/opt/py/bin/python3 -m pip install" in out


def test_make_test_names_skip_reasons_and_shows_the_whole_coverage_table():
    out = dry_run("PYTHON=/opt/py/bin/python3", "test")
    pytest_line = next(ln for ln in out.splitlines() if "-m pytest" in ln and "coverage run" in ln)
    assert " -rfEs" in pytest_line
    report = next(ln for ln in out.splitlines() if "coverage report" in ln)
    assert "|" not in report  # nothing cuts the table (tail cut its header)
    assert "about 14 minutes" in out


def test_every_target_that_runs_pytest_names_failures_and_skip_reasons():
    """The summary names each failed and errored test (pytest's default -rfE, which a
    bare -rs replaces) and why each skipped test skipped (a missing helm, umockdev,
    container engine), wherever make runs pytest, not only in `make test`."""
    text = (ROOT / "Makefile").read_text()
    runs = [ln for ln in text.splitlines() if "-m pytest" in ln and not ln.startswith("#")]
    runs += [ln for ln in text.splitlines() if ln.startswith("MATRIX_PYTEST ?=")]
    assert len(runs) >= 4, runs
    assert [ln for ln in runs if " -rfEs" not in ln] == []


def test_make_test_fetches_helm_first():
    """The chart tests need helm: `make test` fetches it (`make tools`) instead of
    skipping 46 tests on a fresh clone."""
    out = dry_run("PYTHON=/opt/py/bin/python3", "test")
    lines = out.splitlines()
    fetch = next(i for i, ln in enumerate(lines) if "fetch_helm.py" in ln)
    run = next(i for i, ln in enumerate(lines) if "-m pytest" in ln and "coverage run" in ln)
    assert fetch < run


def test_the_docs_say_what_each_target_installs():
    table = (ROOT / "docs" / "install.md").read_text().split("## Make targets", 1)[1]
    for target in phony_targets():
        assert f"| `make {target}` |" in table, target
    assert "14 minutes" in table


def test_check_dists_prints_whole_command_lines(capsys: pytest.CaptureFixture[str]):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "check_dists", ROOT / "scripts" / "check_dists.py"
    )
    assert spec and spec.loader
    check_dists = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_dists)
    long_arg = "x" * 300
    check_dists.run(["true", long_arg])
    assert f"true {long_arg}" in capsys.readouterr().out
