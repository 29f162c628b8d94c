"""``hetero-dp new --wheels DIR``: the project carries hetero-dp's wheel; refusals come
before any write."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import hetero_dp
from hetero_dp.cli import main, scaffold
from hetero_dp.model.errors import ConfigError

from .conftest import VALUES

V = hetero_dp.__version__


def wheelhouse(tmp_path: Path, *names: str) -> Path:
    where = tmp_path / "wheelhouse"
    where.mkdir()
    for name in names:
        (where / name).write_bytes(f"not really a zip: {name}".encode())
    return where


def test_wheels_are_copied_into_the_project(tmp_path: Path):
    names = (f"hetero_dp-{V}-py3-none-any.whl", "grpcio-1.0-cp311-cp311-linux_x86_64.whl")
    source = wheelhouse(tmp_path, *names, "notes.txt")
    project, written = scaffold.generate(VALUES, tmp_path / "p", wheels=source)
    copied = sorted(p.name for p in (project / "wheels").glob("*.whl"))
    assert copied == sorted(names)
    for name in names:
        assert (project / "wheels" / name).read_bytes() == (source / name).read_bytes()
    assert not (project / "wheels" / "notes.txt").exists()
    assert project / "wheels" / names[0] in written


@pytest.mark.parametrize(
    ("names", "said"),
    [
        ((), "no hetero_dp-*.whl"),
        (("hetero_dp_udev-0.1.0-py3-none-any.whl",), "no hetero_dp-*.whl"),
        (("hetero_dp-99.0.0-py3-none-any.whl",), "found: hetero_dp-99.0.0-py3-none-any.whl"),
    ],
)
def test_no_compatible_hetero_dp_wheel_is_refused_before_any_write(
    tmp_path: Path, names: tuple[str, ...], said: str
):
    source = wheelhouse(tmp_path, *names)
    with pytest.raises(ConfigError) as e:
        scaffold.generate(VALUES, tmp_path / "p", wheels=source)
    assert "--wheels" in str(e.value) and f"hetero-dp~={V}" in str(e.value)
    assert said in str(e.value)
    assert not (tmp_path / "p").exists()


def test_missing_directory_is_refused_by_the_command(tmp_path: Path):
    flags = ["--vendor-domain", "acme.example.com", "--resource", "npu", "--device-glob", "/d*"]
    out = tmp_path / "p"
    result = CliRunner().invoke(
        main, ["new", *flags, "--output", str(out), "--wheels", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2, result.output
    assert "--wheels" in result.output and "is not a directory" in result.output
    assert not out.exists()


def test_a_file_in_the_way_refuses_before_any_write(tmp_path: Path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "tests").write_text("a file where the tests/ directory goes")
    with pytest.raises(ConfigError, match="in the way"):
        scaffold.generate(VALUES, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["tests"]


@pytest.mark.parametrize(
    ("candidate", "pin", "ok"),
    [
        ("0.1.0", "0.1.0", True),
        ("0.1.7", "0.1.0", True),
        ("0.2.0", "0.1.0", False),
        ("0.0.9", "0.1.0", False),
        ("1.4", "1.2", True),
        ("2.0", "1.2", False),
        ("0.1.1rc1", "0.1.0", True),
    ],
)
def test_compatible_release(candidate: str, pin: str, ok: bool):
    assert scaffold.compatible(candidate, pin) is ok
