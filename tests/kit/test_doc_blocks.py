"""Every code block in docs/ and README.md is executed, from any working directory.

Each page runs in a fresh directory of its own, its blocks in order, so a block may
use the files an earlier one wrote. What a block is, is said by an HTML comment in
the lines right above its fence (docs/testing.md "Code blocks in these docs" documents
the markers), or by its language:

=================================  =====================================================
``<!-- run: file NAME -->``         written to NAME (a ``.py`` file is also compiled)
``<!-- run: plugin NAME -->``       written to NAME, loaded and discovered once (as
                                    ``hetero-dp list`` does)
``<!-- run: pytest NAME -->``       written to NAME and run by pytest, which must pass
``<!-- run: hook -->``              a hook signature: defined beside ``hetero_dp``'s
                                    names and loaded as a backend (the hook and its
                                    arguments must be real)
``<!-- run: serve RESOURCE -->``    a shell command that serves plugins: run against a
                                    FakeKubelet until RESOURCE registers, then SIGTERM
``<!-- run: config -->``            YAML: a hetero-dp config file, loaded
``<!-- run: k8s -->``               YAML: Kubernetes objects, validated offline (1.34)
``<!-- run: udev-rules -->``        YAML: a udev rules file, parsed
``<!-- run: topology -->``          YAML: a topology file for ``hetero-dp topo``, loaded
``<!-- run: skip: REASON -->``      not run (a cluster, an image build, root); the
                                    reason is required
``python`` (no marker)              run as a script
``sh`` (no marker)                  run by bash -e; must exit 0
``toml``, ``json`` (no marker)      parsed
``text``                            output or a picture: never run
=================================  =====================================================

A block with no language, or a YAML block without a marker, fails the test.
"""

from __future__ import annotations

import asyncio
import json
import os
import py_compile
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hetero_dp.testing import FakeKubelet, short_tempdir
from tests.conftest import ROOT
from tests.kit.run_pytest import run_pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*run:\s*(.*?)\s*-->")
TIMEOUT = 120


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    marker: str  # "" when none

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        above = text[: m.start()].rstrip("\n").split("\n")
        marker = ""
        while above and above[-1].lstrip().startswith("<!--"):
            found = MARKER.search(above.pop())
            if found:
                marker = found.group(1)
        line = text[: m.start()].count("\n") + 1
        rel = str(page.relative_to(ROOT))
        out.append(Block(rel, line, m.group(1).strip(), m.group(2), marker))
    return out


def _env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_DP_")}
    # the hetero-dp of this interpreter first; blocks run from the page's own dir
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["HOME"] = str(workdir)
    return env


