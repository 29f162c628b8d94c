"""Rolling updates: several instances of one DRA driver on a node, one publishing.

During a rolling update with ``POD_UID`` an old and a new pod serve side by side, each
with its own registration socket. Only the newest live instance publishes the pool
(the one the kubelet uses: its plugin manager takes the most recent registration of a
driver), and the last one to leave removes the slices.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.dra.publisher import SlicePublisher

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 2.0


class InstanceRole:
    """Which instance of driver ``name`` publishes: this one (registration socket
    ``registry_socket``, service socket ``socket_path``) or a newer one."""

    def __init__(
        self, name: str, socket_path: Path, registry_socket: Path, publisher: SlicePublisher
    ) -> None:
        self.name = name
        self.socket_path = socket_path
        self.registry_socket = registry_socket
        self.publisher = publisher

    def is_instance_socket(self, name: str) -> bool:
        """True if ``name`` in ``plugins_registry`` may be another instance's
        registration socket."""
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
            if not self.is_instance_socket(path.name):
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

    async def update(self) -> None:
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

    async def remove_slices_if_last(self) -> None:
        """On a clean stop: remove the pool's slices, unless another instance still
        serves this node (it publishes them from now on)."""
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
