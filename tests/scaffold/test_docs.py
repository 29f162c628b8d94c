"""The documentation site: strict build, generated hook reference, and pages that stay in
step with the code they describe."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from hetero_dp import hookspecs
from hetero_dp.cli.main import main as cli_main
from hetero_dp.engine.config import RESOURCE_KEYS, SCALARS, SECTION_KEYS, env_name, load_config

from .conftest import ROOT, subprocess_env

DOCS = ROOT / "docs"


def _gen_hook_docs():
    path = ROOT / "scripts" / "gen_hook_docs.py"
    spec = importlib.util.spec_from_file_location("gen_hook_docs", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(page: str, marker: str) -> str:
    """The fenced code block right after an HTML comment containing ``marker``."""
    text = (DOCS / page).read_text()
    after = text[text.index(marker) :]
    match = re.search(r"```\w*\n(.*?)```", after, re.S)
    assert match, f"no code block after {marker!r} in {page}"
    return match.group(1)


# -- the hook reference ---------------------------------------------------------------


def test_hook_reference_is_fresh():
    gen = _gen_hook_docs()
    assert (DOCS / "hooks.md").read_text() == gen.render(), (
        "docs/hooks.md is stale: run python scripts/gen_hook_docs.py"
    )


def test_hook_reference_check_mode_catches_a_stale_page(tmp_path: Path):
    gen = _gen_hook_docs()
    page = tmp_path / "hooks.md"
    assert gen.main(["--output", str(page)]) == 0
    assert gen.main(["--check", "--output", str(page)]) == 0
    page.write_text(page.read_text().replace("Required.", "Optional."))
    assert gen.main(["--check", "--output", str(page)]) == 1


def test_hook_reference_has_every_hook_with_its_docstring():
    text = (DOCS / "hooks.md").read_text()
    specs = [n for n, f in vars(hookspecs).items() if getattr(f, "hetero_dp_spec", None)]
    assert len(specs) >= 10
    for name in specs:
        assert f"\n## {name}\n" in text, name
        first_line = (getattr(hookspecs, name).__doc__ or "").strip().splitlines()[0]
        plain = re.split(r"[:`]", first_line)[0]  # the words before any markup
        assert len(plain) >= 5 and plain in text, name


# -- pages that show code -------------------------------------------------------------


def test_tutorial_shows_the_example_plugin_verbatim():
    example = (DOCS / "examples" / "acme.py").read_text()
    assert _block("tutorial.md", "acme.py: kept identical") == example


def test_tutorial_test_passes(tmp_path: Path):
    (tmp_path / "acme.py").write_text((DOCS / "examples/acme.py").read_text())
    (tmp_path / "test_acme.py").write_text(_block("tutorial.md", "test_acme.py: run by"))
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_configuration_page_names_every_key_env_var_and_flag():
    text = (DOCS / "configuration.md").read_text()
    missing = []
    for key in SCALARS:
        missing += [s for s in (f"`{key}`", f"`{env_name(key)}`") if s not in text]
    for section, keys in SECTION_KEYS.items():
        missing += [f"`{section}.{k}`" for k in keys if f"`{section}.{k}`" not in text]
    missing += [f"`{k}`" for k in RESOURCE_KEYS if f"`{k}`" not in text]
    missing += [s for s in ("`HETERO_DP_CONFIG`", "`CONFIG_FILE`") if s not in text]
    for name, command in cli_main.commands.items():
        assert f"`hetero-dp {name}" in text, name
        for param in command.params:
            if isinstance(param, click.Option):
                missing += [o for o in param.opts if o.startswith("--") and f"`{o}" not in text]
    assert not missing, f"docs/configuration.md does not mention: {missing}"


def test_configuration_page_example_file_loads():
    block = _block("configuration.md", "## A complete file")
    cfg = load_config(raw=yaml.safe_load(block), env={})
    assert cfg.backends["acme"]["deviceGlob"] == "/dev/acme*"
    assert cfg.metrics.address == "0.0.0.0:9400"


# -- the site -------------------------------------------------------------------------


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert [p for p in pages if p not in nav] == []


def test_site_builds_in_strict_mode(tmp_path: Path):
    pytest.importorskip("mkdocs", reason="pip install mkdocs to build the docs")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "tutorial.html").is_file()  # use_directory_urls: false
