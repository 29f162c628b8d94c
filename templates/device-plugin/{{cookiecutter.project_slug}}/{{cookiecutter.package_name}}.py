"""{{ cookiecutter.project_name }}: each node matching a glob is one {{ cookiecutter.resource }}."""

import glob
import os
from dataclasses import dataclass

from hetero_dp import Device, DeviceNode, hookimpl, option

RESOURCE = "{{ cookiecutter.vendor_domain }}/{{ cookiecutter.resource }}"
DEFAULT_GLOB = "{{ cookiecutter.device_glob }}"


@dataclass(frozen=True)
class Options:
    """backends.{{ cookiecutter.package_name }}.KEY in the config file, or
    -o {{ cookiecutter.package_name }}.KEY=VALUE; hetero-dp list --options lists them."""

    device_glob: str = option(DEFAULT_GLOB, help="device nodes that are devices")
    host_root: str = option("", help="where the host's / is seen (/host in the DaemonSet)")


class Plugin:
    """The backend: hetero-dp calls the methods marked @hookimpl by their names."""

    hetero_dp_name = "{{ cookiecutter.package_name }}"

    def __init__(self):
        self.settings = Options()

    @hookimpl
    def configure(self, options: Options):
        self.settings = options

    @hookimpl
    def discover(self):
        host_root = self.settings.host_root.rstrip("/")
        for path in sorted(glob.glob(host_root + self.settings.device_glob)):
            name = os.path.basename(path)  # the device ID, stable while the node exists
            node = DeviceNode(path[len(host_root) :])  # the kubelet wants the host's path
            env = {"{{ cookiecutter.env_var }}": name}
            yield Device(id=name, resource=RESOURCE, nodes=[node], env=env)

    @hookimpl
    def check_health(self, device):
        path = self.settings.host_root.rstrip("/") + device.nodes[0].host_path
        return os.path.exists(path) or "device node vanished"


# The entry point in pyproject.toml names this instance: "{{ cookiecutter.package_name }}:plugin".
plugin = Plugin()
