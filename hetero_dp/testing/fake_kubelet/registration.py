"""How plugins register with the fake kubelet: the ``Registration`` service and the
plugin watcher (docs/sources.md#device-plugin-api).

- ``Register`` on ``kubelet.sock`` checks the version, the resource name and the
  endpoint (a bare file name in the device-plugin dir) before the kubelet dials
  the plugin back;
- watcher mode: the kubelet finds sockets created in ``plugins_registry``, calls
  ``GetInfo``, dials the endpoint and answers ``NotifyRegistrationStatus``;
  deleting the socket deregisters.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.model.names import API_VERSION, resource_name_problem
from hetero_dp.testing.fake_kubelet.clients import CHANNEL_OPTIONS, DIAL_TIMEOUT, PluginClients
from hetero_dp.testing.fake_kubelet.devices import DeviceManager
from hetero_dp.testing.pluginwatch import dial_registration


def register_problem(req: pb.RegisterRequest) -> str | None:
    """Why the kubelet refuses a ``Register`` before dialling back, or None."""
    if req.version != API_VERSION:
        return f"unsupported API version {req.version!r}; want {API_VERSION}"
    problem = resource_name_problem(req.resource_name)
    if problem:
        return f"invalid resource name: {problem}"
    if "/" in req.endpoint or not req.endpoint:
        return f"endpoint {req.endpoint!r} must be a bare file name"
    return None


class RegistrationServicer(pb_grpc.RegistrationServicer):
    """``Registration`` on ``kubelet.sock``; ``register`` answers None or why not."""

    def __init__(self, register: Callable[[pb.RegisterRequest], Awaitable[str | None]]) -> None:
        self.register = register

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        problem = await self.register(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return pb.Empty()


class PluginWatcher:
    """The kubelet's plugin watcher on ``registry_dir`` (device plugins only)."""

    def __init__(self, registry_dir: Path, devices: DeviceManager, clients: PluginClients) -> None:
        self.registry_dir = registry_dir
        self.devices = devices
        self.clients = clients
        self._watcher: DirectoryWatcher | None = None

    def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._watcher = DirectoryWatcher(self.registry_dir, self.on_event)
        self._watcher.start()
        for entry in sorted(self.registry_dir.iterdir()):  # the plugin watcher's first walk
            self.on_event(entry.name, "created")

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def on_event(self, name: str, kind: str) -> None:
        """A socket ``name`` was created in (or deleted from) the registry dir."""
        path = self.registry_dir / name
        if kind == "created":
            self.clients.spawn(self._register(path))
        elif kind == "deleted":
            for res in list(self.devices.resources.values()):
                if res.mode == "watcher" and res.registry_socket == str(path):
                    self.devices.resources.pop(res.name, None)
                    res.current = False
                    self.clients.spawn(self.clients.drop(res))

    async def _register(self, path: Path) -> None:
        await dial_registration(
            path,
            functools.partial(self._judge, path),
            self._reject,
            timeout=DIAL_TIMEOUT,
            options=CHANNEL_OPTIONS,
        )

    async def _reject(self, why: str) -> None:
        self.devices.reject(why)

    async def _judge(self, path: Path, info: reg_pb.PluginInfo) -> str | None:
        """The device-plugin handler's verdict on a plugin's ``GetInfo``."""
        if info.type != "DevicePlugin":
            problem: str | None = f"plugin type {info.type!r} is not DevicePlugin"
        elif API_VERSION not in info.supported_versions:
            problem = f"no supported version in {list(info.supported_versions)}"
        else:
            problem = resource_name_problem(info.name)
        if problem:
            return self.devices.reject(problem)
        problem = await self.clients.connect(info.name, info.endpoint, None, "watcher")
        if problem is None:
            self.devices.resources[info.name].registry_socket = str(path)
        return problem
