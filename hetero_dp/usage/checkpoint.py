"""The kubelet's device checkpoint: which pod UID and container hold which device IDs.

``kubelet_internal_checkpoint`` in the device-plugin dir is the kubelet's own file
(``pkg/kubelet/cm/devicemanager/checkpoint``), JSON as kubelet 1.36 writes it::

    {"Data": {"PodDeviceEntries": [{"PodUID": "...", "ContainerName": "c",
      "ResourceName": "example.com/acme", "DeviceIDs": {"-1": ["acme1"]},
      "AllocResp": "<base64>"}], "RegisteredDevices": {...}}, "Checksum": n}

``DeviceIDs`` is keyed by NUMA node (``-1`` without topology); kubelets before 1.20
wrote a plain list, read too. It is internal, so it is read defensively: a file
that is missing, not a regular file, bigger than :data:`MAX_CHECKPOINT`, cut short or
of another shape raises :class:`CheckpointError` with the reason, and an entry of
another shape is skipped. The checksum is not verified (the kubelet's is a hash of
its Go structure's printout); a torn read shows as a JSON error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hetero_dp.kits.foreign import ForeignFileError, load_foreign

#: The largest checkpoint read: 110 pods (the kubelet's default limit) with a few
#: containers each, their Allocate answers included, take well under a MiB.
MAX_CHECKPOINT = 8 * 1024 * 1024
MAX_DEPTH = 8  # Data.PodDeviceEntries[].DeviceIDs.<numa>[] nests 6 deep


class CheckpointError(Exception):
    """The checkpoint cannot be used; the message says why."""


@dataclass(frozen=True)
class Entry:
    """One container's devices of one resource."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def _ids(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list):
        lists: Iterable[Any] = [value]
    elif isinstance(value, dict):
        lists = value.values()
    else:
        return None
    out: list[str] = []
    for ids in lists:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return None
        out.extend(ids)
    return tuple(out)


def parse(doc: Any, path: str = "checkpoint") -> tuple[list[Entry], int]:
    """The entries of a checkpoint's document and how many entries were skipped."""
    body = doc.get("Data") if isinstance(doc, dict) else None
    entries = body.get("PodDeviceEntries") if isinstance(body, dict) else None
    if entries is None and isinstance(body, dict):
        entries = []  # a kubelet that has no pod with devices writes null
    if not isinstance(entries, list):
        raise CheckpointError(f"{path} is not of the shape Data.PodDeviceEntries[] expected")
    out: list[Entry] = []
    skipped = 0
    for item in entries:
        ids = _ids(item.get("DeviceIDs")) if isinstance(item, dict) else None
        fields = [item.get(k) for k in ("PodUID", "ContainerName", "ResourceName")] if ids else []
        if ids is None or not all(isinstance(f, str) and f for f in fields):
            skipped += 1
            continue
        out.append(Entry(fields[0], fields[1], fields[2], ids))
    return out, skipped


def read(path: str) -> tuple[list[Entry], int]:
    """:func:`parse` of the file at ``path`` (:class:`CheckpointError` if unusable),
    read with the bounds of :func:`hetero_dp.kits.foreign.load_foreign`."""
    try:
        doc = load_foreign(path, max_bytes=MAX_CHECKPOINT, max_depth=MAX_DEPTH, kind="json")
    except ForeignFileError as e:
        raise CheckpointError(f"{path}: {'missing' if e.missing else e}") from None
    return parse(doc, path)
