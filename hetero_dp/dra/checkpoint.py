"""The prepared-claims checkpoint: what an unprepare needs, in a file that outlives us.

The kubelet may send NodeUnprepareResources to a different process than the
one that prepared the claim (the driver restarted in between). Each prepared
claim's devices and CDI spec path are written here, atomically, before the
kubelet hears of them; a corrupt file is an error naming the path, never
silently emptied.

During a rolling update two instances of the driver share the file: each
prepare or unprepare batch holds :func:`lock_file` on ``serialize.lock`` beside
it (the name the kubelet's own helper uses) and reads the file afresh.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetero_dp.kits.atomic import write_atomic
from hetero_dp.kits.foreign import ForeignFileError, load_foreign
from hetero_dp.usage.view import ClaimHolder

CHECKPOINT_VERSION = 1
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024  # 10,000 prepared claims take ~10 MiB


@dataclass
class PreparedDevice:
    request_names: list[str]
    pool_name: str
    device_name: str
    device_id: str
    cdi_device_ids: list[str]


@dataclass
class PreparedClaim:
    namespace: str
    name: str
    spec_path: str
    devices: list[PreparedDevice] = field(default_factory=list)
    # the pods in the claim's status.reservedFor when it was prepared (for the
    # hetero_dp_claim_allocation_info series); absent in entries older than it
    reserved_for: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedClaim:
        return cls(
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            spec_path=str(data.get("spec_path", "")),
            devices=[PreparedDevice(**d) for d in data.get("devices", [])],
            reserved_for=[str(p) for p in data.get("reserved_for") or []],
        )


def lock_file(path: Path) -> int:
    """Take an exclusive ``flock`` on ``path`` (blocking); close the fd to release it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


class CheckpointError(Exception):
    pass


class Checkpoint:
    """``{claim UID: PreparedClaim}`` persisted as JSON at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.claims: dict[str, PreparedClaim] = {}

    def load(self) -> None:
        try:  # in the kubelet's dir: whatever sits there is read with bounds
            data = load_foreign(self.path, max_bytes=MAX_CHECKPOINT_BYTES, kind="json")
        except ForeignFileError as e:
            if e.missing:
                self.claims = {}
                return
            raise CheckpointError(f"DRA checkpoint {self.path} is unreadable: {e}") from e
        if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(
                f"DRA checkpoint {self.path}: expected version {CHECKPOINT_VERSION}, "
                f"got {data.get('version') if isinstance(data, dict) else type(data).__name__!r}"
            )
        try:
            self.claims = {
                uid: PreparedClaim.from_json(c) for uid, c in (data.get("claims") or {}).items()
            }
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"DRA checkpoint {self.path}: malformed entry ({e})") from e

    def save(self) -> None:
        doc = {
            "version": CHECKPOINT_VERSION,
            "claims": {uid: asdict(c) for uid, c in sorted(self.claims.items())},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(doc, indent=2) + "\n", 0o600)


def holders(
    driver: str, checkpoint: Checkpoint, reserved: Mapping[str, list[str]] | None = None
) -> list[ClaimHolder]:
    """Each device of the claims in ``checkpoint``, once per pod in the claim's
    reservedFor (``hetero_dp_claim_allocation_info``; ``pod`` empty when none):
    ``reserved``'s pods where it has the claim's UID (re-read, :mod:`.reservations`),
    else those read when it was prepared."""
    reserved = reserved or {}
    return [
        ClaimHolder(driver, dev.pool_name, dev.device_name, c.namespace, c.name, pod)
        for uid, c in list(checkpoint.claims.items())
        for dev in c.devices
        for pod in (reserved.get(uid, c.reserved_for) or [""])
    ]
