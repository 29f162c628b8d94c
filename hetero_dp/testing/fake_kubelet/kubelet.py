"""The fake kubelet: a kubelet for tests that speaks the real device-plugin API over
real unix sockets, composed of the pieces in this package.

:meth:`FakeKubelet.restart` models a real kubelet restart (docs/sources.md#kubelet-restart):
the kubelet dies (streams end), stays down for ``downtime`` seconds while its stale
``kubelet.sock`` refuses every connection, then on start deletes the unix sockets in
the device-plugin dir and binds a fresh ``kubelet.sock``.

All waits are awaitable with timeouts; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.model.names import CHECKPOINT_FILE, KUBELET_SOCKET
from hetero_dp.testing.fake_kubelet.clients import PluginClients
from hetero_dp.testing.fake_kubelet.devices import (
    AdmissionError,
    DeviceManager,
    FakeDevice,
    FakeResource,
    HealthPoint,
)
from hetero_dp.testing.fake_kubelet.podlife import PodLife
from hetero_dp.testing.fake_kubelet.pods import FakePod
from hetero_dp.testing.fake_kubelet.registration import (
    PluginWatcher,
    RegistrationServicer,
    register_problem,
)
from hetero_dp.testing.waiting import ChangeWaiter


def _leave_dead_socket(path: Path) -> None:
    """A socket file nobody listens on: what a killed kubelet leaves behind."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # bound, never listening: connect() is refused


