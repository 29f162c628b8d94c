"""hetero-dp: Kubernetes device plugins in Python.

A plugin author imports from here only::

    from hetero_dp import hookimpl, Device, DeviceNode
"""

from __future__ import annotations

import pluggy

from hetero_dp.model.device import (
    HEALTHY,
    REPLICA_SEPARATOR,
    UNHEALTHY,
    Check,
    Device,
    DeviceNode,
    Link,
    Lost,
    Mount,
    Sample,
    is_replica,
    replica_base,
)
from hetero_dp.model.errors import AllocationError, ConfigError
from hetero_dp.model.events import EventSink
from hetero_dp.model.options import option
from hetero_dp.model.response import ContainerResponse
from hetero_dp.model.settings import device_settings
from hetero_dp.model.sysfs import PciFacts, pci_address_of, pci_facts

hookimpl = pluggy.HookimplMarker("hetero_dp")

__version__ = "0.1.0"

__all__ = [
    "HEALTHY",
    "REPLICA_SEPARATOR",
    "UNHEALTHY",
    "AllocationError",
    "Check",
    "ConfigError",
    "ContainerResponse",
    "Device",
    "DeviceNode",
    "EventSink",
    "Link",
    "Lost",
    "Mount",
    "PciFacts",
    "Sample",
    "device_settings",
    "hookimpl",
    "is_replica",
    "option",
    "pci_address_of",
    "pci_facts",
    "replica_base",
]
