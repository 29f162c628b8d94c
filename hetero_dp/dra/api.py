"""The few API server calls DRA needs, through the official ``kubernetes`` client.

Calls are blocking (the client uses urllib3); the driver runs them in worker
threads. Objects travel as plain dicts in the wire shape (``_preload_content=False``
and our own JSON parsing), so ``v1`` and ``v1beta1`` share one code path.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from hetero_dp.dra.slices import VERSIONS

REQUEST_TIMEOUT = 10.0


class APIError(Exception):
    """An API server answer other than success, with its own reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"HTTP {status} {reason}: {message}")

    @classmethod
    def from_exception(cls, e: ApiException) -> APIError:
        reason, message = str(e.reason or ""), ""
        try:
            body = json.loads(e.body or "")
            reason = body.get("reason") or reason
            message = body.get("message") or ""
        except (ValueError, TypeError, AttributeError):
            message = str(e.body or "")[:500]
        return cls(int(e.status or 0), reason, message)


def make_api_client(api_server: str | None = None, kubeconfig: str | None = None) -> Any:
    """An ApiClient: ``api_server`` URL (no auth) if given, else in-cluster, else kubeconfig."""
    if api_server:
        cfg = k8s.Configuration()
        cfg.host = api_server.rstrip("/")
        return k8s.ApiClient(cfg)
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config()
        return k8s.ApiClient()
    return k8s_config.new_client_from_config(config_file=kubeconfig)


def _load(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data or b"{}")
    return data


class ResourceAPI:
    """resource.k8s.io calls for one API version (chosen by :meth:`detect`)."""

    def __init__(self, api_client: Any, version: str = "v1") -> None:
        self.api_client = api_client
        self.version = version

    def _api(self) -> Any:
        if self.version == "v1":
            return k8s.ResourceV1Api(self.api_client)
        return k8s.ResourceV1beta1Api(self.api_client)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            response = getattr(self._api(), method)(
                *args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs
            )
            return _load(response)
        except ApiException as e:
            raise APIError.from_exception(e) from None
        except (HTTPError, OSError) as e:
            raise APIError(0, "Unreachable", f"cannot reach the API server: {e}") from None

    def detect(self, preferred: tuple[str, ...] = VERSIONS) -> str:
        """Pick the first of ``preferred`` the server serves (a 404 list means not served)."""
        last: APIError | None = None
        for version in preferred:
            self.version = version
            try:
                self._call("list_resource_slice", limit=1)
                return version
            except APIError as e:
                if e.status != 404:
                    raise
                last = e
        raise APIError(
            404,
            "NotFound",
            f"the API server serves none of resource.k8s.io {', '.join(preferred)}"
            + (f" ({last.message})" if last and last.message else ""),
        )

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        body = self._call(
            "list_resource_slice", field_selector=f"spec.driver={driver},spec.nodeName={node}"
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def watch_slices(
        self, driver: str, node: str, resource_version: str, timeout_seconds: int
    ) -> Any:
        """An open watch on the node's slices of ``driver``: the raw urllib3 response,
        one JSON event per line. The caller reads it and closes it."""
        try:
            return self._api().list_resource_slice(
                field_selector=f"spec.driver={driver},spec.nodeName={node}",
                watch=True,
                resource_version=resource_version or None,
                timeout_seconds=timeout_seconds,
                _preload_content=False,
                _request_timeout=(REQUEST_TIMEOUT, timeout_seconds + REQUEST_TIMEOUT),
            )
        except ApiException as e:
            raise APIError.from_exception(e) from None
        except (HTTPError, OSError) as e:
            raise APIError(0, "Unreachable", f"cannot reach the API server: {e}") from None

    def create_slice(self, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create a slice; ``dry_run``: the server validates, defaults and drops the
        fields of disabled features, answers what it would store, and stores nothing."""
        if dry_run:
            return self._call("create_resource_slice", body, dry_run="All")
        return self._call("create_resource_slice", body)

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("replace_resource_slice", name, body)

    def delete_slice(self, name: str) -> None:
        self._call("delete_resource_slice", name)

    def read_node(self, name: str) -> dict[str, Any]:
        """The Node object (core/v1), for an owner reference on the pool's slices."""
        try:
            response = k8s.CoreV1Api(self.api_client).read_node(
                name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            return _load(response)
        except ApiException as e:
            raise APIError.from_exception(e) from None
        except (HTTPError, OSError) as e:
            raise APIError(0, "Unreachable", f"cannot reach the API server: {e}") from None

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call("read_namespaced_resource_claim", name, namespace)
