"""Check a CDI spec the way a container runtime would: schema, strictness, semantics.

For any test that generates CDI specs (simulated, udev and NVIDIA backends)::

    from tests.cdi.schema_check import assert_valid_cdi_spec

    spec = hetero_dp.allocation.cdi.build_spec("acme.com/fpga", devices)   # or a file path
    assert_valid_cdi_spec(spec)

Needs ``jsonschema`` (with ``referencing``) and the repository root on
``sys.path`` (run pytest with ``PYTHONPATH=$PWD``). The schema is the vendored
copy in ``tests/cdi/schema/`` (see its SOURCE.md).

Three layers, each of which a runtime enforces:

1. the official JSON schema (``schema.json`` + ``defs.json``);
2. the same schema made strict (``additionalProperties: false`` where it lists
   ``properties``), because CDI loaders reject unknown fields;
3. rules the schema cannot express: a valid kind and device names, unique
   names, at least one device, non-empty device edits, ``NAME=value`` env,
   ``rwm`` permissions, absolute paths, and a ``cdiVersion`` no lower than the
   fields used need (written here from the CDI version table, independently of
   ``hetero_dp.allocation.cdi``).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"

_VERSIONS = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"]
_KIND = re.compile(
    r"^[a-z](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z][-A-Za-z0-9_.]{0,61}[A-Za-z0-9]$"
)
_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.:]*[A-Za-z0-9])?$")


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.lru_cache(maxsize=2)
def cdi_validator(strict: bool = True) -> Any:
    """A ``jsonschema`` Draft 7 validator for CDI specs (strict: no unknown fields)."""
    from jsonschema import Draft7Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    resources = []
    for name in ("schema.json", "defs.json"):
        doc = json.loads((SCHEMA_DIR / name).read_text())
        if strict:
            doc = _strict(copy.deepcopy(doc))
        uri = (SCHEMA_DIR / name).as_uri()
        resources.append((uri, Resource.from_contents(doc, default_specification=DRAFT7)))
    registry: Registry[Any] = Registry().with_resources(resources)
    return Draft7Validator({"$ref": (SCHEMA_DIR / "schema.json").as_uri()}, registry=registry)


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The CDI version table applied to ``spec`` (independent of hetero_dp.allocation.cdi)."""
    devices = list(spec.get("devices") or [])
    edits = [d.get("containerEdits") or {} for d in devices] + [spec.get("containerEdits") or {}]
    need = "0.3.0"

    def bump(v: str) -> None:
        nonlocal need
        if _version_key(v) > _version_key(need):
            need = v

    for e in edits:
        if any(m.get("type") for m in e.get("mounts") or []):
            bump("0.4.0")
        if any(n.get("hostPath") for n in e.get("deviceNodes") or []):
            bump("0.5.0")
        if e.get("intelRdt") is not None or e.get("additionalGids"):
            bump("0.7.0")
    for d in devices:
        name = str(d.get("name", ""))
        if name and not ("a" <= name[0].lower() <= "z"):
            bump("0.5.0")
        if d.get("annotations"):
            bump("0.6.0")
    if spec.get("annotations"):
        bump("0.6.0")
    if "." in str(spec.get("kind", "")).partition("/")[2]:
        bump("0.6.0")
    return need


def _edit_problems(where: str, e: Mapping[str, Any]) -> list[str]:
    problems = []
    for v in e.get("env") or []:
        if not isinstance(v, str) or v.find("=") <= 0:
            problems.append(f"{where}: env entry {v!r} is not NAME=value")
    for n in e.get("deviceNodes") or []:
        for key in ("path", "hostPath"):
            if key in n and not str(n[key]).startswith("/"):
                problems.append(f"{where}: device node {key} {n[key]!r} is not absolute")
        if set(str(n.get("permissions", ""))) - set("rwm"):
            problems.append(f"{where}: permissions {n.get('permissions')!r} not made of r, w, m")
    for m in e.get("mounts") or []:
        for key in ("hostPath", "containerPath"):
            if not str(m.get(key, "")).startswith("/"):
                problems.append(f"{where}: mount {key} {m.get(key)!r} is not absolute")
    return problems


def cdi_spec_problems(spec: Mapping[str, Any]) -> list[str]:
    """Everything a CDI loader would reject in ``spec``; empty if it is valid."""
    problems = [
        f"schema: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for v in (cdi_validator(False), cdi_validator(True))
        for e in v.iter_errors(spec)
    ]
    if problems:
        return sorted(set(problems))
    kind = spec["kind"]
    if not _KIND.match(kind):
        problems.append(f"kind {kind!r} is not a valid CDI kind")
    version = spec["cdiVersion"]
    if version not in _VERSIONS:
        problems.append(f"cdiVersion {version!r} is not a released CDI version")
    elif _version_key(version) < _version_key(need := minimum_version(spec)):
        problems.append(f"cdiVersion {version} is lower than the {need} its fields need")
    names = [d["name"] for d in spec["devices"]]
    if not names:
        problems.append("a spec needs at least one device")
    for name in names:
        if not _NAME.match(name):
            problems.append(f"device name {name!r} is not a valid CDI device name")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"duplicate device names {dupes}")
    for d in spec["devices"]:
        e = d["containerEdits"]
        if not any(e.get(k) for k in ("env", "deviceNodes", "mounts", "hooks")):
            problems.append(f"device {d['name']!r} has empty container edits")
        problems += _edit_problems(f"device {d['name']!r}", e)
    problems += _edit_problems("spec containerEdits", spec.get("containerEdits") or {})
    return problems


def assert_valid_cdi_spec(spec: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """Assert ``spec`` (a dict, or a path to a JSON spec file) is a valid CDI spec.

    Returns the spec as a dict, so a test can go on checking its content.
    """
    data = json.loads(Path(spec).read_text()) if isinstance(spec, (str, Path)) else dict(spec)
    problems = cdi_spec_problems(data)
    assert not problems, "invalid CDI spec:\n  " + "\n  ".join(problems)
    return data
