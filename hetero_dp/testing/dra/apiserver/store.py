"""The stand-in API server's storage: objects, resourceVersions and the watch cache.

resourceVersions are etcd's revisions: one counter for every write. Watch history,
as the real server keeps it (Kubernetes docs, "API Concepts": *Efficient detection
of changes*; the watch cache,
``staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go``): only the last
``history`` changes are kept, and a watch from a ``resourceVersion`` below
:attr:`ObjectStore.compacted` expires (``410 Gone``). Slice writes go through the
checks of :mod:`.schema` and are stored in ``v1`` shape; a refusal is a 422
``Status`` naming the field. It keeps no admission, no authentication and no
field managers.

Every read and write holds :attr:`ObjectStore.cond` (a re-entrant condition the
whole server shares and waits on).
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from hetero_dp.testing.dra.apiserver.objects import not_found, status
from hetero_dp.testing.dra.apiserver.schema import (
    GROUP,
    SCHEMA_VERSION,
    from_v1,
    int64_problem,
    slice_problems,
    store_form,
    to_v1,
)

Event = tuple[int, str, dict[str, Any]]  # (resourceVersion, type, v1 object)


def selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
    """Whether a slice matches the request's ``fieldSelector`` (``spec.driver``,
    ``spec.nodeName``, ``spec.pool.name``; ``a=b`` terms joined by commas)."""
    wanted: dict[str, str] = {}
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        wanted[key.strip()] = value.strip()
    spec = obj["spec"]
    fields = {
        "spec.driver": spec.get("driver"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.pool.name": (spec.get("pool") or {}).get("name"),
    }
    return all(fields.get(k) == v for k, v in wanted.items())


class ObjectStore:
    """Slices (stored as ``v1``), claims and nodes, with the watch cache's events."""

    def __init__(
        self,
        *,
        features: Sequence[str] = (),
        schema: str = SCHEMA_VERSION,
        history: int = 1000,
    ) -> None:
        self.cond = threading.Condition()  # re-entrant: its lock is an RLock
        self.features = tuple(features)
        self.schema = schema
        self.history = history
        self.slices: dict[str, dict[str, Any]] = {}  # name -> object, stored as v1
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> Node (core/v1)
        self.events: list[Event] = []
        # a real server never answers resourceVersion "0" (that means "any" in a request)
        self.rv = 1
        self.compacted = 0  # watches from a resourceVersion below this expire
        self.refuse_slices: str | None = None
        # with refuse_slices: 403 Forbidden (an admission webhook), or e.g. 503 (an API
        # server shedding load answers 429 or 503, "API Priority and Fairness")
        self.refuse_status = 403

    # the watch cache

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """Note a change in the watch cache (a deletion takes a resourceVersion too)."""
        with self.cond:
            if kind == "DELETED":
                self.rv += 1
                obj = copy.deepcopy(obj)
                obj["metadata"]["resourceVersion"] = str(self.rv)
            self.events.append((self.rv, kind, copy.deepcopy(obj)))
            if len(self.events) > self.history:  # the oldest changes fall out of the window
                dropped = self.events[: len(self.events) - self.history]
                del self.events[: len(dropped)]
                self.compacted = max(self.compacted, dropped[-1][0])

    def compact(self, skip: int) -> None:
        """The revision moves ``skip`` on and every watch from before it expires."""
        with self.cond:
            self.rv += skip
            self.compacted = self.rv

    def start_over(self) -> None:
        """A new watch cache (a restarted or new API server process): the history
        dropped, starting past the current revision."""
        with self.cond:
            self.events.clear()
            self.compact(1)

    def changes_after(self, last: int) -> list[Event]:
        with self.cond:
            return [e for e in self.events if e[0] > last]

    # test-side changes

    def add_node(self, name: str) -> dict[str, Any]:
        with self.cond:
            node = self.nodes.setdefault(
                name,
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "uid": str(uuid.uuid4())},
                },
            )
            self.cond.notify_all()
            return copy.deepcopy(node)

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        meta = claim["metadata"]
        with self.cond:
            self.claims[(meta.get("namespace", "default"), meta["name"])] = copy.deepcopy(claim)
            self.cond.notify_all()
        return claim

    def delete_slices(self, names: Sequence[str], *, silently: bool = False) -> None:
        """Delete slices, each with a DELETED event unless ``silently``."""
        with self.cond:
            for name in names:
                obj = self.slices.pop(name, None)
                if obj is not None and not silently:
                    self.event("DELETED", obj)
            self.cond.notify_all()

    def slice_names_of(self, node: str) -> list[str]:
        with self.cond:
            return [n for n, s in self.slices.items() if s["spec"].get("nodeName") == node]

    def slices_of(
        self, driver: str, node: str | None = None, *, version: str = "v1"
    ) -> list[dict[str, Any]]:
        with self.cond:
            return [
                from_v1(s, version)
                for s in self.slices.values()
                if s["spec"].get("driver") == driver
                and (node is None or s["spec"].get("nodeName") == node)
            ]

    def devices_of(self, driver: str, node: str | None = None) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for s in self.slices_of(driver, node):
            for d in s["spec"].get("devices") or []:
                out[d["name"]] = d
        return out

    # the REST operations (under cond; the caller notifies)

    def get_node(self, name: str) -> tuple[int, dict[str, Any]]:
        with self.cond:
            node = self.nodes.get(name)
        if node is None:
            return 404, status(404, "NotFound", f'nodes "{name}" not found')
        return 200, copy.deepcopy(node)

    def get_claim(self, version: str, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        claim = self.claims.get((ns, name))
        if claim is None:
            return not_found("resourceclaims", name)
        out = copy.deepcopy(claim)
        out["apiVersion"] = f"{GROUP}/{version}"
        out["kind"] = "ResourceClaim"
        return 200, out

    def list_slices(self, version: str, query: dict[str, str]) -> dict[str, Any]:
        items = [from_v1(o, version) for o in self.slices.values() if selected(o, query)]
        return {
            "apiVersion": f"{GROUP}/{version}",
            "kind": "ResourceSliceList",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    def get_slice(self, version: str, name: str) -> tuple[int, dict[str, Any]]:
        obj = self.slices.get(name)
        return (200, from_v1(obj, version)) if obj else not_found("resourceslices", name)

    def delete_slice(self, name: str) -> tuple[int, dict[str, Any]]:
        if name not in self.slices:
            return not_found("resourceslices", name)
        self.event("DELETED", self.slices.pop(name))
        return 200, status(200, "", "deleted", success=True)

    def write_slice(
        self, version: str, name: str | None, body: Any, query: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """A create (``name`` None) or an update of ``name``: (HTTP status, JSON body)."""
        query = query or {}
        if not isinstance(body, dict):
            return 400, status(400, "BadRequest", "body must be a JSON object")
        obj_name = str((body.get("metadata") or {}).get("name") or "")
        if self.refuse_slices is not None:
            reason = {403: "Forbidden", 429: "TooManyRequests", 503: "ServiceUnavailable"}
            code = self.refuse_status
            return code, status(code, reason.get(code, "InternalError"), self.refuse_slices)
        too_big = int64_problem(body)
        if too_big:  # the real server's JSON decoder fails before validation: 400, not 422
            return 400, status(
                400, "BadRequest", f"the body of the request was in an unknown format: {too_big}"
            )
        problems = slice_problems(body, version, self.schema, self.features)
        if name is not None and obj_name != name:
            problems.append(f"metadata.name: Invalid value: {obj_name!r}: does not match URL")
        if problems:
            return 422, status(
                422,
                "Invalid",
                f'ResourceSlice.{GROUP} "{obj_name}" is invalid: ' + "; ".join(problems),
            )
        existing = self.slices.get(obj_name)
        if query.get("dryRun") == "All":  # validated and shaped, answered, not stored
            obj = store_form(to_v1(body, version), self.features)
            return (200 if name else 201), from_v1(obj, version)
        if name is None and existing is not None:
            return 409, status(
                409, "AlreadyExists", f'resourceslices.{GROUP} "{obj_name}" already exists'
            )
        if name is not None:
            if existing is None:
                return not_found("resourceslices", name)
            given = (body.get("metadata") or {}).get("resourceVersion")
            current = existing["metadata"]["resourceVersion"]
            if given and given != current:
                return 409, status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on resourceslices.{GROUP} "{name}": the '
                    "object has been modified; please apply your changes to the latest version",
                )
        self.rv += 1
        obj = store_form(to_v1(body, version), self.features)
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.rv)
        meta["uid"] = existing["metadata"]["uid"] if existing else str(uuid.uuid4())
        self.slices[obj_name] = obj
        self.event("MODIFIED" if existing else "ADDED", obj)
        return (200 if name else 201), from_v1(obj, version)
