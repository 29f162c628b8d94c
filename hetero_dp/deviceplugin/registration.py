"""Registering a resource with the kubelet.

Classic mode calls ``Registration.Register`` on ``kubelet.sock`` (the plugin is
already serving: the kubelet dials back before it answers). Watcher mode serves
``pluginregistration.Registration`` on a socket in ``plugins_registry`` and the
kubelet comes to us.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.engine.pluginwatcher import PluginWatcherServicer
from hetero_dp.kits.aiotools import wait_event
from hetero_dp.model.names import API_VERSION

log = logging.getLogger(__name__)

REGISTER_TIMEOUT = 15.0
MAX_BACKOFF = 5.0


async def register_once(
    kubelet_socket: Path, endpoint: str, resource: str, options: pb.DevicePluginOptions
) -> None:
    """One ``Register`` call; raises grpc.aio.AioRpcError with the kubelet's reason."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        await stub.Register(
            pb.RegisterRequest(
                version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options
            ),
            timeout=REGISTER_TIMEOUT,
        )


async def register_with_backoff(
    kubelet_socket: Path,
    endpoint: str,
    resource: str,
    options: pb.DevicePluginOptions,
    kubelet_appeared: asyncio.Event,
    on_failure: Callable[[str], None] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> int | None:
    """Register until it works; returns the number of attempts, or None when
    ``stopping()`` turned true (checked before every attempt and after every wait).

    Waits between attempts with exponential backoff (50 ms to 5 s), cut short
    when ``kubelet_appeared`` is set (``kubelet.sock`` was just created).
    """
    delay = 0.05
    attempt = 0
    while not stopping():
        attempt += 1
        kubelet_appeared.clear()
        try:
            await register_once(kubelet_socket, endpoint, resource, options)
            return attempt
        except grpc.aio.AioRpcError as e:
            reason = f"{e.code().name}: {e.details()}"
        except OSError as e:
            reason = repr(e)
        if not kubelet_socket.exists():
            reason = f"{kubelet_socket} does not exist (is the kubelet running?); {reason}"
        log.warning(
            "registration with the kubelet failed (attempt %d): %s; retrying in %.2fs",
            attempt,
            reason,
            delay,
            extra={"resource": resource},
        )
        if on_failure is not None:
            on_failure(reason)
        await wait_event(kubelet_appeared, delay)
        delay = min(delay * 2, MAX_BACKOFF)
    return None


class WatcherRegistrationServicer(PluginWatcherServicer):
    """``pluginregistration.Registration`` for one device-plugin resource."""

    def __init__(
        self, resource: str, endpoint: str, on_status: Callable[[bool, str], None]
    ) -> None:
        super().__init__("DevicePlugin", [API_VERSION], resource, endpoint, on_status)
