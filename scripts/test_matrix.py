"""Run the version-sensitive tests on every Python the project promises (`make test-matrix`).

For each version (``--pythons "3.10 3.11 3.12 3.13"``) this finds an interpreter, keeps
a venv for it (``.venv-3.10`` ...; made and filled by ``make VENV=... BASE_PYTHON=...
install``, so it holds what ``make test`` installs) and runs pytest there with the
arguments after ``--``. The versions run one after another and a summary names each one's
result and time.

An interpreter is ``python3.X`` on PATH (one that runs: a pyenv shim for a version that
is not selected does not) or else the newest ``$PYENV_ROOT/versions/3.X.*/bin/python``
(``~/.pyenv`` by default). A version without one is skipped with a line that says where
we looked; under ``CI=true`` (or ``--require-all``) a missing version fails the run, and
a run that found no interpreter at all fails everywhere.

``--covered-by PYTHON`` names an interpreter whose run already took the whole suite
(``make test``'s venv, in CI): its ``X.Y`` is reported as covered and not run a second
time, which keeps CI within its time.

Standard library only: it runs on whatever ``python3`` starts it (3.10 or newer).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ".hetero-dp-matrix"  # inside each venv: the hash of the pyproject files installed
PREFIX = "test-matrix:"


@dataclass
class Outcome:
    version: str
    status: str  # "passed", "failed", "skipped", "install failed", "covered"
    detail: str
    seconds: float = 0.0


def say(line: str) -> None:
    print(f"{PREFIX} {line}", flush=True)


def version_of(python: str) -> str | None:
    """``major.minor.micro`` of an interpreter that runs, else None; a venv's interpreter
    ends in ``+venv`` (we make venvs from base interpreters only)."""
    probe = (
        "import sys; v = '%d.%d.%d' % sys.version_info[:3]; "
        "print(v + ('+venv' if sys.prefix != sys.base_prefix else ''))"
    )
    try:
        out = subprocess.run(
            [python, "-c", probe],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def pyenv_root() -> Path:
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def micro_key(path: str) -> tuple[int, ...]:
    match = re.search(r"/versions/(\d+)\.(\d+)\.(\d+)/", path)
    return tuple(int(g) for g in match.groups()) if match else (-1,)


def find_python(version: str) -> tuple[str | None, str, list[str]]:
    """(interpreter, its full version, the places looked at) for ``version`` ("3.10")."""
    looked: list[str] = []
    candidates: list[str] = []
    on_path = shutil.which(f"python{version}")
    looked.append(f"python{version} on PATH")
    if on_path:
        candidates.append(on_path)
    pattern = str(pyenv_root() / "versions" / f"{version}.*" / "bin" / "python")
    looked.append(pattern)
    # Release builds only (3.13.0, not 3.13.0t or 3.13-dev), newest patch first.
    found = [p for p in glob.glob(pattern) if re.search(rf"/{re.escape(version)}\.\d+/", p)]
    candidates.extend(sorted(found, key=micro_key, reverse=True))
    for python in candidates:
        full = version_of(python)
        if full and not full.endswith("+venv") and full.rsplit(".", 1)[0] == version:
            return python, full, looked
    return None, "", looked


def project_hash() -> str:
    """What an install depends on: the pyproject files of hetero-dp and every vendor."""
    digest = hashlib.sha256()
    for path in [ROOT / "pyproject.toml", *sorted(ROOT.glob("vendors/*/pyproject.toml"))]:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def clean_env() -> dict[str, str]:
    """Our environment without an activated venv or the calling make's variables, so the
    inner make picks the venv we name (a command-line VENV= of the outer make would
    otherwise reach it through MAKEFLAGS)."""
    drop = {"VIRTUAL_ENV", "PYTHON", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def ensure_venv(version: str, python: str, full: str, venv: Path) -> str | None:
    """Make or refresh ``venv`` for ``python``; None when it is ready, else why not."""
    venv_python = venv / "bin" / "python"
    if venv.exists() and version_of(str(venv_python)) != f"{full}+venv":
        say(f"{version}: {venv} is broken or was made by another Python; making it again")
        shutil.rmtree(venv)
    stamp = venv / STAMP
    wanted = project_hash()
    if stamp.exists() and stamp.read_text().strip() == wanted:
        return None
    say(f"{version}: installing into {venv} (make install)")
    make = shutil.which("make")
    if make is None:
        return "make is not installed"
    done = subprocess.run(
        [make, "--no-print-directory", f"VENV={venv}", f"BASE_PYTHON={python}", "install"],
        cwd=ROOT,
        env=clean_env(),
    )
    if done.returncode != 0:
        return f"make install exited with {done.returncode}"
    stamp.write_text(wanted + "\n")
    return None


def run_tests(version: str, venv: Path, pytest_args: list[str]) -> int:
    env = clean_env()
    # The venv's own tools (hetero-dp, ...) first on PATH, as `make test` has them.
    env["PATH"] = f"{venv.resolve() / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider"]
    command += pytest_args
    say(f"{version}: {shlex.join(command)}")
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythons", default="3.10 3.11 3.12 3.13", help="versions, spaced")
    parser.add_argument("--venv-prefix", default=".venv-", help="venv for 3.X: PREFIX3.X")
    parser.add_argument(
        "--require-all",
        action="store_true",
        default=os.environ.get("CI", "").lower() in ("1", "true", "yes"),
        help="a missing interpreter fails the run (the default under CI=true)",
    )
    parser.add_argument(
        "--covered-by",
        metavar="PYTHON",
        default="",
        help="an interpreter whose run already took the whole suite (make test's venv): "
        "its X.Y is reported as covered and not run again",
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    versions = args.pythons.split()
    if not versions:
        parser.error("--pythons names no version")
    covered = version_of(args.covered_by) if args.covered_by else None
    if args.covered_by and covered is None:
        say(f"--covered-by {args.covered_by} does not run; every version is tested here")

    outcomes: list[Outcome] = []
    for version in versions:
        if covered and covered.split("+")[0].rsplit(".", 1)[0] == version:
            say(f"{version}: covered: the whole suite ran on Python {covered.split('+')[0]}")
            outcomes.append(
                Outcome(version, "covered", f"whole suite on {args.covered_by}, Python {covered}")
            )
            continue
        python, full, looked = find_python(version)
        if python is None:
            where = "; ".join(looked)
            say(f"{version}: SKIPPED, no Python {version} found (looked at {where})")
            outcomes.append(Outcome(version, "skipped", f"no interpreter ({where})"))
            continue
        venv = ROOT / f"{args.venv_prefix}{version}"  # relative to the repository
        say(f"{version}: Python {full} at {python}, venv {args.venv_prefix}{version}")
        started = time.monotonic()
        problem = ensure_venv(version, python, full, venv)
        if problem:
            say(f"{version}: INSTALL FAILED: {problem}")
            outcomes.append(Outcome(version, "install failed", problem))
            continue
        code = run_tests(version, venv, args.pytest_args)
        status = "passed" if code == 0 else "failed"
        detail = f"Python {full}" + ("" if code == 0 else f", pytest exited with {code}")
        outcomes.append(Outcome(version, status, detail, time.monotonic() - started))

    say("summary")
    for o in outcomes:
        took = f" in {o.seconds:.0f} s" if o.seconds else ""
        say(f"  {o.version:>5}  {o.status.upper()}{took} ({o.detail})")
    bad = [o for o in outcomes if o.status in ("failed", "install failed")]
    missing = [o for o in outcomes if o.status == "skipped"]
    if missing and args.require_all:
        names = ", ".join(o.version for o in missing)
        say(f"FAILED: no interpreter for {names}, and CI=true (or --require-all) needs them all")
        return 1
    if len(missing) == len(outcomes):
        say("FAILED: no interpreter found for any version; nothing was tested")
        return 1
    if bad:
        say(f"FAILED on {', '.join(o.version for o in bad)}")
        return 1
    if missing:
        say(f"passed, but {', '.join(o.version for o in missing)} untested (no interpreter)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
