"""The floor: a bare grpc.aio DevicePlugin server, with no hetero-dp in it.

    python3 -m benchmarks._floor SOCKET [RESPONSE_FILE [PREFERRED_FILE]]
        [--register KUBELET_SOCKET RESOURCE]

Serves ``Allocate`` with the serialized ``AllocateResponse`` read from
RESPONSE_FILE (the very bytes hetero-dp answered), ``GetPreferredAllocation``
with the ``PreferredAllocationResponse`` in PREFERRED_FILE (likewise),
``ListAndWatch`` with one message then an endless wait, and
``GetDevicePluginOptions``. Prints ``ready`` once serving; with ``--register``
it then registers RESOURCE through the kubelet's socket as any device plugin
must (so that "start to registered and streaming" is timed the same way for the
floor as for hetero-dp). Stops on SIGTERM. The generated message module is loaded by file
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

API = Path(__file__).resolve().parent.parent / "hetero_dp" / "api"
SERVICE = "v1beta1.DevicePlugin"


def load_pb() -> ModuleType:
    spec = importlib.util.spec_from_file_location("floor_pb", API / "deviceplugin_v1beta1_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def handlers(pb: Any, response: Any, preferred: Any) -> grpc.GenericRpcHandler:
    forever = asyncio.Event()
    plugin_options = pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def allocate(request: Any, context: Any) -> Any:
        return response

    async def options(request: Any, context: Any) -> Any:
        return plugin_options

    async def preferred_allocation(request: Any, context: Any) -> Any:
        return preferred

    async def list_and_watch(request: Any, context: Any) -> Any:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="floor0", health="Healthy")])
        await forever.wait()

    methods = {
        "Allocate": grpc.unary_unary_rpc_method_handler(
            allocate,
            request_deserializer=pb.AllocateRequest.FromString,
            response_serializer=pb.AllocateResponse.SerializeToString,
        ),
        "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
            preferred_allocation,
            request_deserializer=pb.PreferredAllocationRequest.FromString,
            response_serializer=pb.PreferredAllocationResponse.SerializeToString,
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


async def register(pb: Any, kubelet_socket: str, socket: str, resource: str) -> None:
    """Register through kubelet.sock, as the kubelet's device manager expects."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        call = channel.unary_unary(
            "/v1beta1.Registration/Register",
            request_serializer=pb.RegisterRequest.SerializeToString,
            response_deserializer=pb.Empty.FromString,
        )
        request = pb.RegisterRequest(
            version="v1beta1",
            endpoint=Path(socket).name,
            resource_name=resource,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        await call(request, timeout=30)


async def serve(
    socket: str,
    response_file: str | None,
    preferred_file: str | None,
    registration: tuple[str, str] | None,
) -> None:
    pb = load_pb()
    response = pb.AllocateResponse()
    if response_file:
        response = pb.AllocateResponse.FromString(Path(response_file).read_bytes())
    preferred = pb.PreferredAllocationResponse()
    if preferred_file:
        preferred = pb.PreferredAllocationResponse.FromString(Path(preferred_file).read_bytes())
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handlers(pb, response, preferred),))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    if registration:
        await register(pb, registration[0], socket, registration[1])
    await stop.wait()
    await server.stop(0)


def main(argv: list[str]) -> None:
    registration = None
    if "--register" in argv:
        i = argv.index("--register")
        registration = (argv[i + 1], argv[i + 2])
        argv = argv[:i] + argv[i + 3 :]
    files = [*argv[1:], None, None]
    asyncio.run(serve(argv[0], files[0], files[1], registration))


if __name__ == "__main__":
    main(sys.argv[1:])