class FakeKubelet(ChangeWaiter):
    """An in-process kubelet for tests: ``async with FakeKubelet(dir) as kubelet: ...``.

    ``plugin_dir`` is the device-plugin dir (keep its path short: unix socket
    paths are limited to 107 bytes). ``registry_dir``, when given, is watched
    for watcher-mode plugins. ``open_streams=False`` makes it register plugins
    but never open ListAndWatch (a misbehaving kubelet, for reliability tests).

    Its pieces: :attr:`device_manager` (device sets, registrations, the health
    timeline, devices in use), :attr:`plugin_clients` (the client per plugin
    endpoint and its stream, kubelet 1.32 semantics) and :attr:`plugin_watcher`.
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
        self.restarts = 0
        self.down = False  # inside a restart's downtime
        self._init_changes()
        self.device_manager = DeviceManager()
        self.plugin_clients = PluginClients(
            self.device_manager, self._notify, open_streams=open_streams
        )
        self.plugin_watcher = (
            PluginWatcher(self.registry_dir, self.device_manager, self.plugin_clients)
            if self.registry_dir is not None
            else None
        )
        self._server: grpc.aio.Server | None = None
        self.pod_life = PodLife(self.plugin_dir, self.device_manager, self.allocate)

    @property
    def open_streams(self) -> bool:
        return self.plugin_clients.open_streams

    @open_streams.setter
    def open_streams(self, value: bool) -> None:
        self.plugin_clients.open_streams = value

    @property
    def resources(self) -> dict[str, FakeResource]:
        """The current client per resource name, with its devices."""
        return self.device_manager.resources

    @property
    def registrations(self) -> list[tuple[str, str]]:
        return self.device_manager.registrations  # (resource, mode) in order

    @property
    def rejections(self) -> list[str]:
        return self.device_manager.rejections

    @property
    def timeline(self) -> list[HealthPoint]:
        return self.device_manager.timeline

    @property
    def in_use(self) -> set[str]:
        return self.device_manager.in_use  # device IDs admitted pods hold

    @property
    def clients(self) -> list[FakeResource]:
        """Every client dialled and not dropped, replaced ones whose streams run included."""
        return self.plugin_clients.clients

    @property
    def disconnects(self) -> list[tuple[str, str, str]]:
        """(resource, socket whose stream ended, socket disconnected) per disconnect."""
        return self.plugin_clients.disconnects

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
        pb_grpc.add_RegistrationServicer_to_server(RegistrationServicer(self.register), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        if self.plugin_watcher is not None:
            self.plugin_watcher.start()

    async def stop(self) -> None:
        """Stop serving and drop every stream (plugins see the kubelet die)."""
        await self.pod_life.pause()
        if self.plugin_watcher is not None:
            self.plugin_watcher.close()
        self.plugin_clients.cancel_tasks()
        await self.plugin_clients.drop_all()  # the kubelet dies: no runClient follows
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
        self.device_manager.forget_devices()  # back from the checkpoint with 0 devices
        await self.start()
        await self.pod_life.resume()
        await self._notify()

    # --- registration ----------------------------------------------------

    async def register(self, req: pb.RegisterRequest) -> str | None:
        """What the kubelet does with a ``Register`` call: None when it accepted it,
        else why not (the call then fails with INVALID_ARGUMENT)."""
        problem = register_problem(req)
        if problem:
            return self.device_manager.reject(problem)
        return await self.plugin_clients.connect(
            req.resource_name, str(self.plugin_dir / req.endpoint), req.options, "classic"
        )

    async def drop_stream(self, name: str) -> None:
        """Cancel a resource's ListAndWatch as a flaky kubelet would (no re-open); the
        kubelet then disconnects the resource's current client, as for any stream end."""
        await self.plugin_clients.drop(self.resources[name])
        await self._notify()

    # --- waiting ---------------------------------------------------------

    async def wait_registered(
        self, name: str, *, after: int = 0, timeout: float = 10.0
    ) -> FakeResource:
        """Wait until ``name`` has registered more than ``after`` times and streams."""

        found: list[FakeResource] = []

        def done() -> bool:
            count = self.registration_count(name)
            res = self.resources.get(name)
            if count > after and res is not None and (res.updates > 0 or not self.open_streams):
                found[:] = [res]
                return True
            return False

        await self.wait_for(done, timeout)
        return found[0]

    def registration_count(self, name: str) -> int:
        return self.device_manager.registration_count(name)

    def healthy_counts(self, name: str, since: float = 0.0) -> list[int]:
        """See :meth:`DeviceManager.healthy_counts`."""
        return self.device_manager.healthy_counts(name, since)

    def zero_windows(
        self, name: str, since: float = 0.0, until: float | None = None
    ) -> list[float]:
        """See :meth:`DeviceManager.zero_windows`."""
        return self.device_manager.zero_windows(name, since, until)

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
        res, ids = self.device_manager.take(name, count)
        try:
            await self.allocate(name, ids, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            self.device_manager.release(ids)
            raise AdmissionError(f"Allocate of {ids} failed: {e.code().name}: {e.details()}") from e
        except asyncio.CancelledError:
            self.device_manager.release(ids)
            if res.channel is None:  # the kubelet closed the connection under the call
                raise AdmissionError(
                    f"Allocate of {ids} failed: {name}: endpoint {res.endpoint} stopped"
                ) from None
            raise
        return ids

    def release(self, ids: Sequence[str]) -> None:
        """The pods holding ``ids`` ended: their devices are free again."""
        self.device_manager.release(ids)

    async def allocate(
        self, name: str, ids: Sequence[str], *, timeout: float = 10.0
    ) -> pb.ContainerAllocateResponse:
        """One Allocate for one container; raises grpc.aio.AioRpcError on refusal."""
        resp = await self.plugin_clients.stub(name).Allocate(
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
        resp = await self.plugin_clients.stub(name).GetPreferredAllocation(
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
        await self.plugin_clients.stub(name).PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=ids), timeout=timeout
        )

    # --- pods and the pod-resources API (pods.PodLife) --------------------

    async def serve_pod_resources(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Serve the pod-resources API (default: ``pod-resources/kubelet.sock`` beside
        the device-plugin dir); it stops and comes back with the kubelet."""
        where = Path(path) if path else self.plugin_dir.parent / "pod-resources" / "kubelet.sock"
        return await self.pod_life.serve(where)

    async def stop_pod_resources(self) -> None:
        """Stop the pod-resources API and remove its socket."""
        await self.pod_life.stop_serving()

    async def admit_pod(
        self, name: str, containers: Mapping[str, Mapping[str, int]], **kw: Any
    ) -> FakePod:
        """Admit a pod through the device manager's path (:meth:`PodLife.admit`:
        ``namespace``, ``uid``, ``timeout``)."""
        return await self.pod_life.admit(name, containers, **kw)

    def remove_pod(self, name: str, namespace: str = "default") -> None:
        """The pod ended: its devices are free, it leaves the list and the checkpoint."""
        self.pod_life.remove(name, namespace)
