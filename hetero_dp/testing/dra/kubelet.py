""":class:`FakeDRAKubelet`: the kubelet's DRA manager as a driver sees it.

It behaves as the kubelet's DRA manager does toward a
driver (docs/sources.md#dra-kubelet): it finds registration sockets in
``plugins_registry``, calls ``GetInfo`` (type ``DRAPlugin``, a non-empty
``supported_versions``), picks the newest wire version both sides speak
(``v1.DRAPlugin``, then ``v1beta1.DRAPlugin``; a 1.32-1.33 kubelet is
``versions=("v1beta1",)``), answers ``NotifyRegistrationStatus``, and drops
the driver when its socket disappears. Pods prepare claims through it with
reference counting: a claim shared by several pods is prepared once and
unprepared only when the last pod lets go.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.dra.names import is_dns_subdomain
from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.testing.dra.apiserver import FakeAPIServer
from hetero_dp.testing.pluginwatch import NOT_MINE, dial_registration
from hetero_dp.testing.waiting import ChangeWaiter

DIAL_TIMEOUT = 10.0

WIRE = {
    "v1": ("v1.DRAPlugin", dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": ("v1beta1.DRAPlugin", dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


@dataclass
class DRAPlugin:
    """A driver the fake kubelet registered."""

    name: str
    endpoint: str
    version: str  # "v1" or "v1beta1"
    registry_socket: str
    supported_versions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceHealthStatus:
    """One device's health as the kubelet last heard it on the health stream."""

    pool: str
    health: str  # HEALTHY, UNHEALTHY, UNKNOWN
    message: str
    last_updated: int


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, claim: dict[str, Any]) -> ClaimRef:
        m = claim["metadata"]
        return cls(m.get("namespace", "default"), m["name"], m["uid"])


