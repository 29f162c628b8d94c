"""The schema checker itself: the vendored schema loads, refs resolve, bad specs fail."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from tests.cdi.schema_check import SCHEMA_DIR, cdi_spec_problems, minimum_version

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "cdi-schema"
GOOD = sorted((SCHEMA_DIR / "testdata" / "good").glob("*.json"))
BAD = sorted((SCHEMA_DIR / "testdata" / "bad").glob("*.json"))


def _load(path: Path) -> object:
    text = path.read_text()
    return json.loads(text) if text.strip() else None


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_upstream_good_examples_pass(path: Path) -> None:
    assert cdi_spec_problems(_load(path)) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_upstream_bad_examples_fail(path: Path) -> None:
    assert cdi_spec_problems(_load(path))  # type: ignore[arg-type]


def _minimal() -> dict:
    return json.loads((SCHEMA_DIR / "testdata" / "good" / "minimal.json").read_text())


def test_relative_ref_to_defs_json_is_followed() -> None:
    # "annotations" is only defined in defs.json (mapStringString): a non-string
    # value can only be caught if schema.json's relative $ref was resolved.
    spec = _minimal() | {"cdiVersion": "0.6.0", "annotations": {"a": 1}}
    problems = cdi_spec_problems(spec)
    assert any("annotations/a" in p and "is not of type 'string'" in p for p in problems)
    # and deeper: DeviceNode (a ref inside defs.json to defs.json) needs a path
    spec = _minimal()
    spec["devices"][0]["containerEdits"]["deviceNodes"] = [{"permissions": "rw"}]
    assert any("'path' is a required property" in p for p in cdi_spec_problems(spec))


def test_unknown_fields_are_rejected_like_a_loader_does() -> None:
    spec = _minimal()
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["readonly"] = True
    assert any("readonly" in p for p in cdi_spec_problems(spec))


@pytest.mark.parametrize(
    ("edit", "needs"),
    [
        (lambda s: s, "0.3.0"),
        (lambda s: s["devices"][0].update(name="0card"), "0.5.0"),
        (
            lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(hostPath="/x"),
            "0.5.0",
        ),
        (lambda s: s.update(kind="vendor.com/dev.ice"), "0.6.0"),
        (
            lambda s: s["devices"][0]["containerEdits"].update(
                mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]
            ),
            "0.4.0",
        ),
    ],
)
def test_version_rule_catches_too_low_versions(edit, needs: str) -> None:
    spec = _minimal()
    edit(spec)
    assert minimum_version(spec) == needs
    if needs != "0.3.0":
        assert any("lower than" in p for p in cdi_spec_problems(spec))
    spec["cdiVersion"] = needs
    assert cdi_spec_problems(spec) == []


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(kind="Vendor.com/device"),
        lambda s: s.update(kind="vendor.com/device/x"),
        lambda s: s["devices"][0].update(name="my device"),
        lambda s: s["devices"].append(dict(s["devices"][0])),
        lambda s: s["devices"][0].update(containerEdits={}),
        lambda s: s["devices"][0]["containerEdits"].update(env=["=x"]),
        lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(permissions="rx"),
        lambda s: s.update(devices=[]),
        lambda s: s.update(cdiVersion="0.3"),
    ],
)
def test_semantic_rules_reject(edit) -> None:
    spec = _minimal()
    edit(spec)
    assert cdi_spec_problems(spec)


def test_vendored_schema_matches_shared_copy() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (CI places shared/ beside the clone)")
    for name in ("schema.json", "defs.json"):
        assert filecmp.cmp(SCHEMA_DIR / name, SHARED / name, shallow=False), name
    for sub in ("good", "bad"):
        ours = sorted(p.name for p in (SCHEMA_DIR / "testdata" / sub).iterdir())
        theirs = sorted(p.name for p in (SHARED / "testdata" / sub).iterdir())
        assert ours == theirs
