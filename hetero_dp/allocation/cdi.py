"""CDI (Container Device Interface) specs generated from device records.

One spec file per CDI kind (``vendor.com/class``), one CDI device per device
record, written atomically into the CDI spec dir (``/var/run/cdi`` by default),
where containerd and CRI-O look them up when a container asks for
``vendor.com/class=<device id>``. The rules (names, ``cdiVersion``, what goes
where) are in ``docs/cdi.md``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hetero_dp.model.device import Device, DeviceNode, Mount
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import DNS_LABEL_PATTERN

log = logging.getLogger(__name__)

DEFAULT_CDI_DIR = "/var/run/cdi"
SPEC_FILE_PREFIX = "hetero-dp_"
SPEC_MODE = 0o644
SUPERSEDED_SUFFIX = ".hetero-dp-superseded"
# Env a device gets when it has no edits of its own: CDI rejects a spec holding
# a device with empty container edits.
FILLER_ENV = "HETERO_DP_CDI_DEVICE"

# Vendor: a lowercase DNS subdomain (the CDI spec) that starts with a letter (the
# reference parser). Class: the spec's 63-character name segment, starting with a
# letter (the reference parser). Both at least 2 characters: the Go parser slices
# name[1:len-1] and fails on 1-character names.
_VENDOR = re.compile(rf"^[a-z](?:[-a-z0-9]*[a-z0-9])?(?:\.{DNS_LABEL_PATTERN})*$")
_CLASS = re.compile(r"^[A-Za-z][-A-Za-z0-9_.]*[A-Za-z0-9]$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.:]*[A-Za-z0-9])?$")


class CDINameError(ConfigError):
    """Device IDs that are not valid CDI device names (``ids`` lists them)."""

    def __init__(self, reason: str, ids: Sequence[str], *, field: str = "") -> None:
        self.ids = list(ids)
        super().__init__(reason, field=field)


def kind_problem(kind: object) -> str | None:
    """Why ``kind`` is not a valid CDI kind ``vendor/class``, or None."""
    if not isinstance(kind, str) or not kind:
        return f"a CDI kind must be a non-empty string like 'vendor.com/class', got {kind!r}"
    vendor, slash, cls = kind.partition("/")
    if not slash or not vendor or not cls:
        return f"CDI kind {kind!r} must look like 'vendor.com/class'"
    if "/" in cls:
        return f"CDI kind {kind!r} has more than one '/'"
    if len(vendor) > 253 or len(vendor) < 2 or not _VENDOR.match(vendor):
        return (
            f"vendor {vendor!r} of CDI kind {kind!r} must be a lowercase DNS name of 2 to 253 "
            "characters (letters, digits, '-' and '.'), starting with a letter"
        )
    if len(cls) > 63 or len(cls) < 2 or not _CLASS.match(cls):
        return (
            f"class {cls!r} of CDI kind {kind!r} must be 2 to 63 characters of letters, digits, "
            "'-', '_' or '.', starting with a letter and ending with a letter or digit"
        )
    return None


def validate_kind(kind: object, field: str = "cdiKind") -> str:
    """Return ``kind`` if it is a valid CDI kind, else raise ConfigError naming ``field``."""
    problem = kind_problem(kind)
    if problem:
        raise ConfigError(problem, field=field)
    assert isinstance(kind, str)
    return kind


def device_name_problem(device_id: object) -> str | None:
    """Why a device ID cannot be a CDI device name, or None.

    CDI device names are letters, digits, ``-``, ``_``, ``.`` and ``:``, starting
    and ending with a letter or digit. IDs are never rewritten to fit: a renamed
    device would not match the ID the kubelet allocated.
    """
    if not isinstance(device_id, str) or not _DEVICE_NAME.match(device_id):
        return (
            f"device ID {device_id!r} is not a valid CDI device name (letters, digits, "
            "'-', '_', '.' and ':', starting and ending with a letter or digit)"
        )
    return None


def check_device_names(ids: Iterable[str], kind: str = "") -> None:
    """Raise :class:`CDINameError` naming every ID that is not a valid CDI device name."""
    bad = [i for i in ids if device_name_problem(i)]
    if bad:
        what = f" of CDI kind {kind!r}" if kind else ""
        raise CDINameError(
            f"device IDs {', '.join(map(repr, bad))}{what} are not valid CDI device names "
            "(letters, digits, '-', '_', '.' and ':', starting and ending with a letter or "
            "digit); deliver these devices with 'device-specs' instead",
            bad,
        )


def qualified_name(kind: str, device_id: str) -> str:
    """The fully qualified CDI name ``vendor.com/class=<device id>``.

    Raises ConfigError for a bad kind and :class:`CDINameError` for an ID that
    is not a valid CDI device name.
    """
    validate_kind(kind)
    check_device_names([device_id], kind)
    return f"{kind}={device_id}"


# --- spec generation ------------------------------------------------------------------------


def _all_edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    edits = [d.get("containerEdits") or {} for d in spec.get("devices", ())]
    return [*edits, spec.get("containerEdits") or {}]


def required_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` whose fields ``spec`` uses (the CDI spec's version table).

    0.7.0: ``intelRdt`` or ``additionalGids``. 0.6.0: ``annotations`` on the spec or
    a device, or a ``.`` in the kind's class. 0.5.0: a device node ``hostPath``, or
    a device name that does not start with a letter. 0.4.0: a mount ``type``.
    Otherwise 0.3.0.
    """
    edits = _all_edits(spec)
    devices = list(spec.get("devices", ()))
    if any(e.get("intelRdt") is not None or e.get("additionalGids") for e in edits):
        return "0.7.0"
    cls = str(spec.get("kind", "")).partition("/")[2]
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in cls:
        return "0.6.0"
    if any("hostPath" in n for e in edits for n in e.get("deviceNodes", ())) or any(
        not str(d.get("name", "a"))[:1].isalpha() for d in devices
    ):
        return "0.5.0"
    if any("type" in m for e in edits for m in e.get("mounts", ())):
        return "0.4.0"
    return "0.3.0"


