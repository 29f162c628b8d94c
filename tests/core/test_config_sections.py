"""A config section a backend contributes (its ``config_sections`` hook) is read and
checked the same way by every command, for a backend loaded from a file too: the CLI
passes the loaded backends' sections to the config reader."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hetero_dp.engine.config import load_config
from hetero_dp.model.errors import ConfigError

ACME = """
from dataclasses import dataclass

from hetero_dp import Device, hookimpl, option


@dataclass(frozen=True)
class AcmeOptions:
    boards: int = option(1, help="boards to advertise", min=1, max=8)


OPTIONS = AcmeOptions()


@hookimpl
def config_sections():
    return {"acme": ""}  # the keys of a top-level ``acme`` section are its options


@hookimpl
def configure(options: AcmeOptions) -> None:
    global OPTIONS
    OPTIONS = options


@hookimpl
def discover():
    return [Device(f"a{i}", "acme.example.com/npu") for i in range(OPTIONS.boards)]
"""


def hetero_dp(cmd, env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def acme(tmp_path: Path) -> Path:
    path = tmp_path / "acme_sections.py"
    path.write_text(ACME)
    return path


def test_list_reads_the_section_of_a_backend_loaded_from_a_file(
    tmp_path: Path, acme: Path, cli_env, hetero_dp_cmd
):
    config = tmp_path / "config.yaml"
    config.write_text("acme:\n  boards: 3\n")
    listed = hetero_dp(hetero_dp_cmd, cli_env, "list", str(acme), "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert all(f"a{i}" in listed.stdout for i in range(3)) and "a3" not in listed.stdout


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "acme:\n  bords: 3\n",
            "field 'acme.bords': unknown key; did you mean 'boards'? (known: boards)",
        ),
        ("acme:\n  boards: 99\n", "field 'acme.boards': must be at most 8, got 99"),
    ],
)
def test_run_and_list_refuse_a_bad_section_value_alike(
    tmp_path: Path, acme: Path, cli_env, hetero_dp_cmd, text: str, expected: str
):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    kdir = tmp_path / "kubelet"
    kdir.mkdir()
    common = [str(acme), "--config", str(config)]
    listed = hetero_dp(hetero_dp_cmd, cli_env, "list", *common)
    ran = hetero_dp(hetero_dp_cmd, cli_env, "run", *common, "--kubelet-dir", str(kdir))
    for proc in (listed, ran):
        assert proc.returncode == 2, proc.stderr
        assert f"configuration error: {config}, {expected}" in proc.stderr
    assert list(kdir.iterdir()) == []


def test_a_section_no_backend_claims_is_an_unknown_key(tmp_path: Path):
    with pytest.raises(ConfigError) as e:
        load_config(raw={"acme": {"boards": 3}}, env={})
    assert e.value.field == "acme" and "unknown key" in e.value.reason


def test_a_section_the_caller_names_is_read_without_looking_up_installed_backends():
    cfg = load_config(raw={"acme": {"boards": 3}}, env={}, sections={"acme": {"acme": ""}})
    assert cfg.backend_options("acme") == {"boards": 3}


def test_doctor_reads_the_section_of_a_backend_loaded_from_a_file(
    tmp_path: Path, acme: Path, cli_env, hetero_dp_cmd
):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("acme:\n  boards: 2\n")
    bad.write_text("acme:\n  bords: 2\n")
    root = ["--root", str(tmp_path / "root")]  # a node with nothing on it
    found = hetero_dp(hetero_dp_cmd, cli_env, "doctor", str(acme), "--config", str(good), *root)
    assert "acme_sections: 2 devices" in found.stdout, found.stdout + found.stderr
    found = hetero_dp(hetero_dp_cmd, cli_env, "doctor", str(acme), "--config", str(bad), *root)
    assert found.returncode == 1
    assert f"refuses its options: {bad}, field 'acme.bords': unknown key" in found.stdout


@pytest.mark.parametrize("key", ["boards", "", ".", "plugin.x"])
def test_an_option_from_a_claimed_section_is_named_as_written_whatever_its_key(key):
    """Keys such as "" or "." (a fuzzer's) are named in the section too, not left as
    ``backends.acme.``: the longest written key the field lies under wins."""
    cfg = load_config(raw={"acme": {key: 1}}, env={}, sections={"acme": {"acme": ""}})
    assert cfg.option_field("acme", f"backends.acme.{key}") == f"acme.{key}"
    assert cfg.option_field("acme", f"backends.acme.{key}[0]") == f"acme.{key}[0]"


async def test_plugin_runner_reads_the_section_of_a_backend_loaded_from_a_file(
    acme: Path, plugin_runner
):
    """The test runner reads the config as ``hetero-dp run`` does: the sections of the
    backends it runs, a backend from a ``.py`` file included (not only installed ones)."""
    daemon = await plugin_runner.start(str(acme), config={"acme": {"boards": 3}})
    assert [d.id for d in daemon.devices("acme.example.com/npu")] == ["a0", "a1", "a2"]
    with pytest.raises(ConfigError) as err:
        await plugin_runner.start(str(acme), config={"acme": {"bords": 3}})
    assert err.value.field == "acme.bords"
    assert "unknown key; did you mean 'boards'? (known: boards)" in str(err.value)


async def test_dra_runner_reads_the_section_of_a_backend_loaded_from_a_file(acme: Path):
    from hetero_dp.testing import short_tempdir
    from hetero_dp.testing.dra import DRARunner, FakeAPIServer

    root = short_tempdir("hdra-")
    with FakeAPIServer() as api:
        runner = DRARunner(root, api)
        try:
            daemon = await runner.start(str(acme), config={"acme": {"boards": 2}})
            assert [d.id for d in daemon.devices("acme.example.com/npu")] == ["a0", "a1"]
            with pytest.raises(ConfigError) as err:
                await runner.start(str(acme), config={"acme": {"boards": 99}})
            assert err.value.field == "acme.boards" and "at most 8, got 99" in str(err.value)
        finally:
            await runner.stop_all()
            shutil.rmtree(root, ignore_errors=True)


def test_the_settings_table_in_the_docs_is_generated_from_the_declarations():
    """docs/configuration.md's table of every setting is rendered from
    engine/settings.py (scripts/gen_config_docs.py): a setting changed without it fails."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", root / "scripts/gen_config_docs.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = gen.PAGE.read_text()
    assert gen.render(page) == page, (
        "docs/configuration.md is stale: run scripts/gen_config_docs.py"
    )
    # each `resources` entry's keys are rows of it too (engine/settings.py ResourceSettings)
    from hetero_dp.engine.settings import RESOURCE_KEYS

    assert RESOURCE_KEYS and all(f"| `resources.<name>.{k}` |" in page for k in RESOURCE_KEYS)


def test_every_core_setting_declares_what_a_reload_does():
    from hetero_dp.engine.settings import SETTINGS
    from hetero_dp.model.options import RELOADS

    assert {s.info.reload for s in SETTINGS} <= set(RELOADS)
    assert len(SETTINGS) == len({s.key for s in SETTINGS}) > 15


def test_run_has_a_flag_for_every_setting_that_declares_one():
    """The flags of ``hetero-dp run`` are generated from the declarations: each one
    declared is there, typed as declared, and what it gives reaches load_config."""
    import click

    from hetero_dp.cli.main import run
    from hetero_dp.cli.settings import FLAGGED, overrides, param_name
    from hetero_dp.engine.config import load_config

    by_flag = {o: p for p in run.params for o in getattr(p, "opts", [])}
    for s in FLAGGED:
        assert s.info.flag in by_flag, s.key
        assert by_flag[s.info.flag].name == param_name(s)
    assert isinstance(by_flag["--registration"].type, click.Choice)
    given = {param_name(s): None for s in FLAGGED}
    given.update({"s_kubeletDir": "rel/dp", "s_healthInterval": 2.5, "s_metrics__address": ":9400"})
    cfg = load_config(raw={}, env={}, overrides=overrides(given))
    assert cfg.kubelet_dir.is_absolute() and cfg.kubelet_dir.name == "dp"  # the shell's
    assert (cfg.health_interval, cfg.metrics.address) == (2.5, ":9400")


def test_a_sections_env_var_is_read_by_the_config_and_named_when_refused():
    """HETERO_DP_LABELS_DIR (the DaemonSets set it) turns labels on, as its flag does;
    a bad HETERO_DP_METRICS_ADDRESS is refused naming the variable."""
    from hetero_dp.engine.config import load_config
    from hetero_dp.model.errors import ConfigError

    cfg = load_config(raw={}, env={"HETERO_DP_LABELS_DIR": "/run/features.d"})
    assert (cfg.labels.enabled, cfg.labels.dir) == (True, "/run/features.d")
    cfg = load_config(raw={"labels": {"dir": "/x"}}, env={"HETERO_DP_LABELS_DIR": ""})
    assert (cfg.labels.enabled, cfg.labels.dir) == (False, "/x")  # empty: unset
    cfg = load_config(
        raw={}, env={"HETERO_DP_LABELS_DIR": "/e"}, overrides={"labels": {"dir": "/f"}}
    )
    assert cfg.labels.dir == "/f"  # the flag wins
    with pytest.raises(ConfigError) as e:
        load_config(raw={}, env={"HETERO_DP_PROC_ROOT": "relative"})
    assert (e.value.field, e.value.source) == ("attribution.procRoot", "env HETERO_DP_PROC_ROOT")
