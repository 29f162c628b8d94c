"""One advertised resource: its state, its backend, its settings, and the logic
behind the kubelet's calls (the gRPC side only translates)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_dp.allocation.allocate import build_response, show_ids, validate_ids
from hetero_dp.allocation.delivery import Delivery, apply_delivery, parse_delivery, without_cdi
from hetero_dp.allocation.gate import response_problems
from hetero_dp.allocation.preferred import choose_preferred
from hetero_dp.allocation.sharing import SharingConfig, to_physical
from hetero_dp.engine.backend import Backend
from hetero_dp.model.device import Device
from hetero_dp.model.errors import AllocationError, BackendError, ConfigError
from hetero_dp.model.response import ContainerResponse
from hetero_dp.model.state import ResourceState

log = logging.getLogger(__name__)


class Resource:
    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        settings: Mapping[str, Any] | None = None,
        sharing: SharingConfig | None = None,
        cdi_off: str | None = None,
    ) -> None:
        self.name = name
        self.backend = backend
        # why the node's container runtime cannot consume CDI (None: it can, or unknown)
        self.cdi_off = cdi_off
        self.settings = dict(settings or {})
        self.sharing = sharing or SharingConfig()
        self.state = ResourceState(name)
        self.links: dict[tuple[str, str], float] = {}
        self.registered = False
        self.open_streams = 0
        self.streams_opened = 0
        self.streams_changed = asyncio.Event()  # set on every stream open and close

    @property
    def settings(self) -> Mapping[str, Any]:
        return self._settings

    @settings.setter
    def settings(self, value: Mapping[str, Any]) -> None:
        # Parsed once here, not on every Allocate; invalid settings were refused at
        # start-up or reload, so None (parse at allocation, which names the error)
        # only happens for settings nobody validated.
        self._settings = dict(value)
        try:
            self._delivery: Delivery | None = parse_delivery(self._settings, resource=self.name)
        except ConfigError:
            self._delivery = None
        if self._delivery is not None and self._delivery.uses_cdi and self.cdi_off:
            fallback = without_cdi(self._delivery)
            log.warning(
                "%s: delivery %s needs CDI, but %s: delivering with %s instead, so pods "
                "get their device nodes",
                self.name,
                ",".join(self._delivery.strategies),
                self.cdi_off,
                ",".join(fallback.strategies),
            )
            self._delivery = fallback

    @property
    def pre_start_required(self) -> bool:
        return self.backend.implements("pre_start_container")

    @property
    def preferred_allocation_available(self) -> bool:
        return bool(self.settings.get("preferredAllocation", True))

    @property
    def ready(self) -> bool:
        return self.registered and self.open_streams > 0

    def _physical_devices(self, ids: Sequence[str]) -> list[Device]:
        devices = []
        for pid in to_physical(ids):
            d = self.state.physical(pid)
            if d is None:  # the advertised set and the physical map disagree: a bug
                raise AllocationError(f"{self.name}: no physical device {pid!r}", code="INTERNAL")
            devices.append(d)
        return devices

    async def allocate(self, ids: Sequence[str]) -> ContainerResponse:
        validate_ids(self.state, ids)
        self.sharing.check_request(self.name, ids)
        physical = self._physical_devices(ids)
        response = apply_delivery(
            build_response(physical), physical, self._delivery or self.settings
        )
        try:
            await self.backend.call("allocate", devices=physical, response=response)
        except BackendError as e:
            log.error("%s", e, extra={"resource": self.name, "devices": show_ids(ids)})
            raise AllocationError(
                f"{self.name}: backend {self.backend.name!r} failed to allocate "
                f"{show_ids(ids)}: {e}",
                code="INTERNAL",
            ) from e
        # Built from records the gate passed at discovery; an allocate hook may add more.
        problems = response_problems(response) if self.backend.implements("allocate") else []
        if problems:
            log.error(
                "Allocate of %s refused by the container gate: %s",
                show_ids(ids),
                "; ".join(problems[:3]),
                extra={"resource": self.name},
            )
            raise AllocationError(
                f"{self.name}: backend {self.backend.name!r} answered {show_ids(ids)} with "
                f"what may not go into a container: {'; '.join(problems[:3])}",
                code="INTERNAL",
            )
        return response

    async def pre_start(self, ids: Sequence[str]) -> None:
        validate_ids(self.state, ids, require_healthy=False)
        physical = self._physical_devices(ids)
        try:
            await self.backend.call("pre_start_container", devices=physical, timeout=30)
        except BackendError as e:
            raise AllocationError(f"{self.name}: pre-start of {show_ids(ids)}: {e}") from e

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        avail = validate_ids(self.state, available, require_healthy=False, what="available devices")
        must = (
            validate_ids(
                self.state, must_include, require_healthy=False, what="must-include devices"
            )
            if must_include
            else []
        )
        offered = set(available)
        outside = [d.id for d in must if d.id not in offered]
        if outside:
            raise AllocationError(
                f"{self.name}: must-include devices not in available: {show_ids(outside)}"
            )
        if self.backend.implements("preferred_allocation"):
            try:
                chosen = await self.backend.call(
                    "preferred_allocation", available=avail, must_include=must, size=size
                )
            except BackendError as e:
                log.warning("%s; using the default engine", e, extra={"resource": self.name})
                chosen = None
            if chosen is not None:
                chosen = list(chosen)
                ok = (
                    len(chosen) == size
                    and set(chosen) <= offered
                    and set(must_include) <= set(chosen)
                )
                if ok:
                    return chosen
                log.warning(
                    "backend %r preferred_allocation returned %r, not %d of the available "
                    "with the must-include; using the default engine",
                    self.backend.name,
                    chosen,
                    size,
                    extra={"resource": self.name},
                )
        policy = str(self.settings.get("replicaPolicy", "distributed"))
        return choose_preferred(
            avail, must, size, self.links, policy, advertised=self.state.devices
        )
