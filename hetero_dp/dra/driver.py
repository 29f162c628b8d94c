"""One DRA driver: a device set served to the kubelet and published to the API server.

Start order: load the checkpoint (unprepare must work for claims a previous
process prepared), serve ``DRAPlugin`` (v1 and v1beta1) and the health service
``DRAResourceHealth`` (:mod:`.health`) on ``<plugins dir>/<driver>/dra.sock``,
then offer the registration socket ``<plugins_registry>/<driver>-reg.sock``
(serve before register, as with device plugins), then publish the pool and
watch it. With an instance ID (the pod UID, for rolling updates) the sockets are
``dra-<uid>.sock`` and ``<driver>-<uid>-reg.sock``; only the newest live
instance publishes. Stop order is the reverse; slices are deleted on a clean
stop by the last instance, so the scheduler stops placing claims on a node
whose driver has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.checkpoint import Checkpoint, CheckpointError
from hetero_dp.dra.claimspec import claim_kind
from hetero_dp.dra.health import HealthFeed, add_health_services
from hetero_dp.dra.names import device_name, driver_name_problem, is_dns_subdomain
from hetero_dp.dra.prepare import ClaimPreparer
from hetero_dp.dra.publisher import SlicePublisher
from hetero_dp.dra.servicer import DRARegistrationServicer, add_dra_services
from hetero_dp.dra.slices import VERSIONS
from hetero_dp.dra.watch import SliceWatch
from hetero_dp.engine.cdi_publisher import CDIWriter
from hetero_dp.kits import observe
from hetero_dp.kits.aiotools import wait_event
from hetero_dp.kits.decoding import DecodeGuard
from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.kits.sockets import (
    bind_unix,
    check_socket_path,
    claim_socket_path,
    remove_own_socket,
)
from hetero_dp.model.device import Device
from hetero_dp.model.errors import ConfigError

log = logging.getLogger(__name__)

_INSTANCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
PROBE_TIMEOUT = 2.0
WATCH_STOP_TIMEOUT = 5.0

DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_RESYNC_INTERVAL = 30.0
STOP_GRACE = 0.2


@dataclass
class DriverSettings:
    driver: str
    node: str
    plugins_dir: Path
    registry_dir: Path
    cdi_dir: Path
    resync_interval: float = DEFAULT_RESYNC_INTERVAL
    api_versions: tuple[str, ...] = VERSIONS
    remove_slices_on_stop: bool = True
    watch_slices: bool = True  # a watch repairs slices someone deleted at once
    resource: str = ""  # the resource name this driver serves (for events and logs)
    # The pod's UID (downward API) for rolling updates: sockets named per instance.
    instance: str = ""

    def validate(self) -> None:
        if self.instance and not _INSTANCE.match(self.instance):
            raise ConfigError(
                f"instance ID {self.instance!r} must be 1-64 letters, digits and '-' "
                "(the pod UID from the downward API)",
                field="instance",
            )
        problem = driver_name_problem(self.driver)
        if problem:
            raise ConfigError(problem, field="driverName")
        if not self.node or not is_dns_subdomain(self.node):
            raise ConfigError(
                f"node name {self.node!r} must be the node's name (a lowercase DNS subdomain); "
                "set --node-name or NODE_NAME from the downward API",
                field="nodeName",
            )
        claim_kind(self.driver)


class DRADriver:
    def __init__(self, settings: DriverSettings, api_client: Any) -> None:
        settings.validate()
        self.settings = settings
        self.name = settings.driver
        self.node = settings.node
        self.dir = Path(settings.plugins_dir) / self.name
        # With an instance ID, as the kubelet's own helper names them for rolling
        # updates (k8s.io/dynamic-resource-allocation/kubeletplugin, RollingUpdate):
        # <driver>-<uid>-reg.sock and dra-<uid>.sock, so two pods never share a path.
        part = f"-{settings.instance}" if settings.instance else ""
        self.socket_path = self.dir / f"dra{part}.sock"
        self.registry_socket = Path(settings.registry_dir) / f"{self.name}{part}-reg.sock"
        for p in (self.socket_path, self.registry_socket):
            try:
                check_socket_path(p)
            except ValueError as e:
                raise ConfigError(str(e), field="pluginsDir") from None
        self.api = ResourceAPI(api_client)
        self.checkpoint = Checkpoint(self.dir / "checkpoint.json")
        self.by_name: dict[str, Device] = {}
        self.preparer = ClaimPreparer(
            driver=self.name,
            pool=self.node,
            api=self.api,
            checkpoint=self.checkpoint,
            cdi_dir=settings.cdi_dir,
            devices=lambda: self.by_name,
        )
        self.health = HealthFeed(self.node)
        self.publisher = SlicePublisher(
            self.api,
            self.name,
            self.node,
            versions=settings.api_versions,
            watched=settings.watch_slices,
        )
        self.registered = asyncio.Event()
        self.registration_error = ""
        self.api_ready = False
        self._devices: list[Device] = []
        self._server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._watcher: DirectoryWatcher | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self._slice_watch: SliceWatch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resync_now = asyncio.Event()
        self._running = False
        self._restarting_registration = False
        # (device, inode) of each socket file this instance bound: only those it removes
        self._bound: dict[Path, tuple[int, int] | None] = {}

    @property
    def running(self) -> bool:
        return self._running

    # --- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        CDIWriter(self.settings.cdi_dir).check(field="cdi.dir")  # exists and takes files
        try:
            self.checkpoint.load()
        except CheckpointError as e:
            raise ConfigError(str(e), field="checkpoint") from None
        await self._connect_api()
        self._claim(self.socket_path)
        self.health.closed = False
        server = grpc.aio.server(interceptors=[DecodeGuard()])  # bad bodies: INVALID_ARGUMENT
        add_dra_services(server, self.preparer)
        add_health_services(server, self.health)
        self._bound[self.socket_path] = bind_unix(server, self.socket_path)
        await server.start()
        self._server = server
        self._running = True
        await self._start_registration()
        self._watcher = DirectoryWatcher(self.registry_socket.parent, self._on_registry_event)
        self._watcher.start()
        await self._update_role()
        if self.api_ready:
            await self.publisher.publish(self._devices)
        self._loop = asyncio.get_running_loop()
        if self.settings.watch_slices:
            self._slice_watch = self.publisher.watch(self._on_slices_changed)
            self._slice_watch.start()
        self._resync_task = asyncio.get_running_loop().create_task(
            self._resync_loop(), name=f"dra resync {self.name}"
        )
        log.info(
            "DRA driver %s serving on %s (resource.k8s.io/%s)",
            self.name,
            self.socket_path,
            self.api.version if self.api_ready else "?",
        )

    async def _connect_api(self) -> bool:
        try:
            version = await asyncio.to_thread(self.api.detect, self.settings.api_versions)
            await self.publisher.start()
        except APIError as e:
            log.error("DRA driver %s: API server not usable yet: %s", self.name, e)
            return False
        if not self.api_ready:
            log.info("DRA driver %s uses resource.k8s.io/%s", self.name, version)
        self.api_ready = True
        return True

    def _claim(self, path: Path) -> None:
        """Make ``path`` free to bind: a stale socket goes; a live one is another
        instance's (two pods without ``POD_UID`` share the same names): refused, and
        the first instance keeps serving."""
        try:
            claim_socket_path(path, "instance")
        except ConfigError as e:
            if "another running instance" not in e.reason:
                raise
            raise ConfigError(
                f"DRA driver {self.name}: {path} is the socket of another running instance "
                "of this driver; set POD_UID from the downward API (fieldRef "
                "metadata.uid) so that each pod has its own sockets, or stop the other "
                "instance first",
                field="instance",
            ) from None

    async def _start_registration(self) -> None:
        self.registry_socket.parent.mkdir(parents=True, exist_ok=True)
        self._claim(self.registry_socket)
        reg = grpc.aio.server(interceptors=[DecodeGuard()])  # bad bodies: INVALID_ARGUMENT
        reg_grpc.add_RegistrationServicer_to_server(
            DRARegistrationServicer(self.name, str(self.socket_path), self._on_status), reg
        )
        self._bound[self.registry_socket] = bind_unix(reg, self.registry_socket)
        await reg.start()
        self._reg_server = reg

    def _on_status(self, registered: bool, error: str) -> None:
        resource = self.settings.resource or self.name
        if registered:
            self.registration_error = ""
            log.info("DRA driver %s registered with the kubelet", self.name)
            observe.emit("registered", resource=resource, mode="dra")
            self.registered.set()
        else:
            self.registered.clear()
            self.registration_error = error
            log.error("the kubelet refused DRA driver %s: %s", self.name, error)
            observe.emit("registration_failed", resource=resource, reason=error)

    # --- rolling updates: several instances of this driver on one node ------

    def _is_instance_socket(self, name: str) -> bool:
        return name != self.registry_socket.name and (
            name == f"{self.name}-reg.sock"
            or (name.startswith(f"{self.name}-") and name.endswith("-reg.sock"))
        )

    async def other_instances(self) -> list[tuple[int, str]]:
        """Other live instances of this driver on this node: (socket mtime, endpoint).

        A candidate registration socket counts when it answers ``GetInfo`` with
        this driver's name (a stale socket of a killed pod does not answer; a
        driver whose name merely starts like ours answers another name).
        """
        found: list[tuple[int, str]] = []
        try:
            entries = list(self.registry_socket.parent.iterdir())
        except OSError:
            return found
        for path in entries:
            if not self._is_instance_socket(path.name):
                continue
            try:
                mtime = path.lstat().st_mtime_ns
                async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
                    info = await reg_grpc.RegistrationStub(channel).GetInfo(
                        reg_pb.InfoRequest(), timeout=PROBE_TIMEOUT
                    )
            except (OSError, grpc.aio.AioRpcError):
                continue
            if info.name == self.name and info.endpoint != str(self.socket_path):
                found.append((mtime, info.endpoint))
        return found

    async def _update_role(self) -> None:
        """Publish only while this is the newest live instance (the one the kubelet
        uses: its plugin manager takes the most recent registration of a driver)."""
        try:
            own = self.registry_socket.lstat().st_mtime_ns
        except OSError:
            own = 0
        others = await self.other_instances()
        # equal times (a coarse file-system clock): the endpoint name decides, so
        # exactly one instance publishes
        me = (own, str(self.socket_path))
        newer = [endpoint for mtime, endpoint in others if (mtime, endpoint) > me]
        active = not newer
        if active != self.publisher.active:
            if active:
                log.info("DRA driver %s: this instance publishes the pool now", self.name)
            else:
                log.info(
                    "DRA driver %s: a newer instance (%s) publishes the pool; standing by",
                    self.name,
                    newer[0],
                )
        self.publisher.active = active

    async def _role_changed(self) -> None:
        await self._update_role()
        self._resync_now.set()

    def _on_registry_event(self, name: str, kind: str) -> None:
        if self._running and self._is_instance_socket(name):
            # another instance of this driver came or went (a rolling update)
            asyncio.get_running_loop().create_task(self._role_changed())
        # Someone removed our registration socket: offer it again, or the kubelet
        # never finds this driver after its next start.
        if (
            kind == "deleted"
            and name == self.registry_socket.name
            and self._running
            and not self._restarting_registration
            and not self.registry_socket.exists()
        ):
            log.warning("registration socket %s deleted; recreating it", self.registry_socket)
            self.registered.clear()
            asyncio.get_running_loop().create_task(self._restart_registration())

    async def _restart_registration(self) -> None:
        self._restarting_registration = True
        try:
            if self._reg_server is not None:
                await self._reg_server.stop(STOP_GRACE)
            if self._running:
                await self._start_registration()
        except ConfigError as e:  # another instance took the name meanwhile
            log.error("cannot offer the registration socket again: %s", e)
        finally:
            self._restarting_registration = False

    def _on_slices_changed(self, why: str) -> None:
        """From the watch thread: someone changed our slices; sync now."""
        loop = self._loop
        if loop is None or not self._running:
            return
        log.debug("DRA driver %s: %s; syncing", self.name, why)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._resync_now.set)

    async def stop(self) -> None:
        self._running = False
        self.publisher.cancel_retry()
        if self._slice_watch is not None:
            self._slice_watch.stop()
            if not await asyncio.to_thread(self._slice_watch.join, WATCH_STOP_TIMEOUT):
                log.warning("DRA driver %s: the slice watch did not stop in time", self.name)
            self._slice_watch = None
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._resync_task is not None:
            self._resync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resync_task
            self._resync_task = None
        await self.health.close()  # health streams end before the server stops
        for server in (self._reg_server, self._server):
            if server is not None:
                await server.stop(STOP_GRACE)
        self._reg_server = self._server = None
        # only the files this instance bound: never another instance's
        for path in (self.registry_socket, self.socket_path):
            remove_own_socket(path, self._bound.pop(path, None))
        self.registered.clear()
        if self.settings.remove_slices_on_stop and self.api_ready:
            others = await self.other_instances()
            if others:
                log.info(
                    "DRA driver %s: another instance (%s) still serves this node; "
                    "leaving the pool to it",
                    self.name,
                    ", ".join(e for _, e in others),
                )
            else:
                await self.publisher.remove()

    # --- devices ---------------------------------------------------------

    async def update(
        self, devices: Iterable[Device], shares: Mapping[str, int] | None = None
    ) -> None:
        """Take the backend's current devices (healthy or not) and republish.

        ``shares``: device ID -> the number of replicas the sharing config makes
        of it (time-slicing), published as consumable capacity where served.
        """
        self._devices = list(devices)
        self.publisher.shares = {device_name(k): n for k, n in (shares or {}).items()}
        self.by_name = {device_name(d.id): d for d in self._devices}
        await self.health.update(self._devices)
        if self._running and self.api_ready:
            await self.publisher.publish(self._devices)

    async def resync(self) -> None:
        """Check the API server now: reconnect if needed, recreate vanished slices."""
        if not self.api_ready:
            if not await self._connect_api():
                return
            await self.publisher.publish(self._devices)
            return
        await self.publisher.sync()

    async def _resync_loop(self) -> None:
        interval = self.settings.resync_interval or None
        while True:
            await wait_event(self._resync_now, interval)
            self._resync_now.clear()
            try:
                await self.resync()
            except Exception:
                log.exception("DRA driver %s: resync failed", self.name)
