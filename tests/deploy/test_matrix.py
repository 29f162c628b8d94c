"""``make test-matrix`` (scripts/test_matrix.py): every Python the project promises, and a
missing one said out loud, never skipped in silence.

Only the paths that need no interpreter are run here (making four venvs is the matrix's
own job); ``make -n`` shows what the target runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomli is hetero-dp's own dependency on 3.10
    import tomli as tomllib

SCRIPT = ROOT / "scripts" / "test_matrix.py"


def matrix(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with an empty pyenv root and a PATH without any python3.X."""
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "VIRTUAL_ENV")}
    base.update(PYENV_ROOT=str(tmp_path / "pyenv"), PATH="/nonexistent")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_versions() -> list[str]:
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "test-matrix"],
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "CI")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    match = re.search(r'scripts/test_matrix\.py --pythons "([^"]+)"', out.stdout)
    assert match, out.stdout
    return match.group(1).split()


def test_the_matrix_starts_at_the_oldest_python_we_promise():
    promise = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    oldest = re.fullmatch(r">=\s*(3\.\d+)", promise)
    assert oldest, f"requires-python {promise!r}: update this test and the matrix together"
    versions = make_versions()
    assert versions[0] == oldest.group(1)
    # one step at a time up to the newest, none left out
    minors = [int(v.split(".")[1]) for v in versions]
    assert minors == list(range(minors[0], minors[0] + len(minors)))
    assert minors[-1] >= 13


def test_a_missing_python_is_named_with_where_we_looked(tmp_path: Path):
    done = matrix(tmp_path, "--pythons", "3.98 3.99", "--", "-q")
    pyenv = tmp_path / "pyenv" / "versions"
    assert f"3.98: SKIPPED, no Python 3.98 found (looked at python3.98 on PATH; {pyenv}" in (
        done.stdout
    )
    assert "3.99: SKIPPED" in done.stdout
    # nothing could be tested: that is a failure, not a quiet success
    assert "nothing was tested" in done.stdout
    assert done.returncode == 1


def test_under_ci_a_missing_python_fails(tmp_path: Path):
    done = matrix(tmp_path, "--pythons", "3.99", CI="true")
    assert "no interpreter for 3.99, and CI=true" in done.stdout
    assert done.returncode == 1


@pytest.mark.skipif(sys.version_info[:2] == (3, 99), reason="the impostor must differ")
def test_an_interpreter_of_another_version_is_not_taken(tmp_path: Path):
    """A pyenv dir named 3.99.0 whose python is really this one (the base interpreter,
    not our venv's): skipped, not used."""
    bin_dir = tmp_path / "pyenv" / "versions" / "3.99.0" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(Path(sys.executable).resolve())
    done = matrix(tmp_path, "--pythons", "3.99")
    assert "3.99: SKIPPED" in done.stdout
    assert ".venv-3.99" not in done.stdout
    assert not (ROOT / ".venv-3.99").exists()


def test_a_version_the_whole_suite_ran_on_is_reported_covered_not_run_again(tmp_path: Path):
    """CI passes make test's venv: its X.Y is not tested a second time, and says so."""
    here = "{}.{}".format(*sys.version_info[:2])
    done = matrix(tmp_path, "--pythons", here, "--covered-by", sys.executable, CI="true")
    assert f"{here}: covered: the whole suite ran on Python {here}." in done.stdout
    assert re.search(rf"{re.escape(here)}\s+COVERED", done.stdout), done.stdout
    assert "pytest" not in done.stdout  # nothing was started for it
    assert not (ROOT / f".venv-{here}").exists() or f".venv-{here}" not in done.stdout
    assert done.returncode == 0, done.stdout
    # an interpreter that does not run covers nothing: the version is looked for as usual
    done = matrix(tmp_path, "--pythons", "3.99", "--covered-by", "/nonexistent/python")
    assert "does not run; every version is tested here" in done.stdout
    assert "3.99: SKIPPED" in done.stdout