def _check(block: Block, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (
        f"{block.where}: exit {result.returncode}\n{block.text}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


def _pytest(block: Block, workdir: Path, name: str) -> None:
    result = run_pytest(
        workdir / name, root=workdir, cwd=workdir, env=_env(workdir), timeout=TIMEOUT
    )
    _check(block, result)
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout


def _hook(block: Block) -> None:
    import hetero_dp
    from hetero_dp.engine.loading import load_backends

    namespace: dict[str, object] = {"__name__": f"doc_hook_{block.line}"}
    exec("from collections.abc import *\nfrom typing import *\nfrom hetero_dp import *", namespace)
    namespace["hookimpl"] = hetero_dp.hookimpl
    before = set(namespace)
    exec(compile(block.text, block.where, "exec"), namespace)
    functions = [namespace[k] for k in set(namespace) - before]
    assert len(functions) == 1, f"{block.where}: one hook per block"

    class Plugin:
        pass

    plugin = Plugin()
    name = functions[0].__name__  # type: ignore[attr-defined]
    setattr(plugin, name, functions[0])
    if name != "discover":
        plugin.discover = hetero_dp.hookimpl(lambda: [])  # type: ignore[attr-defined]
    for backend in load_backends([plugin]):
        assert backend.implements(name), block.where
        backend.close()


async def _serve(block: Block, workdir: Path, resource: str) -> None:
    root = short_tempdir()  # unix socket paths stay under 108 bytes
    async with FakeKubelet(root / "dp", root / "reg") as kubelet:
        env = dict(_env(workdir), HETERO_DP_KUBELET_DIR=str(kubelet.plugin_dir))
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-ec",
            block.text,
            cwd=workdir,
            start_new_session=True,  # SIGTERM goes to the command's whole group
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            waiting = asyncio.ensure_future(kubelet.wait_registered(resource, timeout=60))
            exited = asyncio.ensure_future(proc.wait())
            await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                err = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
                pytest.fail(f"{block.where}: exited {proc.returncode} before registering\n{err}")
            waiting.result()
            os.killpg(proc.pid, signal.SIGTERM)
            code = await asyncio.wait_for(exited, 30)
        finally:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        err = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        shutil.rmtree(root, ignore_errors=True)
        assert code == 0, f"{block.where}: exit {code}\n{err}"


def _k8s(block: Block) -> None:
    import kubernetes_validate

    docs = [d for d in yaml.safe_load_all(block.text) if d is not None]
    assert docs, block.where
    for doc in docs:
        kubernetes_validate.validate(doc, "1.34", strict=True)


def run_block(block: Block, workdir: Path) -> None:
    kind, _, arg = block.marker.partition(" ")
    kind = kind.rstrip(":")
    arg = arg.strip()
    if kind == "skip":
        assert arg, f"{block.where}: a skipped block says why (<!-- run: skip: REASON -->)"
        return
    if block.lang == "text":
        assert not kind, f"{block.where}: a text block is never run; drop the marker"
        return
    if kind in ("file", "plugin", "pytest"):
        assert arg, f"{block.where}: {kind} needs a file name"
        (workdir / arg).parent.mkdir(parents=True, exist_ok=True)
        (workdir / arg).write_text(block.text)
        if arg.endswith(".py"):
            py_compile.compile(str(workdir / arg), doraise=True)
        if kind == "pytest":
            _pytest(block, workdir, arg)
        if kind == "plugin":
            result = subprocess.run(
                [sys.executable, "-m", "hetero_dp", "list", arg],
                cwd=workdir,
                env=_env(workdir),
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
            _check(block, result)
        return
    if kind == "hook":
        _hook(block)
    elif kind == "serve":
        assert arg, f"{block.where}: serve needs the resource it registers"
        asyncio.run(_serve(block, workdir, arg))
    elif kind == "config":
        from hetero_dp.engine.config import load_config

        load_config(raw=yaml.safe_load(block.text), env={})
    elif kind == "k8s":
        _k8s(block)
    elif kind == "udev-rules":
        from hetero_dp_udev.rules import parse_rules

        assert parse_rules(block.text, block.where)
    elif kind == "topology":
        from hetero_dp.cli.topo_report import parse_topology

        parse_topology(yaml.safe_load(block.text), block.where)
    elif kind:
        pytest.fail(f"{block.where}: unknown marker {block.marker!r}")
    elif block.lang == "python":
        result = subprocess.run(
            [sys.executable, "-"],
            input=block.text,
            cwd=workdir,
            env=_env(workdir),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        _check(block, result)
    elif block.lang == "sh":
        result = subprocess.run(
            ["bash", "-ec", block.text],
            cwd=workdir,
            env=_env(workdir),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        _check(block, result)
    elif block.lang == "toml":
        tomllib.loads(block.text)
    elif block.lang == "json":
        json.loads(block.text)
    else:
        pytest.fail(
            f"{block.where}: a {block.lang or 'plain'} block needs a language and, unless it "
            "is python, sh, toml, json or text, a <!-- run: ... --> marker"
        )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_block_of_the_page_runs(page: Path, tmp_path: Path, monkeypatch):
    workdir = tmp_path / "page"
    workdir.mkdir()
    monkeypatch.chdir(tmp_path)  # never the repository: blocks find nothing by accident
    for block in blocks(page):
        run_block(block, workdir)


def test_the_markers_are_understood():
    """Every marker in the docs is one this test knows (a typo would skip a block)."""
    known = {"file", "plugin", "pytest", "hook", "serve", "config", "k8s", "udev-rules"}
    known |= {"topology", "skip"}
    for page in PAGES:
        for block in blocks(page):
            kind = block.marker.partition(" ")[0].rstrip(":")
            assert not block.marker or kind in known, f"{block.where}: {block.marker!r}"


def test_a_failing_block_fails_the_test(tmp_path: Path):
    bad = Block("x.md", 1, "sh", "hetero-dp list no-such-backend\n", "")
    with pytest.raises(AssertionError, match=r"x\.md:1: exit 2"):
        run_block(bad, tmp_path)
    with pytest.raises(pytest.fail.Exception):
        run_block(Block("x.md", 1, "yaml", "a: 1\n", ""), tmp_path)
    with pytest.raises(AssertionError, match="says why"):
        run_block(Block("x.md", 1, "sh", "true\n", "skip"), tmp_path)
