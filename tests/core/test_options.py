"""Issue 17, point 1: typed backend options. A backend declares a dataclass; the
framework reads the file, the environment and ``-o``, checks every value, and hands
the backend an instance, at start-up and on reload. Over real sockets (FakeKubelet,
PluginRunner) and through ``hetero-dp`` in a subprocess."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from hetero_dp import ConfigError, Device, hookimpl, option
from hetero_dp.engine.config import load_config
from hetero_dp.model.options import describe, parse_options
from hetero_dp.ops.reload import ConfigReloader

ZETA = "zeta.example.com/npu"


@dataclass(frozen=True)
class Health:
    interval: float = option(5.0, help="seconds between checks", min=0.1, max=60)
    words: tuple[str, ...] = option(("ecc",), help="words that mean unhealthy")


@dataclass(frozen=True)
class ZetaOptions:
    device_glob: str = option("/dev/zeta*", help="the cards' nodes", env="ZETA_DEV_GLOB")
    boards: int = option(2, help="boards to advertise", min=0, max=64)
    mode: Literal["fast", "safe"] = option("safe", help="how to drive the cards")
    enabled: bool = option(True)
    root: pathlib.Path = option(pathlib.Path("/"))
    model: str | None = option(None)
    health: Health = field(default_factory=Health)


class Zeta:
    """A backend with declared options; it advertises ``boards`` devices."""

    hetero_dp_name = "zeta"

    def __init__(self) -> None:
        self.seen: list[ZetaOptions] = []

    @hookimpl
    def configure(self, options: ZetaOptions) -> None:
        self.seen.append(options)

    @hookimpl
    def discover(self) -> list[Device]:
        boards = self.seen[-1].boards if self.seen else 0
        return [Device(id=f"z{i}", resource=ZETA) for i in range(boards)]


class NoOptions:
    hetero_dp_name = "bare"

    @hookimpl
    def discover(self) -> list[Device]:
        return [Device(id="b0", resource="bare.example.com/x")]


def parse(raw, environ=None, flagged=frozenset()):
    return parse_options(
        ZetaOptions,
        raw,
        field="backends.zeta",
        source="c.yaml",
        environ=environ or {},
        flagged=flagged,
    )


# --- reading and checking -----------------------------------------------------------------


def test_values_are_converted_to_the_declared_types():
    got = parse(
        {
            "boards": "3",  # -o and env give text
            "mode": "fast",
            "enabled": "no",
            "root": "/host",
            "model": 910,
            "health.interval": "2.5",  # a dotted key reads as the nested section
            "health": {"words": "ecc,xid"},
        }
    )
    assert got == ZetaOptions(
        boards=3,
        mode="fast",
        enabled=False,
        root=pathlib.Path("/host"),
        model="910",
        health=Health(interval=2.5, words=("ecc", "xid")),
    )
    assert parse({}) == ZetaOptions()  # every default
    assert parse({"model": None}).model is None


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"deviceGlb": "/x"}, "backends.zeta.deviceGlb", "did you mean 'deviceGlob'?"),
        ({"Boards": 1}, "backends.zeta.Boards", "did you mean 'boards'?"),
        ({"health": {"intervall": 1}}, "backends.zeta.health.intervall", "'interval'"),
        ({"boards": "two"}, "backends.zeta.boards", "expected an integer, got 'two'"),
        ({"boards": True}, "backends.zeta.boards", "expected an integer"),
        ({"boards": 65}, "backends.zeta.boards", "at most 64, got 65"),
        ({"mode": "turbo"}, "backends.zeta.mode", "expected one of fast, safe"),
        ({"enabled": "maybe"}, "backends.zeta.enabled", "expected true or false"),
        ({"health": {"interval": ".nan"}}, "backends.zeta.health.interval", "a number"),
        ({"health": {"interval": float("inf")}}, "backends.zeta.health.interval", "finite"),
        ({"health": 5}, "backends.zeta.health", "expected a mapping"),
        ({"deviceGlob": ["/a"]}, "backends.zeta.deviceGlob", "expected a string"),
    ],
)
def test_a_bad_option_names_itself_and_what_was_expected(raw, field, words):
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    e = caught.value
    assert e.field == field and e.source == "c.yaml"
    assert words in e.reason, e.reason


@pytest.mark.parametrize("raw", [[], "", 0, False])
def test_an_empty_value_that_is_no_mapping_is_refused_not_taken_as_no_options(raw):
    """Only None (a key with nothing under it) means 'no options': an empty list,
    string, 0 or false is a mistake the user should hear about (they were read as
    no options, so every option silently kept its default)."""
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    assert caught.value.reason.startswith("expected a mapping, got ")
    assert caught.value.source == "c.yaml"


def test_no_options_at_all_means_the_defaults():
    assert parse(None) == parse({})


def test_an_unknown_key_lists_the_options():
    with pytest.raises(ConfigError) as caught:
        parse({"nonsense": 1})
    assert "did you mean" not in caught.value.reason
    assert "(known: boards, deviceGlob, enabled, health, mode, model, root)" in str(caught.value)


def test_a_required_option_must_be_given():
    @dataclass(frozen=True)
    class Needs:
        rules: str = option(help="the rules file")

    with pytest.raises(ConfigError, match=r"'backends.x.rules'.*required.*the rules file"):
        parse_options(Needs, {}, field="backends.x", environ={})
    assert parse_options(Needs, {"rules": "r.yaml"}, field="backends.x", environ={}).rules


def test_the_environment_wins_over_the_file_and_a_flag_over_the_environment():
    env = {"ZETA_DEV_GLOB": "/env/zeta*"}
    assert parse({"deviceGlob": "/file*"}, env).device_glob == "/env/zeta*"
    flagged = frozenset({"deviceGlob"})
    assert parse({"deviceGlob": "/flag*"}, env, flagged).device_glob == "/flag*"
    assert parse({"deviceGlob": "/file*"}, {"ZETA_DEV_GLOB": ""}).device_glob == "/file*"


def test_describe_lists_every_option_with_type_default_and_limits():
    rows = {r.key: r for r in describe(ZetaOptions)}
    assert list(rows) == [
        "deviceGlob",
        "boards",
        "mode",
        "enabled",
        "root",
        "model",
        "health.interval",
        "health.words",
    ]
    assert rows["deviceGlob"].env == "ZETA_DEV_GLOB"
    assert rows["boards"].type == "int" and rows["boards"].help == "boards to advertise (0 to 64)"
    assert rows["mode"].type == "fast | safe" and rows["mode"].default == "'safe'"
    assert rows["model"].type == "str (or none)"
    assert rows["health.words"].type == "list of str"


# --- through the daemon --------------------------------------------------------------------


async def test_the_backend_gets_an_instance_and_a_bad_reload_keeps_the_old_one(
    fake_kubelet, plugin_runner, tmp_path, monkeypatch
):
    monkeypatch.setenv("ZETA_DEV_GLOB", "/env/zeta*")
    path = tmp_path / "c.yaml"
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "backends": {"zeta": {"boards": 2, "health": {"interval": 1}}},
    }
    path.write_text(yaml.safe_dump(doc))
    zeta = Zeta()
    daemon = await plugin_runner.start(zeta, config=load_config(path, env={}).raw)
    await fake_kubelet.wait_devices(ZETA, lambda d: len(d) == 2)
    assert zeta.seen == [
        ZetaOptions(device_glob="/env/zeta*", boards=2, health=Health(interval=1.0))
    ]
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        path.write_text(yaml.safe_dump({**doc, "backends": {"zeta": {"bords": 3}}}))
        results = await reloader.wait_results(1)
        assert results[0].startswith("rejected: "), results[0]
        assert "'backends.zeta.bords'" in results[0] and "did you mean 'boards'?" in results[0]
        assert len(zeta.seen) == 1  # the hook never saw it
        path.write_text(yaml.safe_dump({**doc, "backends": {"zeta": {"boards": 3}}}))
        results = await reloader.wait_results(2)
        assert results[1].startswith("applied"), results[1]
        assert zeta.seen[-1].boards == 3 and daemon.backends[0].options is zeta.seen[-1]
        await daemon.rediscover()
        await fake_kubelet.wait_devices(ZETA, lambda d: len(d) == 3)
    finally:
        await reloader.stop()


async def test_options_for_a_backend_without_configure_are_refused(plugin_runner):
    with pytest.raises(ConfigError) as caught:
        await plugin_runner.start(NoOptions(), options={"bare": {"count": 2}})
    assert caught.value.field == "backends.bare.count"
    assert "takes no options" in caught.value.reason


# --- the command line ----------------------------------------------------------------------

PLUGIN = """
from dataclasses import dataclass
from hetero_dp import Device, hookimpl, option

