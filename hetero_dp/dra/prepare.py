"""NodePrepareResources / NodeUnprepareResources, independent of the gRPC version.

Prepare, per claim: a claim already in the checkpoint answers from it (the
kubelet retries; preparing twice must not differ). Otherwise read the claim
from the API server, check its UID, take the allocation results whose driver
is ours, map them to this node's devices, record them in the checkpoint, write
the claim's CDI spec and answer its CDI IDs. Any failure is that claim's error
string; the other claims of the batch go on.

Unprepare, per claim: remove the CDI spec and the checkpoint entry. Unknown
claims succeed (already unprepared, or never prepared here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_dp.allocation.cdi import with_edits
from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
    lock_file,
)
from hetero_dp.dra.claimread import (
    ClaimError,
    ClaimRef,
    allocated,
    opaque_config,
    reserved_pods,
)
from hetero_dp.dra.claimspec import build_claim_spec, spec_path, write_claim_spec
from hetero_dp.kits import observe
from hetero_dp.model.device import Device
from hetero_dp.model.errors import ConfigError

log = logging.getLogger(__name__)
Requests = dict[str, list[str]]  # request name -> the device names it got


PrepareHook = Callable[
    ["ClaimRef", dict[str, Device], list[dict[str, Any]]], Awaitable[list[Device]]
]
UnprepareHook = Callable[["ClaimRef", list[str]], Awaitable[None]]
# (the claim spec's kind, the claim's devices) -> spec-wide CDI edits (driver files, hooks)
SpecEditsHook = Callable[[str, list[Device]], Awaitable[Mapping[str, Any]]]


@dataclass
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class ClaimPreparer:
    def __init__(
        self,
        *,
        driver: str,
        pool: str,
        api: ResourceAPI,
        checkpoint: Checkpoint,
        cdi_dir: Path,
        devices: Callable[[], Mapping[str, Device]],
        on_prepare: PrepareHook | None = None,
        on_unprepare: UnprepareHook | None = None,
        spec_edits: SpecEditsHook | None = None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.api = api
        self.checkpoint = checkpoint
        self.cdi_dir = Path(cdi_dir)
        self.devices = devices  # DRA device name -> record, all this node has now
        # the backends' prepare hooks: (claim, devices by DRA name, opaque config) ->
        # the records to use for this claim
        self.on_prepare = on_prepare
        # the backends' unprepare hooks: (claim, device IDs from the checkpoint)
        self.on_unprepare = on_unprepare
        # the backends' spec-wide edits, as in their device-plugin specs
        self.spec_edits = spec_edits
        self._lock = asyncio.Lock()
        self._batch = asyncio.Lock()
        self.lock_path = self.checkpoint.path.with_name("serialize.lock")

    @contextlib.asynccontextmanager
    async def _shared(self) -> AsyncIterator[None]:
        """Hold the checkpoint across processes (a rolling update runs two) and read it
        afresh: the other instance may have prepared or unprepared meanwhile."""
        async with self._batch:
            fd = await asyncio.to_thread(lock_file, self.lock_path)
            try:
                await asyncio.to_thread(self.checkpoint.load)
                yield
            finally:
                os.close(fd)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        try:
            async with self._shared():
                return await self._prepare(claims)
        except CheckpointError as e:
            log.error("DRA driver %s cannot prepare claims: %s", self.driver, e)
            return {ref.uid: PrepareResult(error=str(e)) for ref in claims}

    async def _prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        started = time.perf_counter()
        out: dict[str, PrepareResult] = {}
        for ref in claims:
            try:
                out[ref.uid] = PrepareResult(devices=await self._prepare_one(ref))
            except ClaimError as e:
                out[ref.uid] = PrepareResult(error=str(e))
            except Exception as e:  # one claim's surprise must not fail the batch
                log.exception("preparing claim %s/%s (%s) failed", ref.namespace, ref.name, ref.uid)
                out[ref.uid] = PrepareResult(error=f"internal error: {type(e).__name__}: {e}")
            if out[ref.uid].error:
                log.error(
                    "DRA driver %s cannot prepare ResourceClaim %s/%s (uid %s): %s",
                    self.driver,
                    ref.namespace,
                    ref.name,
                    ref.uid,
                    out[ref.uid].error,
                    extra={"reason": out[ref.uid].error},
                )
        observe.emit(
            "dra_prepare",
            driver=self.driver,
            seconds=time.perf_counter() - started,
            claims=len(claims),
            errors=sum(1 for r in out.values() if r.error),
        )
        return out

    async def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        if not ref.uid:
            raise ClaimError(f"claim {ref.namespace}/{ref.name} has no UID in the request")
        done = self.checkpoint.claims.get(ref.uid)
        if done is not None:
            return done.devices
        try:
            claim = await asyncio.to_thread(self.api.read_claim, ref.namespace, ref.name)
        except APIError as e:
            if e.status == 404:
                raise ClaimError(
                    f"ResourceClaim {ref.namespace}/{ref.name} not found on the API server"
                ) from None
            raise ClaimError(f"reading ResourceClaim {ref.namespace}/{ref.name}: {e}") from None
        uid = claim.get("metadata", {}).get("uid", "")
        if uid != ref.uid:
            raise ClaimError(
                f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid!r}, the kubelet asked "
                f"for {ref.uid!r} (the claim was deleted and recreated?)"
            )
        chosen, requests = allocated(claim, ref, self.driver, self.pool, self.devices())
        pods = reserved_pods(claim)
        if self.on_prepare is None:
            return await self._record(ref, chosen, requests, pods)
        chosen = await self._apply_config(claim, ref, chosen)
        try:
            return await self._record(ref, chosen, requests, pods)
        except BaseException:
            # the hooks made something (a MIG instance) that no checkpoint entry holds
            if self.on_unprepare is not None:
                with contextlib.suppress(Exception):
                    await self.on_unprepare(ref, [d.id for d in chosen.values()])
            raise

    async def _record(
        self, ref: ClaimRef, chosen: dict[str, Device], requests: Requests, pods: list[str]
    ) -> list[PreparedDevice]:
        """Checkpoint the claim and write its CDI spec."""
        spec, cdi_ids = self._spec(ref, chosen, requests)
        if self.spec_edits is not None:
            spec = with_edits(spec, await self.spec_edits(spec["kind"], list(chosen.values())))
        prepared = [
            PreparedDevice(
                request_names=sorted(r for r, names in requests.items() if name in names),
                pool_name=self.pool,
                device_name=name,
                device_id=device.id,
                cdi_device_ids=cdi_ids[name],
            )
            for name, device in chosen.items()
        ]
        path = spec_path(self.cdi_dir, self.driver, ref.uid)
        async with self._lock:
            # Checkpoint first: a crash before the spec is written leaves an entry
            # whose unprepare removes nothing, never a spec nobody will remove.
            entry = PreparedClaim(ref.namespace, ref.name, str(path), prepared, pods)
            self.checkpoint.claims[ref.uid] = entry
            try:
                await asyncio.to_thread(self.checkpoint.save)
                await asyncio.to_thread(write_claim_spec, path, spec)
            except BaseException:
                self.checkpoint.claims.pop(ref.uid, None)
                with contextlib.suppress(Exception):  # best effort: drop the entry on disk too
                    await asyncio.to_thread(self.checkpoint.save)
                raise
        log.info(
            "DRA driver %s prepared ResourceClaim %s/%s: %s",
            self.driver,
            ref.namespace,
            ref.name,
            ", ".join(d.device_id for d in prepared),
            extra={"devices": [d.device_id for d in prepared]},
        )
        return prepared

    async def _apply_config(
        self, claim: Mapping[str, Any], ref: ClaimRef, chosen: dict[str, Device]
    ) -> dict[str, Device]:
        assert self.on_prepare is not None
        config = opaque_config(claim, self.driver)
        try:
            result = await self.on_prepare(ref, dict(chosen), config)
        except ClaimError:
            raise
        except Exception as e:
            raise ClaimError(f"applying the claim's configuration failed: {e}") from None
        by_id = {d.id: name for name, d in chosen.items()}
        out = dict(chosen)
        for d in result:
            if not isinstance(d, Device) or d.id not in by_id:
                raise ClaimError(
                    f"the prepare hook returned {d!r}, not one of the claim's devices "
                    f"({', '.join(sorted(by_id))})"
                )
            out[by_id[d.id]] = d
        return out

    def _spec(
        self, ref: ClaimRef, chosen: Mapping[str, Device], requests: Mapping[str, list[str]]
    ) -> tuple[dict[str, Any], dict[str, list[str]]]:
        try:
            return build_claim_spec(self.driver, ref.uid, chosen, requests)
        except ConfigError as e:
            raise ClaimError(f"cannot build the CDI spec: {e}") from None

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error ("" on success)."""
        try:
            async with self._shared():
                return await self._unprepare(claims)
        except CheckpointError as e:
            log.error("DRA driver %s cannot unprepare claims: %s", self.driver, e)
            return {ref.uid: str(e) for ref in claims}

    async def _unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        started = time.perf_counter()
        out: dict[str, str] = {}
        for ref in claims:
            try:
                await self._unprepare_one(ref)
                out[ref.uid] = ""
            except Exception as e:
                log.exception(
                    "unpreparing claim %s/%s (%s) failed", ref.namespace, ref.name, ref.uid
                )
                out[ref.uid] = f"unprepare failed: {type(e).__name__}: {e}"
        observe.emit(
            "dra_unprepare",
            driver=self.driver,
            seconds=time.perf_counter() - started,
            claims=len(claims),
            errors=sum(1 for e in out.values() if e),
        )
        return out

    async def _unprepare_one(self, ref: ClaimRef) -> None:
        async with self._lock:
            entry = self.checkpoint.claims.get(ref.uid)
            if entry is not None and self.on_unprepare is not None:
                # first: a failure keeps the entry, and the kubelet retries
                await self.on_unprepare(ref, [d.device_id for d in entry.devices])
            path = Path(entry.spec_path) if entry else spec_path(self.cdi_dir, self.driver, ref.uid)
            await asyncio.to_thread(path.unlink, True)
            if entry is not None:
                del self.checkpoint.claims[ref.uid]
                try:
                    await asyncio.to_thread(self.checkpoint.save)
                except BaseException:
                    self.checkpoint.claims[ref.uid] = entry
                    raise
                log.info(
                    "DRA driver %s unprepared ResourceClaim %s/%s",
                    self.driver,
                    ref.namespace,
                    ref.name,
                )