def _node(node: DeviceNode) -> dict[str, Any]:
    out: dict[str, Any] = {"path": node.container_path}
    if node.host_path != node.container_path:
        out["hostPath"] = node.host_path
    out["permissions"] = node.permissions
    return out


def _mount(mount: Mount) -> dict[str, Any]:
    # The options a CRI runtime gives a device plugin's plain Mount; no "type",
    # which would need cdiVersion 0.4.0 (an empty type with "rbind" is a bind mount).
    return {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "options": ["rbind", "rprivate", "ro" if mount.read_only else "rw"],
    }


def _check_paths(device: Device) -> None:
    for what, paths in (
        ("device node", [p for n in device.nodes for p in (n.host_path, n.container_path)]),
        ("mount", [p for m in device.mounts for p in (m.host_path, m.container_path)]),
    ):
        bad = [p for p in paths if not p.startswith("/")]
        if bad:
            raise ConfigError(
                f"device {device.id!r}: {what} paths must be absolute for CDI, got {bad}",
                field="devices",
            )
    bad_env = [k for k in device.env if not k or "=" in k or "\0" in k]
    if bad_env:
        raise ConfigError(
            f"device {device.id!r}: env names must be non-empty and contain no '=', got {bad_env}",
            field="devices",
        )


def spec_device_problems(kind: str, device: Device) -> list[str]:
    """Why ``device`` cannot be one device of a CDI spec of ``kind`` (its ID is no CDI
    device name, a path is relative, an env name is bad), each naming the field; empty
    when it can. One such device is left out of the spec (and made Unhealthy by the
    daemon) instead of blocking the spec of every device of the kind."""
    out = []
    problem = device_name_problem(device.id)
    if problem:
        out.append(f"id: {problem} (CDI kind {kind!r})")
    try:
        _check_paths(device)
    except ConfigError as e:
        out.append(f"{e.reason}")
    return out


def list_env_keys(devices: Sequence[Device]) -> set[str]:
    """Env keys that devices set to different values (``ACME_VISIBLE_DEVICES=0`` / ``=1``).

    Such a key is a per-allocation list that must be joined (``0,1``). CDI cannot
    join: its env edits replace, so the last device would win. These keys stay
    out of the spec; the Allocate response carries them (see delivery.py).
    """
    seen: dict[str, str] = {}
    lists: set[str] = set()
    for d in devices:
        for k, v in d.env.items():
            if seen.setdefault(k, v) != v:
                lists.add(k)
    return lists


def _add_shared(
    shared: dict[str, tuple[str, dict[str, Any]]], key: str, entry: dict[str, Any], owner: str
) -> None:
    first = shared.get(key)
    if first is None:
        shared[key] = (owner, entry)
    elif first[1] != entry:
        raise ConfigError(
            f"devices {first[0]!r} and {owner!r} describe the shared path {key!r} "
            f"differently ({first[1]} vs {entry}); shared nodes and mounts must agree",
            field="devices",
        )


