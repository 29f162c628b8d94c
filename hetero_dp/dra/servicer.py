"""The kubelet-facing gRPC services of a DRA driver.

``DRAPlugin`` in both wire versions (``v1`` and ``v1beta1`` carry the same
messages under different package names) and the ``pluginregistration``
service the kubelet's plugin watcher finds in ``plugins_registry``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import grpc

from hetero_dp.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from hetero_dp.dra.claimread import ClaimRef
from hetero_dp.dra.prepare import ClaimPreparer
from hetero_dp.engine.pluginwatcher import PluginWatcherServicer

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# Wire versions, newest first: (name in GetInfo, messages, services)
API_VERSIONS: tuple[tuple[str, ModuleType, ModuleType], ...] = (
    ("v1.DRAPlugin", dra_v1_pb2, dra_v1_pb2_grpc),
    ("v1beta1.DRAPlugin", dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
)
SUPPORTED_VERSIONS = [name for name, _, _ in API_VERSIONS]


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def make_servicer(pb: ModuleType, pb_grpc: ModuleType, preparer: ClaimPreparer) -> Any:
    """A ``DRAPlugin`` servicer for one wire version, backed by ``preparer``."""

    class Servicer(pb_grpc.DRAPluginServicer):  # type: ignore[name-defined]
        async def NodePrepareResources(
            self, request: Any, context: grpc.aio.ServicerContext
        ) -> Any:
            results = await preparer.prepare(_refs(request.claims))
            response = pb.NodePrepareResourcesResponse()
            for uid, result in results.items():
                entry = response.claims[uid]
                if result.error:
                    entry.error = result.error
                    continue
                for d in result.devices:
                    entry.devices.add(
                        request_names=d.request_names,
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        cdi_device_ids=d.cdi_device_ids,
                    )
            return response

        async def NodeUnprepareResources(
            self, request: Any, context: grpc.aio.ServicerContext
        ) -> Any:
            errors = await preparer.unprepare(_refs(request.claims))
            response = pb.NodeUnprepareResourcesResponse()
            for uid, error in errors.items():
                response.claims[uid].error = error
            return response

    return Servicer()


def add_dra_services(server: grpc.aio.Server, preparer: ClaimPreparer) -> None:
    for _name, pb, pb_grpc in API_VERSIONS:
        pb_grpc.add_DRAPluginServicer_to_server(make_servicer(pb, pb_grpc, preparer), server)


class DRARegistrationServicer(PluginWatcherServicer):
    """What the kubelet's plugin watcher asks a socket in ``plugins_registry`` of a DRA
    driver; its ``resource`` is the driver name."""

    def __init__(self, driver: str, endpoint: str, on_status: Callable[[bool, str], None]) -> None:
        super().__init__(PLUGIN_TYPE, SUPPORTED_VERSIONS, driver, endpoint, on_status)
