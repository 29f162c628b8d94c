"""The MPS side of the NVIDIA backend (``sharing.mps``): the one
:class:`~.mps_daemon.MpsManager` the options ask for, created, reconfigured or
stopped as they change (a reload), run while the backend's ``watch`` runs (a
reload that replaces the manager starts the new one), its verdicts reported as the
GPUs' health, and the compute mode it sets on the GPUs it serves."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

import pynvml

from hetero_dp import EventSink

from . import nvml
from .mps import MpsResource
from .mps_daemon import MpsManager, find_control
from .nvml import log
from .options import Options


class MpsControl:
    """Which MPS manager runs now (``manager``: None without ``sharing.mps``)."""

    def __init__(self, handles: Callable[[], Mapping[str, object]]) -> None:
        self._lock = threading.Lock()
        self._handles = handles  # GPU UUID -> NVML handle, of the node read last
        self.manager: MpsManager | None = None

    def configure(self, opts: Options, plan: list[MpsResource] | None) -> None:
        """Create, reconfigure or stop the MPS manager for ``opts``; with ``plan``
        (a reload of a running backend), the daemons it wants."""
        with self._lock:
            mps = self.manager
            if not opts.uses_mps:
                self.manager = None
                if mps is not None:
                    mps.stop()  # its thread quits the daemons it started
                return
            control = find_control(opts.mps, opts.visible_driver_root)
            if mps is None:
                mps = self.manager = MpsManager(opts.mps, control)
                mps.compute_mode = self.set_compute_mode
            elif mps.settings != opts.mps or mps.control != control:
                mps.reconfigure(opts.mps, control)
        if plan is not None:
            mps.want(plan)

    def set_compute_mode(self, uuids: list[str], exclusive: bool) -> str:
        """EXCLUSIVE_PROCESS (or back to DEFAULT) for MPS GPUs; '' or what failed."""
        mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if exclusive else 0
        handles = self._handles()
        errors = []
        for uuid in uuids:
            handle = handles.get(uuid)
            if handle is None:
                continue
            try:
                pynvml.nvmlDeviceSetComputeMode(handle, mode)
            except nvml.NVMLError as err:
                errors.append(nvml.explain(err, "setting the compute mode", uuid))
        return "; ".join(errors)

    def run(self, events: EventSink, stop: threading.Event, held: Callable[[str], str]) -> None:
        """Run the current MPS manager until ``stop`` (or the daemon stops); a reload
        that replaces it starts the new one. A GPU whose daemon answers again turns
        Healthy unless ``held(uuid)`` (an XID) still holds it."""

        def report(uuids: Iterable[str], reason: str) -> None:
            for uuid in uuids:
                if reason:
                    events.set_health(uuid, False, reason)
                elif not held(uuid):  # an XID still holds it: leave it
                    events.set_health(uuid, True, "MPS control daemon answers")

        while not stop.is_set() and not events.stopping.is_set():
            with self._lock:
                mps = self.manager
            if mps is None or mps.stopped:  # none yet, or replaced: wait for the next
                if events.wait(1.0):
                    return
                continue
            try:
                mps.run(report)
            except Exception as err:
                log.exception("MPS monitor ended with an error; restarting it")
                for res in list(mps.daemons().values()):
                    report([g.uuid for g in res.resource.gpus], f"MPS monitor failed: {err!r}")
                if events.wait(1.0):
                    return

    def stop(self) -> None:
        """Stop the running manager (its thread quits the daemons it started)."""
        with self._lock:
            mps = self.manager
        if mps is not None:
            mps.stop()
