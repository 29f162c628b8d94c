"""A fake kubelet that speaks the real device-plugin API over real unix sockets.

It behaves as the kubelet's device manager does (REFERENCE section 1):

- serves ``Registration`` on ``kubelet.sock``; ``Register`` checks the version and
  the resource name, dials the plugin back on ``<dir>/<endpoint>``, calls
  ``GetDevicePluginOptions`` (the options must agree with the request) and only
  then answers; a second registration of a resource replaces the first;
- opens ``ListAndWatch`` right after registration and keeps the latest device
  set per resource (capacity: all devices; allocatable: healthy ones); when a
  stream ends, every device of that resource turns unhealthy;
- watcher mode: finds sockets created in ``plugins_registry``, calls ``GetInfo``,
  dials the endpoint and answers ``NotifyRegistrationStatus``; deleting the
  socket deregisters;
- :meth:`restart` models a real kubelet restart (REFERENCE section 7): the
  kubelet dies (streams end), stays down for ``downtime`` seconds while its
  stale ``kubelet.sock`` refuses every connection, then on start deletes the
  unix sockets in the device-plugin dir and binds a fresh ``kubelet.sock``.

All waits are awaitable with timeouts; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.kubelet.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.kubelet.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.kubelet.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.kubelet.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.model.names import (
    API_VERSION,
    CHECKPOINT_FILE,
    KUBELET_SOCKET,
    resource_name_problem,
)
from hetero_dp.testing.waiting import ChangeWaiter

log = logging.getLogger(__name__)

DIAL_TIMEOUT = 10.0
_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def _leave_dead_socket(path: Path) -> None:
    """A socket file nobody listens on: what a killed kubelet leaves behind."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # bound, never listening: connect() is refused


@dataclass
class FakeDevice:
    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.health == "Healthy"


@dataclass
class FakeResource:
    """What the fake kubelet knows about one registered resource."""

    name: str
    endpoint: str
    options: pb.DevicePluginOptions
    mode: str = "classic"
    devices: dict[str, FakeDevice] = field(default_factory=dict)
    updates: int = 0
    stream_open: bool = False
    stream_ended: bool = False
    channel: grpc.aio.Channel | None = None
    stream_task: asyncio.Task[None] | None = None
    generation: int = 0
    registry_socket: str = ""

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        return sum(1 for d in self.devices.values() if d.healthy)

    @property
    def healthy_ids(self) -> list[str]:
        return [d.id for d in self.devices.values() if d.healthy]


