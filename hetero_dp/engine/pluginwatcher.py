"""What a socket in the kubelet's ``plugins_registry`` answers: the kubelet's plugin
watcher finds the socket, asks ``GetInfo`` (type, name, endpoint, versions) and reports
back with ``NotifyRegistrationStatus``. Both front ends register through it: a device
plugin in watcher mode (type ``DevicePlugin``) and a DRA driver (type ``DRAPlugin``);
the protocol is ``pkg/kubelet/pluginmanager`` (docs/sources.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc


class PluginWatcherServicer(reg_grpc.RegistrationServicer):
    """``pluginregistration.Registration`` for one plugin socket: ``plugin_type`` and
    ``versions`` say what kind of plugin this is; ``resource`` is the name the kubelet
    registers (a device-plugin resource, a DRA driver); ``on_status`` hears the
    kubelet's verdict (registered, error)."""

    def __init__(
        self,
        plugin_type: str,
        versions: Sequence[str],
        resource: str,
        endpoint: str,
        on_status: Callable[[bool, str], None],
    ) -> None:
        self.plugin_type = plugin_type
        self.versions = list(versions)
        self.resource = resource
        self.endpoint = endpoint
        self.on_status = on_status

    async def GetInfo(
        self, request: reg_pb.InfoRequest, context: grpc.aio.ServicerContext
    ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type=self.plugin_type,
            name=self.resource,
            endpoint=self.endpoint,
            supported_versions=self.versions,
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> reg_pb.RegistrationStatusResponse:
        self.on_status(request.plugin_registered, request.error)
        return reg_pb.RegistrationStatusResponse()
