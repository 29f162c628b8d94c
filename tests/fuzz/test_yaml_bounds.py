"""Untrusted YAML is read with bounds (issue #36 point 1): an alias bomb, a merge-key
bomb, deep nesting, a FIFO or a huge file in the config's place are refused at once,
naming the file; a key given twice is refused naming its path and both lines; the
numbers YAML 1.1 reads unlike their digits (``12:30:00``, ``0x10``, ``010``) are warned
about naming the field; a refused value is shown in a message without walking it."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hetero_dp.engine.config import load_config
from hetero_dp.kits.yamlread import load_yaml
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.options import parse_options
from hetero_dp.model.shown import shown


def alias_bomb(levels: int = 9, key: str = "healthInterval") -> str:
    """The issue's document: nine levels of nine aliases (9**9 values as a value of
    ``key``), under 500 bytes."""
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for n in "bcdefghijk"[: levels - 1]:
        text += f"{n}: &{n} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = n
    return f"{key}:\n  " + text.replace("\n", "\n  ").rstrip() + f"\n  z: *{prev}\n"


def merge_bomb(levels: int = 40) -> str:
    """Merge keys that double at every level: 2**40 pairs once flattened."""
    text = "a0: &a0 {k: 1}\n"
    for i in range(1, levels):
        text += f"a{i}: &a{i}\n  <<: [*a{i - 1}, *a{i - 1}]\n"
    return "backends:\n  simulated:\n    " + text.replace("\n", "\n    ").rstrip() + "\n"


def refused(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert str(path) in str(err.value)
    return err.value


def test_the_alias_bomb_is_refused_while_it_is_composed(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(alias_bomb())
    assert len(path.read_bytes()) < 600
    e = refused(path)
    assert "stands for more than" in e.reason and "alias" in e.reason, e


def test_a_merge_key_bomb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(merge_bomb())
    assert "stands for more than" in refused(path).reason


@pytest.mark.parametrize(
    "text",
    ["healthInterval: " + "[" * 200_000, "healthInterval:\n" + "- " * 100_000 + "1"],
    ids=["flow", "block"],
)
def test_deep_nesting_is_refused_before_it_is_scanned_whole(tmp_path: Path, text: str) -> None:
    # PyYAML's scanner looks ahead over every open '[' (quadratic: 2,000 took 2 s)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert "nested deeper than" in refused(path).reason


def test_an_alias_inside_what_it_names_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("backends:\n  sim: &a [1, *a]\n")
    e = refused(path)
    assert "refers to itself" in e.reason and "line 2" in e.reason


def test_a_key_given_twice_is_refused_naming_its_path_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("backends:\n  simulated:\n    count: 2\n    numa: 1\n    count: 3000\n")
    e = refused(path)
    assert e.field == "backends.simulated.count"
    assert "given twice (lines 3 and 5)" in e.reason, e


def test_a_merge_key_may_repeat_what_it_merges() -> None:
    doc, surprises = load_yaml("x: &b {a: 1, c: 3}\ny:\n  <<: *b\n  a: 2\n")
    assert doc == {"x": {"a": 1, "c": 3}, "y": {"a": 2, "c": 3}} and surprises == []


def test_yaml_1_1_numbers_are_warned_about_naming_the_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("healthInterval: 12:30:00\nhookTimeout: 0x10\nstreamTimeout: 010\n")
    with caplog.at_level(logging.WARNING, logger="hetero_dp.engine.configfile"):
        cfg = load_config(path, env={})
    assert (cfg.health_interval, cfg.hook_timeout, cfg.stream_timeout) == (45000, 16, 8)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, warned
    assert f"{path}: healthInterval: '12:30:00' (line 1) is read as 45000" in warned[0]
    assert "hookTimeout: '0x10' (line 2) is read as 16" in warned[1]
    assert "streamTimeout: '010' (line 3) is read as 8" in warned[2]
    path.write_text("healthInterval: '12:30:00'\nhookTimeout: 16\n")  # quoted: text, no word
    caplog.clear()
    with pytest.raises(ConfigError, match="expected a number"):
        load_config(path, env={})
    assert not caplog.records


def test_a_fifo_in_the_configs_place_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    result: list[BaseException] = []
    reader = threading.Thread(target=lambda: result.append(refused(path)), daemon=True)
    reader.start()
    reader.join(20)  # a blocking open() waits for a writer for ever
    if reader.is_alive():
        with open(path, "wb"):  # let the stuck reader go
            pass
        pytest.fail("reading a FIFO config blocked")
    assert "a FIFO, not a regular file" in str(result[0])


def test_a_config_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    with open(path, "wb") as f:
        f.truncate(64 * 1024 * 1024 * 1024)  # sparse: 64 GiB that nobody reads
    assert "more than the 262144 read" in refused(path).reason


class Counted:
    """A leaf whose repr counts its calls: how much of a value a message looked at."""

    calls = 0

    def __repr__(self) -> str:
        Counted.calls += 1
        return "c"


def test_a_refused_value_is_shown_without_walking_all_of_it() -> None:
    from hetero_dp.engine.config import CoreSettings

    value: object = [Counted()] * 9
    for _ in range(5):  # 9**6 = 531,441 leaves, a few hundred objects
        value = [value] * 9
    Counted.calls = 0
    with pytest.raises(ConfigError) as err:
        parse_options(CoreSettings, {"healthInterval": value}, field="", environ={})
    assert Counted.calls < 100, Counted.calls  # repr() then a cut: 531,441
    assert len(err.value.reason) < 120, err.value.reason
    assert shown(10**5000) == "<an integer of 16610 bits>"  # str() of it raises
    assert shown("x" * 10_000_000) == "'" + "x" * 56 + "..."


def test_list_on_the_bomb_exits_2_at_once_in_bounded_memory(
    tmp_path: Path, cli_env: dict[str, str], hetero_dp_cmd: list[str]
) -> None:
    """``hetero-dp list --config`` on the bomb took 60 s and 1.9 GB (issue #36)."""
    path = tmp_path / "config.yaml"
    path.write_text(alias_bomb())
    # a fresh interpreter whose only child is the CLI: its children's peak RSS is the CLI's
    wrapper = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(r.returncode)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, *hetero_dp_cmd, "list", "simulated", "--config", str(path)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=30,
    )
    *message, peak = proc.stderr.rstrip("\n").split("\n")
    assert proc.returncode == 2, proc.stderr
    assert message[0].startswith(f"hetero-dp: configuration error: {path}"), proc.stderr
    assert "stands for more than" in proc.stderr
    assert int(peak) < 400 * 1024, f"peak RSS {int(peak) // 1024} MiB"


