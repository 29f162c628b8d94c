"""The type reference covers every public name and is fresh; the site builds strict
and needs nothing from the network."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hetero_dp
from tests.conftest import ROOT


def _gen():
    path = ROOT / "scripts" / "gen_hook_docs.py"
    spec = importlib.util.spec_from_file_location("gen_hook_docs_ref", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_fresh_and_has_every_exported_name(tmp_path):
    gen = _gen()
    text = (ROOT / "docs" / "reference.md").read_text()
    assert text == gen.render_reference(), (
        "docs/reference.md is stale: run scripts/gen_hook_docs.py"
    )
    for name in hetero_dp.__all__:
        assert f"\n## {name}\n" in text, name
    # the types the hooks use, with what an author must know about them
    assert "| `read_only` | `bool` | `True` |" in text  # Mount is read-only by default
    for name in ("Device", "DeviceNode", "Mount", "Link", "Sample", "Check"):
        assert f"\n## {name}\n" in text
    page = tmp_path / "reference.md"
    assert gen.main(["--reference", "--output", str(page)]) == 0
    page.write_text(page.read_text().replace("read_only", "ro"))
    assert gen.main(["--reference", "--check", "--output", str(page)]) == 1


def test_the_site_builds_strict_and_works_offline(tmp_path: Path):
    pytest.importorskip("mkdocs", reason="pip install mkdocs to build the docs")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    remote = re.compile(r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(?:https?:)?//", re.I)
    pages = list(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        html = page.read_text()
        found = remote.findall(html)
        assert not found, f"{page.relative_to(site)} loads from the network: {found[:3]}"
    # code is highlighted at build time, by a stylesheet served with the site
    tutorial = (site / "tutorial" / "index.html").read_text()
    assert 'class="codehilite"' in tutorial and '<span class="kn">import</span>' in tutorial
    assert (site / "css" / "pygments.css").is_file()
