"""A fake kubelet that speaks the real device-plugin API over real unix sockets.

It behaves as the kubelet's device manager does (docs/sources.md#device-plugin-api):

- serves ``Registration`` on ``kubelet.sock``; ``Register`` checks the version and
  the resource name, dials the plugin back on ``<dir>/<endpoint>``, calls
  ``GetDevicePluginOptions`` (the options must agree with the request) and only
  then answers;
- opens ``ListAndWatch`` right after registration and keeps the latest device
  set per resource (capacity: all devices; allocatable: healthy ones);
- a second registration of a resource, and the end of a stream, behave as in the
  kubelet 1.32 device manager (``pkg/kubelet/cm/devicemanager/plugin/v1beta1/
  handler.go`` and ``manager.go``): ``Register`` makes the new client the current
  one for the name (``registerClient`` overwrites ``clients[name]``) without
  closing the old one, whose ListAndWatch keeps running and whose updates still
  land in the resource's device sets (``PluginListAndWatchReceiver`` is keyed by
  name); the endpoint is replaced (``PluginConnected``) and the device sets stay
  until a stream sends new ones. When ANY client's stream ends, ``runClient``
  looks up the *current* client of that name (``getClient(name)``) and
  disconnects it (``disconnectClient``: its connection closed,
  ``PluginDisconnected`` -> ``markResourceUnhealthy``: every device unhealthy,
  allocatable 0, and ``setStopTime``) until the next ``Register``. So an old
  instance that leaves after a new one registered takes the new one down too;
- :attr:`FakeKubelet.timeline` records each change of a resource's healthy count
  and :meth:`FakeKubelet.admit` models pod admission (it fails for good when too
  few devices are healthy), so upgrade tests assert on events, not on times;
- watcher mode: finds sockets created in ``plugins_registry``, calls ``GetInfo``,
  dials the endpoint and answers ``NotifyRegistrationStatus``; deleting the
  socket deregisters;
- :meth:`restart` models a real kubelet restart (docs/sources.md#kubelet-restart): the
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
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.kits.inotify import DirectoryWatcher
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
    # True while this is the kubelet's current client for the name (handler.go
    # ``clients[name]``); False once replaced by a later Register or disconnected.
    current: bool = True
    # True once the kubelet disconnected this endpoint (``PluginDisconnected``).
    stopped: bool = False
    # ListAndWatch messages received on this client's own stream (``updates`` counts
    # every message that set the name's devices, a replaced client's included)
    messages: int = 0

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        return sum(1 for d in self.devices.values() if d.healthy)

    @property
    def healthy_ids(self) -> list[str]:
        return [d.id for d in self.devices.values() if d.healthy]


class AdmissionError(Exception):
    """The kubelet refused a pod at admission (``UnexpectedAdmissionError``): the
    pod fails for good, it is not retried."""


@dataclass(frozen=True)
class HealthPoint:
    """One change of a resource's healthy device count, as the kubelet saw it."""

    at: float  # time.monotonic()
    resource: str
    healthy: int
    why: str  # "update", "disconnect", "restart", "register"


