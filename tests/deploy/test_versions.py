"""One source of the version (hetero_dp.__version__) and the copies that follow it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import hetero_dp
from hetero_dp.cli import scaffold

from .conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, a dependency of hetero-dp there
    import tomli as tomllib  # type: ignore[no-redef]

SCRIPT = ROOT / "scripts" / "set_version.py"


def test_every_copy_matches_the_source():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_vendors_pin_hetero_dp_by_compatible_release():
    for pyproject in sorted(ROOT.glob("vendors/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        ours = [d for d in project["dependencies"] if d.startswith("hetero-dp")]
        assert ours == [f"hetero-dp~={hetero_dp.__version__}"], pyproject
        assert project["version"] == hetero_dp.__version__, pyproject


def test_generated_project_pins_the_generating_version(tmp_path: Path):
    values = {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/a*"}
    project, _ = scaffold.generate(values, tmp_path / "p")
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["dependencies"] == [f"hetero-dp~={hetero_dp.__version__}"]


def test_set_version_rewrites_every_copy(tmp_path: Path):
    """On a copy of the files it touches: every copy takes the new version, the check
    then passes, and it failed while one copy lagged."""
    copy = tmp_path / "repo"
    for rel in ["scripts/set_version.py", "hetero_dp/__init__.py"]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, copy / rel)
    for pattern in ["vendors/*/pyproject.toml", "vendors/*/*/__init__.py", "templates/*/*.json"]:
        for src in ROOT.glob(pattern):
            (copy / src.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, copy / src.relative_to(ROOT))
    shutil.copytree(ROOT / "deploy", copy / "deploy")
    script = [sys.executable, str(copy / "scripts" / "set_version.py")]
    done = subprocess.run([*script, "7.8.9"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert subprocess.run([*script, "--check"]).returncode == 0
    assert '__version__ = "7.8.9"' in (copy / "hetero_dp/__init__.py").read_text()
    udev = (copy / "vendors/udev/pyproject.toml").read_text()
    assert 'version = "7.8.9"' in udev and '"hetero-dp~=7.8.9"' in udev
    assert "hetero-dp-udev:7.8.9" in (copy / "deploy/udev/daemonset.yaml").read_text()
    old = hetero_dp.__version__
    (copy / "deploy/udev/daemonset.yaml").write_text(
        (copy / "deploy/udev/daemonset.yaml").read_text().replace("7.8.9", old)
    )
    lagging = subprocess.run([*script, "--check"], capture_output=True, text=True)
    assert lagging.returncode == 1 and "deploy/udev/daemonset.yaml" in lagging.stderr
