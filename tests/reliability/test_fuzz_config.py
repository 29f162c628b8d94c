"""Fuzzing the config parser: any document, any file, any environment gives a
Config or a clean ConfigError naming where the problem is, never a crash."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_dp.engine.config import SCALARS, SECTION_KEYS, SECTIONS, Config, env_name, load_config
from hetero_dp.model.errors import ConfigError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
    st.sampled_from(["classic", "watcher", "v1", "true", "0", "-1", "1e400", "nan", "/tmp/x"]),
)
KNOWN_KEYS = [*SCALARS, *SECTIONS, "version", "timeSlicing", "resources", "replicas", "rename"]
KNOWN_KEYS += [k for spec in SECTION_KEYS.values() for k in spec]
KNOWN_KEYS += ["deliver", "cdiKind", "replicaPolicy", "preferredAllocation", "example.com/gpu"]
keys = st.one_of(st.sampled_from(KNOWN_KEYS), text)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=15,
)
documents = st.dictionaries(keys, values, max_size=8)


def _check(make):
    try:
        cfg = make()
    except ConfigError as e:
        assert str(e), "a ConfigError says what is wrong"
        return None
    assert isinstance(cfg, Config)
    for key in ("health_interval", "rediscover_interval", "hook_timeout", "stream_timeout"):
        value = getattr(cfg, key)
        assert value >= 0 and not math.isnan(value), (key, value)
    assert cfg.registration in ("classic", "watcher")
    return cfg


@FUZZ
@given(doc=documents)
def test_fuzz_documents(doc):
    _check(lambda: load_config(raw=doc, env={}))


@FUZZ
@given(env=st.dictionaries(st.sampled_from([env_name(k) for k in SCALARS]), text, max_size=4))
def test_fuzz_environment(env):
    cfg = _check(lambda: load_config(raw={}, env=env))
    if cfg is not None:
        for key in SCALARS:  # the environment wins over defaults when it parses
            if env_name(key) in env and SCALARS[key][0] is str:
                attr = "".join("_" + c.lower() if c.isupper() else c for c in key)
                assert str(getattr(cfg, attr)) == str(Path(env[env_name(key)])) or key[-3:] != "Dir"


@FUZZ
@given(content=st.one_of(st.binary(max_size=300), text.map(str.encode)))
def test_fuzz_files(content):
    with tempfile.NamedTemporaryFile(suffix=".yaml") as f:
        f.write(content)
        f.flush()
        try:
            load_config(f.name, env={})
        except ConfigError as e:
            assert f.name in str(e), "the error names the file"


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"\xff\xfe\x00garbage", "UTF-8"),
        (b"kubeletDir: " + b"[" * 800 + b"]" * 800 + b"\n", "deep"),
        (b"flags: &a {x: *a}\nbackends: {nvidia: *a}\n", "refers to itself"),
        (b"backends:\n  sim: &a [*a]\n", "refers to itself"),
        (b"- just\n- a list\n", "mapping"),
        (b"key: [unclosed\n", "line"),
    ],
    ids=["not-utf8", "deep", "recursive-alias", "recursive-list", "list", "syntax"],
)
def test_hostile_files(tmp_path, content, named):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert str(path) in str(err.value)
    assert named in str(err.value)
