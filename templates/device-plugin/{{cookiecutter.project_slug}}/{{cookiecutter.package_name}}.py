"""{{ cookiecutter.project_name }}: each node matching a glob is one {{ cookiecutter.resource }}."""

import glob
import os

from hetero_dp import Device, DeviceNode, hookimpl

RESOURCE = "{{ cookiecutter.vendor_domain }}/{{ cookiecutter.resource }}"
DEFAULT_GLOB = "{{ cookiecutter.device_glob }}"
device_glob = DEFAULT_GLOB


@hookimpl
def configure(options):
    global device_glob  # option deviceGlob: config file, or -o {{ cookiecutter.package_name }}.deviceGlob=...
    device_glob = options.get("deviceGlob", DEFAULT_GLOB)


@hookimpl
def discover():
    for path in sorted(glob.glob(device_glob)):
        name = os.path.basename(path)  # the device ID, stable while the node exists
        env = {"{{ cookiecutter.env_var }}": name}
        yield Device(id=name, resource=RESOURCE, nodes=[DeviceNode(path)], env=env)


@hookimpl
def check_health(device):
    return os.path.exists(device.nodes[0].host_path) or "device node vanished"
