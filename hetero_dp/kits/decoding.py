"""Requests that protobuf cannot decode answer INVALID_ARGUMENT with one log line,
never grpc's multi-line traceback and UNKNOWN: for every gRPC server of both front ends
(the DevicePlugin service decodes leniently itself; the servers whose services come from
generated code (DRA, plugin-watcher registration) get :class:`DecodeGuard`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)


class Undecodable:
    """What a request that protobuf cannot decode arrives as (instead of grpc's
    traceback and UNKNOWN): the method answers INVALID_ARGUMENT and logs one line."""

    __slots__ = ("error", "size")

    def __init__(self, error: Exception, size: int) -> None:
        self.error = error
        self.size = size


def lenient(message: type[Any]) -> Callable[[bytes], Any]:
    """A request decoder for ``message`` that hands a body protobuf cannot decode on as
    :class:`Undecodable` (the method then refuses it with :func:`refuse_undecodable`)."""

    def decode(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except Exception as e:
            return Undecodable(e, len(data))

    return decode


async def refuse_undecodable(
    request: object, rpc: str, name: str, context: grpc.aio.ServicerContext
) -> None:
    """Abort with INVALID_ARGUMENT (and one log line) if ``request`` did not decode."""
    if isinstance(request, Undecodable):
        log.warning(
            "%s refused: a request of %d bytes that is no valid %s message: %s",
            rpc,
            request.size,
            rpc,
            request.error,
            extra={"resource": name} if name else None,
        )
        where = f"{name}: " if name else ""
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{where}{rpc}: the request is not a valid protobuf message: {request.error}",
        )


class DecodeGuard(grpc.aio.ServerInterceptor):
    """For the servers whose services come from generated code (DRA, registration):
    every unary request is decoded leniently, and one that does not decode answers
    INVALID_ARGUMENT with one log line, as the DevicePlugin service does."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            return handler
        rpc = str(handler_call_details.method).rpartition("/")[2]
        decode = handler.request_deserializer

        def tolerant(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception as e:
                return Undecodable(e, len(data))

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await refuse_undecodable(request, rpc, "", context)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=tolerant,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await refuse_undecodable(request, rpc, "", context)
                async for item in inner_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=tolerant,
                response_serializer=handler.response_serializer,
            )
        return handler
