"""The type reference covers every public name and is fresh; the site builds strict
and needs nothing from the network."""

from __future__ import annotations

import importlib.util
import os
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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it (strict), once for this module's tests."""
    pytest.importorskip("mkdocs", reason="pip install mkdocs to build the docs")
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def test_the_site_builds_strict_and_works_offline(site: Path):
    remote = re.compile(r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(?:https?:)?//", re.I)
    pages = list(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        html = page.read_text()
        found = remote.findall(html)
        assert not found, f"{page.relative_to(site)} loads from the network: {found[:3]}"
    # code is highlighted at build time, by a stylesheet served with the site
    tutorial = (site / "tutorial.html").read_text()
    assert 'class="codehilite"' in tutorial and '<span class="kn">import</span>' in tutorial
    assert (site / "css" / "pygments.css").is_file()


def test_every_link_of_the_site_opens_a_file_from_disk(site: Path):
    """Opened from disk (file://), a link to a directory shows the directory's listing,
    not its index.html: with mkdocs' default use_directory_urls every navigation link
    did. Every local link must name a file that exists."""
    href = re.compile(r'<a\b[^>]*\bhref="([^"#]+)(?:#[^"]*)?"', re.I)
    checked = 0
    for page in site.rglob("*.html"):
        if page.name == "404.html":  # a web server's page, with absolute links
            continue
        for link in href.findall(page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", link, re.I):  # http:, mailto:, ...
                continue
            target = (page.parent / link).resolve()
            assert target.is_file(), f"{page.relative_to(site)} links {link!r}: no such file"
            checked += 1
    assert checked > 100


#: Chromium's headless shell opens one harness page that holds every page of the site in
#: an iframe 1280 px wide (a laptop's browser window); the harness's load event waits for
#: every frame, then measures each frame's document. Every file:// page is an origin of
#: its own to Chromium: for the harness to read its frames it runs with web security
#: off, in a profile of its own, on nothing but the built site.
HARNESS = """<!doctype html><html><body>%s<script>
window.addEventListener("load", () => {
  const out = [];
  for (const frame of document.querySelectorAll("iframe")) {
    const root = frame.contentDocument.documentElement;
    out.push([frame.getAttribute("src"), root.scrollWidth, root.clientWidth]);
  }
  document.body.setAttribute("data-widths", JSON.stringify(out));
});
</script></body></html>
"""


def test_no_page_overflows_sideways_at_1280_px(site: Path):
    """A page wider than the window scrolls sideways as a whole (the udev page did, a
    table too wide for its column); a wide code block scrolls inside itself instead."""
    import json
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing: make system-deps installs it (Debian: chromium)")
        pytest.skip("no chromium (Debian package chromium; make system-deps installs it)")
    pages = sorted(str(p.relative_to(site)) for p in site.glob("*.html"))
    pages = [p for p in pages if p not in ("404.html", "search.html")]
    harness = site / "measure-widths.html"
    frames = "".join(
        f'<iframe src="{page}" style="width:1280px;height:800px"></iframe>' for page in pages
    )
    harness.write_text(HARNESS % frames)
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # as root (CI), Chromium refuses to start with its sandbox
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--disable-web-security",
            f"--user-data-dir={site.parent / 'chromium-profile'}",
            "--dump-dom",
            harness.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = re.search(r'data-widths="([^"]*)"', result.stdout)
    assert found, f"chromium gave no measurements: {result.stderr[-2000:]}"
    widths = json.loads(found.group(1).replace("&quot;", '"'))
    assert len(widths) == len(pages), widths
    wide = [(page, sw, cw) for page, sw, cw in widths if sw > cw]
    assert not wide, f"pages wider than a 1280 px window (page, scrollWidth, clientWidth): {wide}"


def test_the_reference_summaries_are_whole_sentences():
    """The table at the top of the type reference gives each class and function the
    first sentence of its docstring, whole: it once took the first line, and cut
    "gone until someone" (Lost) or "... alike:" (unknown_key) mid-sentence."""
    text = (ROOT / "docs" / "reference.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| [`")]
    assert len(rows) > 20
    for row in rows:
        cell = row.rsplit(" |", 1)[0].split(" | ", 1)[1]
        if cell.startswith(("constant, ", "the marker ")):
            continue
        assert cell.endswith((".", "!", "?")), row
