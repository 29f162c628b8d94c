"""Time-slicing replicas and renaming, for every backend.

PLACEHOLDER on main until the topology branch lands (it owns this file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .device import Device

REPLICA_SEPARATOR = "::"


@dataclass(frozen=True)
class SharingConfig:
    """Parsed ``sharing.timeSlicing`` block (NVIDIA's schema)."""

    raw: Mapping[str, Any] | None = None

    def check_request(self, resource: str, ids: Sequence[str]) -> None:
        """Raise AllocationError if the request breaks a rule (failRequestsGreaterThanOne)."""


def parse_sharing(raw: Mapping[str, Any] | None, source: str = "") -> SharingConfig:
    """Parse and validate the ``sharing`` block; ConfigError names the field."""
    return SharingConfig(raw)


def advertise(physical: Sequence[Device], config: SharingConfig) -> list[Device]:
    """The devices to advertise: replicas ``<id>::<n>`` where sharing applies."""
    return list(physical)


def physical_id(device_id: str) -> str:
    """The physical device behind an advertised ID (strips ``::<n>``)."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def to_physical(ids: Sequence[str]) -> list[str]:
    """Physical IDs behind advertised IDs, de-duplicated, first-seen order kept."""
    seen: dict[str, None] = {}
    for i in ids:
        seen.setdefault(physical_id(i), None)
    return list(seen)
