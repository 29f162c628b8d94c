"""XID health: an NVML event set waited on in the watch thread, with recovery.

The thread blocks in ``nvmlEventSetWait``; an event wakes it at once and it
posts the health change through the EventSink (which hops to the event loop).
The wait has a bounded timeout only so that the thread notices shutdown and
due recoveries; events never wait for it.

Unlike NVIDIA's plugin this one (1) marks the whole GPU, so every MIG slice and
replica derived from it goes Unhealthy, (2) reacts to double-bit ECC events and
lost GPUs, and (3) recovers: after ``recovery_quiet_s`` without a new critical
event on the GPU and a successful probe, the GPU is reported Healthy again.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from hetero_dp import EventSink, Lost

from . import nvml
from .nvml import NVMLError, explain, log, log_once
from .options import HealthSettings

# What an XID means, for the log line and the device's reason.
XID_MEANING = {
    13: "graphics engine exception (application error)",
    31: "GPU memory page fault (application error)",
    43: "GPU stopped processing (application error)",
    45: "preemptive cleanup (application error)",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    68: "video processor exception (application error)",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout (application error)",
    119: "GSP RPC timeout",
    120: "GSP error",
}
XID_FIX = {
    48: "drain the node and reset the GPU; check nvidia-smi -q -d ECC",
    79: nvml.FIX_LOST,
    95: "drain the node and reset the GPU (nvidia-smi -r)",
}
DEFAULT_FIX = (
    "check nvidia-smi and the kernel log (dmesg | grep -i xid); reset the GPU if it persists"
)

EVENT_XID = pynvml.nvmlEventTypeXidCriticalError
EVENT_DBE = pynvml.nvmlEventTypeDoubleBitEccError
WANTED_EVENTS = EVENT_XID | EVENT_DBE


# XIDs after which the GPU is gone until it is reset or the node rebooted: a Lost
# reason (DRA taints the device NoExecute, evicting its pods). 79: NVIDIA's XID
# catalogue, "GPU has fallen off the bus".
LOST_XIDS = frozenset({79})


def xid_reason(xid: int, gpu_uuid: str, gi: int = -1, ci: int = -1) -> str:
    meaning = XID_MEANING.get(xid, "critical error")
    where = f" (MIG GPU instance {gi}, compute instance {ci})" if gi >= 0 else ""
    fix = XID_FIX.get(xid, DEFAULT_FIX)
    text = f"XID {xid} ({meaning}) on GPU {gpu_uuid}{where}; fix: {fix}"
    return Lost(text) if xid in LOST_XIDS else text


@dataclass
class _Bad:
    reason: str
    last_event: float  # monotonic time of the latest critical event
    probe_failed: bool = False  # logged once per episode


Probe = Callable[[str], "str | None"]


class HealthMonitor:
    """Owns the event loop of one backend; thread-safe queries for check_health."""

    # Each nvmlEventSetWait returns after at most wait_ms, and a stop waits for the
    # wait in progress: at 1000 ms the exit on SIGTERM took ~1 s, and in a rolling
    # update that stops the old pod first the old pod's exit is part of the time the
    # node has no GPU to offer (benchmarks/bench_upgrade.py). A timed-out wait costs
    # one NVML call.
    def __init__(self, settings: HealthSettings, probe: Probe, wait_ms: int = 150) -> None:
        self.settings = settings
        self._probe = probe  # uuid -> None when healthy, else a reason
        self.wait_ms = wait_ms
        self._bad: dict[str, _Bad] = {}
        self._lock = threading.Lock()
        self.ready = threading.Event()  # set once events are registered
        # Set by discovery when the GPU set changed (a GPU hot-added or gone): the loop
        # registers the new GPUs for events after its current wait (<= wait_ms).
        self.gpus_changed = threading.Event()
        self.registered: set[str] = set()  # UUIDs whose events this loop receives
        self.refreshed = threading.Event()  # set after each re-registration (for tests)

    def reason(self, uuid: str) -> str | None:
        """Why a GPU is held Unhealthy by an event, or None."""
        with self._lock:
            bad = self._bad.get(uuid)
            return bad.reason if bad else None

    def _mark(self, events: EventSink, uuid: str, reason: str) -> None:
        with self._lock:
            new = uuid not in self._bad
            self._bad[uuid] = _Bad(reason, time.monotonic())
        if new:
            log.error("GPU %s marked Unhealthy: %s", uuid, reason)
        events.set_health(uuid, False, reason)

    def run(self, events: EventSink, gpus: Callable[[], list[tuple[str, object]]]) -> None:
        """The watch hook's body: ``gpus`` returns (uuid, handle) of the physical GPUs."""
        if self.settings.disabled:
            log.info("health checks disabled (DP_DISABLE_HEALTHCHECKS=all)")
            self.ready.set()
            events.wait()
            return
        try:
            eventset = pynvml.nvmlEventSetCreate()
        except NVMLError as err:
            log.error("%s; GPUs are probed only", explain(err, "creating the NVML event set"))
            self.ready.set()
            events.wait()
            return
        try:
            self.gpus_changed.clear()
            by_address = self._register(events, eventset, gpus())
            self.ready.set()
            self._loop(events, eventset, by_address, gpus)
        finally:
            try:
                pynvml.nvmlEventSetFree(eventset)
            except NVMLError:
                pass

    def _register(
        self, events: EventSink, eventset: Any, gpus: list[tuple[str, Any]]
    ) -> dict[int, str]:
        by_address: dict[int, str] = {}
        for uuid, handle in gpus:
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                wanted = supported & WANTED_EVENTS
                if not wanted & EVENT_XID:
                    log_once(
                        f"noxid:{uuid}",
                        f"GPU {uuid} does not report XID events; it is probed only",
                    )
                if wanted:
                    pynvml.nvmlDeviceRegisterEvents(handle, wanted, eventset)
            except NVMLError as err:
                if err.value == nvml.GPU_IS_LOST:
                    self._mark(events, uuid, Lost(explain(err, "registering events", uuid)))
                else:
                    log_once(f"register:{uuid}", explain(err, "registering health events", uuid))
                continue
            by_address[ctypes.cast(handle, ctypes.c_void_p).value or 0] = uuid
        with self._lock:
            self.registered |= set(by_address.values())
        return by_address

    def _refresh(
        self,
        events: EventSink,
        eventset: Any,
        by_address: dict[int, str],
        gpus: Callable[[], list[tuple[str, object]]],
    ) -> None:
        """Register GPUs that appeared since the last registration; forget gone ones."""
        self.gpus_changed.clear()
        now = gpus()
        present = {uuid for uuid, _ in now}
        for address in [a for a, u in by_address.items() if u not in present]:
            del by_address[address]
        known = set(by_address.values())
        new = [(uuid, handle) for uuid, handle in now if uuid not in known]
        with self._lock:
            self.registered &= present
        if new:
            by_address.update(self._register(events, eventset, new))
            log.info("GPU events registered for hot-added GPUs %s", [u for u, _ in new])
        self.refreshed.set()

    def _loop(
        self,
        events: EventSink,
        eventset: Any,
        by_address: dict[int, str],
        gpus: Callable[[], list[tuple[str, object]]] | None = None,
    ) -> None:
        failures = 0
        while not events.stopping.is_set():
            if gpus is not None and self.gpus_changed.is_set():
                self._refresh(events, eventset, by_address, gpus)
            try:
                data = pynvml.nvmlEventSetWait(eventset, self._timeout_ms())
            except NVMLError as err:
                if err.value == nvml.TIMEOUT:
                    failures = 0
                elif err.value == nvml.GPU_IS_LOST:
                    if not self._find_lost(events, by_address):
                        failures += 1
                else:
                    failures += 1
                    log_once(f"wait:{err.value}", explain(err, "waiting for GPU events"))
                if failures:
                    # A wait that fails at once would spin; back off, still stoppable.
                    events.wait(min(30.0, 0.1 * 2**failures))
            else:
                failures = 0
                self._handle(events, data, by_address)
            self._recover_due(events)

    def _timeout_ms(self) -> int:
        quiet = self.settings.recovery_quiet_s
        with self._lock:
            due = [b.last_event + quiet for b in self._bad.values()] if quiet > 0 else []
        if not due:
            return self.wait_ms
        left = min(due) - time.monotonic()
        return max(1, min(self.wait_ms, int(left * 1000) + 1))

    def _handle(self, events: EventSink, data: Any, by_address: dict[int, str]) -> None:
        address = ctypes.cast(data.device, ctypes.c_void_p).value or 0
        uuid = by_address.get(address)
        if uuid is None:
            try:
                uuid = nvml.text(pynvml.nvmlDeviceGetUUID(data.device))
            except NVMLError:
                log.warning("event for an unknown GPU handle; ignored")
                return
        kind = data.eventType
        if kind & EVENT_DBE:
            self._mark(
                events,
                uuid,
                f"double-bit ECC error on GPU {uuid}; fix: {XID_FIX[48]}",
            )
            return
        if not kind & EVENT_XID:
            return
        xid = int(data.eventData)
        gi, ci = data.gpuInstanceId, data.computeInstanceId
        gi = -1 if gi == 0xFFFFFFFF else gi
        ci = -1 if ci == 0xFFFFFFFF else ci
        if not self.settings.counts(xid):
            log.info(
                "GPU %s: XID %d (%s) ignored (application error or disabled by "
                "DP_DISABLE_HEALTHCHECKS)",
                uuid,
                xid,
                XID_MEANING.get(xid, "critical error"),
            )
            return
        self._mark(events, uuid, xid_reason(xid, uuid, gi, ci))

    def _find_lost(self, events: EventSink, by_address: dict[int, str]) -> bool:
        found = False
        for uuid in by_address.values():
            reason = self._probe(uuid)
            if reason and self.reason(uuid) is None:
                self._mark(events, uuid, reason)
                found = True
        return found

    def _recover_due(self, events: EventSink) -> None:
        quiet = self.settings.recovery_quiet_s
        if quiet <= 0:
            return
        now = time.monotonic()
        with self._lock:
            due = [(u, b) for u, b in self._bad.items() if now - b.last_event >= quiet]
        for uuid, bad in due:
            failure = self._probe(uuid)
            with self._lock:
                current = self._bad.get(uuid)
                if current is not bad:
                    continue  # a new event arrived meanwhile
                first_failure = bool(failure) and not current.probe_failed
                if failure:
                    current.last_event = time.monotonic()
                    current.probe_failed = True
                else:
                    del self._bad[uuid]
            if failure:
                if first_failure:
                    log.warning("GPU %s stays Unhealthy, its probe fails: %s", uuid, failure)
                continue
            reason = f"recovered: no critical event for {quiet:g}s and the probe passed"
            log.warning("GPU %s back to Healthy (%s); earlier: %s", uuid, reason, bad.reason)
            events.set_health(uuid, True, reason)


def probe_gpu(uuid: str) -> str | None:
    """A cheap liveness probe: the GPU answers by UUID and reports its memory."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except NVMLError as err:
        if err.value == nvml.NOT_SUPPORTED:
            return None
        text = explain(err, "probing", uuid)
        return Lost(text) if err.value == nvml.GPU_IS_LOST else text
    return None
