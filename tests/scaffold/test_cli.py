"""``hetero-dp new`` from the command line: flags, validation, refusals and prompts."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetero_dp.cli import scaffold
from hetero_dp.cli.main import main
from hetero_dp.model.errors import ConfigError

from .conftest import VALUES, subprocess_env

FLAGS = ["--vendor-domain", "acme.example.com", "--resource", "npu", "--device-glob", "/dev/acme*"]


def new(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["new", *args])
    return result.exit_code, result.output


def test_flags_create_the_project(tmp_path: Path):
    code, out = new(*FLAGS, "--output", str(tmp_path / "p"))
    assert code == 0, out
    assert (tmp_path / "p" / "acme_npu.py").is_file()
    assert "created" in out and "8 files" in out


def test_package_and_image_flags(tmp_path: Path):
    code, out = new(
        *FLAGS, "--package", "acme_v2", "--image", "reg:5000/x/y:1", "--output", str(tmp_path)
    )
    assert code == 0, out
    assert (tmp_path / "acme_v2.py").is_file()
    assert "image: reg:5000/x/y:1" in (tmp_path / "deploy" / "daemonset.yaml").read_text()


def test_default_output_is_the_project_slug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    code, out = new(*FLAGS)
    assert code == 0, out
    assert (tmp_path / "acme-npu-device-plugin" / "pyproject.toml").is_file()


BAD = [
    ("--vendor-domain", "Acme.com", "lowercase DNS subdomain"),
    ("--vendor-domain", "acme_corp.com", "lowercase DNS subdomain"),
    ("--vendor-domain", "-acme.com", "lowercase DNS subdomain"),
    ("--vendor-domain", "acme..com", "lowercase DNS subdomain"),
    ("--vendor-domain", "x" * 64 + ".com", "lowercase DNS subdomain"),
    ("--vendor-domain", "gpu.kubernetes.io", "kubernetes.io"),
    ("--vendor-domain", "acme.com/npu", "lowercase DNS subdomain"),
    ("--resource", "my npu", "must be letters, digits"),
    ("--resource", "-npu", "must be letters, digits"),
    ("--resource", "n" * 64, "longer than 63"),
    ("--resource", "npu/extra", "more than one '/'"),
    ("--device-glob", "dev/acme*", "absolute path"),
    ("--device-glob", "/dev/../etc/*", "'..'"),
    ("--device-glob", '/dev/acme"0', "no spaces, quotes"),
    ("--device-glob", "/dev/{a,b}", "no spaces, quotes"),
    ("--device-glob", "/dev/acme\n0", "control characters"),
    ("--package", "1acme", "Python identifier"),
    ("--package", "acme-npu", "Python identifier"),
    ("--package", "Acme", "Python identifier"),
    ("--package", "../evil", "Python identifier"),
    ("--package", "class", "keyword"),
    ("--package", "json", "shadow"),
    ("--package", "hetero_dp", "shadow"),
    ("--project-name", 'say "hi"', "without"),
    ("--image", "Registry/X", "image reference"),
    ("--image", "a b", "image reference"),
]


@pytest.mark.parametrize(("flag", "value", "reason"), BAD)
def test_bad_input_is_refused_naming_the_flag(tmp_path: Path, flag: str, value: str, reason: str):
    args = list(FLAGS)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    code, out = new(*args, "--output", str(tmp_path / "p"))
    assert code == 2, out
    assert f"field '{flag}'" in out and reason in out
    assert not (tmp_path / "p").exists()  # nothing written


def test_longest_package_still_makes_a_dns_label_slug(tmp_path: Path):
    # the slug (package + "-device-plugin") names the DaemonSet: at most 63 characters
    code, out = new(*FLAGS, "--package", "a" * 49, "--output", str(tmp_path / "p"))
    assert code == 0, out
    assert f"name: {'a' * 49}-device-plugin" in (tmp_path / "p/deploy/daemonset.yaml").read_text()
    code, out = new(*FLAGS, "--package", "a" * 50, "--output", str(tmp_path / "q"))
    assert code == 2 and "at most 49 characters" in out


@pytest.mark.parametrize("missing", ["--vendor-domain", "--resource", "--device-glob"])
def test_missing_value_without_a_terminal(tmp_path: Path, missing: str):
    args = list(FLAGS)
    i = args.index(missing)
    del args[i : i + 2]
    code, out = new(*args, "--output", str(tmp_path / "p"))
    assert code == 2
    assert f"field '{missing}': is required (stdin is not a terminal" in out


def test_non_empty_directory_needs_force(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    code, out = new(*FLAGS, "--output", str(tmp_path))
    assert code == 2 and "not empty; pass --force" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    code, out = new(*FLAGS, "--output", str(tmp_path), "--force")
    assert code == 0, out
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "acme_npu.py").is_file()


def test_output_that_is_a_file_is_refused(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    code, out = new(*FLAGS, "--output", str(tmp_path / "f"))
    assert code == 2 and "is a file" in out  # click's own check
    with pytest.raises(ConfigError, match="not a directory"):
        scaffold.generate(VALUES, tmp_path / "f")
    assert (tmp_path / "f").read_text() == "x"


def test_force_does_not_write_through_a_symlink(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    project = tmp_path / "p"
    project.mkdir()
    (project / "tests").symlink_to(outside)
    code, out = new(*FLAGS, "--output", str(project), "--force")
    assert code == 2 and "outside" in out
    assert list(outside.iterdir()) == []
    # every path is checked before anything is written: no Dockerfile, no module
    assert [x.name for x in project.iterdir()] == ["tests"]


# -- prompting on a real terminal -----------------------------------------------------


class Terminal:
    """A child process on a pseudo-terminal; waits on its output, never sleeps."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=subprocess_env()
        )
        os.close(slave)
        self.seen = b""

    def expect(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {text!r} in {self.seen.decode(errors='replace')!r}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"EOF before {text!r}: {self.seen.decode()!r}")
                self.seen += chunk
        self.seen = self.seen[self.seen.index(text.encode()) + len(text) :]

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            os.close(self.master)


def test_prompts_on_a_terminal_and_re_asks_bad_answers(tmp_path: Path):
    term = Terminal([sys.executable, "-m", "hetero_dp", "new", "--output", "p"], tmp_path)
    term.expect("vendor domain [acme.example.com]:")
    term.send("Bad_Domain")
    term.expect("not a lowercase DNS subdomain")
    term.expect("vendor domain [acme.example.com]:")
    term.send("npu.example.org")
    term.expect("resource [npu]:")
    term.send("")  # the default
    term.expect("device glob [/dev/npu*]:")  # derived from the domain given
    term.send("/dev/accel/accel*")
    term.expect("package [npu_npu]:")
    term.send("orgnpu")
    term.expect("created p (8 files)")
    assert term.close() == 0
    source = (tmp_path / "p" / "orgnpu.py").read_text()
    assert 'RESOURCE = "npu.example.org/npu"' in source
    assert 'DEFAULT_GLOB = "/dev/accel/accel*"' in source