class _RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        problem = await self.kubelet.register(request)
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
        # Every client the kubelet dialled and has not dropped: the current one per
        # name and the replaced ones whose streams still run.
        self.clients: list[FakeResource] = []
        # (resource, socket of the stream that ended, socket disconnected) per
        # disconnect the end of a stream caused (handler.go runClient).
        self.disconnects: list[tuple[str, str, str]] = []
        self.timeline: list[HealthPoint] = []
        self.in_use: set[str] = set()  # device IDs admitted pods hold
        self._tearing_down = False
        self._server: grpc.aio.Server | None = None
        self._init_changes()
        self._watcher: DirectoryWatcher | None = None
        self._watcher_tasks: set[asyncio.Task[Any]] = set()

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
        self._tearing_down = True  # the kubelet dies: no runClient follows
        try:
            for res in list(self.clients):
                await self._drop(res)
        finally:
            self._tearing_down = False
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
        ``Register`` meanwhile fails with "connection refused" (docs/sources.md#kubelet-restart).
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
            self._record(res.name, "restart")
        await self.start()
        await self._notify()

    # --- registration ----------------------------------------------------

    async def register(self, req: pb.RegisterRequest) -> str | None:
        """What the kubelet does with a ``Register`` call: None when it accepted it,
        else why not (the call then fails with INVALID_ARGUMENT)."""
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
        res = FakeResource(name=name, endpoint=endpoint_path, options=options, mode=mode)
        old = self.resources.get(name)
        if old is not None:
            # handler.go registerClient overwrites clients[name] and closes nothing:
            # the old client's stream keeps running. manager.go PluginConnected replaces
            # the endpoint; the device sets stay until the next ListAndWatch response.
            old.current = False
            res.devices = {
                i: FakeDevice(d.id, d.health, d.numa_nodes) for i, d in old.devices.items()
            }
            res.generation = old.generation
        res.channel = channel
        self.resources[name] = res
        self.clients.append(res)
        self.registrations.append((name, mode))
        self._record(name, "register")
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
                # manager.go PluginListAndWatchReceiver: keyed by the resource name,
                # so a replaced client's updates still set the name's devices
                target = self.resources.get(res.name, res)
                target.devices = {
                    d.ID: FakeDevice(d.ID, d.health, tuple(n.ID for n in d.topology.nodes))
                    for d in msg.devices
                }
                target.updates += 1
                target.generation += 1
                res.messages += 1
                self._record(res.name, "update")
                await self._notify()
        except grpc.aio.AioRpcError:
            pass
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            res.stream_open = False
            res.stream_ended = True
            if self._tearing_down:  # the kubelet itself stops: everything goes
                res.current = False
                self._mark_unhealthy(res)
            else:
                self._client_ended(res)
            with contextlib.suppress(RuntimeError):
                await self._notify()

    def _client_ended(self, ended: FakeResource) -> None:
        """handler.go ``runClient`` after ``c.Run`` returns: disconnect the *current*
        client of the name (1.32 ``getClient(name)``), which need not be ``ended``."""
        if ended in self.clients:
            self.clients.remove(ended)
        if ended.channel is not None:  # ours to close; 1.32 leaks a replaced client's
            channel, ended.channel = ended.channel, None
            self._spawn(channel.close())
        cur = self.resources.get(ended.name)
        if cur is None or not cur.current:
            return  # deregistered already: nothing to disconnect
        # disconnectClient: deregisterClient (clients[name] deleted), then Disconnect:
        # the connection closed and PluginDisconnected -> markResourceUnhealthy
        cur.current = False
        cur.stopped = True
        self.disconnects.append((ended.name, ended.endpoint, cur.endpoint))
        log.info(
            "fake kubelet: stream of %s ended; disconnecting current client %s",
            ended.endpoint,
            cur.endpoint,
        )
        self._mark_unhealthy(cur)
        if cur is not ended:
            if cur in self.clients:
                self.clients.remove(cur)
            task, cur.stream_task = cur.stream_task, None
            channel, cur.channel = cur.channel, None
            if task is not None:
                task.cancel()
            if channel is not None:
                self._spawn(channel.close())

    def _mark_unhealthy(self, res: FakeResource) -> None:
        for d in res.devices.values():  # markResourceUnhealthy: allocatable 0
            d.health = "Unhealthy"
        if self.resources.get(res.name) is res:
            self._record(res.name, "disconnect")

    def _record(self, name: str, why: str) -> None:
        res = self.resources.get(name)
        healthy = res.allocatable if res is not None else 0
        last = next((p for p in reversed(self.timeline) if p.resource == name), None)
        if last is None or last.healthy != healthy:
            self.timeline.append(HealthPoint(time.monotonic(), name, healthy, why))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._watcher_tasks.add(task)
        task.add_done_callback(self._watcher_tasks.discard)

    async def _drop(self, res: FakeResource) -> None:
        if res.stream_task is not None:
            res.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await res.stream_task
            res.stream_task = None
        if res.channel is not None:
            await res.channel.close()
            res.channel = None
        if res in self.clients:
            self.clients.remove(res)

    async def drop_stream(self, name: str) -> None:
        """Cancel a resource's ListAndWatch as a flaky kubelet would (no re-open); the
        kubelet then disconnects the resource's current client, as for any stream end."""
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
                    res.current = False
                    self._spawn(self._drop(res))

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

    def healthy_counts(self, name: str, since: float = 0.0) -> list[int]:
        """The healthy device counts ``name`` went through since ``since`` (a
        ``time.monotonic()`` value), the one in force at ``since`` first."""
        points = [p for p in self.timeline if p.resource == name]
        before = [p.healthy for p in points if p.at < since]
        return before[-1:] + [p.healthy for p in points if p.at >= since]

    def zero_windows(
        self, name: str, since: float = 0.0, until: float | None = None
    ) -> list[float]:
        """The lengths in seconds of each stretch since ``since`` during which ``name``
        had no healthy device (one still open at ``until``, default now, ends there)."""
        end = time.monotonic() if until is None else until
        points = [p for p in self.timeline if p.resource == name and p.at <= end]
        out: list[float] = []
        start: float | None = None
        for p in points:
            if p.healthy == 0 and start is None:
                start = max(p.at, since)
            elif p.healthy > 0 and start is not None:
                if p.at >= since:
                    out.append(p.at - start)
                start = None
        if start is not None:
            out.append(end - start)
        return out

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

    async def admit(self, name: str, count: int = 1, *, timeout: float = 10.0) -> list[str]:
        """Admit a pod asking for ``count`` devices of ``name``, as the kubelet does:
        pick healthy devices not in use and call Allocate on the current endpoint.

        Raises :class:`AdmissionError` when fewer than ``count`` devices are healthy
        (kubelet 1.32 ``manager.go`` ``devicesToAllocate``: the pod fails with
        ``UnexpectedAdmissionError``, for good) or when Allocate fails. Returns the
        device IDs given. Devices stay in use until :meth:`release`.
        """
        res = self.resources.get(name)
        if res is None:
            raise AdmissionError(f"{name}: unknown resource")
        free = [i for i in res.healthy_ids if i not in self.in_use]
        if len(free) < count:
            raise AdmissionError(
                f"Allocate failed due to no healthy devices present for {name} "
                f"({len(free)} healthy and free, {count} requested)"
            )
        ids = free[:count]
        if res.stopped or res.channel is None:
            raise AdmissionError(f"{name}: endpoint {res.endpoint} stopped")
        self.in_use.update(ids)
        try:
            await self.allocate(name, ids, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            self.in_use.difference_update(ids)
            raise AdmissionError(f"Allocate of {ids} failed: {e.code().name}: {e.details()}") from e
        except asyncio.CancelledError:
            self.in_use.difference_update(ids)
            if res.channel is None:  # the kubelet closed the connection under the call
                raise AdmissionError(
                    f"Allocate of {ids} failed: {name}: endpoint {res.endpoint} stopped"
                ) from None
            raise
        return ids

    def release(self, ids: Sequence[str]) -> None:
        """The pods holding ``ids`` ended: their devices are free again."""
        self.in_use.difference_update(ids)

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
