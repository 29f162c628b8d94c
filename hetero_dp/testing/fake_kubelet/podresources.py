"""The kubelet's pod-resources API over a real unix socket, fed from admitted pods.

``v1.PodResourcesLister`` (``k8s.io/kubelet/pkg/apis/podresources/v1``): ``List``
gives every pod's name, namespace, containers and each container's devices (the IDs
as the plugin advertised them; no pod UID, no container ID); ``Get`` one pod (NOT_FOUND
for another); ``GetAllocatableResources`` the healthy devices. Like the kubelet's
server (``pkg/kubelet/apis/podresources/grpc/ratelimit.go``: a token bucket of 100
calls/s with a burst of 10, ``codes.ResourceExhausted`` "rejected by rate limit"
beyond), calls past the bucket are refused. Test knobs: :attr:`hold` (set: answers
wait on it, a slow kubelet), :attr:`garbage` (answers bytes that are no message).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import podresources_v1_pb2 as pb
from hetero_dp.testing.fake_kubelet.pods import FakePod

RATE = 100.0  # calls per second (DefaultQPS)
BURST = 10  # DefaultBurstTokens
GARBAGE = b"\xff\xff\xff\xff\x0f"  # a varint that never ends: no message parses it


class TokenBucket:
    """golang.org/x/time/rate's limiter as the kubelet uses it (Allow: take a token or refuse)."""

    def __init__(self, rate: float = RATE, burst: int = BURST) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def _pod_message(p: FakePod) -> pb.PodResources:
    return pb.PodResources(
        name=p.name,
        namespace=p.namespace,
        containers=[
            pb.ContainerResources(
                name=c.name,
                devices=[
                    pb.ContainerDevices(resource_name=r, device_ids=ids)
                    for r, ids in c.devices.items()
                ],
            )
            for c in p.containers
        ],
    )


class PodResourcesServer:
    def __init__(
        self,
        path: Path,
        pods: Callable[[], list[FakePod]],
        allocatable: Callable[[], dict[str, list[str]]],
    ) -> None:
        self.path = path
        self.pods = pods
        self.allocatable = allocatable
        self.bucket = TokenBucket()
        self.calls = 0
        self.refused = 0
        self.hold: asyncio.Event | None = None
        self.garbage = False
        self._server: grpc.aio.Server | None = None

    async def _gate(self, context: grpc.aio.ServicerContext) -> None:
        self.calls += 1
        if not self.bucket.allow():
            self.refused += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        if self.hold is not None:
            await self.hold.wait()

    async def list(
        self, _req: pb.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        await self._gate(context)
        return pb.ListPodResourcesResponse(pod_resources=[_pod_message(p) for p in self.pods()])

    async def get(
        self, req: pb.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        await self._gate(context)
        for p in self.pods():
            if (p.name, p.namespace) == (req.pod_name, req.pod_namespace):
                return pb.GetPodResourcesResponse(pod_resources=_pod_message(p))
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {req.pod_name} not found in {req.pod_namespace}"
        )
        raise AssertionError("unreachable")

    async def allocatable_(
        self, _req: pb.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        await self._gate(context)
        return pb.AllocatableResourcesResponse(
            devices=[
                pb.ContainerDevices(resource_name=r, device_ids=ids)
                for r, ids in sorted(self.allocatable().items())
            ]
        )

    def _serialize(self, message: Any) -> bytes:
        return GARBAGE if self.garbage else message.SerializeToString()

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        handlers: dict[str, tuple[Any, Any]] = {
            "List": (self.list, pb.ListPodResourcesRequest),
            "Get": (self.get, pb.GetPodResourcesRequest),
            "GetAllocatableResources": (self.allocatable_, pb.AllocatableResourcesRequest),
        }
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "v1.PodResourcesLister",
                    {
                        name: grpc.unary_unary_rpc_method_handler(
                            fn,
                            request_deserializer=req.FromString,
                            response_serializer=self._serialize,
                        )
                        for name, (fn, req) in handlers.items()
                    },
                ),
            )
        )
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop and remove the socket (the kubelet gone)."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
