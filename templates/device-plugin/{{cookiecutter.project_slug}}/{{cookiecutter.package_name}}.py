"""{{ cookiecutter.project_name }}: each node matching a glob is one {{ cookiecutter.resource }}."""

import glob
import os

from hetero_dp import Device, DeviceNode, hookimpl

RESOURCE = "{{ cookiecutter.vendor_domain }}/{{ cookiecutter.resource }}"
DEFAULT_GLOB = "{{ cookiecutter.device_glob }}"
device_glob, host_root = DEFAULT_GLOB, ""


@hookimpl
def configure(options):
    global device_glob, host_root  # options deviceGlob and hostRoot (see README.md)
    device_glob = options.get("deviceGlob", DEFAULT_GLOB)
    host_root = options.get("hostRoot", "").rstrip("/")  # where the host's / is seen


@hookimpl
def discover():
    for path in sorted(glob.glob(host_root + device_glob)):
        name = os.path.basename(path)  # the device ID, stable while the node exists
        node = DeviceNode(path[len(host_root) :])  # the kubelet wants the host's path
        env = {"{{ cookiecutter.env_var }}": name}
        yield Device(id=name, resource=RESOURCE, nodes=[node], env=env)


@hookimpl
def check_health(device):
    return os.path.exists(host_root + device.nodes[0].host_path) or "device node vanished"
