"""The objects the stand-in API server answers with, and its request log.

``Status`` bodies as the real server sends them on failure (kind ``Status``,
``reason``, ``code``), an allocated ``ResourceClaim`` as the scheduler leaves it
(:func:`make_claim`), and each request answered (:class:`Request`) with the verb an
audit log would name it by (:func:`verb`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hetero_dp.testing.dra.apiserver.schema import GROUP


@dataclass
class Request:
    method: str
    path: str
    status: int
    auth: str = ""  # the Authorization header, as sent
    at: float = field(default_factory=time.monotonic)  # when it was recorded (answered)


def verb(r: Request) -> str:
    url = urlsplit(r.path)
    parts = [p for p in url.path.split("/") if p]
    if r.method == "WATCH":
        return "WATCH"
    if parts == ["apis", GROUP]:
        return "DISCOVERY"
    collection = len(parts) % 2 == 0 if parts[:1] == ["apis"] else len(parts) == 3
    if r.method == "GET":
        return "LIST" if collection else "GET"
    if r.method == "POST":
        return "DRYRUN" if "dryRun=" in url.query else "CREATE"
    return {"PUT": "UPDATE", "DELETE": "DELETE"}.get(r.method, r.method)


class RequestLog:
    """Every request answered, in order; ``cond`` is notified on each."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.requests: list[Request] = []

    def record(self, request: Request) -> None:
        with self.cond:
            self.requests.append(request)
            self.cond.notify_all()

    def writes(self) -> list[Request]:
        """The slice writes (POST, PUT, DELETE) received so far; dry runs are not writes."""
        with self.cond:
            return [
                r
                for r in self.requests
                if r.method in ("POST", "PUT", "DELETE")
                and "/resourceslices" in r.path
                and "dryRun=" not in r.path
            ]

    def verbs(self, since: int = 0) -> dict[str, int]:
        """Requests from ``requests[since:]`` by verb, as an audit log names them:
        LIST, WATCH, GET, CREATE, UPDATE, DELETE, DRYRUN (a dry-run create) and
        DISCOVERY; FAILED counts answers of 400 and up as well."""
        counts: dict[str, int] = {}
        with self.cond:
            requests = self.requests[since:]
        for r in requests:
            v = verb(r)
            counts[v] = counts.get(v, 0) + 1
            if r.status >= 400:
                counts["FAILED"] = counts.get("FAILED", 0) + 1
        return counts


def status(code: int, reason: str, message: str, *, success: bool = False) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if success else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def not_found(resource: str, name: str) -> tuple[int, dict[str, Any]]:
    return 404, status(404, "NotFound", f'{resource}.{GROUP} "{name}" not found')


def make_claim(
    name: str,
    results: Iterable[tuple[str, str]],
    *,
    driver: str,
    pool: str,
    namespace: str = "default",
    uid: str | None = None,
    version: str = "v1",
    config: Iterable[tuple[str, Any]] = (),
    reserved_for: Iterable[str] = (),
) -> dict[str, Any]:
    """An allocated ResourceClaim: ``results`` are ``(request, device name)`` pairs.

    ``reserved_for``: pod names for ``status.reservedFor`` (ResourceClaimConsumerReference:
    ``apiGroup`` empty for the core group, ``resource`` "pods", ``name``, ``uid``), as
    the scheduler reserves the claim for the pods it schedules.

    ``config``: ``(source, parameters)`` pairs of opaque configuration for
    ``driver`` (source ``FromClass`` or ``FromClaim``), as the scheduler copies
    them into ``status.allocation.devices.config``.
    """
    requests = sorted({r.partition("/")[0] for r, _ in results})
    exactly = "exactly" if version == "v1" else None
    spec_requests = []
    for r in requests:
        item: dict[str, Any] = {"name": r}
        if exactly:
            item["exactly"] = {"deviceClassName": driver}
        else:
            item["deviceClassName"] = driver
        spec_requests.append(item)
    consumers = [
        {"resource": "pods", "name": p, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, p))}
        for p in reserved_for
    ]
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": spec_requests}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": driver, "pool": pool, "device": d}
                        for r, d in results
                    ],
                    "config": [
                        {"source": src, "opaque": {"driver": driver, "parameters": params}}
                        for src, params in config
                    ],
                }
            },
            **({"reservedFor": consumers} if consumers else {}),
        },
    }
