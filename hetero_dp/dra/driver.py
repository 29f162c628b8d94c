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
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.dra.api import ResourceAPI
from hetero_dp.dra.checkpoint import Checkpoint, CheckpointError
from hetero_dp.dra.claimspec import claim_kind
from hetero_dp.dra.health import HealthFeed, add_health_services
from hetero_dp.dra.instances import InstanceRole
from hetero_dp.dra.kubeletplugin import KubeletPlugin
from hetero_dp.dra.names import device_name, driver_name_problem, is_dns_subdomain
from hetero_dp.dra.prepare import ClaimPreparer
from hetero_dp.dra.publisher import SlicePublisher
from hetero_dp.dra.reservations import Reservations
from hetero_dp.dra.resync import SliceSync
from hetero_dp.dra.servicer import add_dra_services
from hetero_dp.dra.slices import VERSIONS
from hetero_dp.dra.watch import SliceWatch
from hetero_dp.engine.cdi_publisher import CDIWriter
from hetero_dp.kits.sockets import check_socket_path
from hetero_dp.model.device import Device
from hetero_dp.model.errors import ConfigError

log = logging.getLogger(__name__)

_INSTANCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")

DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_RESYNC_INTERVAL = 30.0


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
    """One driver: its presence at the kubelet (:class:`.kubeletplugin.KubeletPlugin`),
    its role among instances on the node (:class:`.instances.InstanceRole`) and its
    slices (:class:`.resync.SliceSync`), started and stopped in order."""

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
        for p, field, advice in (
            (self.socket_path, "pluginsDir", "use a shorter --dra-plugins-dir"),
            (
                self.registry_socket,
                "pluginsRegistryDir",
                "use a shorter pluginsRegistryDir (--plugins-registry-dir)",
            ),
        ):
            try:
                check_socket_path(p, f"{advice} or driver name")
            except ValueError as e:
                raise ConfigError(str(e), field=field) from None
        self.api = ResourceAPI(api_client)
        self.checkpoint = Checkpoint(self.dir / "checkpoint.json")
        # who the prepared claims are reserved for now (the holder series)
        self.reservations = Reservations(self.name, self.api, self.checkpoint)
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
        self._devices: list[Device] = []
        self._running = False
        self.kubelet = KubeletPlugin(
            self.name,
            self.socket_path,
            self.registry_socket,
            resource=settings.resource or self.name,
            running=lambda: self._running,
        )
        self.role = InstanceRole(self.name, self.socket_path, self.registry_socket, self.publisher)
        self.slices = SliceSync(
            self.name,
            self.api,
            self.publisher,
            api_versions=settings.api_versions,
            resync_interval=lambda: self.settings.resync_interval,
            watch_slices=settings.watch_slices,
            devices=lambda: self._devices,
            running=lambda: self._running,
        )

    def follow_cdi_dir(self, cdi_dir: Path) -> None:
        """Claims prepared from now on have their CDI specs in ``cdi_dir`` (a reload of
        ``cdi.dir``, checked by the caller); those prepared before keep theirs."""
        self.settings.cdi_dir = cdi_dir
        self.preparer.cdi_dir = Path(cdi_dir)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def registered(self) -> asyncio.Event:
        """Set while the kubelet has this driver registered."""
        return self.kubelet.registered

    @property
    def registration_error(self) -> str:
        """Why the kubelet last refused this driver ("" once registered)."""
        return self.kubelet.registration_error

    @property
    def api_ready(self) -> bool:
        """True once the API server answered with a resource.k8s.io version we serve."""
        return self.slices.api_ready

    @property
    def slice_watch(self) -> SliceWatch | None:
        return self.slices.slice_watch

    async def other_instances(self) -> list[tuple[int, str]]:
        """Other live instances of this driver on this node: (socket mtime, endpoint)."""
        return await self.role.other_instances()

    # --- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        CDIWriter(self.settings.cdi_dir).check(field="cdi.dir")  # exists and takes files
        try:
            self.checkpoint.load()
        except CheckpointError as e:
            raise ConfigError(str(e), field="checkpoint") from None
        await self.slices.connect()
        await self.kubelet.serve(self._add_services)
        self._running = True
        await self.kubelet.offer()
        self.kubelet.watch_registry(self._on_registry_event)
        await self.role.update()
        await self.slices.start()
        log.info(
            "DRA driver %s serving on %s (resource.k8s.io/%s)",
            self.name,
            self.socket_path,
            self.api.version if self.api_ready else "?",
        )

    def _add_services(self, server: grpc.aio.Server) -> None:
        self.health.closed = False
        add_dra_services(server, self.preparer)
        add_health_services(server, self.health)

    async def _role_changed(self) -> None:
        await self.role.update()
        self.slices.resync_soon()

    def _on_registry_event(self, name: str, kind: str) -> None:
        if self._running and self.role.is_instance_socket(name):
            # another instance of this driver came or went (a rolling update)
            asyncio.get_running_loop().create_task(self._role_changed())

    async def stop(self) -> None:
        self._running = False
        await self.slices.stop_watch()
        self.kubelet.close_watch()
        await self.slices.stop_resync()
        await self.health.close()  # health streams end before the server stops
        await self.kubelet.stop()  # removes only the files this instance bound
        if self.settings.remove_slices_on_stop and self.api_ready:
            await self.role.remove_slices_if_last()

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
        await self.slices.publish()

    async def resync(self) -> None:
        """Check the API server now: reconnect if needed, recreate vanished slices."""
        await self.slices.resync()
