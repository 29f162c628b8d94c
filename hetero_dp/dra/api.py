"""The few API server calls DRA needs, over :class:`~hetero_dp.dra.client.KubeClient`.

Calls are blocking (plain ``http.client``); the driver runs them in worker
threads. Objects travel as plain dicts in the wire shape, so ``v1`` and
``v1beta1`` share one code path. Each call is one try: retrying is the
caller's, with :class:`~hetero_dp.dra.client.Backoff`.

Which ``resource.k8s.io`` version the server serves is read from the group's
discovery document (``GET /apis/resource.k8s.io``, readable by every
authenticated client through the ``system:discovery`` role) and kept per
process and server, so several drivers in one daemon ask once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from hetero_dp.dra.client import (
    REQUEST_TIMEOUT,
    APIError,
    Backoff,
    ClusterConfig,
    KubeClient,
    Stream,
    load_config,
)
from hetero_dp.dra.slices import GROUP, VERSIONS

__all__ = [
    "REQUEST_TIMEOUT",
    "APIError",
    "Backoff",
    "ClusterConfig",
    "KubeClient",
    "ResourceAPI",
    "Stream",
    "make_api_client",
]

# (server URL) -> (the resource.k8s.io versions it served when last asked, when)
_served: dict[str, tuple[tuple[str, ...], float]] = {}
_served_lock = threading.Lock()


def make_api_client(api_server: str | None = None, kubeconfig: str | None = None) -> KubeClient:
    """A client: ``api_server`` URL (no auth) if given, else in-cluster, else kubeconfig."""
    return KubeClient(load_config(api_server, kubeconfig))


def forget_served(server: str | None = None) -> None:
    """Drop the per-process record of served versions (one server, or all)."""
    with _served_lock:
        if server is None:
            _served.clear()
        else:
            _served.pop(server, None)


class ResourceAPI:
    """resource.k8s.io calls for one API version (chosen by :meth:`detect`)."""

    def __init__(self, api_client: KubeClient, version: str = "v1") -> None:
        self.api_client = api_client
        self.version = version

    def _path(self, *parts: str) -> str:
        return "/".join(["", "apis", GROUP, self.version, *parts])

    def served(self, *, max_age: float | None = None) -> tuple[str, ...]:
        """The versions of resource.k8s.io the server serves (discovery), kept per
        process; asked again when the answer is older than ``max_age`` seconds."""
        server = self.api_client.server
        with _served_lock:
            known = _served.get(server)
        if known is not None and (max_age is None or time.monotonic() - known[1] <= max_age):
            return known[0]
        try:
            group = self.api_client.request("GET", f"/apis/{GROUP}")
        except APIError as e:
            if e.status != 404:
                raise
            group = {}
        versions = tuple(
            str(v.get("version"))
            for v in group.get("versions") or []
            if isinstance(v, dict) and v.get("version")
        )
        with _served_lock:
            _served[server] = (versions, time.monotonic())
        return versions

    def detect(self, preferred: tuple[str, ...] = VERSIONS, *, max_age: float | None = None) -> str:
        """Pick the first of ``preferred`` the server serves (``max_age``: see :meth:`served`)."""
        served = self.served(max_age=max_age)
        for version in preferred:
            if version in served:
                self.version = version
                return version
        raise APIError(
            404,
            "NotFound",
            f"the API server serves none of {GROUP} {', '.join(preferred)}"
            + (f" (it serves {', '.join(served)})" if served else ""),
        )

    @staticmethod
    def _selector(driver: str, node: str) -> str:
        return f"spec.driver={driver},spec.nodeName={node}"

    def list_slices_rv(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        """The node's slices of ``driver`` and the list's resourceVersion (to watch from)."""
        body = self.api_client.request(
            "GET",
            self._path("resourceslices"),
            query={"fieldSelector": self._selector(driver, node)},
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items, str((body.get("metadata") or {}).get("resourceVersion") or "")

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        return self.list_slices_rv(driver, node)[0]

    def watch_slices(
        self, driver: str, node: str, resource_version: str, timeout_seconds: int
    ) -> Stream:
        """An open watch on the node's slices of ``driver`` (bookmarks asked for): one
        JSON event per line. The caller reads it and closes it."""
        return self.api_client.stream(
            self._path("resourceslices"),
            query={
                "fieldSelector": self._selector(driver, node),
                "watch": "true",
                "allowWatchBookmarks": "true",
                "resourceVersion": resource_version or None,
                "timeoutSeconds": timeout_seconds,
            },
            timeout=timeout_seconds + REQUEST_TIMEOUT,
        )

    def create_slice(self, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create a slice; ``dry_run``: the server validates, defaults and drops the
        fields of disabled features, answers what it would store, and stores nothing."""
        return self.api_client.request(
            "POST",
            self._path("resourceslices"),
            query={"dryRun": "All"} if dry_run else None,
            body=body,
        )

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api_client.request("PUT", self._path("resourceslices", name), body=body)

    def delete_slice(self, name: str) -> None:
        self.api_client.request("DELETE", self._path("resourceslices", name))

    def read_node(self, name: str) -> dict[str, Any]:
        """The Node object (core/v1), for an owner reference on the pool's slices."""
        return self.api_client.request("GET", f"/api/v1/nodes/{name}")

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api_client.request(
            "GET", self._path("namespaces", namespace, "resourceclaims", name)
        )
