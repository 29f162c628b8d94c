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

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: The largest checkpoint read: 110 pods (the kubelet's default limit) with a few
#: containers each, their Allocate answers included, take well under a MiB.
MAX_CHECKPOINT = 8 * 1024 * 1024


class CheckpointError(Exception):
    """The checkpoint cannot be used; the message says why."""


@dataclass(frozen=True)
class Entry:
    """One container's devices of one resource."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def read_bounded(path: str, limit: int) -> tuple[bytes, os.stat_result]:
    """A regular file's bytes, at most ``limit``; never blocks on a FIFO or device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except OSError as e:
        raise CheckpointError(f"{path} cannot be opened: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise CheckpointError(f"{path} is {st.st_size} bytes, over the {limit} read")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise CheckpointError(f"{path} grew past the {limit} bytes read")
        return b"".join(chunks), st
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read: {e.strerror}") from None
    finally:
        os.close(fd)


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


def parse(data: bytes, path: str = "checkpoint") -> tuple[list[Entry], int]:
    """The entries of a checkpoint's bytes and how many entries were skipped."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path} is not JSON (cut short?): {str(e)[:80]}") from None
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
    """:func:`parse` of the file at ``path`` (:class:`CheckpointError` if unusable)."""
    data, _st = read_bounded(path, MAX_CHECKPOINT)
    return parse(data, path)