class FakeDRAKubelet(ChangeWaiter):
    """``async with FakeDRAKubelet(registry_dir) as kubelet: ...`` — see the module docstring."""

    def __init__(
        self,
        registry_dir: str | Path,
        *,
        versions: Sequence[str] = ("v1", "v1beta1"),
        api: FakeAPIServer | None = None,
        node: str = "",
    ) -> None:
        self.registry_dir = Path(registry_dir)
        # With an API server and a node name, starting wipes the node's ResourceSlices,
        # as the real kubelet's DRA manager does when it starts (issue 19 saw the node
        # advertise nothing for 5-28 s after each kubelet restart until drivers noticed).
        self.api = api
        self.node = node
        self.versions = tuple(versions)  # newest first
        self.plugins: dict[str, DRAPlugin] = {}  # driver -> the instance in use
        # driver -> its registered instances, oldest first. Since 1.33 the kubelet
        # keeps several registrations of one driver (rolling updates: sockets named
        # per pod, see k8s.io/dynamic-resource-allocation/kubeletplugin RollingUpdate),
        # uses the most recent one and falls back to the others when it goes.
        self.instances: dict[str, list[DRAPlugin]] = {}
        self.registrations: list[tuple[str, str]] = []  # (driver, version)
        self.rejections: list[str] = []
        self.calls: list[tuple[str, str, list[str]]] = []  # (method, driver, claim UIDs)
        self.prepared: dict[str, Any] = {}  # claim UID -> NodePrepareResourceResponse
        self.claim_pods: dict[str, set[str]] = {}  # claim UID -> pods using it
        self._claim_refs: dict[str, tuple[str, ClaimRef]] = {}  # UID -> (driver, ref)
        self.health: dict[str, dict[str, DeviceHealthStatus]] = {}  # driver -> device -> ...
        self.health_errors: list[str] = []
        self.health_messages: dict[str, int] = {}  # driver -> messages received
        self._init_changes()
        self._watcher: DirectoryWatcher | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FakeDRAKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        if self.api is not None and self.node:
            self.api.wipe_node(self.node)
        self._watcher = DirectoryWatcher(self.registry_dir, self._on_event)
        self._watcher.start()
        for entry in sorted(self.registry_dir.iterdir()):  # the plugin watcher's first walk
            self._on_event(entry.name, "created")

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        for t in list(self._tasks):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def restart(self) -> None:
        """Forget the drivers and find them again (the kubelet restarted)."""
        await self.stop()
        self.plugins.clear()
        self.instances.clear()
        await self.start()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_event(self, name: str, kind: str) -> None:
        path = self.registry_dir / name
        if kind == "created":
            self._spawn(self._register(path))
        elif kind == "deleted":
            for name, instances in list(self.instances.items()):
                left = [p for p in instances if p.registry_socket != str(path)]
                if len(left) == len(instances):
                    continue
                if left:
                    self.instances[name] = left
                    self.plugins[name] = left[-1]
                else:
                    del self.instances[name]
                    self.plugins.pop(name, None)
                self._spawn(self._notify())

    async def _register(self, path: Path) -> None:
        verdict = await dial_registration(
            path, functools.partial(self._judge, path), self._reject, timeout=DIAL_TIMEOUT
        )
        if verdict is not NOT_MINE:
            await self._notify()  # once the plugin has its verdict

    async def _judge(self, path: Path, info: reg_pb.PluginInfo) -> object:
        """The DRA handler's verdict on a plugin's ``GetInfo`` (NOT_MINE for another
        handler's plugin, such as a device plugin in watcher mode)."""
        if info.type != "DRAPlugin":
            return NOT_MINE
        problem, chosen = None, None
        offered = list(info.supported_versions)
        if not offered:
            problem = "empty list of supported versions"
        elif not is_dns_subdomain(info.name):
            problem = f"driver name {info.name!r} is not a DNS subdomain"
        else:
            chosen = next((v for v in self.versions if f"{v}.DRAPlugin" in offered), None)
            if chosen is None:
                problem = f"none of the versions {offered} is supported (kubelet: {self.versions})"
        if problem is None and not Path(info.endpoint).is_socket():
            problem = f"endpoint {info.endpoint} is not a socket"
        if problem is None:
            assert chosen is not None
            plugin = DRAPlugin(info.name, info.endpoint, chosen, str(path), offered)
            same = [p for p in self.instances.get(info.name, []) if p.registry_socket != str(path)]
            self.instances[info.name] = [*same, plugin]
            self.plugins[info.name] = plugin
            self.registrations.append((info.name, chosen))
        else:
            self.rejections.append(problem)
        return problem

    async def _reject(self, why: str) -> None:
        self.rejections.append(why)
        await self._notify()

    async def wait_registered(
        self, driver: str, *, after: int = 0, timeout: float = 10.0
    ) -> DRAPlugin:
        """Wait until ``driver`` has registered more than ``after`` times and is current."""

        def done() -> bool:
            n = sum(1 for d, _ in self.registrations if d == driver)
            return n > after and driver in self.plugins

        await self.wait_for(done, timeout)
        return self.plugins[driver]

    # --- RPCs ------------------------------------------------------------

    async def _rpc(self, method: str, driver: str, refs: Sequence[ClaimRef]) -> Any:
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        _name, pb, pb_grpc = WIRE[plugin.version]
        claims = [pb.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
        self.calls.append((method, driver, [r.uid for r in refs]))
        async with grpc.aio.insecure_channel(f"unix://{plugin.endpoint}") as channel:
            stub = pb_grpc.DRAPluginStub(channel)
            request_type = getattr(pb, f"{method}Request")
            return await getattr(stub, method)(request_type(claims=claims), timeout=DIAL_TIMEOUT)

    # --- device health (KEP-4680) -----------------------------------------

    async def watch_health(self, driver: str, version: str = "v1alpha1") -> None:
        """Open the driver's health stream as the kubelet does and keep it open.

        Kubelets 1.34-1.36 call ``/v1alpha1.DRAResourceHealth/NodeWatchResources``
        on the DRA socket and retry every 5 s when it fails; later ones also speak
        ``v1beta1`` and ``v1``. What arrives is in :attr:`health`.
        """
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        from hetero_dp.dra.health import HEALTH_VERSIONS

        pb, pb_grpc = HEALTH_VERSIONS[version]
        opened = asyncio.Event()

        async def run() -> None:
            async with grpc.aio.insecure_channel(f"unix://{plugin.endpoint}") as channel:
                stream = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                    pb.NodeWatchResourcesRequest()
                )
                opened.set()
                try:
                    async for response in stream:
                        self.health_messages[driver] = self.health_messages.get(driver, 0) + 1
                        # each message is the complete list for the driver
                        self.health[driver] = {
                            d.device.device_name: DeviceHealthStatus(
                                pool=d.device.pool_name,
                                health=pb.HealthStatus.Name(d.health),
                                message=getattr(d, "message", ""),
                                last_updated=d.last_updated_time,
                            )
                            for d in response.devices
                        }
                        await self._notify()
                except grpc.aio.AioRpcError as e:
                    self.health_errors.append(f"{driver}: {e.code().name}: {e.details()}")
                    await self._notify()

        self._spawn(run())
        await opened.wait()

    def pod_resource_status(self, pod: str) -> list[dict[str, Any]]:
        """``status.containerStatuses[].allocatedResourcesStatus`` of a pod, as the
        kubelet fills it from the health stream (KEP-4680): one entry per claim
        request, ``claim:<claim>/<request>``, listing each device with ``Healthy``,
        ``Unhealthy`` or ``Unknown``. The device's ``resourceID`` is its first CDI
        device ID, or ``<driver>/<pool>/<device>`` when it has none (kubelet 1.36
        ``pkg/kubelet/cm/dra/manager.go`` ``buildResourceHealth``)."""
        words = {"HEALTHY": "Healthy", "UNHEALTHY": "Unhealthy"}
        out: dict[str, list[dict[str, str]]] = {}
        for uid, pods in sorted(self.claim_pods.items()):
            if pod not in pods:
                continue
            driver, ref = self._claim_refs[uid]
            for d in self.prepared[uid].devices:
                known = self.health.get(driver, {}).get(d.device_name)
                health = words.get(known.health, "Unknown") if known else "Unknown"
                cdi = list(d.cdi_device_ids)
                resource_id = cdi[0] if cdi else f"{driver}/{d.pool_name}/{d.device_name}"
                for request in d.request_names:
                    out.setdefault(f"claim:{ref.name}/{request}", []).append(
                        {"resourceID": resource_id, "health": health}
                    )
        return [{"name": k, "resources": v} for k, v in sorted(out.items())]

    async def node_prepare(self, driver: str, refs: Sequence[ClaimRef]) -> Any:
        """One raw NodePrepareResources call (no reference counting)."""
        return await self._rpc("NodePrepareResources", driver, refs)

    async def node_unprepare(self, driver: str, refs: Sequence[ClaimRef]) -> Any:
        """One raw NodeUnprepareResources call."""
        return await self._rpc("NodeUnprepareResources", driver, refs)

    async def prepare_pod(self, pod: str, driver: str, refs: Sequence[ClaimRef]) -> dict[str, Any]:
        """Prepare a pod's claims: only claims no other pod holds reach the driver.

        Returns claim UID -> NodePrepareResourceResponse for every claim. A claim
        whose answer carries an error is not recorded as prepared, and the pod
        holds none of its claims until a retry prepares them all (as the kubelet
        retries a pod whose claims failed).
        """
        fresh = [r for r in refs if r.uid not in self.prepared]
        failed: dict[str, Any] = {}
        if fresh:
            response = await self.node_prepare(driver, fresh)
            missing = [r.uid for r in fresh if r.uid not in response.claims]
            if missing:
                raise AssertionError(f"driver answered no entry for claims {missing}")
            for r in fresh:
                entry = response.claims[r.uid]
                if entry.error:
                    failed[r.uid] = entry
                else:  # prepared claims stay prepared while the pod waits for the others
                    self.prepared[r.uid] = entry
                    self._claim_refs[r.uid] = (driver, r)
        if not failed:  # the pod starts only when all its claims are prepared
            for r in refs:
                self.claim_pods.setdefault(r.uid, set()).add(pod)
        return {r.uid: failed.get(r.uid) or self.prepared[r.uid] for r in refs}

    async def unprepare_pod(self, pod: str) -> list[str]:
        """Release a pod's claims; unprepare those no pod holds any more. Returns their UIDs."""
        last: dict[str, list[ClaimRef]] = {}
        for uid, pods in list(self.claim_pods.items()):
            if pod in pods:
                pods.discard(pod)
                if not pods:
                    driver, ref = self._claim_refs[uid]
                    last.setdefault(driver, []).append(ref)
        done = []
        for driver, refs in last.items():
            response = await self.node_unprepare(driver, refs)
            for r in refs:
                entry = response.claims.get(r.uid)
                if entry is None or entry.error:
                    raise AssertionError(
                        f"unprepare of {r.uid} failed: {entry.error if entry else 'no entry'}"
                    )
                del self.claim_pods[r.uid]
                self.prepared.pop(r.uid, None)
                self._claim_refs.pop(r.uid, None)
                done.append(r.uid)
        return done
