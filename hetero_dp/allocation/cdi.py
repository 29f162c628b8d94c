"""CDI (Container Device Interface) specs generated from device records.

One spec file per CDI kind (``vendor.com/class``), one CDI device per device
record, written atomically into the CDI spec dir (``/var/run/cdi`` by default),
where containerd and CRI-O look them up when a container asks for
``vendor.com/class=<device id>``. The rules (names, ``cdiVersion``, what goes
where) are in ``docs/cdi.md``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hetero_dp.kits.atomic import create_unique, write_atomic
from hetero_dp.model.device import Device, DeviceNode, Mount
from hetero_dp.model.errors import ConfigError

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
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_VENDOR = re.compile(rf"^[a-z](?:[-a-z0-9]*[a-z0-9])?(?:\.{_DNS_LABEL})*$")
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


def _load_spec_file(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    import yaml  # only when a YAML spec sits in the dir

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from e


def render_spec(spec: Mapping[str, Any]) -> str:
    """The spec as the JSON text written to disk (stable, so unchanged specs compare equal)."""
    return json.dumps(spec, indent=2) + "\n"


def spec_file_name(kind: str) -> str:
    """``hetero-dp_<vendor>_<class>.json``: one name per kind.

    A vendor never holds ``_`` (DNS name), so the first ``_`` after the prefix
    splits vendor from class and two kinds never share a file.
    """
    validate_kind(kind)
    vendor, _, cls = kind.partition("/")
    return f"{SPEC_FILE_PREFIX}{vendor}_{cls}.json"


class CDIWriter:
    """Writes and removes this daemon's spec files in a CDI spec dir.

    Only files named ``hetero-dp_*.json`` (and the temp files of their atomic
    writes) are ever touched. Specs are deliberately left in place at shutdown:
    the runtime resolves CDI names at every container (re)start, so a spec must
    outlive a plugin restart while containers that use it run.
    """

    def __init__(self, directory: str | os.PathLike[str] = DEFAULT_CDI_DIR) -> None:
        self.dir = Path(directory)

    def path_for(self, kind: str) -> Path:
        """Where the spec of ``kind`` lives."""
        return self.dir / spec_file_name(kind)

    def check(self, field: str = "cdi.dir") -> None:
        """Start-up check: the dir exists (created if missing) and takes new files.

        Also removes temp files that a killed write left behind. Raises
        ConfigError naming the path otherwise.
        """
        if self.dir.exists() and not self.dir.is_dir():
            raise ConfigError(f"CDI spec dir {str(self.dir)!r} is not a directory", field=field)
        try:
            self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"CDI spec dir {str(self.dir)!r} is missing and cannot be created: "
                f"{e.strerror or e}",
                field=field,
            ) from e
        try:
            # A real file, not os.access(): root passes access() on read-only mounts.
            fd, probe = create_unique(self.dir, f".{SPEC_FILE_PREFIX}probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise ConfigError(
                f"CDI spec dir {str(self.dir)!r} is not writable: {e.strerror or e}", field=field
            ) from e
        # Hidden ".hetero-dp_*" files are ours and transient: temp files of atomic
        # writes (".<spec name>.<random>.tmp") and probes that a killed process left.
        for p in self.dir.glob(f".{SPEC_FILE_PREFIX}*"):
            if p.is_file():
                p.unlink(missing_ok=True)

    def write(self, kind: str, devices: Sequence[Device]) -> Path | None:
        """Write the spec of ``kind`` for ``devices`` atomically; skip if unchanged.

        With no devices the spec is removed (CDI rejects a spec without devices).
        Returns the spec's path, or None when there is none.
        """
        if not devices:
            self.remove(kind)
            return None
        return self.write_spec(kind, build_spec(kind, devices))

    def write_spec(self, kind: str, spec: Mapping[str, Any]) -> Path:
        """Write an already built spec of ``kind`` atomically; skip if unchanged."""
        path = self.path_for(kind)
        text = render_spec(spec)
        try:
            same = path.read_text(encoding="utf-8") == text
        except (FileNotFoundError, UnicodeDecodeError):
            same = False
        if not same:
            write_atomic(path, text, SPEC_MODE)
        self.set_aside_conflicts(kind, spec)  # a replaced plugin's spec may be back
        return path

    def set_aside_conflicts(self, kind: str, spec: Mapping[str, Any]) -> list[Path]:
        """Rename other specs in the dir that define devices of ``spec`` again.

        Two specs of one dir that define the same ``kind=name`` make the CDI cache
        drop that device as conflicting, so every container asking for it fails: the
        usual case is the spec a replaced plugin left behind (NVIDIA's plugin writes
        ``k8s.device-plugin.nvidia.com-gpu.json``). Such a file is renamed to
        ``<name>.hetero-dp-superseded`` (runtimes load only ``*.json``/``*.yaml``, and
        nothing is lost), with a warning naming it. Returns the new paths.
        """
        ours = {str(d.get("name")) for d in spec.get("devices", ())}
        moved = []
        for other in sorted(self.dir.iterdir()):
            if other.name.startswith((SPEC_FILE_PREFIX, ".")) or other.suffix not in (
                ".json",
                ".yaml",
            ):
                continue
            try:
                data = _load_spec_file(other)
            except (OSError, ValueError):
                continue  # not readable as a spec: the runtime skips it as well
            if not isinstance(data, Mapping) or data.get("kind") != kind:
                continue
            names = {str(d.get("name")) for d in data.get("devices") or () if isinstance(d, dict)}
            clash = sorted(ours & names)
            if not clash:
                continue
            target = other.with_name(other.name + SUPERSEDED_SUFFIX)
            try:
                other.rename(target)
            except OSError as e:
                log.error(
                    "CDI spec %s defines %d devices of %s again (e.g. %s), so the runtime "
                    "refuses them, and it cannot be renamed: %s; remove it",
                    other,
                    len(clash),
                    kind,
                    clash[0],
                    e.strerror or e,
                )
                continue
            log.warning(
                "CDI spec %s defined %d devices of %s again (e.g. %s), which makes the runtime "
                "refuse them; renamed to %s",
                other,
                len(clash),
                kind,
                clash[0],
                target.name,
            )
            moved.append(target)
        return moved

    def remove(self, kind: str) -> bool:
        """Delete the spec of ``kind``; True if there was one."""
        try:
            self.path_for(kind).unlink()
        except FileNotFoundError:
            return False
        return True

    def read(self, kind: str) -> dict[str, Any] | None:
        """The spec of ``kind`` as written, or None."""
        try:
            data: dict[str, Any] = json.loads(self.path_for(kind).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return data
