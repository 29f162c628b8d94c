"""The fake kubelet's clients of plugin endpoints: dial-back, ListAndWatch, disconnects.

After a ``Register`` (or a watcher-mode registration) the kubelet dials the plugin
back on its endpoint, calls ``GetDevicePluginOptions`` (the options must agree with
the request) and only then answers; it opens ``ListAndWatch`` right after
registration and keeps the latest device set per resource
(docs/sources.md#device-plugin-api).

A second registration of a resource, and the end of a stream, behave as in the
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
instance that leaves after a new one registered takes the new one down too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.testing.fake_kubelet.devices import DeviceManager, FakeDevice, FakeResource

log = logging.getLogger(__name__)

DIAL_TIMEOUT = 10.0
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


class PluginClients:
    """The kubelet's client per plugin endpoint, and its ListAndWatch stream.

    ``notify`` is awaited after every change (the owner's change notification).
    ``open_streams=False`` registers plugins but never opens ListAndWatch.
    """

    def __init__(
        self,
        devices: DeviceManager,
        notify: Callable[[], Awaitable[None]],
        *,
        open_streams: bool = True,
    ) -> None:
        self.devices = devices
        self.notify = notify
        self.open_streams = open_streams
        # Every client the kubelet dialled and has not dropped: the current one per
        # name and the replaced ones whose streams still run.
        self.clients: list[FakeResource] = []
        # (resource, socket of the stream that ended, socket disconnected) per
        # disconnect the end of a stream caused (handler.go runClient).
        self.disconnects: list[tuple[str, str, str]] = []
        self._tearing_down = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in a task held (and cancelled by :meth:`cancel_tasks`) here."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_tasks(self) -> None:
        for t in list(self._tasks):
            t.cancel()

    async def connect(
        self,
        name: str,
        endpoint_path: str,
        request_options: pb.DevicePluginOptions | None,
        mode: str,
    ) -> str | None:
        """Dial the plugin back and make it the current client of ``name``: None when
        it was accepted, else why not."""
        channel = grpc.aio.insecure_channel(f"unix://{endpoint_path}", options=CHANNEL_OPTIONS)
        try:
            stub = pb_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(
                pb.Empty(), timeout=DIAL_TIMEOUT, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as e:
            await channel.close()
            return self.devices.reject(f"dial-back to {endpoint_path} failed: {e.code().name}")
        if request_options is not None and options != request_options:
            await channel.close()
            return self.devices.reject(
                f"options disagree: Register said {request_options!r}, "
                f"GetDevicePluginOptions said {options!r}"
            )
        res = FakeResource(name=name, endpoint=endpoint_path, options=options, mode=mode)
        old = self.devices.resources.get(name)
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
        self.devices.resources[name] = res
        self.clients.append(res)
        self.devices.registrations.append((name, mode))
        self.devices.record(name, "register")
        if self.open_streams:
            res.stream_task = asyncio.get_running_loop().create_task(self._stream(res, stub))
        await self.notify()
        return None

    async def _stream(self, res: FakeResource, stub: pb_grpc.DevicePluginStub) -> None:
        call = stub.ListAndWatch(pb.Empty())
        try:
            res.stream_open = True
            await self.notify()
            async for msg in call:
                # manager.go PluginListAndWatchReceiver: keyed by the resource name,
                # so a replaced client's updates still set the name's devices
                target = self.devices.resources.get(res.name, res)
                target.devices = {
                    d.ID: FakeDevice(d.ID, d.health, tuple(n.ID for n in d.topology.nodes))
                    for d in msg.devices
                }
                target.updates += 1
                target.generation += 1
                res.messages += 1
                self.devices.record(res.name, "update")
                await self.notify()
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
                self.devices.mark_unhealthy(res)
            else:
                self._client_ended(res)
            with contextlib.suppress(RuntimeError):
                await self.notify()

    def _client_ended(self, ended: FakeResource) -> None:
        """handler.go ``runClient`` after ``c.Run`` returns: disconnect the *current*
        client of the name (1.32 ``getClient(name)``), which need not be ``ended``."""
        if ended in self.clients:
            self.clients.remove(ended)
        if ended.channel is not None:  # ours to close; 1.32 leaks a replaced client's
            channel, ended.channel = ended.channel, None
            self.spawn(channel.close())
        cur = self.devices.resources.get(ended.name)
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
        self.devices.mark_unhealthy(cur)
        if cur is not ended:
            if cur in self.clients:
                self.clients.remove(cur)
            task, cur.stream_task = cur.stream_task, None
            channel, cur.channel = cur.channel, None
            if task is not None:
                task.cancel()
            if channel is not None:
                self.spawn(channel.close())

    async def drop(self, res: FakeResource) -> None:
        """Cancel ``res``'s stream and close its connection (no re-open)."""
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

    async def drop_all(self) -> None:
        """The kubelet dies: every stream ends and no ``runClient`` follows."""
        self._tearing_down = True
        try:
            for res in list(self.clients):
                await self.drop(res)
        finally:
            self._tearing_down = False

    def stub(self, name: str) -> pb_grpc.DevicePluginStub:
        """A stub on the current connection to ``name``'s endpoint."""
        res = self.devices.resources.get(name)
        if res is None or res.channel is None:
            raise KeyError(f"resource {name} is not registered")
        return pb_grpc.DevicePluginStub(res.channel)