def build_spec(kind: str, devices: Sequence[Device]) -> dict[str, Any]:
    """The CDI spec (a JSON-ready dict) for ``devices`` under ``kind``.

    Per device: its non-shared nodes (with permissions), non-shared mounts and
    env (except list keys, see :func:`list_env_keys`). Spec-wide
    ``containerEdits``: the shared nodes and mounts, once each. ``cdiVersion``
    is :func:`required_version`. Raises ConfigError for a bad kind, duplicate
    IDs, relative paths or disagreeing shared paths, and :class:`CDINameError`
    for IDs that are not CDI device names.
    """
    validate_kind(kind)
    if not devices:
        raise ConfigError(f"CDI kind {kind!r}: a spec needs at least one device", field="devices")
    check_device_names([d.id for d in devices], kind)
    dupes = sorted(i for i, n in Counter(d.id for d in devices).items() if n > 1)
    if dupes:
        raise ConfigError(f"CDI kind {kind!r}: duplicate device IDs {dupes}", field="devices")
    list_keys = list_env_keys(devices)
    shared_nodes: dict[str, tuple[str, dict[str, Any]]] = {}
    shared_mounts: dict[str, tuple[str, dict[str, Any]]] = {}
    cdi_devices = []
    for d in devices:
        _check_paths(d)
        edits: dict[str, Any] = {}
        env = [f"{k}={v}" for k, v in d.env.items() if k not in list_keys]
        nodes: list[dict[str, Any]] = []
        for n in d.nodes:
            if n.shared:
                _add_shared(shared_nodes, n.container_path, _node(n), d.id)
            elif all(x["path"] != n.container_path for x in nodes):
                nodes.append(_node(n))
        mounts: list[dict[str, Any]] = []
        for m in d.mounts:
            if m.shared:
                _add_shared(shared_mounts, m.container_path, _mount(m), d.id)
            elif all(x["containerPath"] != m.container_path for x in mounts):
                mounts.append(_mount(m))
        if not (env or nodes or mounts):
            env = [f"{FILLER_ENV}={kind}={d.id}"]
        if env:
            edits["env"] = env
        if nodes:
            edits["deviceNodes"] = nodes
        if mounts:
            edits["mounts"] = mounts
        cdi_devices.append({"name": d.id, "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": cdi_devices}
    common: dict[str, Any] = {}
    if shared_nodes:
        common["deviceNodes"] = [e for _, e in shared_nodes.values()]
    if shared_mounts:
        common["mounts"] = [e for _, e in shared_mounts.values()]
    if common:
        spec["containerEdits"] = common
    spec["cdiVersion"] = required_version(spec)
    return spec


def _merge_entries(
    base: list[dict[str, Any]], extra: Sequence[Mapping[str, Any]], key: str
) -> list[dict[str, Any]]:
    """``base`` with ``extra`` entries added; an extra entry replaces a base one with
    the same ``key`` (a device node's ``path``, a mount's ``containerPath``)."""
    by_key = {e.get(key): i for i, e in enumerate(base)}
    out = list(base)
    for e in extra:
        i = by_key.get(e.get(key))
        if i is None:
            by_key[e.get(key)] = len(out)
            out.append(dict(e))
        else:
            out[i] = dict(e)
    return out


def merge_edits(edits: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """CDI ``containerEdits`` ``edits`` with ``extra`` merged in (a new dict).

    Device nodes and mounts of ``extra`` replace those at the same container path;
    env entries replace the same variable; hooks are appended. Used for the
    spec-wide edits a backend contributes through the ``cdi_spec_edits`` hook.
    """
    out = {k: list(v) if isinstance(v, list) else v for k, v in edits.items()}
    for name, value in extra.items():
        if name == "deviceNodes":
            out[name] = _merge_entries(out.get(name, []), value, "path")
        elif name == "mounts":
            out[name] = _merge_entries(out.get(name, []), value, "containerPath")
        elif name == "env":
            added = {str(e).partition("=")[0] for e in value}
            kept = [e for e in out.get(name, []) if str(e).partition("=")[0] not in added]
            out[name] = kept + [str(e) for e in value]
        elif name == "hooks":
            out[name] = [*out.get(name, []), *(dict(h) for h in value)]
        else:
            raise ConfigError(
                f"unsupported container edit {name!r} (supported: deviceNodes, env, hooks, mounts)",
                field="cdi_spec_edits",
            )
    return out


def with_edits(spec: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with spec-wide ``extra`` edits merged in and ``cdiVersion`` recomputed."""
    out = dict(spec)
    common = merge_edits(dict(spec.get("containerEdits") or {}), extra)
    if common:
        out["containerEdits"] = common
    out["cdiVersion"] = required_version(out)
    return out


def render_spec(spec: Mapping[str, Any]) -> str:
    """The spec as the JSON text written to disk (stable, so unchanged specs compare equal)."""
    import json  # here: a start that publishes no CDI spec never needs it (issue 35)

    return json.dumps(spec, indent=2) + "\n"


def spec_file_name(kind: str) -> str:
    """``hetero-dp_<vendor>_<class>.json``: one name per kind.

    A vendor never holds ``_`` (DNS name), so the first ``_`` after the prefix
    splits vendor from class and two kinds never share a file.
    """
    validate_kind(kind)
    vendor, _, cls = kind.partition("/")
    return f"{SPEC_FILE_PREFIX}{vendor}_{cls}.json"
