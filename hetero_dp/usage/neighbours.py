"""The noisy neighbour, named: a container over its fair share of a shared device.

A shared device's fair share for a container is the device's memory x the replicas
the container holds / the device's replicas. Crossing it logs one WARNING naming
``namespace/pod``, the container, the device and both figures; falling back under
logs one line. A container that leaves while over is forgotten without a line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from hetero_dp.usage.view import ContainerUse, Owner

log = logging.getLogger("hetero_dp.usage")
MIB = 1024 * 1024


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


class FairShareWatch:
    def __init__(self) -> None:
        self.over: set[tuple[Owner, str, str]] = set()

    def check(self, uses: Iterable[ContainerUse]) -> None:
        seen = set()
        for use in uses:
            if use.fair_share_bytes is None or use.memory_bytes is None:
                continue
            key = (use.owner, use.resource, use.physical)
            seen.add(key)
            o = use.owner
            who = f"{o.namespace}/{o.pod}, container {o.container}, device {use.device}"
            if use.memory_bytes > use.fair_share_bytes and key not in self.over:
                self.over.add(key)
                log.warning(
                    "over its fair share of a shared device: %s uses %s (%d bytes), "
                    "its fair share is %s (%d bytes)",
                    who,
                    _mib(use.memory_bytes),
                    use.memory_bytes,
                    _mib(use.fair_share_bytes),
                    use.fair_share_bytes,
                    extra={"resource": use.resource, "device": use.device},
                )
            elif use.memory_bytes <= use.fair_share_bytes and key in self.over:
                self.over.discard(key)
                log.info(
                    "back under its fair share: %s uses %s, its fair share is %s",
                    who,
                    _mib(use.memory_bytes),
                    _mib(use.fair_share_bytes),
                    extra={"resource": use.resource, "device": use.device},
                )
        self.over &= seen
