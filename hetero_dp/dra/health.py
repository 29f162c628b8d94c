"""Device health to the kubelet: the DRA health service (KEP-4680).

The kubelet (1.34+, feature gate ResourceHealthStatus) opens
``DRAResourceHealth/NodeWatchResources`` on the driver's DRA socket and keeps
the stream open; each message lists every device of the driver with its
health, and the kubelet shows it in the status of the pods whose claims hold
those devices (``allocatedResourcesStatus``). Without the service the kubelet
logs ``Unimplemented`` every 5 s.

:class:`HealthFeed` holds the current list and a version; every served wire
version (``v1alpha1`` for kubelets 1.34-1.36, ``v1beta1`` and ``v1`` after)
streams it: the whole list at once, then again on each change. Streams end
when the feed closes, before the gRPC server stops (a stream blocked on
something else would hold the server's stop forever: docs/sources.md#grpc-aio-stop).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Iterable
from types import ModuleType
from typing import Any

import grpc

from hetero_dp.api import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_health_v1beta1_pb2,
    dra_health_v1beta1_pb2_grpc,
)
from hetero_dp.dra.names import device_name
from hetero_dp.kits.aiotools import with_timeout
from hetero_dp.model.device import Device

MAX_MESSAGE = 1024  # the kubelet cuts longer messages
# The list is sent again every HEARTBEAT seconds, with the time refreshed: the kubelet
# counts a device it has heard nothing of within its timeout as Unknown. We tell it
# HEALTH_TIMEOUT (v1beta1 and v1 carry the field); its default was not checked.
HEARTBEAT = 10.0
HEALTH_TIMEOUT = 60

# wire version -> (messages, services)
HEALTH_VERSIONS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1alpha1": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
    "v1beta1": (dra_health_v1beta1_pb2, dra_health_v1beta1_pb2_grpc),
    "v1": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
}


class HealthFeed:
    """The driver's devices and their health, with a version that moves on change."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.version = 0
        self.closed = False
        # DRA device name -> (healthy, reason, unix seconds of the last change)
        self.devices: dict[str, tuple[bool, str, int]] = {}
        self.heartbeat = HEARTBEAT
        self._cond = asyncio.Condition()

    async def update(self, devices: Iterable[Device]) -> None:
        now = int(time.time())
        fresh: dict[str, tuple[bool, str, int]] = {}
        for d in devices:
            name = device_name(d.id)
            old = self.devices.get(name)
            reason = "" if d.healthy else (d.reason or "unhealthy")
            same = old is not None and old[:2] == (d.healthy, reason)
            fresh[name] = old if same and old is not None else (d.healthy, reason, now)
        async with self._cond:
            if fresh != self.devices:
                self.devices = fresh
                self.version += 1
                self._cond.notify_all()

    async def close(self) -> None:
        async with self._cond:
            self.closed = True
            self._cond.notify_all()

    def _moved(self, seen: int) -> bool:
        return self.closed or self.version != seen

    async def changes(self) -> AsyncIterator[dict[str, tuple[bool, str, int]]]:
        """The device list now, then after every change and every ``heartbeat``
        seconds (times refreshed: the health is still current), until the feed closes."""
        seen = -1
        while True:
            fresh = True
            async with self._cond:
                try:
                    await with_timeout(
                        self._cond.wait_for(functools.partial(self._moved, seen)),
                        self.heartbeat if seen >= 0 else None,
                    )
                except asyncio.TimeoutError:
                    fresh = False
                if self.closed:
                    return
                seen = self.version
                snapshot = dict(self.devices)
            if not fresh:
                now = int(time.time())
                snapshot = {k: (h, r, now) for k, (h, r, _) in snapshot.items()}
            yield snapshot


def _response(pb: ModuleType, pool: str, devices: dict[str, tuple[bool, str, int]]) -> Any:
    response = pb.NodeWatchResourcesResponse()
    rich = "message" in pb.DeviceHealth.DESCRIPTOR.fields_by_name
    for name, (healthy, reason, since) in sorted(devices.items()):
        entry = response.devices.add(
            device=pb.DeviceIdentifier(pool_name=pool, device_name=name),
            health=pb.HEALTHY if healthy else pb.UNHEALTHY,
            last_updated_time=since,
        )
        if rich:
            entry.health_check_timeout_seconds = HEALTH_TIMEOUT
            if reason:
                entry.message = reason[:MAX_MESSAGE]
    return response


def make_health_servicer(pb: ModuleType, pb_grpc: ModuleType, feed: HealthFeed) -> Any:
    class Servicer(pb_grpc.DRAResourceHealthServicer):  # type: ignore[name-defined]
        async def NodeWatchResources(
            self, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async for devices in feed.changes():
                yield _response(pb, feed.pool, devices)

    return Servicer()


def add_health_services(server: grpc.aio.Server, feed: HealthFeed) -> None:
    for pb, pb_grpc in HEALTH_VERSIONS.values():
        pb_grpc.add_DRAResourceHealthServicer_to_server(
            make_health_servicer(pb, pb_grpc, feed), server
        )
