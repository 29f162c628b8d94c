"""The five DevicePlugin RPCs for one resource, on grpc.aio.

Only translation and error mapping live here: the logic is in
:class:`hetero_dp.resource.Resource`. Every failure reaches the kubelet as a
gRPC status with a message naming the device IDs, never as a traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import grpc

from .. import observe
from ..errors import AllocationError
from ..resource import Resource
from .api import deviceplugin_v1beta1_pb2 as pb
from .api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from .convert import container_response_to_pb, list_and_watch_response

log = logging.getLogger(__name__)


def _status(code: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, code, grpc.StatusCode.INTERNAL)


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, resource: Resource) -> None:
        self.resource = resource

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=self.resource.pre_start_required,
            get_preferred_allocation_available=self.resource.preferred_allocation_available,
        )

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return self.options()

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        res = self.resource
        state = res.state
        res.open_streams += 1
        res.streams_changed.set()
        observe.emit("stream_opened", resource=res.name, open=res.open_streams)
        log.info("ListAndWatch opened", extra={"resource": res.name})
        try:
            version: int | None = state.version
            yield list_and_watch_response(state.devices)
            while True:
                assert version is not None
                version = await state.wait_newer(version)
                if version is None:  # the resource is stopping: end the stream
                    return
                yield list_and_watch_response(state.devices)
        finally:
            res.open_streams -= 1
            res.streams_changed.set()
            observe.emit("stream_closed", resource=res.name, open=res.open_streams)
            log.info("ListAndWatch closed", extra={"resource": res.name})

    async def _fail(self, context: grpc.aio.ServicerContext, e: AllocationError) -> None:
        await context.abort(_status(e.code), str(e))

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        res = self.resource
        start = time.perf_counter()
        code = "OK"
        ids: list[str] = []
        try:
            if not request.container_requests:
                raise AllocationError(f"{res.name}: Allocate with no container requests")
            responses = []
            for creq in request.container_requests:
                ids = list(creq.devices_ids)
                responses.append(container_response_to_pb(await res.allocate(ids)))
            log.info("allocated %s", ", ".join(ids), extra={"resource": res.name, "devices": ids})
            return pb.AllocateResponse(container_responses=responses)
        except AllocationError as e:
            code = e.code
            log.warning("Allocate refused: %s", e, extra={"resource": res.name, "devices": ids})
            await self._fail(context, e)
            raise  # abort() raises; this line is for type checkers
        except Exception as e:
            code = "INTERNAL"
            log.exception("Allocate failed", extra={"resource": res.name, "devices": ids})
            await context.abort(grpc.StatusCode.INTERNAL, f"{res.name}: allocate failed: {e!r}")
            raise
        finally:
            observe.emit(
                "allocate",
                resource=res.name,
                seconds=time.perf_counter() - start,
                code=code,
                devices=ids,
            )

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        res = self.resource
        start = time.perf_counter()
        code = "OK"
        try:
            out = []
            for creq in request.container_requests:
                chosen = await res.preferred(
                    list(creq.available_deviceIDs),
                    list(creq.must_include_deviceIDs),
                    int(creq.allocation_size),
                )
                out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
            return pb.PreferredAllocationResponse(container_responses=out)
        except AllocationError as e:
            code = e.code
            log.warning("GetPreferredAllocation refused: %s", e, extra={"resource": res.name})
            await self._fail(context, e)
            raise
        except Exception as e:
            code = "INTERNAL"
            log.exception("GetPreferredAllocation failed", extra={"resource": res.name})
            await context.abort(grpc.StatusCode.INTERNAL, f"{res.name}: preferred failed: {e!r}")
            raise
        finally:
            observe.emit(
                "preferred_allocation",
                resource=res.name,
                seconds=time.perf_counter() - start,
                code=code,
            )

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        try:
            await self.resource.pre_start(list(request.devices_ids))
        except AllocationError as e:
            await self._fail(context, e)
        return pb.PreStartContainerResponse()
