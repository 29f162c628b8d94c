"""A complete device plugin: every /dev/acme* node is one acme.example.com/npu."""

import glob
import os

from hetero_dp import Device, DeviceNode, hookimpl

RESOURCE = "acme.example.com/npu"
DEV_GLOB = os.environ.get("ACME_DEV_GLOB", "/dev/acme*")


@hookimpl
def discover():
    for i, path in enumerate(sorted(glob.glob(DEV_GLOB))):
        yield Device(
            id=f"npu{i}",
            resource=RESOURCE,
            nodes=[DeviceNode(path, f"/dev/acme{i}")],
            env={"ACME_VISIBLE_DEVICES": str(i)},
        )


@hookimpl
def check_health(device):
    return os.path.exists(device.nodes[0].host_path) or "device node vanished"
