"""The floor: a bare grpc.aio DevicePlugin server, with no hetero-dp in it.

    python3 -m benchmarks._floor SOCKET [RESPONSE_FILE]

Serves ``Allocate`` with the serialized ``AllocateResponse`` read from
RESPONSE_FILE (the very bytes hetero-dp answered), ``ListAndWatch`` with one
message then an endless wait, and ``GetDevicePluginOptions``. Prints ``ready``
once serving; stops on SIGTERM. The generated message module is loaded by file
path so that the hetero_dp package (pluggy, our modules) is not imported: the
floor's memory and start-up are grpc.aio's and protobuf's alone.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

API = Path(__file__).resolve().parent.parent / "hetero_dp" / "kubelet" / "api"
SERVICE = "v1beta1.DevicePlugin"


def load_pb() -> ModuleType:
    spec = importlib.util.spec_from_file_location("floor_pb", API / "deviceplugin_v1beta1_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def handlers(pb: Any, response: Any) -> grpc.GenericRpcHandler:
    forever = asyncio.Event()

    async def allocate(request: Any, context: Any) -> Any:
        return response

    async def options(request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions()

    async def list_and_watch(request: Any, context: Any) -> Any:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="floor0", health="Healthy")])
        await forever.wait()

    methods = {
        "Allocate": grpc.unary_unary_rpc_method_handler(
            allocate,
            request_deserializer=pb.AllocateRequest.FromString,
            response_serializer=pb.AllocateResponse.SerializeToString,
        ),
        "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
            options,
            request_deserializer=pb.Empty.FromString,
            response_serializer=pb.DevicePluginOptions.SerializeToString,
        ),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            list_and_watch,
            request_deserializer=pb.Empty.FromString,
            response_serializer=pb.ListAndWatchResponse.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


async def serve(socket: str, response_file: str | None) -> None:
    pb = load_pb()
    response = pb.AllocateResponse()
    if response_file:
        response = pb.AllocateResponse.FromString(Path(response_file).read_bytes())
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handlers(pb, response),))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
