"""The fake kubelet's pods through their life: admitted through the plugin's Allocate,
listed by the pod-resources API, recorded in the device checkpoint, removed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from hetero_dp.api import deviceplugin_v1beta1_pb2 as dp_pb
from hetero_dp.testing.fake_kubelet.devices import DeviceManager
from hetero_dp.testing.fake_kubelet.podresources import PodResourcesServer
from hetero_dp.testing.fake_kubelet.pods import FakeContainer, FakePod, write_checkpoint

Allocate = Callable[..., Awaitable[dp_pb.ContainerAllocateResponse]]


class PodLife:
    """The fake kubelet's pods: admitted through Allocate, listed by the pod-resources
    API (:mod:`.podresources`) and recorded in the device checkpoint."""

    def __init__(self, plugin_dir: Path, devices: DeviceManager, allocate: Allocate) -> None:
        self.plugin_dir = plugin_dir
        self.devices = devices
        self.allocate = allocate
        self.pods: list[FakePod] = []  # in the order admitted
        self.server: PodResourcesServer | None = None
        self._paused = False

    async def serve(self, path: Path) -> Path:
        if self.server is None:
            self.server = PodResourcesServer(path, lambda: list(self.pods), self._healthy)
            await self.server.start()
        return self.server.path

    async def stop_serving(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None

    async def pause(self) -> None:
        """The kubelet stops: so does its pod-resources server."""
        if self.server is not None and not self._paused:
            self._paused = True
            await self.server.stop()

    async def resume(self) -> None:
        if self.server is not None and self._paused:
            self._paused = False
            await self.server.start()

    def _healthy(self) -> dict[str, list[str]]:
        return {name: res.healthy_ids for name, res in self.devices.resources.items()}

    def write(self) -> None:
        registered = {name: list(res.devices) for name, res in self.devices.resources.items()}
        write_checkpoint(self.plugin_dir, self.pods, registered)

    async def admit(
        self,
        name: str,
        containers: Mapping[str, Mapping[str, int]],
        namespace: str = "default",
        uid: str | None = None,
        timeout: float = 10.0,
    ) -> FakePod:
        """For each container and each resource it asks for (``{"main":
        {"example.com/acme": 1}}``), pick devices and call Allocate, as the device
        manager admits a pod; then list the pod and rewrite the checkpoint. A refusal
        releases what the pod took and raises."""
        pod = FakePod(name, namespace)
        if uid:
            pod.uid = uid
        try:
            for cname, wants in containers.items():
                c = FakeContainer(cname)
                pod.containers.append(c)
                for resource, count in wants.items():
                    _res, ids = self.devices.take(resource, count)
                    c.devices[resource] = ids
                    resp = await self.allocate(resource, ids, timeout=timeout)
                    c.responses[resource] = resp.SerializeToString()
        except BaseException:
            self.devices.release(pod.device_ids())
            raise
        self.pods.append(pod)
        self.write()
        return pod

    def remove(self, name: str, namespace: str) -> None:
        for pod in [p for p in self.pods if (p.name, p.namespace) == (name, namespace)]:
            self.pods.remove(pod)
            self.devices.release(pod.device_ids())
        self.write()
