"""How an Allocate response delivers devices: device specs, CDI annotations, CDI names.

PLACEHOLDER on main until the cdi branch lands (it owns this file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .device import Device
from .response import ContainerResponse

DEFAULT_STRATEGIES = ("device-specs",)


def apply_delivery(
    default: ContainerResponse, devices: Sequence[Device], settings: Mapping[str, Any]
) -> ContainerResponse:
    """Turn the default response into what the resource's strategies ask for.

    ``settings`` is the resource's config section (``deliver``, ``cdiKind``,
    ``cdiAnnotationPrefix`` ...).
    """
    return default
