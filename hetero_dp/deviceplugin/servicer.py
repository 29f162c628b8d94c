"""The five DevicePlugin RPCs for one resource, on grpc.aio.

Only translation and error mapping live here: the logic is in
:class:`hetero_dp.engine.resource.Resource`. Every failure reaches the kubelet as a
gRPC status with a message naming the device IDs, never as a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.deviceplugin.contract import ServedResource, Session
from hetero_dp.deviceplugin.convert import allocate_response, list_and_watch_response
from hetero_dp.kits import observe
from hetero_dp.kits.decoding import Undecodable, lenient, refuse_undecodable
from hetero_dp.model.errors import AllocationError
from hetero_dp.model.response import ContainerResponse
from hetero_dp.model.wire import MAX_ANSWER_BYTES

log = logging.getLogger(__name__)

T = TypeVar("T")


def _status(code: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, code, grpc.StatusCode.INTERNAL)


def _fitting(answer: pb.AllocateResponse, resource: str, count: int) -> pb.AllocateResponse:
    """``answer``, or AllocationError when it is larger than the kubelet receives.
    The container gate bounds each device's items; many devices (or containers) in
    one request can still add up past the limit, and the kubelet would then see a
    transport error instead of the reason."""
    size = answer.ByteSize()
    if size > MAX_ANSWER_BYTES:
        raise AllocationError(
            f"{resource}: the Allocate answer for {count} devices would be {size} bytes; "
            f"the kubelet receives at most {MAX_ANSWER_BYTES} (4 MiB): the devices' nodes, "
            "mounts, env and annotations are too large together (request fewer devices)",
            code="RESOURCE_EXHAUSTED",
        )
    return answer


_RPCS = {
    "GetDevicePluginOptions": (grpc.unary_unary_rpc_method_handler, pb.Empty),
    "ListAndWatch": (grpc.unary_stream_rpc_method_handler, pb.Empty),
    "GetPreferredAllocation": (grpc.unary_unary_rpc_method_handler, pb.PreferredAllocationRequest),
    "Allocate": (grpc.unary_unary_rpc_method_handler, pb.AllocateRequest),
    "PreStartContainer": (grpc.unary_unary_rpc_method_handler, pb.PreStartContainerRequest),
}
_RESPONSES: dict[str, Any] = {
    "GetDevicePluginOptions": pb.DevicePluginOptions,
    "ListAndWatch": pb.ListAndWatchResponse,
    "GetPreferredAllocation": pb.PreferredAllocationResponse,
    "Allocate": pb.AllocateResponse,
    "PreStartContainer": pb.PreStartContainerResponse,
}


def add_to_server(servicer: DevicePluginServicer, server: grpc.aio.Server) -> None:
    """``pb_grpc.add_DevicePluginServicer_to_server``, with request decoders that hand
    an undecodable request to the method as
    :class:`hetero_dp.kits.decoding.Undecodable` (grpc would log a
    multi-line traceback and answer UNKNOWN)."""
    handlers = {
        rpc: kind(
            getattr(servicer, rpc),
            request_deserializer=lenient(request),
            response_serializer=_RESPONSES[rpc].SerializeToString,
        )
        for rpc, (kind, request) in _RPCS.items()
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers),)
    )


_Call = TypeVar("_Call", bound=Callable[..., Awaitable[Any]])


def _counted(method: _Call) -> _Call:
    """Count the kubelet's unary calls in flight, so a stop can let them finish before
    it ends the streams (kubelet 1.32 closes its connection when a stream ends, which
    would cancel them)."""

    async def counted(self: DevicePluginServicer, request: Any, context: Any) -> Any:
        tracked = self.call_started(context)
        try:
            return await method(self, request, context)
        finally:
            if not tracked:
                self.call_ended()

    counted.__name__ = method.__name__
    counted.__doc__ = method.__doc__
    return counted  # type: ignore[return-value]


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, resource: ServedResource, session: Session) -> None:
        self.resource = resource
        self.session = session  # the streams this servicer opens and closes count there
        self.calls_in_flight = 0  # Allocate, GetPreferredAllocation, PreStartContainer
        self.idle = asyncio.Event()
        self.idle.set()

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=self.resource.pre_start_required,
            get_preferred_allocation_available=self.resource.preferred_allocation_available,
        )

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        await refuse_undecodable(request, "GetDevicePluginOptions", self.resource.name, context)
        return self.options()

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        res = self.resource
        await refuse_undecodable(request, "ListAndWatch", res.name, context)
        state = res.state
        session = self.session
        session.open_streams += 1
        session.streams_opened += 1
        session.streams_changed.set()
        observe.emit("stream_opened", resource=res.name, open=session.open_streams)
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
            session.open_streams -= 1
            session.streams_changed.set()
            observe.emit("stream_closed", resource=res.name, open=session.open_streams)
            log.info("ListAndWatch closed", extra={"resource": res.name})

    async def _answer(
        self,
        rpc: str,
        context: grpc.aio.ServicerContext,
        work: Callable[[], Awaitable[T]],
        *,
        event: str | None = None,
        ids: list[str] | None = None,
    ) -> T:
        """Run one RPC's work: refusals become their gRPC status, anything else
        INTERNAL, with a message and a log line naming the resource (and ``ids``, which
        ``work`` may fill in); ``event`` is emitted with the time taken and the code."""
        res = self.resource
        start = time.perf_counter()
        code = "OK"
        fields: dict[str, object] = {"resource": res.name}
        if ids is not None:
            fields["devices"] = ids
        try:
            return await work()
        except AllocationError as e:
            code = e.code
            log.warning("%s refused: %s", rpc, e, extra=fields)
            await context.abort(_status(e.code), str(e))
            raise  # abort() raises; this line is for type checkers
        except Exception as e:
            code = "INTERNAL"
            log.exception("%s failed", rpc, extra=fields)
            await context.abort(grpc.StatusCode.INTERNAL, f"{res.name}: {rpc} failed: {e!r}")
            raise
        finally:
            if event is not None:
                observe.emit(event, seconds=time.perf_counter() - start, code=code, **fields)

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        # The kubelet's hot path, with fewer layers than the other calls (no _counted,
        # _answer or closure: two coroutine frames per call, not four); it counts itself
        # as _counted does and _allocate answers as _answer does.
        res = self.resource
        tracked = self.call_started(context)
        try:
            if isinstance(request, Undecodable):
                await refuse_undecodable(request, "Allocate", res.name, context)
            return await self._allocate(request, context)
        finally:
            if not tracked:
                self.call_ended()

    def call_started(self, context: Any) -> bool:
        """Count a call in flight until its RPC has ended, its answer sent (gRPC's done
        callback: after the status went out, also on abort, error or cancel), not only
        until the handler returned: a stop that ended the streams in between had
        kubelet 1.32 close the connection under an answer not yet written (the call
        cancelled, seen under load). True when the context tracks it; else (a context
        without callbacks, e.g. a benchmark's direct call) the caller ends it."""
        self.calls_in_flight += 1
        self.idle.clear()
        add = getattr(context, "add_done_callback", None)
        if add is None:
            return False
        add(lambda _ctx: self.call_ended())
        return True

    def call_ended(self) -> None:
        self.calls_in_flight -= 1
        if self.calls_in_flight == 0:
            self.idle.set()

    async def _allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        """Allocate's work: the resource answers (:meth:`~hetero_dp.engine.resource.
        Resource.answer`, which keeps the answers: a request answered before is answered
        with the message built then while nothing it depends on changed). The event and
        log lines are as for any call (see :meth:`_answer`)."""
        res = self.resource
        start = time.perf_counter()
        code = "OK"
        ids: list[str] = []
        try:
            creqs = request.container_requests
            if not creqs:
                raise AllocationError(f"{res.name}: Allocate with no container requests")
            # the request's own bytes: equal IDs serialize alike, and this is cheaper
            # than reading the IDs out of the message; the resource keeps the answers
            request_key = request.SerializeToString()
            kept = res.kept(request_key)  # answered before, nothing changed: as it was
            if kept is not None:
                answer, ids = kept
                return answer

            def containers() -> list[list[str]]:  # read only when not answered before
                return [list(c.devices_ids) for c in creqs]

            def convert(
                responses: list[ContainerResponse],
            ) -> tuple[pb.AllocateResponse, list[str]]:
                count = sum(len(c.devices_ids) for c in creqs)
                answer = _fitting(allocate_response(responses), res.name, count)
                return answer, list(creqs[-1].devices_ids)  # the last container's: the event

            answer, ids = await res.answer(request_key, containers, convert)
            if log.isEnabledFor(logging.DEBUG):
                # debug, not info: one log line per Allocate was a third of its cost
                # (benchmarks/bench_core.py); the "allocate" event still counts each one
                log.debug(
                    "allocated %s", ", ".join(ids), extra={"resource": res.name, "devices": ids}
                )
            return answer
        except AllocationError as e:
            code = e.code
            if not ids and request.container_requests:
                ids = list(request.container_requests[-1].devices_ids)
            log.warning("Allocate refused: %s", e, extra={"resource": res.name, "devices": ids})
            await context.abort(_status(e.code), str(e))
            raise  # abort() raises; this line is for type checkers
        except Exception as e:
            code = "INTERNAL"
            log.exception("Allocate failed", extra={"resource": res.name, "devices": ids})
            await context.abort(grpc.StatusCode.INTERNAL, f"{res.name}: Allocate failed: {e!r}")
            raise
        finally:
            observe.emit(
                "allocate",
                seconds=time.perf_counter() - start,
                code=code,
                resource=res.name,
                devices=ids,
            )

    @_counted
    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        res = self.resource
        await refuse_undecodable(request, "GetPreferredAllocation", res.name, context)

        async def work() -> pb.PreferredAllocationResponse:
            out = []
            for creq in request.container_requests:
                chosen = await res.preferred(
                    list(creq.available_deviceIDs),
                    list(creq.must_include_deviceIDs),
                    int(creq.allocation_size),
                )
                out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
            return pb.PreferredAllocationResponse(container_responses=out)

        return await self._answer(
            "GetPreferredAllocation", context, work, event="preferred_allocation"
        )

    @_counted
    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        await refuse_undecodable(request, "PreStartContainer", self.resource.name, context)
        ids = list(request.devices_ids)

        async def work() -> pb.PreStartContainerResponse:
            await self.resource.pre_start(ids)
            return pb.PreStartContainerResponse()

        return await self._answer("PreStartContainer", context, work, ids=ids)
