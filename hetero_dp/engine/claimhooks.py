"""The hooks a claim-based front end (DRA) calls, called through the engine: the
engine owns devices and the container gate, so the front end never calls a
backend's hook nor judges what one returned itself.

:class:`ClaimHooks` (one per daemon, ``daemon.claim_hooks``) answers which
backend owns a device or partition, asks the ``partitions`` hook (again only when
a backend's device IDs change) and calls ``prepare``, ``unprepare`` and
``cdi_spec_edits`` for a claim's devices on the backends they belong to, each
result through the container gate. A failure is a :class:`BackendError` whose
message says which backend and why; the front end fails the claim with it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hetero_dp.allocation.cdi import merge_edits
from hetero_dp.allocation.gate import device_problems, summary
from hetero_dp.engine.cdi_publisher import spec_wide_edits
from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError, ConfigError

log = logging.getLogger(__name__)


class ClaimHooks:
    """Claim hooks over the daemon's backends (``runtimes``: backend name -> runtime)."""

    def __init__(self, runtimes: Mapping[str, BackendRuntime]) -> None:
        self.runtimes = runtimes
        # backend -> (the device IDs asked about, the partitions its hook gave for them)
        self._partitions: dict[str, tuple[frozenset[str], dict[str, Device]]] = {}

    async def partitions(self, rt: BackendRuntime) -> dict[str, Device]:
        """The backend's partitions of its published devices, health following the
        parent's; the hook is asked again only when the device IDs change."""
        if not rt.backend.implements("partitions"):
            return {}
        ids = frozenset(rt.published)
        cached = self._partitions.get(rt.backend.name)
        if cached is None or cached[0] != ids:
            found: dict[str, Device] = {}
            try:
                result = await rt.backend.call("partitions", devices=list(rt.published.values()))
            except BackendError as e:
                log.error("%s; its devices are published without partitions", e)
                result = None
            for p in result or ():
                problem = self._partition_problem(rt, p)
                if problem:
                    log.error("backend %s: partitions hook: %s; left out", rt.backend.name, problem)
                else:
                    found[p.id] = p
            cached = self._partitions[rt.backend.name] = (ids, found)
        out = {}
        for p in cached[1].values():
            parent = rt.published[p.parent or ""]
            out[p.id] = p.with_health(parent.healthy, parent.reason)
        return out

    @staticmethod
    def _partition_problem(rt: BackendRuntime, p: object) -> str:
        if not isinstance(p, Device):
            return f"returned {p!r}, not a Device"
        parent = rt.published.get(p.parent or "")
        if parent is None:
            return f"partition {p.id} names parent {p.parent!r}, not one of the backend's devices"
        if p.id in rt.published:
            return f"partition {p.id} has the ID of one of the backend's devices"
        if p.resource != parent.resource:
            return (
                f"partition {p.id} has resource {p.resource}, its parent {parent.id} "
                f"{parent.resource}: a partition is published in its parent's pool"
            )
        problems = device_problems(p, rt.fake_node_roots)
        if problems:  # the container gate, as for discovered records
            return f"partition {p.id} holds what may not go into a container: {summary(problems)}"
        return ""

    def owned(self, rt: BackendRuntime, device_id: str) -> bool:
        """Whether ``device_id`` is one of ``rt``'s devices or partitions."""
        cached = self._partitions.get(rt.backend.name)
        return device_id in rt.published or (cached is not None and device_id in cached[1])

    async def prepare(
        self, claim: Mapping[str, str], devices: Mapping[str, Device], config: list[Any]
    ) -> list[Device]:
        """Call the ``prepare`` hook of each backend that serves some of ``devices``
        (``claim``: namespace, name, uid); what a hook returned that is new passes
        the container gate."""
        out: list[Device] = []
        for rt in self.runtimes.values():
            mine = [d for d in devices.values() if self.owned(rt, d.id)]
            if not mine or not rt.backend.implements("prepare"):
                continue
            # keyed by claim: while a call that passed hookTimeout is still stuck in
            # the backend, the kubelet's retry is refused, never run beside it
            result = await rt.backend.call(
                "prepare", key=claim["uid"], claim=claim, devices=mine, config=config
            )
            returned = mine if result is None else list(result)
            for d in returned:  # the container gate, for what the hook changed
                if isinstance(d, Device) and not any(d is m for m in mine):
                    problems = device_problems(d, rt.fake_node_roots)
                    if problems:
                        raise BackendError(
                            f"backend {rt.backend.name}: the prepare hook returned {d.id} "
                            f"with what may not go into a container: {summary(problems)}"
                        )
            out.extend(returned)
        return out

    async def spec_edits(self, kind: str, devices: list[Device]) -> dict[str, Any]:
        """The spec-wide edits (driver files, hooks) for a claim's spec, from each
        backend that serves some of ``devices`` and implements ``cdi_spec_edits``: the
        same a device-plugin spec of theirs holds. A failure fails the claim."""
        extra: dict[str, Any] = {}
        for rt in self.runtimes.values():
            mine = [d for d in devices if self.owned(rt, d.id)]
            if not mine or not rt.backend.implements("cdi_spec_edits"):
                continue
            try:
                extra = merge_edits(extra, await spec_wide_edits(rt.backend, kind, mine))
            except (BackendError, ConfigError) as e:
                raise BackendError(f"backend {rt.backend.name}: CDI spec edits: {e}") from None
        return extra

    async def unprepare(self, claim: Mapping[str, str], device_ids: list[str]) -> None:
        """Call the ``unprepare`` hook of each backend that has some of ``device_ids``
        (every backend that has the hook gets the IDs no backend publishes now)."""
        hooked = [rt for rt in self.runtimes.values() if rt.backend.implements("unprepare")]
        runtimes = list(self.runtimes.values())
        orphans = [i for i in device_ids if not any(self.owned(rt, i) for rt in runtimes)]
        errors = []
        for rt in hooked:
            ids = [i for i in device_ids if self.owned(rt, i)] + orphans
            if not ids:
                continue
            try:
                await rt.backend.call("unprepare", key=claim["uid"], claim=claim, device_ids=ids)
            except BackendError as e:
                errors.append(str(e))
        if errors:
            raise BackendError("; ".join(errors))