class _RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        problem = await self.kubelet._register_classic(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return pb.Empty()


class FakeKubelet(ChangeWaiter):
    """An in-process kubelet for tests: ``async with FakeKubelet(dir) as kubelet: ...``.

    ``plugin_dir`` is the device-plugin dir (keep its path short: unix socket
    paths are limited to 107 bytes). ``registry_dir``, when given, is watched
    for watcher-mode plugins. ``open_streams=False`` makes it register plugins
    but never open ListAndWatch (a misbehaving kubelet, for reliability tests).
    """

    def __init__(
        self,
        plugin_dir: str | os.PathLike[str],
        registry_dir: str | os.PathLike[str] | None = None,
        *,
        open_streams: bool = True,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.registry_dir = Path(registry_dir) if registry_dir else None
        self.open_streams = open_streams
        self.resources: dict[str, FakeResource] = {}
        self.registrations: list[tuple[str, str]] = []  # (resource, mode) in order
        self.rejections: list[str] = []
        self.restarts = 0
        self.down = False  # inside a restart's downtime
        self._server: grpc.aio.Server | None = None
        self._init_changes()
        self._watcher: DirectoryWatcher | None = None
        self._watcher_tasks: set[asyncio.Task[None]] = set()

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        if self.registry_dir is not None:
            self.registry_dir.mkdir(parents=True, exist_ok=True)
            self._watcher = DirectoryWatcher(self.registry_dir, self._on_registry_event)
            self._watcher.start()
            for entry in sorted(self.registry_dir.iterdir()):  # the plugin watcher's first walk
                self._on_registry_event(entry.name, "created")

    async def stop(self) -> None:
        """Stop serving and drop every stream (plugins see the kubelet die)."""
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        for t in list(self._watcher_tasks):
            t.cancel()
        for res in list(self.resources.values()):
            await self._drop(res)
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def restart(self, downtime: float = 0.0) -> None:
        """Die and come back: drop streams, stay down ``downtime`` seconds, then delete
        the dir's unix sockets and bind a new kubelet.sock.

        A real kubelet is down for seconds (a systemd restart) to minutes (an
        upgrade), and the socket file of the dead process stays behind: every
        ``Register`` meanwhile fails with "connection refused" (REFERENCE section 7).
        On start its device manager deletes the files in the dir, then binds
        ``kubelet.sock``, so a plugin in registration backoff sees its own socket
        deleted and ``kubelet.sock`` created in the same instant.
        """
        await self.stop()
        if downtime > 0:
            self.down = True
            await self._notify()
            _leave_dead_socket(self.socket_path)
            await asyncio.sleep(downtime)  # the modelled outage, not a synchronisation
            self.down = False
        for entry in self.plugin_dir.iterdir():
            if entry.name == CHECKPOINT_FILE:
                continue
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
        self.restarts += 1
        for res in self.resources.values():
            res.devices.clear()  # back from the checkpoint with 0 devices
            res.generation = -1
        await self.start()
        await self._notify()

    # --- registration ----------------------------------------------------

    async def _register_classic(self, req: pb.RegisterRequest) -> str | None:
        if req.version != API_VERSION:
            return self._reject(f"unsupported API version {req.version!r}; want {API_VERSION}")
        problem = resource_name_problem(req.resource_name)
        if problem:
            return self._reject(f"invalid resource name: {problem}")
        if "/" in req.endpoint or not req.endpoint:
            return self._reject(f"endpoint {req.endpoint!r} must be a bare file name")
        return await self._connect(
            req.resource_name, str(self.plugin_dir / req.endpoint), req.options, "classic"
        )

    def _reject(self, why: str) -> str:
        self.rejections.append(why)
        log.info("fake kubelet rejected a registration: %s", why)
        return why

    async def _connect(
        self,
        name: str,
        endpoint_path: str,
        request_options: pb.DevicePluginOptions | None,
        mode: str,
    ) -> str | None:
        channel = grpc.aio.insecure_channel(f"unix://{endpoint_path}", options=_CHANNEL_OPTIONS)
        try:
            stub = pb_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(
                pb.Empty(), timeout=DIAL_TIMEOUT, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as e:
            await channel.close()
            return self._reject(f"dial-back to {endpoint_path} failed: {e.code().name}")
        if request_options is not None and options != request_options:
            await channel.close()
            return self._reject(
                f"options disagree: Register said {request_options!r}, "
                f"GetDevicePluginOptions said {options!r}"
            )
        old = self.resources.get(name)
        if old is not None:
            await self._drop(old)
        res = FakeResource(name=name, endpoint=endpoint_path, options=options, mode=mode)
        res.channel = channel
        self.resources[name] = res
        self.registrations.append((name, mode))
        if self.open_streams:
            res.stream_task = asyncio.get_running_loop().create_task(self._stream(res, stub))
        await self._notify()
        return None

    async def _stream(self, res: FakeResource, stub: pb_grpc.DevicePluginStub) -> None:
        call = stub.ListAndWatch(pb.Empty())
        try:
            res.stream_open = True
            await self._notify()
            async for msg in call:
                res.devices = {
                    d.ID: FakeDevice(d.ID, d.health, tuple(n.ID for n in d.topology.nodes))
                    for d in msg.devices
                }
                res.updates += 1
                res.generation += 1
                await self._notify()
        except grpc.aio.AioRpcError:
            pass
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            res.stream_open = False
            res.stream_ended = True
            for d in res.devices.values():  # the kubelet marks everything unhealthy
                d.health = "Unhealthy"
            with contextlib.suppress(RuntimeError):
                await self._notify()

    async def _drop(self, res: FakeResource) -> None:
        if res.stream_task is not None:
            res.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await res.stream_task
            res.stream_task = None
        if res.channel is not None:
            await res.channel.close()
            res.channel = None

    async def drop_stream(self, name: str) -> None:
        """Cancel a resource's ListAndWatch as a flaky kubelet would (no re-open)."""
        await self._drop(self.resources[name])
        await self._notify()

    # --- watcher mode ----------------------------------------------------

    def _on_registry_event(self, name: str, kind: str) -> None:
        assert self.registry_dir is not None
        path = self.registry_dir / name
        if kind == "created":
            task = asyncio.get_running_loop().create_task(self._watcher_register(path))
            self._watcher_tasks.add(task)
            task.add_done_callback(self._watcher_tasks.discard)
        elif kind == "deleted":
            for res in list(self.resources.values()):
                if res.mode == "watcher" and res.registry_socket == str(path):
                    self.resources.pop(res.name, None)
                    task = asyncio.get_running_loop().create_task(self._drop(res))
                    self._watcher_tasks.add(task)
                    task.add_done_callback(self._watcher_tasks.discard)

    async def _watcher_register(self, path: Path) -> None:
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode):
                return
        except FileNotFoundError:
            return
        async with grpc.aio.insecure_channel(f"unix://{path}", options=_CHANNEL_OPTIONS) as channel:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(
                    reg_pb.InfoRequest(), timeout=DIAL_TIMEOUT, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as e:
                self._reject(f"GetInfo on {path} failed: {e.code().name}")
                return
            problem = None
            if info.type != "DevicePlugin":
                problem = f"plugin type {info.type!r} is not DevicePlugin"
            elif API_VERSION not in info.supported_versions:
                problem = f"no supported version in {list(info.supported_versions)}"
            else:
                problem = resource_name_problem(info.name)
            if problem:
                self._reject(problem)
            else:
                problem = await self._connect(info.name, info.endpoint, None, "watcher")
                if problem is None:
                    self.resources[info.name].registry_socket = str(path)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(
                    reg_pb.RegistrationStatus(
                        plugin_registered=problem is None, error=problem or ""
                    ),
                    timeout=DIAL_TIMEOUT,
                )

    # --- waiting ---------------------------------------------------------

    async def wait_registered(
        self, name: str, *, after: int = 0, timeout: float = 10.0
    ) -> FakeResource:
        """Wait until ``name`` has registered more than ``after`` times and streams."""

        found: list[FakeResource] = []

        def done() -> bool:
            count = sum(1 for n, _ in self.registrations if n == name)
            res = self.resources.get(name)
            if count > after and res is not None and (res.updates > 0 or not self.open_streams):
                found[:] = [res]
                return True
            return False

        await self.wait_for(done, timeout)
        return found[0]

    def registration_count(self, name: str) -> int:
        return sum(1 for n, _ in self.registrations if n == name)

    async def wait_devices(
        self,
        name: str,
        predicate: Callable[[dict[str, FakeDevice]], bool],
        timeout: float = 10.0,
    ) -> dict[str, FakeDevice]:
        """Wait until the resource's latest device set satisfies ``predicate``."""

        def ok() -> bool:
            res = self.resources.get(name)
            return res is not None and res.updates > 0 and predicate(res.devices)

        await self.wait_for(ok, timeout)
        return self.resources[name].devices

    # --- calls the kubelet makes -----------------------------------------

    def _stub(self, name: str) -> pb_grpc.DevicePluginStub:
        res = self.resources.get(name)
        if res is None or res.channel is None:
            raise KeyError(f"resource {name} is not registered")
        return pb_grpc.DevicePluginStub(res.channel)

    async def allocate(
        self, name: str, ids: Sequence[str], *, timeout: float = 10.0
    ) -> pb.ContainerAllocateResponse:
        """One Allocate for one container; raises grpc.aio.AioRpcError on refusal."""
        resp = await self._stub(name).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
            timeout=timeout,
        )
        return resp.container_responses[0]

    async def preferred_allocation(
        self,
        name: str,
        available: Sequence[str],
        must_include: Sequence[str] = (),
        size: int = 1,
        *,
        timeout: float = 10.0,
    ) -> list[str]:
        resp = await self._stub(name).GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available,
                        must_include_deviceIDs=must_include,
                        allocation_size=size,
                    )
                ]
            ),
            timeout=timeout,
        )
        return list(resp.container_responses[0].deviceIDs)

    async def pre_start(self, name: str, ids: Sequence[str], *, timeout: float = 30.0) -> None:
        await self._stub(name).PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=ids), timeout=timeout
        )
