"""Facts the code leans on are cited from docs/sources.md, with their public sources,
never from a document outside the repository; the README's claims match its blocks;
``list`` says where it looked when it found nothing."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import ROOT

SOURCES = ROOT / "docs" / "sources.md"
# Spelled in two parts so that this file does not match itself.
OUTSIDE = re.compile("REFER" + r"ENCE(\.md| section| \d)|(?<![\w/.-])" + "sha" + r"red/\w")
# The vendored CDI schema names the folder it was copied from, and its test compares
# the copy with that folder where it is present: provenance, not a citation.
PROVENANCE = ("tests/cdi/",)
CITED = re.compile(r"sources\.md#([a-z0-9-]+)")


def tracked_texts() -> dict[str, str]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    texts = {}
    for name in names:
        path = ROOT / name
        try:
            texts[name] = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def test_no_citation_of_a_document_outside_the_repository():
    found = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
        for name, text in tracked_texts().items()
        for m in OUTSIDE.finditer(text)
        if not (m.group().startswith("sha") and name.startswith(PROVENANCE))
    ]
    assert found == []


def test_every_cited_section_of_sources_exists_and_names_a_public_source():
    ids = set(re.findall(r"\{ #([a-z0-9-]+) \}", SOURCES.read_text()))
    cited = {
        (name, m.group(1)) for name, text in tracked_texts().items() for m in CITED.finditer(text)
    }
    assert cited, "the code cites docs/sources.md"
    assert sorted(c for c in cited if c[1] not in ids) == []
    sections = SOURCES.read_text().split("\n## ")[1:]
    # each names where it was checked: a source file, a page, an issue, a man page
    public = re.compile(r"https://|\.(go|c|h|py|pyx\.pxi|proto|rst)\b|gh-\d+|\(\d\)|npm registry")
    for section in sections:
        assert public.search(section), section.splitlines()[0]


def test_the_readme_plugin_has_as_many_lines_as_its_heading_says():
    text = (ROOT / "README.md").read_text()
    heading = re.search(r"^## A plugin in (\d+) lines$", text, re.M)
    assert heading
    block = text[heading.end() :].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.splitlines()) == int(heading.group(1))


def test_list_says_which_glob_it_searched_when_it_finds_nothing(tmp_path, cli_env):
    env = {**cli_env, "ACME_DEV_GLOB": str(tmp_path / "acme*")}
    listed = subprocess.run(
        [sys.executable, "-m", "hetero_dp", "list", str(ROOT / "docs/examples/acme.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == f"no devices found (searched: deviceGlob={tmp_path}/acme*)"
