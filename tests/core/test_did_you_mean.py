"""A mistyped name gets "did you mean" wherever a name is looked up, and an empty value
that would silently change an option's meaning is refused (issue #37 point 4)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest

from hetero_dp import option, parse_options
from hetero_dp.model.errors import ConfigError


def cli(cmd, env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", ["list", "doctor", "run"])
def test_a_mistyped_backend_gets_the_installed_name_not_a_package(
    cli_env, hetero_dp_cmd, tmp_path, command
):
    extra = ["--kubelet-dir", str(tmp_path)] if command == "run" else []
    out = cli(hetero_dp_cmd, cli_env, command, "simulatd", *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "did you mean 'simulated'?" in out.stderr
    assert "pip install" not in out.stderr  # was: pip install hetero-dp-simulatd


@pytest.mark.parametrize(
    "args",
    [["--fake-kubelt", "simulated"], ["simulated", "--fake-kubelt"]],
    ids=["before the backend", "after the backend"],
)
def test_a_mistyped_flag_of_run_gets_the_flag(cli_env, hetero_dp_cmd, args):
    out = cli(hetero_dp_cmd, cli_env, "run", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "did you mean --fake-kubelet?" in out.stderr, out.stderr
    assert "name at least one backend" not in out.stderr


@dataclass(frozen=True)
class Acme:
    device_glob: str = option("/dev/apex_*", help="where the devices are")
    label: str = option("", help="may be empty")
    prefix: str = option("x", min=0, help="may be emptied on purpose")


def test_an_empty_value_for_an_option_with_a_default_is_refused():
    with pytest.raises(ConfigError, match=r"deviceGlob.*may not be empty.*'/dev/apex_\*'"):
        parse_options(Acme, {"deviceGlob": ""}, field="backends.acme")
    assert parse_options(Acme, {"label": ""}, field="backends.acme").label == ""
    assert parse_options(Acme, {"prefix": ""}, field="backends.acme").prefix == ""


def test_an_empty_value_from_a_flag_names_the_flag(cli_env, hetero_dp_cmd):
    out = cli(hetero_dp_cmd, cli_env, "list", "simulated", "-o", "simulated.resource=")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "flag -o simulated.resource" in out.stderr and "may not be empty" in out.stderr
