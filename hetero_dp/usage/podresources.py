"""A client of the kubelet's pod-resources API (``List``), one call per refresh.

The kubelet serves ``v1.PodResourcesLister`` on ``<kubelet root>/pod-resources/
kubelet.sock`` (``k8s.io/kubelet/pkg/apis/podresources/v1``); ``List`` names every
pod's containers and the device IDs each holds, as the plugins advertised them (no
pod UID, no container ID). The kubelet rate-limits the service (its podresources
server's ``ratelimit.go``: 100 calls/s, a burst of 10, ``RESOURCE_EXHAUSTED``
beyond), so :class:`PodResourcesClient` calls it at most once per refresh, and
answers from the last list when asked again within :data:`MIN_GAP` seconds while the
kubelet's device checkpoint is unchanged (a pod that comes or goes rewrites it). Its answer is
bounded as the kubelet's own client bounds it (16 MiB, ``podresources``'
``DefaultMaxMsgSize``) and by :data:`DEADLINE`.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from hetero_dp.api import podresources_v1_pb2 as pb

LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_MESSAGE = 16 * 1024 * 1024
DEADLINE = 2.0  # seconds one List may take before the scrape goes on without it
MIN_GAP = 1.0  # seconds between two calls: scrapes closer than this share one answer
#: After RESOURCE_EXHAUSTED (someone else spends the kubelet's rate), the last list
#: answers for this long.
STALE_OK = 30.0


class PodResourcesUnavailable(Exception):
    """No list this time; the message says why (one line for the log)."""


@dataclass(frozen=True)
class ContainerDevices:
    """One container's device IDs of one resource, from ``List``."""

    pod: str
    namespace: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def flatten(resp: pb.ListPodResourcesResponse) -> list[ContainerDevices]:
    out = []
    for p in resp.pod_resources:
        for c in p.containers:
            for d in c.devices:
                if d.device_ids:
                    out.append(
                        ContainerDevices(
                            p.name, p.namespace, c.name, d.resource_name, tuple(d.device_ids)
                        )
                    )
    return out


class PodResourcesClient:
    """``List`` on the socket at ``path``, cached for :data:`MIN_GAP` seconds."""

    def __init__(self, path: str, *, deadline: float = DEADLINE, min_gap: float = MIN_GAP) -> None:
        self.path = path
        self.deadline = deadline
        self.min_gap = min_gap
        self.calls = 0  # Lists sent, for tests and the benchmark
        self._last: list[ContainerDevices] | None = None
        self._last_at = -1e9  # when the kubelet gave the last list
        self._tried_at = -1e9  # when the last call was sent
        self._answered = False  # whether that call's refresh has a list
        self._stamp: object = None  # the checkpoint's identity at that call

    def socket_problem(self) -> str | None:
        """Why there is no socket to call (None: there is one)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"no pod-resources socket at {self.path}"
        except OSError as e:
            return f"pod-resources socket {self.path}: {e.strerror}"
        if not stat.S_ISSOCK(st.st_mode):
            return f"{self.path} is not a socket"
        return None

    async def list(self, stamp: object = None) -> list[ContainerDevices]:
        """The pods' devices now (or as of at most ``min_gap`` seconds ago, when
        ``stamp``, the checkpoint's identity, is the same as then);
        :class:`PodResourcesUnavailable` when there is no answer."""
        now = time.monotonic()
        problem = self.socket_problem()
        if problem:
            # no call made: the next refresh with a socket asks at once
            self._last, self._answered, self._tried_at = None, False, -1e9
            raise PodResourcesUnavailable(problem)
        if now - self._tried_at < self.min_gap and stamp == self._stamp:
            if self._answered and self._last is not None:
                return self._last
            raise PodResourcesUnavailable(
                f"pod-resources asked less than {self.min_gap} s ago, without an answer"
            )
        self._tried_at, self._answered, self._stamp = now, False, stamp
        self.calls += 1
        try:
            # a connection per call (one per refresh): a restarted kubelet's new socket
            # is simply dialled, and nothing stays open between scrapes
            async with grpc.aio.insecure_channel(
                f"unix://{self.path}", options=[("grpc.max_receive_message_length", MAX_MESSAGE)]
            ) as channel:
                # the answer's bytes, parsed here: grpc's own parse of garbage logs
                # a traceback and answers None
                call = channel.unary_unary(
                    LIST_METHOD, request_serializer=pb.ListPodResourcesRequest.SerializeToString
                )
                data = await call(pb.ListPodResourcesRequest(), timeout=self.deadline)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if (
                code == grpc.StatusCode.RESOURCE_EXHAUSTED
                and self._last is not None
                and now - self._last_at <= STALE_OK
            ):
                self._answered = True
                return self._last
            self._last = None
            raise PodResourcesUnavailable(
                f"pod-resources List on {self.path}: {code.name}: {(e.details() or '')[:120]}"
            ) from None
        try:
            resp = pb.ListPodResourcesResponse.FromString(data)
        except (DecodeError, TypeError):
            self._last = None
            raise PodResourcesUnavailable(
                f"pod-resources List on {self.path} answered {len(data or b'')} bytes that are "
                "no ListPodResourcesResponse"
            ) from None
        self._last = flatten(resp)
        self._last_at, self._answered = now, True
        return self._last