@dataclass(frozen=True)
class Options:
    device_glob: str = option("/dev/zeta*", help="the cards' nodes", env="ZETA_DEV_GLOB")
    count: int = option(1, help="devices", min=0, max=8)

@hookimpl
def configure(options: Options):
    global settings
    settings = options

@hookimpl
def discover():
    for i in range(settings.count):
        yield Device(id=f"{settings.device_glob.strip('/*').replace('/', '-')}{i}",
                     resource="zeta.example.com/npu")
"""


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "zeta.py"
    path.write_text(PLUGIN)
    return path


def hetero_dp(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "hetero_dp", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_list_options_prints_the_declared_table(plugin, cli_env):
    out = hetero_dp("list", "--options", plugin, env=cli_env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("options of backend 'zeta' (backends.zeta.OPTION")
    assert lines[1].split() == ["OPTION", "TYPE", "DEFAULT", "ENV", "HELP"]
    assert lines[2].split()[:4] == ["deviceGlob", "str", "'/dev/zeta*'", "ZETA_DEV_GLOB"]
    assert lines[3].split() == ["count", "int", "1", "-", "devices", "(0", "to", "8)"]
    out = hetero_dp("list", "--options", "--json", plugin, env=cli_env)
    assert [r["key"] for r in json.loads(out.stdout)] == ["deviceGlob", "count"]


def test_a_mistyped_option_stops_start_up_with_did_you_mean(plugin, cli_env, tmp_path):
    kdir = tmp_path / "k"
    kdir.mkdir()
    out = hetero_dp(
        "run", plugin, "--kubelet-dir", kdir, "-o", "zeta.deviceGlb=/dev/x*", env=cli_env
    )
    assert out.returncode == 2, out.stderr
    assert "field 'backends.zeta.deviceGlb': unknown key; did you mean 'deviceGlob'?" in (
        out.stderr
    )
    assert "Traceback" not in out.stderr and list(kdir.iterdir()) == []


def test_env_file_and_flag_reach_the_plugin_in_that_order(plugin, cli_env, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"backends": {"zeta": {"deviceGlob": "/file/z*"}}}))
    env = {**cli_env, "ZETA_DEV_GLOB": "/env/z*"}

    def ids(*extra):
        out = hetero_dp("list", plugin, "-c", config, "--json", *extra, env=env)
        assert out.returncode == 0, out.stderr
        return [d["id"] for d in json.loads(out.stdout)]

    assert ids() == ["env-z0"]
    assert ids("-o", "zeta.deviceGlob=/flag/z*", "-o", "zeta.count=2") == [
        "flag-z0",
        "flag-z1",
    ]
    out = hetero_dp("list", plugin, "-o", "zeta.count=9", env=env)
    assert out.returncode == 2 and "at most 8, got 9" in out.stderr, out.stderr


def test_the_bundled_backends_declare_their_options(cli_env):
    env = {**cli_env, "PYTHONPATH": os.pathsep.join(sys.path)}
    for backend, key in (("simulated", "numaNodes"), ("nvidia", "plugin.deviceIDStrategy")):
        out = hetero_dp("list", "--options", "--json", backend, env=env)
        assert out.returncode == 0, out.stderr
        assert key in [r["key"] for r in json.loads(out.stdout)]


def test_an_annotation_that_does_not_resolve_is_said(caplog):
    """Options declared inside a function cannot be resolved from a string annotation
    (``from __future__ import annotations``): the hook gets a mapping, and the log
    says why instead of the author meeting an AttributeError later."""
    from hetero_dp.model.options import schema_of

    def make():
        @dataclass(frozen=True)
        class Local:
            count: int = option(1)

        def configure(options: Local) -> None: ...

        return configure

    with caplog.at_level("WARNING", logger="hetero_dp.model.options"):
        assert schema_of(make()) is None
    assert "does not resolve" in caplog.text and "module level" in caplog.text
    assert schema_of(Zeta().configure) is ZetaOptions
