"""CDI spec validation: the structural problems a container runtime refuses a spec for."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hetero_dp.allocation.cdi import device_name_problem, kind_problem

# --- CDI specs -------------------------------------------------------------------------------

_SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
EDIT_KEYS = {
    "env",
    "deviceNodes",
    "hooks",
    "mounts",
    "intelRdt",
    "additionalGids",
    "netDevices",
}


def _edits_problems(edits: Any, where: str) -> list[str]:
    if not isinstance(edits, Mapping):
        return [f"{where}: containerEdits must be a mapping"]
    out = []
    unknown = sorted(set(edits) - EDIT_KEYS)
    if unknown:
        out.append(f"{where}: unknown containerEdits key {unknown[0]!r}")
    for i, env in enumerate(edits.get("env") or []):
        if not isinstance(env, str) or "=" not in env:
            out.append(f"{where}.env[{i}]: {env!r} is not KEY=VALUE")
    for i, node in enumerate(edits.get("deviceNodes") or []):
        if not isinstance(node, Mapping) or not str(node.get("path", "")).startswith("/"):
            out.append(f"{where}.deviceNodes[{i}]: needs an absolute path")
    for i, m in enumerate(edits.get("mounts") or []):
        if not isinstance(m, Mapping) or not m.get("hostPath") or not m.get("containerPath"):
            out.append(f"{where}.mounts[{i}]: needs hostPath and containerPath")
    return out


def spec_problems(doc: Any) -> list[str]:
    """Structural problems of one CDI spec (the fields runtimes refuse a spec for)."""
    if not isinstance(doc, Mapping):
        return ["the spec is not a mapping"]
    out = []
    version = doc.get("cdiVersion")
    if not isinstance(version, str) or not _SEMVER.match(version):
        out.append(f"cdiVersion {version!r} is not a version like '0.6.0'")
    problem = kind_problem(doc.get("kind"))  # the same rules our spec writer follows
    if problem:
        out.append(problem)
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        out.append("devices must be a non-empty list")
        devices = []
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        if not isinstance(dev, Mapping):
            out.append(f"devices[{i}] is not a mapping")
            continue
        name = dev.get("name")
        problem = device_name_problem(name)
        if problem:
            out.append(f"devices[{i}]: {problem}")
        elif name in seen:
            out.append(f"devices[{i}]: device {name!r} defined twice")
        else:
            seen.add(str(name))
        edits = dev.get("containerEdits")
        if not edits:
            out.append(f"devices[{i}] ({name}): containerEdits must not be empty")
        else:
            out.extend(_edits_problems(edits, f"devices[{i}]"))
    if doc.get("containerEdits"):
        out.extend(_edits_problems(doc["containerEdits"], "containerEdits"))
    return out


def host_paths(doc: Mapping[str, Any]) -> list[str]:
    """Every host path a (valid) spec hands to a container: device nodes (``hostPath``,
    else ``path``, as the CDI specification defines it) and mount sources."""
    edits = [d.get("containerEdits") or {} for d in doc.get("devices") or []]
    edits.append(doc.get("containerEdits") or {})
    paths = []
    for e in edits:
        for node in e.get("deviceNodes") or []:
            paths.append(str(node.get("hostPath") or node.get("path")))
        for mount in e.get("mounts") or []:
            paths.append(str(mount.get("hostPath")))
    return list(dict.fromkeys(p for p in paths if p.startswith("/")))
