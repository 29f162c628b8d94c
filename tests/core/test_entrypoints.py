"""hetero_dp.kits.entrypoints answers as importlib.metadata does, in this environment
(every group of every installed distribution, and after sys.path changes)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from hetero_dp.kits.entrypoints import EntryPoint, entry_points


def _theirs(group: str) -> list[tuple[str, str]]:
    return [(ep.name, ep.value) for ep in importlib.metadata.entry_points(group=group)]


def _ours(group: str) -> list[tuple[str, str]]:
    return [(ep.name, ep.value) for ep in entry_points(group=group)]


def test_every_group_agrees_with_importlib_metadata() -> None:
    groups = {ep.group for d in importlib.metadata.distributions() for ep in d.entry_points}
    assert "hetero_dp" in groups, "the bundled backends are installed in the test env"
    for group in sorted(groups):
        assert _ours(group) == _theirs(group), group


def test_first_distribution_on_sys_path_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for where, value in (("a", "first:plugin"), ("b", "second:plugin")):
        info = tmp_path / where / "Demo_Pkg-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "entry_points.txt").write_text(
            f"# comment\n[other]\nx = nope:x\n\n[hetero_dp_test]\n demo = {value} [extra]\n"
        )
    # an egg-info of another project, and a dist-info without entry points
    egg = tmp_path / "b" / "other.egg-info"
    egg.mkdir()
    (egg / "entry_points.txt").write_text("[hetero_dp_test]\nmore = pkg.mod:obj.attr\n")
    (tmp_path / "a" / "bare-2.0.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b"), *sys.path])
    assert sorted(_ours("hetero_dp_test")) == sorted(_theirs("hetero_dp_test"))
    assert sorted(_ours("hetero_dp_test")) == [
        ("demo", "first:plugin [extra]"),
        ("more", "pkg.mod:obj.attr"),
    ]


def test_load_follows_module_and_attribute_path() -> None:
    ep = EntryPoint("x", "hetero_dp.kits.entrypoints:EntryPoint.load [extra]", "g")
    assert ep.load() is EntryPoint.load
    assert EntryPoint("m", "hetero_dp.kits", "g").load() is sys.modules["hetero_dp.kits"]
