"""Who a prepared claim is reserved for now: ``status.reservedFor``, re-read.

A claim's ``reservedFor`` is read when this node prepares it; a pod that joins a
shared claim later is added there by the scheduler (the Kubernetes docs, "Dynamic
Resource Allocation": the claim is reserved for each pod that uses it), without the
kubelet preparing the claim again on this node. So the pods behind
``hetero_dp_claim_allocation_info`` are re-read: each prepared claim with one GET at
most once per ``gap`` seconds (no informer of ResourceClaims exists here; the
attribution loop drives it, ops/attributing.py). The answer lives in memory only (the
checkpoint keeps what prepare read); a claim that cannot be read keeps its last
pods, with one line until it reads again.
"""

from __future__ import annotations

import asyncio
import logging
import time

from hetero_dp.dra.api import ResourceAPI
from hetero_dp.dra.checkpoint import Checkpoint
from hetero_dp.dra.claimread import reserved_pods
from hetero_dp.dra.client import APIError

log = logging.getLogger(__name__)


class Reservations:
    def __init__(self, driver: str, api: ResourceAPI, checkpoint: Checkpoint) -> None:
        self.driver = driver
        self.api = api
        self.checkpoint = checkpoint
        self.pods: dict[str, list[str]] = {}  # claim UID -> its pods as last read
        self._read_at: dict[str, float] = {}  # claim UID -> when it was last asked for
        self._failing: set[str] = set()  # claim UIDs whose last read failed

    def reserved_for(self) -> dict[str, list[str]]:
        """Claim UID -> its pods, where a re-read has them."""
        return dict(self.pods)

    async def refresh(self, gap: float) -> int:
        """Re-read the prepared claims not asked for within ``gap`` seconds, one after
        the other; returns how many requests were sent."""
        claims = dict(self.checkpoint.claims)
        for uid in set(self._read_at) - set(claims):  # unprepared: forgotten
            self._read_at.pop(uid, None)
            self.pods.pop(uid, None)
            self._failing.discard(uid)
        sent = 0
        for uid, claim in sorted(claims.items()):
            now = time.monotonic()
            if now - self._read_at.get(uid, -1e18) < gap:
                continue
            self._read_at[uid] = now
            sent += 1
            what = f"ResourceClaim {claim.namespace}/{claim.name}"
            try:
                got = await asyncio.to_thread(self.api.read_claim, claim.namespace, claim.name)
            except APIError as e:
                if uid not in self._failing:
                    log.warning(
                        "DRA driver %s: re-reading %s for its pods failed (%s); its holder "
                        "series keep the pods read before",
                        self.driver,
                        what,
                        e,
                    )
                    self._failing.add(uid)
                continue
            if (got.get("metadata") or {}).get("uid") != uid:
                continue  # deleted and made again: not the claim this node prepared
            if uid in self._failing:
                self._failing.discard(uid)
                log.info("DRA driver %s: %s reads again", self.driver, what)
            self.pods[uid] = reserved_pods(got)
        return sent
