"""hetero-dp: Kubernetes device plugins in Python.

A plugin author imports from here only::

    from hetero_dp import hookimpl, Device, DeviceNode
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from hetero_dp.kits.atomic import write_atomic
from hetero_dp.kits.foreign import read_foreign
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
from hetero_dp.model.names import resource_name_problem
from hetero_dp.model.options import option, parse_options, unknown_key
from hetero_dp.model.response import ContainerResponse
from hetero_dp.model.settings import device_settings
from hetero_dp.model.sysfs import PciFacts, pci_address_of, pci_facts
from hetero_dp.model.usage import ProcessUsage

hookimpl = pluggy.HookimplMarker("hetero_dp")

# The sharing helpers pull in the kubelet's protobuf module: loaded on first use, so
# ``import hetero_dp`` stays cheap for a backend that never shares.
_LAZY = {
    name: "hetero_dp.allocation.sharing" for name in ("SharingConfig", "advertise", "parse_sharing")
}
_LAZY["load_yaml"] = "hetero_dp.kits.yamlread"  # PyYAML only for a backend that reads YAML


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hetero_dp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from hetero_dp.allocation.sharing import SharingConfig, advertise, parse_sharing
    from hetero_dp.kits.yamlread import load_yaml

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
    "ProcessUsage",
    "Sample",
    "SharingConfig",
    "advertise",
    "device_settings",
    "hookimpl",
    "is_replica",
    "load_yaml",
    "option",
    "parse_options",
    "parse_sharing",
    "pci_address_of",
    "pci_facts",
    "read_foreign",
    "replica_base",
    "resource_name_problem",
    "unknown_key",
    "write_atomic",
]
