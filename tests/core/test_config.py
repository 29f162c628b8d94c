"""Configuration: file, env and flags, and errors that name the file, field and reason."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from hetero_dp.engine.config import env_name, load_config, set_option
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import resource_name_problem, validate_resource_name


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_precedence_flags_over_env_over_file(tmp_path):
    p = write(tmp_path, "kubeletDir: /from/file\nhealthInterval: 5\nregistration: classic\n")
    cfg = load_config(
        p, env={"HETERO_DP_KUBELET_DIR": "/from/env", "HETERO_DP_HEALTH_INTERVAL": "7"}
    )
    assert str(cfg.kubelet_dir) == "/from/env" and cfg.health_interval == 7.0
    cfg = load_config(
        p, env={"HETERO_DP_KUBELET_DIR": "/from/env"}, overrides={"kubeletDir": "/from/flag"}
    )
    assert str(cfg.kubelet_dir) == "/from/flag"
    assert cfg.registration == "classic"


def test_nvidia_config_file_is_accepted_as_is(tmp_path):
    p = write(
        tmp_path,
        """
version: v1
flags:
  migStrategy: single
  failOnInitError: true
  plugin:
    deviceListStrategy: envvar
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
""",
    )
    cfg = load_config(p, env={})
    assert cfg.backend_options("nvidia")["migStrategy"] == "single"
    assert cfg.backend_options("nvidia")["plugin"] == {"deviceListStrategy": "envvar"}


def test_option_flags_set_nested_backend_options():
    overrides: dict = {}
    set_option(overrides, "simulated.count=8")
    set_option(overrides, "nvidia.plugin.deviceIDStrategy=index")
    cfg = load_config(env={}, overrides=overrides)
    assert cfg.backend_options("simulated") == {"count": 8}
    assert cfg.backend_options("nvidia") == {"plugin": {"deviceIDStrategy": "index"}}


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("kubeletDirr: /x\n", "kubeletDirr", "unknown key"),
        ("healthInterval: soon\n", "healthInterval", "expected a number"),
        ("healthInterval: -1\n", "healthInterval", "must be at least 0.01 (or 0: off), got -1"),
        ("registration: magic\n", "registration", "expected one of classic, watcher"),
        (
            "resources:\n  nvidia.com/gpu:\n    deliverr: []\n",
            "resources.nvidia.com/gpu.deliverr",
            "unknown key",
        ),
        ("resources:\n  gpu:\n    deliver: []\n", "resources.gpu", "no vendor prefix"),
        (
            "resources:\n  a.com/x:\n    replicaPolicy: random\n",
            "resources.a.com/x.replicaPolicy",
            "one of distributed, packed, spread",
        ),
        ("cdi:\n  enabled: maybe\n", "cdi.enabled", "expected true or false"),
        ("version: v2\n", "version", "expected one of v1, got 'v2'"),
        ("backends: [1, 2]\n", "backends", "expected a mapping"),
    ],
)
def test_bad_config_names_file_field_and_reason(tmp_path, text, field, reason):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(p, env={})
    msg = str(err.value)
    assert str(p) in msg and f"field {field!r}" in msg and reason in msg


def test_yaml_syntax_error_names_line(tmp_path):
    p = write(tmp_path, "kubeletDir: /x\nbackends: {a: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(p, env={})
    assert str(p) in str(err.value) and "line" in str(err.value)


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml", env={})
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"), env={})


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError) as err:
        load_config(env={"HETERO_DP_REGISTRATION": "sometimes"})
    assert "env HETERO_DP_REGISTRATION" in str(err.value)
    assert env_name("rediscoverInterval") == "HETERO_DP_REDISCOVER_INTERVAL"


@pytest.mark.parametrize(
    "name",
    ["nvidia.com/gpu", "amd.com/gpu", "example.com/mig-1g.5gb", "vendor/x", "a.b.c/Name_1.x"],
)
def test_valid_resource_names(name):
    assert resource_name_problem(name) is None
    assert validate_resource_name(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gpu", "no vendor prefix"),
        ("Nvidia.com/gpu", "not a lowercase DNS subdomain"),
        ("kubernetes.io/gpu", "reserved"),
        ("foo.kubernetes.io/gpu", "reserved"),
        ("requests.nvidia.com/gpu", "requests."),
        ("nvidia.com/", "empty name part"),
        ("nvidia.com/-gpu", "starting and ending"),
        ("nvidia.com/" + "g" * 64, "longer than 63"),
        ("a/b/c", "more than one"),
        ("nvidia.com/gp u", "letters, digits"),
    ],
)
def test_invalid_resource_names(name, why):
    problem = resource_name_problem(name)
    assert problem is not None and why in problem


def test_cli_config_error_exits_2_before_touching_sockets(tmp_path, cli_env, hetero_dp_cmd):
    kdir = tmp_path / "dp"
    kdir.mkdir()
    p = write(tmp_path, "healthInterval: [1]\n")
    proc = subprocess.run(
        [*hetero_dp_cmd, "run", "simulated", "--config", str(p), "--kubelet-dir", str(kdir)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert str(p) in proc.stderr and "healthInterval" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(kdir.iterdir()) == []


def test_cli_invalid_backend_resource_name_exits_2(tmp_path, cli_env, hetero_dp_cmd):
    kdir = tmp_path / "dp"
    proc = subprocess.run(
        [
            *hetero_dp_cmd,
            "run",
            "simulated",
            "-o",
            "simulated.resource=Bad/Name",
            "--kubelet-dir",
            str(kdir),
            "--create-kubelet-dir",  # a missing dir is refused first otherwise
        ],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Bad/Name" in proc.stderr and "DNS subdomain" in proc.stderr
    assert not kdir.exists() or not any(kdir.iterdir())


def test_cli_unknown_backend_exits_2(cli_env, hetero_dp_cmd):
    proc = subprocess.run(
        [*hetero_dp_cmd, "run", "no-such-backend"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown backend 'no-such-backend'" in proc.stderr


def test_a_bundled_backend_that_is_not_installed_says_what_to_install(tmp_path, monkeypatch):
    """After `make demo` or a wheel install without a vendor package, naming its backend
    says which package holds it: from the naming convention (checked against vendors/
    below), and definitely where a source checkout has it in vendors/."""
    from hetero_dp.engine import loading

    with pytest.raises(ConfigError) as e:
        loading.resolve("tenstorrent")
    assert "unknown backend 'tenstorrent'" in str(e.value)
    assert "pip install hetero-dp-tenstorrent if it is one" in str(e.value)
    assert "pip install -e vendors/tenstorrent" in str(e.value)

    (tmp_path / "tenstorrent").mkdir()
    (tmp_path / "tenstorrent" / "pyproject.toml").write_text("[project]\n")
    monkeypatch.setattr(loading, "VENDORS_DIR", tmp_path)
    with pytest.raises(ConfigError) as e:
        loading.resolve("tenstorrent")
    assert "it is the package hetero-dp-tenstorrent: pip install hetero-dp-tenstorrent" in str(
        e.value
    )
    assert "from this source checkout pip install -e vendors/tenstorrent" in str(e.value)


def test_the_bundled_backends_keep_to_the_naming_convention():
    try:
        import tomllib
    except ImportError:  # Python 3.10: the dependency hetero-dp declares there
        import tomli as tomllib  # type: ignore[no-redef]

    from hetero_dp.engine.loading import BUNDLED_PREFIX, VENDORS_DIR

    root = Path(__file__).resolve().parents[2]
    assert root / "vendors" == VENDORS_DIR
    found = {}
    for pyproject in sorted(root.glob("vendors/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for name in project["entry-points"]["hetero_dp"]:
            found[name] = project["name"]
            assert pyproject.parent.name == name
    assert len(found) >= 3 and "simulated" in found
    assert found == {name: f"{BUNDLED_PREFIX}{name}" for name in found}


# -o values: the common plain ones are read without importing PyYAML, exactly as
# PyYAML reads them (hypothesis over words, numbers and paths, plus YAML's own words)
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hetero_dp.engine.config import NOT_PLAIN, plain_scalar  # noqa: E402

_YAML_TRICKS = [
    "010",
    "-0",
    "00",
    "1e3",
    "0x10",
    "~",
    "null",
    "NULL",
    "yes",
    "No",
    "ON",
    "off",
    "y",
    "n",
    "True",
    "FALSE",
    ".inf",
    "1.5",
    "2001-01-01",
    "a:b",
    "-5",
]


@given(
    st.one_of(
        st.sampled_from(_YAML_TRICKS),
        st.from_regex(r"\A[A-Za-z0-9_./:*+~-]{1,12}\Z"),
        st.integers().map(str),
    )
)
def test_plain_option_values_read_as_yaml_reads_them(value):
    import yaml

    parsed = plain_scalar(value)
    if parsed is NOT_PLAIN:
        return  # left to PyYAML itself
    expected = yaml.safe_load(value)
    assert parsed == expected and type(parsed) is type(expected), (value, parsed, expected)


def test_run_with_plain_options_does_not_import_yaml(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from hetero_dp.engine.config import set_option; o = {}; "
        "set_option(o, 'simulated.count=3'); set_option(o, 'x.glob=/dev/acme*'); "
        "set_option(o, 'x.flag=true'); print(o, 'yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False"), out.stdout
    assert "'count': 3" in out.stdout and "'flag': True" in out.stdout


# One error style for every key the core reads (#26 point 3): where the value came from
# (the file, ``env HETERO_DP_X``, ``flag --x``), the field as written (dotted), the
# reason, did-you-mean: the same reader as a backend's options (model/options.py).
@pytest.mark.parametrize(
    ("text", "env", "flags", "expected"),
    [
        (
            "resources:\n  a.com/x:\n    replicaPolicy: packd\n",
            {},
            {},
            "{file}, field 'resources.a.com/x.replicaPolicy': expected one of distributed, "
            "packed, spread, got 'packd'",
        ),
        (
            "resources:\n  a.com/x:\n    deliverr: [cdi-cri]\n",
            {},
            {},
            "{file}, field 'resources.a.com/x.deliverr': unknown key; did you mean 'deliver'? "
            "(known: cdiAnnotationPrefix, cdiKind, deliver, preferredAllocation, replicaPolicy)",
        ),
        (
            "resources:\n  a.com/x:\n    preferredAllocation: maybe\n",
            {},
            {},
            "{file}, field 'resources.a.com/x.preferredAllocation': expected true or false, "
            "got 'maybe'",
        ),
        (
            "resources:\n  a.com/x:\n    cdiKind: 5\n",
            {},
            {},
            "{file}, field 'resources.a.com/x.cdiKind': expected a string, got 5",
        ),
        (
            "cdi:\n  dri: /x\n",
            {},
            {},
            "{file}, field 'cdi.dri': unknown key; did you mean 'dir'? "
            "(known: dir, enabled, runtimeConfig)",
        ),
        (
            "healthInterval: 5\n",
            {"HETERO_DP_HEALTH_INTERVAL": "-5"},
            {},
            "env HETERO_DP_HEALTH_INTERVAL, field 'healthInterval': must be at least 0.01 "
            "(or 0: off), got -5",
        ),
        (
            "hookTimeout: 5\n",
            {},
            {"hookTimeout": "0"},
            "flag --hook-timeout, field 'hookTimeout': must be at least 0.01, got 0",
        ),
        (
            "metrics:\n  address: ':9000'\n",
            {},
            {"metrics": {"address": 9435}},
            "flag --metrics-address, field 'metrics.address': expected a string, got 9435",
        ),
        (
            "metrics: 9435\n",
            {},
            {"metrics": {"address": ":9000"}},
            "{file}, field 'metrics': expected a mapping, got 9435",
        ),
        (
            "kubeletDir: 5\n",
            {},
            {},
            "{file}, field 'kubeletDir': expected a string, got 5",
        ),
        (
            "streamTimeout: .inf\n",
            {},
            {},
            "{file}, field 'streamTimeout': expected a finite number, got inf",
        ),
        # the sharing block: the same reader, list entries named by index
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replica: 4\n",
            {},
            {},
            "{file}, field 'sharing.timeSlicing.resources[0].replica': unknown key; "
            "did you mean 'replicas'? (known: devices, name, rename, replicas)",
        ),
        (
            "sharing:\n  timeslicing: {}\n",
            {},
            {},
            "{file}, field 'sharing.timeslicing': unknown key; did you mean 'timeSlicing'? "
            "(known: mps, timeSlicing)",
        ),
        (
            "sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: '4'\n",
            {},
            {},
            "{file}, field 'sharing.mps.resources[0].replicas': expected an integer, got '4'",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2000}\n",
            {},
            {},
            "{file}, field 'sharing.timeSlicing.resources[0].replicas': must be at most 1024, "
            "got 2000",
        ),
        (
            "sharing:\n  mps:\n    renameByDefault: 'yes'\n",
            {},
            {},
            "{file}, field 'sharing.mps.renameByDefault': expected true or false, got 'yes'",
        ),
    ],
)
def test_every_core_key_is_refused_in_one_style(tmp_path, text, env, flags, expected):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(p, env=env, overrides=flags)
    assert str(err.value) == expected.format(file=p)


def test_zero_turns_an_interval_off_but_no_timeout():
    cfg = load_config(raw={"healthInterval": 0, "rediscoverInterval": "0"}, env={})
    assert cfg.health_interval == 0 and cfg.rediscover_interval == 0
    with pytest.raises(ConfigError, match=r"must be at least 0\.01, got 0$"):
        load_config(raw={"streamTimeout": 0}, env={})


def test_the_replica_policies_a_resource_takes_are_sharing_s():
    import typing

    from hetero_dp.allocation.sharing import REPLICA_POLICIES
    from hetero_dp.engine.config import ResourceSettings

    hint = typing.get_type_hints(ResourceSettings)["replica_policy"]
    literal = next(a for a in typing.get_args(hint) if a is not type(None))
    assert typing.get_args(literal) == REPLICA_POLICIES


def test_the_error_style_docs_show_what_the_code_says(tmp_path, monkeypatch):
    """docs/configuration.md's "One error style" lines are this code's messages."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    monkeypatch.chdir(tmp_path)
    Path("config.yaml").write_text("resources:\n  example.com/gpu:\n    replicaPolicy: packd\n")
    Path("typo.yaml").write_text("resources:\n  example.com/gpu:\n    deliverr: [cdi-cri]\n")
    refused = [
        lambda: load_config("config.yaml", env={}),
        lambda: load_config("typo.yaml", env={}),
        lambda: load_config(env={"HETERO_DP_HEALTH_INTERVAL": "soon"}),
        lambda: load_config(env={}, overrides={"healthInterval": 100000.0}),
    ]
    for attempt in refused:
        with pytest.raises(ConfigError) as err:
            attempt()
        assert f"hetero-dp: configuration error: {err.value}\n" in docs


def test_a_section_with_every_key_commented_out_means_its_defaults(tmp_path):
    """``metrics:`` with its keys commented out is null in YAML (not a mistake to
    refuse): each section then keeps its defaults, as an absent one does."""
    path = tmp_path / "config.yaml"
    path.write_text(
        "cdi:\n#  dir: /etc/cdi\nlabels:\nmetrics:\n#  address: 1.2.3.4:9435\nsharing:\n"
    )
    given = load_config(path, env={})
    absent = load_config(raw={}, env={})
    for section in ("cdi", "labels", "metrics"):
        assert getattr(given, section) == getattr(absent, section), section
    # the same sharing (it remembers which file it came from)
    assert dataclasses.replace(given.sharing, source="") == dataclasses.replace(
        absent.sharing, source=""
    )
    # a section that is no mapping at all is still refused, naming it
    path.write_text("metrics: 9435\n")
    with pytest.raises(ConfigError, match=r"field 'metrics': expected a mapping, got 9435"):
        load_config(path, env={})
