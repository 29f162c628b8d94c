"""Per-resource state: the advertised device set, a version, and change notification.

ListAndWatch streams wait on :meth:`ResourceState.wait_newer`; only a real
change (a device added, removed, or its health or topology changed) bumps the
version and wakes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from hetero_dp.model.device import Device

_pending: set[asyncio.Task[None]] = set()  # keep wake-up tasks alive until done


def _wire_view(d: Device) -> tuple[str, bool, tuple[int, ...]]:
    return d.id, d.healthy, d.numa_nodes


class ResourceState:
    """The devices one resource advertises, and the physical records behind them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.version = 0
        # Bumped by every update, even one the kubelet would not see (a physical record
        # behind unchanged replicas): answers built from the records hold while it holds.
        self.generation = 0
        self._devices: dict[str, Device] = {}
        self._physical: dict[str, Device] = {}
        self._cond = asyncio.Condition()
        self._closed = False

    @property
    def devices(self) -> list[Device]:
        """The advertised devices, in a stable order."""
        return list(self._devices.values())

    def get(self, device_id: str) -> Device | None:
        return self._devices.get(device_id)

    def physical(self, physical_id: str) -> Device | None:
        """The physical device record behind a replica (or the device itself)."""
        return self._physical.get(physical_id)

    @property
    def physical_devices(self) -> list[Device]:
        return list(self._physical.values())

    @property
    def healthy_count(self) -> int:
        return sum(1 for d in self._devices.values() if d.healthy)

    def update(self, advertised: Sequence[Device], physical: Mapping[str, Device]) -> bool:
        """Replace the device set; True (and streams woken) if the kubelet would see a change."""
        new = {d.id: d for d in advertised}
        changed = [_wire_view(d) for d in new.values()] != [
            _wire_view(d) for d in self._devices.values()
        ]
        self._physical = dict(physical)
        self.generation += 1
        records_changed = new != self._devices
        self._devices = new
        if changed or records_changed:
            self.version += 1
            self._notify()
        return changed

    def _notify(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop yet: nobody can be waiting
            return

        async def wake() -> None:
            async with self._cond:
                self._cond.notify_all()

        task = loop.create_task(wake())
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    def close(self) -> None:
        """Wake and end every waiting stream (before the gRPC server stops)."""
        self._closed = True
        self._notify()

    def reopen(self) -> None:
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_newer(self, seen_version: int) -> int | None:
        """Wait until the version differs from ``seen_version``; None once closed."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._closed or self.version != seen_version)
        return None if self._closed else self.version
