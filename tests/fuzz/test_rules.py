"""Fuzzed udev rules files (issue #29): every file loads or fails with a ConfigError
naming the file, never another exception; no regex a rule can hold takes more than
linear time to match (each match of a long value is waited on with a bound, so a
backtracking engine fails the test instead of hanging it); what loads never names
an attribute outside the device's sysfs directory."""

from __future__ import annotations

import random
import threading

import pytest
import yaml

pytest.importorskip("hetero_dp_udev")
from hetero_dp_udev.rules import attribute_name_problem, parse_rules

from hetero_dp import ConfigError

COUNT = 400
REGEXES = [
    "0x03[0-9a-f]{4}",
    "(a+)+b",
    "(a|aa)*c",
    "(.*a){20}",
    "(?=x)y",
    "(a)\\1",
    "[",
    "a{1000}{1000}",
    "(x+x+)+y",
    ".*",
]
ATTRS = ["vendor", "device/vendor", "../../etc/passwd", "/etc/shadow", "rom.*/VBNV", "./x", "a//b"]
TEMPLATES = [
    "/dev/accel{index}",
    "/dev/../etc/shadow{index}",
    "/dev//x{index}",
    "x-{attribute:vendor}",
    "{attribute:../../../../etc/passwd}",
    "{nope}",
    "{index!r}",
    "/dev/dri/renderD{sysnum}",
]


def _entry(rng: random.Random) -> dict:
    def pick(options: list):
        # the first choice is clean; the others are hostile a quarter of the time
        return options[0] if rng.random() < 0.6 else rng.choice(options)

    entry: dict = {"name": pick(["example.com/x", "bad name", "example.com/y-{attribute:vendor}"])}
    match: dict = {"subsystem": pick(["accel", "drm", 5])}
    if rng.random() < 0.7:
        match["attributes"] = {pick(ATTRS): {"regex": pick(REGEXES)}}
    if rng.random() < 0.5:
        match["properties"] = {"ID_MODEL": {"regex": pick(REGEXES)}}
    entry["match"] = match
    if rng.random() < 0.5:
        entry["nodeTemplates"] = [pick(TEMPLATES)]
    if rng.random() < 0.5:
        entry["env"] = {pick(["ACME", "LD_PRELOAD"]): pick(TEMPLATES)}
    if rng.random() < 0.3:
        entry["health"] = {"attribute": pick(ATTRS), "regex": pick(REGEXES)}
    if rng.random() < 0.3:
        entry["id"] = pick(["pci", "attribute:serial", "attribute:../x", "A-{index}"])
    if rng.random() < 0.2:
        entry["mounts"] = [{"hostPath": pick(["/opt/x", "/opt/../etc", "rel"])}]
    return entry


def _bounded(fn, timeout: float = 5.0):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert out, "a match did not finish within its bound"
    return out[0]


def test_fuzzed_rules_load_or_name_the_file_and_never_hang():
    rng = random.Random(4242)
    loaded = 0
    for _ in range(COUNT):
        text = yaml.safe_dump({"resources": [_entry(rng) for _ in range(rng.randint(1, 2))]})
        try:
            rules = parse_rules(text, source="fuzz.yaml")
        except ConfigError as e:
            assert "fuzz.yaml" in str(e)
            continue
        loaded += 1
        for rule in rules:
            for name in rule.template_attributes:
                assert attribute_name_problem(name) is None, name
            patterns = [*rule.match.attributes.items(), *rule.match.properties.items()]
            for attr, pattern in patterns:
                assert attribute_name_problem(attr) is None or attr == "ID_MODEL"
                _bounded(lambda p=pattern: p.matches("a" * 20000 + "x" * 3 + "c"))
            if rule.health is not None:
                _bounded(lambda p=rule.health.pattern: p.matches("a" * 20000))
    assert loaded > 20  # the fuzz reaches past loading
