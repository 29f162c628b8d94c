"""A complete device plugin: every /dev/acme* node is one acme.example.com/npu."""

import glob
import os
from dataclasses import dataclass

from hetero_dp import Device, DeviceNode, hookimpl, option

RESOURCE = "acme.example.com/npu"


@dataclass(frozen=True)
class Options:
    device_glob: str = option("/dev/acme*", help="the cards' nodes", env="ACME_DEV_GLOB")


settings = Options()


@hookimpl
def configure(options: Options):
    global settings
    settings = options


@hookimpl
def discover():
    for i, path in enumerate(sorted(glob.glob(settings.device_glob))):
        yield Device(
            id=f"npu{i}",
            resource=RESOURCE,
            nodes=[DeviceNode(path, f"/dev/acme{i}")],
            env={"ACME_VISIBLE_DEVICES": str(i)},
        )


@hookimpl
def check_health(device):
    return os.path.exists(device.nodes[0].host_path) or "device node vanished"
