"""Readiness held back by a resource that has no device: the resources each backend's
``required_resources`` hook names (after each ``configure``) must each have at least
one device published, Healthy or not, before the daemon is ready.

Why: in a DaemonSet's surge roll the old pod leaves once the new one is ready, and a
new pod that found nothing (a typo in the rolled-out rules) used to be ready with
nothing to serve, so the node went to allocatable 0. With its resource required, the
new pod stays unready and the roll stalls with the old pod serving. Unhealthy devices
count: a device that fails its check must not block rolling out a fix, and its reason
is logged where it is advertised. A resource no backend requires never holds
readiness back: a DaemonSet runs on nodes without some of its hardware.

:class:`Requirements` answers :meth:`missing` (the lines ``/readyz`` and the
readiness file show) and logs one line each time a required resource loses or gains
its first device, judged after every publish once start-up's first publishes are
done (before, a backend not yet discovered would read as missing).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from hetero_dp.engine.runtime import BackendRuntime

log = logging.getLogger("hetero_dp.engine.daemon")  # read as the daemon's


class Requirements:
    def __init__(self, runtimes: Mapping[str, BackendRuntime]) -> None:
        self.runtimes = runtimes
        self.armed = False  # start-up's first publishes are done
        self._missing: set[str] = set()  # as last logged

    def missing(self) -> dict[str, str]:
        """Required resource -> the ``/readyz`` line saying why it holds readiness back."""
        present = {d.resource for rt in self.runtimes.values() for d in rt.published.values()}
        out: dict[str, str] = {}
        for rt in self.runtimes.values():
            for name, why in sorted(rt.backend.required.items()):
                if name in present or name in out:
                    continue
                because = f": {why}" if why else ""
                out[name] = (
                    f"{name}: not ready: no device found, and backend {rt.backend.name!r} "
                    f"requires one{because}"
                )
        return out

    def arm(self) -> None:
        """Start-up's first publishes are done: judge now, and after every publish."""
        self.armed = True
        self.check()

    def check(self, rt: BackendRuntime | None = None) -> None:
        """Log what changed since the last judgement (a publisher: ``rt`` unused)."""
        if not self.armed:
            return
        missing = self.missing()
        for name in sorted(set(missing) - self._missing):
            log.warning(
                "%s; the daemon stays unready until one is found (in a rolling "
                "update the old pod keeps serving meanwhile)",
                missing[name],
            )
        required = {n for rt in self.runtimes.values() for n in rt.backend.required}
        for name in sorted(self._missing - set(missing)):
            now = "a device is found now" if name in required else "no longer required"
            log.info("%s: %s; no longer holds readiness back", name, now)
        self._missing = set(missing)
