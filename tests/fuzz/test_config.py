"""Fuzzed config files through what ``hetero-dp run nvidia simulated --config FILE``
does before it serves (issue #29): parse the file, then read every backend's options
from it. Each of 400 seeded documents either loads or fails with a ConfigError that
names the file and a field as the user wrote it (its first part a key of the file),
never another exception. Seeded (random.Random), so a failure reproduces."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetero_dp.engine.config import load_config
from hetero_dp.engine.loading import load_backends
from hetero_dp.model.errors import ConfigError

COUNT = 400
TOP = ["flags", "sharing", "resources", "backends", "version", "metrics", "cdi", "labels"]
FLAGS = {
    "migStrategy": ["none", "single", "mixed", "bogus", 3],
    "failOnInitError": [True, False, "yes", "maybe"],
    "plugin": {
        "deviceListStrategy": ["envvar", "volume-mounts", "cdi-cri", ["envvar", "x"], 5, "nope"],
        "passDeviceSpecs": [True, "nope"],
        "deviceIDStrategy": ["uuid", "index", "serial"],
    },
    "nvidiaDriverRoot": ["/", "/run/nvidia/driver", 7, ""],
}
SHARING = {
    "timeSlicing": {"resources": [[{"name": "nvidia.com/gpu", "replicas": 4}], "x", [{}]]},
    "mps": {"resources": [[{"name": "nvidia.com/gpu", "replicas": 2}], [{"replicas": -1}]]},
}
MPS = {"labels": [True, "x", {}], "checkInterval": [1, -1, "s"], "controlDaemon": ["managed", 1]}
RESOURCES = {"gpus": [[{"pattern": "*", "name": "gpu"}], [{"pattern": 1}], "x"], "mig": [[], 3]}
SECTIONS = {
    "metrics": {"address": ["127.0.0.1:0", ":x", 80]},
    "cdi": {"enabled": [False, "x"], "dir": ["/tmp/cdi", "rel", 5]},
    "labels": {"enabled": [False, 2], "dir": ["/tmp/l", 1]},
}
SCALARS: list[Any] = [None, True, 0, -1, 2**40, 1.5, float("nan"), "", "x", "/tmp", [], {}]


def _pick(rng: random.Random, spec: Any) -> Any:
    if isinstance(spec, dict):
        return {k: _pick(rng, v) for k, v in spec.items() if rng.random() < 0.6} or rng.choice(
            SCALARS
        )
    if isinstance(spec, list) and spec and rng.random() < 0.85:
        return rng.choice(spec)
    return rng.choice(SCALARS)


def _document(rng: random.Random) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key in rng.sample(TOP, rng.randint(1, 4)):
        if key == "flags":
            doc[key] = _pick(rng, FLAGS)
        elif key == "sharing":
            doc[key] = _pick(rng, SHARING)
        elif key == "resources":
            doc[key] = _pick(rng, RESOURCES)
        elif key == "backends":
            doc[key] = {rng.choice(["nvidia", "simulated"]): _pick(rng, {"mps": MPS, **FLAGS})}
        elif key == "version":
            doc[key] = rng.choice(["v1", "v1", "v1", 1, "v2"])
        else:
            doc[key] = _pick(rng, SECTIONS[key])
    return doc


@pytest.fixture
def backends():
    pytest.importorskip("hetero_dp_nvidia")
    loaded = load_backends(["nvidia", "simulated"])
    yield loaded
    for b in loaded:
        b.close()


async def test_fuzzed_configs_load_or_name_the_file_and_the_field(
    tmp_path: Path, backends, fake_node
):
    fake_node("v100-2x-pcie.scn")  # the fake NVML: the nvidia backend's configure runs
    rng = random.Random(2029)
    path = tmp_path / "config.yaml"
    bad: list[str] = []
    for _ in range(COUNT):
        doc = _document(rng)
        path.write_text(yaml.safe_dump(doc))
        try:
            cfg = load_config(path, env={})
            for b in backends:
                await b.configure_from(cfg)
        except ConfigError as e:
            head = e.field.split(".")[0].split("[")[0] if e.field else ""
            if str(path) not in str(e) or (head and head not in doc):
                bad.append(f"{e} (field {e.field!r}) for {doc!r}")
    assert not bad, f"{len(bad)} of {COUNT}:\n" + "\n".join(bad[:5])


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"flags": {"plugin": {"deviceListStrategy": ["envvar", "x"]}}}, "flags.plugin"),
        ({"flags": {"plugin": {"deviceListStrategy": 5}}}, "flags.plugin.deviceListStrategy"),
        ({"backends": {"nvidia": {"mps": {"labels": "x"}}}}, "backends.nvidia.mps"),
        ({"sharing": {"mps": {"resources": [{"replicas": -1}]}}}, "sharing.mps.resources[0]"),
    ],
)
async def test_hostile_nvidia_options_name_the_file_and_the_field_as_written(
    tmp_path: Path, backends, fake_node, doc, field
):
    fake_node("v100-2x-pcie.scn")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        cfg = load_config(path, env={})
        for b in backends:
            await b.configure_from(cfg)
    assert str(path) in str(err.value)
    assert err.value.field.startswith(field), err.value.field


CLI_COUNT = 8


def test_fuzzed_configs_through_the_cli_exit_0_or_2_naming_the_file(
    tmp_path: Path, cli_env, hetero_dp_cmd
):
    """The same documents through ``hetero-dp list simulated --config FILE``, as a
    user runs it: exit 0, or exit 2 with one message naming the file; never a
    traceback or another code; within a bound. A few only (one process each)."""
    import subprocess

    rng = random.Random(2929)
    codes = set()
    for i in range(CLI_COUNT):
        path = tmp_path / f"config{i}.yaml"
        path.write_text(yaml.safe_dump(_document(rng)))
        proc = subprocess.run(
            [*hetero_dp_cmd, "list", "simulated", "--config", str(path)],
            capture_output=True,
            text=True,
            env=cli_env,
            timeout=60,
        )
        codes.add(proc.returncode)
        assert proc.returncode in (0, 2), proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        if proc.returncode == 2:
            assert proc.stderr.startswith(f"hetero-dp: configuration error: {path}, field "), (
                proc.stderr
            )
    assert 2 in codes  # the documents are hostile enough to be refused