TOKENS = [
    "a", "b", ": ", "- ", "\n", "\n  ", "\n    ", "[", "]", "{", "}", ", ", "&x ", "&y ",
    "*x", "*y", "<<: ", "? ", "'q'", '"\\u0000"', "12:30", "0x1F", "010", "1_0", ".inf", "~",
    "!!str ", "!!python/object:os.system ", "---\n", "...\n", "#c\n", "|\n  t\n", "9" * 5000,
    "\t", "%YAML 1.1\n",
]  # fmt: skip


def test_random_yaml_loads_or_is_refused_never_anything_else() -> None:
    """400 seeded documents of YAML's own tokens (anchors, aliases, merges, tags,
    directives, huge numbers): a document or a YamlRefused, nothing else escapes."""
    from hetero_dp.kits.yamlread import YamlRefused

    rng = random.Random(3636)
    escaped = []
    for _ in range(400):
        text = "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 60)))
        try:
            load_yaml(text)
        except YamlRefused:
            pass
        except Exception as e:
            escaped.append(f"{type(e).__name__}: {e} for {text!r}")
    assert not escaped, "\n".join(escaped[:5])


def test_a_huge_name_is_cut_in_its_refusal() -> None:
    """A refused resource name is shown up to the longest valid name (253 + 1 + 63
    characters), not whole: a 1 MB key was a 1 MB message."""
    with pytest.raises(ConfigError) as err:
        load_config(raw={"resources": {"example.com/" + "x" * 1_000_000: {}}}, env={})
    assert "longer than 63 characters" in err.value.reason
    assert len(str(err.value)) < 1000, len(str(err.value))
    with pytest.raises(ConfigError, match="has no vendor prefix"):
        load_config(raw={"resources": {"gpu": {}}}, env={})


def test_a_number_too_long_to_build_cheaply_is_refused() -> None:
    """YAML 1.1 reads '1:1:1:...' as one base-60 integer, built by repeated
    multiplication: 40,000 groups took 3 s (85,000 fit in a config file)."""
    from hetero_dp.kits.yamlread import YamlRefused

    with pytest.raises(YamlRefused, match="a number written with over 100 characters"):
        load_yaml("a: " + "1:" * 85_000 + "1\n")
    assert load_yaml("a: " + "9" * 100 + "\n")[0] == {"a": int("9" * 100)}
