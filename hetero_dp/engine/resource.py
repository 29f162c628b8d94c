"""One advertised resource: its state, its backend, its settings, and the logic
behind the kubelet's calls (the gRPC side only translates)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
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

#: Prepared answers one resource keeps (one per distinct request of device IDs); past
#: this the cache starts over.
MAX_PREPARED = 256


class Resource:
    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        settings: Mapping[str, Any] | None = None,
        sharing: SharingConfig | None = None,
        cdi_off: str | None = None,
        undefined_cdi: Callable[[Sequence[str]], list[str]] | None = None,
    ) -> None:
        self.name = name
        # the CDI names of the daemon's own kinds no spec written defines
        self.undefined_cdi = undefined_cdi
        self.backend = backend  # (whether it has an allocate hook: known from here on)
        # why the node's container runtime cannot consume CDI (None: it can, or unknown)
        self._cdi_off = cdi_off
        self.settings = dict(settings or {})
        self.sharing = sharing or SharingConfig()
        self.state = ResourceState(name)
        self.links: dict[tuple[str, str], float] = {}
        # request IDs -> (physical devices, response before the allocate hook, whether
        # that passes the container gate), for the stamp below: what Allocate derives
        # from the records, done once per request
        self._prepared: dict[tuple[str, ...], tuple[list[Device], ContainerResponse, bool]] = {}
        self._prepared_stamp: object = None

    @property
    def backend(self) -> Backend:
        return self._backend

    @backend.setter
    def backend(self, value: Backend) -> None:
        self._backend = value
        self._hooked = value.implements("allocate")  # asked on every Allocate
        # unless it names what its answers depend on (the allocate_key hook)
        self._answer_key = value.runner.hook_function("allocate_key") if self._hooked else None
        self._answer_key_failed = False

    @property
    def cdi_off(self) -> str | None:
        """Why the node's container runtime cannot consume CDI (None: it can, or it is
        unknown); set again when a reload reads ``cdi.runtimeConfig`` afresh, which
        derives the delivery again (a CDI delivery falls back, or no longer does)."""
        return self._cdi_off

    @cdi_off.setter
    def cdi_off(self, value: str | None) -> None:
        if value != self._cdi_off:
            self._cdi_off = value
            self.settings = self._settings

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
        if self._delivery is not None and self._delivery.uses_cdi and self._cdi_off:
            fallback = without_cdi(self._delivery)
            log.warning(
                "%s: delivery %s needs CDI, but %s: delivering with %s instead, so pods "
                "get their device nodes",
                self.name,
                ",".join(self._delivery.strategies),
                self._cdi_off,
                ",".join(fallback.strategies),
            )
            self._delivery = fallback

    @property
    def pre_start_required(self) -> bool:
        return self.backend.implements("pre_start_container")

    @property
    def preferred_allocation_available(self) -> bool:
        return bool(self.settings.get("preferredAllocation", True))

    def _physical_devices(self, ids: Sequence[str]) -> list[Device]:
        devices = []
        for pid in to_physical(ids):
            d = self.state.physical(pid)
            if d is None:  # the advertised set and the physical map disagree: a bug
                raise AllocationError(f"{self.name}: no physical device {pid!r}", code="INTERNAL")
            devices.append(d)
        return devices

    def _stamp(self) -> tuple[int, Mapping[str, Any], SharingConfig, str | None]:
        # the records (every state update), the settings and whether the runtime takes
        # CDI (together: the delivery) and the sharing config decide the answer before
        # the hook
        return (self.state.generation, self._settings, self.sharing, self._cdi_off)

    def answer_stamp(self) -> object | None:
        """Equal from one call to the next for as long as :meth:`allocate` answers the
        same IDs with the same response (the device records, the settings and the
        sharing config unchanged); None when every call must be asked, as with an
        ``allocate`` hook, which may answer differently each time, unless the backend
        names what its answers depend on (its ``allocate_key``)."""
        if not self._hooked:
            return self._stamp()
        if self._answer_key is None:
            return None
        try:
            key = self._answer_key()
        except Exception as e:  # a broken key costs speed, never an answer
            if not self._answer_key_failed:
                self._answer_key_failed = True
                log.warning(
                    "backend %r: allocate_key raised %r; allocate runs on every request",
                    self.backend.name,
                    e,
                    extra={"resource": self.name},
                )
            return None
        return None if key is None else (self._stamp(), key)

    def _prepare(self, ids: Sequence[str]) -> tuple[list[Device], ContainerResponse, bool]:
        """The physical devices and the default response (delivery applied) for
        ``ids`` and, with an allocate hook, whether that response passes the container
        gate (then only what the hook changes is judged on each call), or
        AllocationError: checked and built once per request of IDs while the stamp
        holds (only successes are kept, so a refusal is judged afresh)."""
        stamp = self._stamp()
        if stamp != self._prepared_stamp:
            self._prepared = {}
            self._prepared_stamp = stamp
        key = tuple(ids)
        entry = self._prepared.get(key)
        if entry is not None:
            return entry
        validate_ids(self.state, ids)
        self.sharing.check_request(self.name, ids)
        physical = self._physical_devices(ids)
        response = apply_delivery(
            build_response(physical), physical, self._delivery or self.settings
        )
        # the records passed the gate at discovery; the joined env values may not
        clean = not self._hooked or not response_problems(response)
        if len(self._prepared) >= MAX_PREPARED:
            self._prepared = {}
        entry = self._prepared[key] = (physical, response, clean)
        return entry

    async def allocate(self, ids: Sequence[str]) -> ContainerResponse:
        physical, default, clean = self._prepare(ids)
        response = default.copy()  # the hook, or the caller, may change it
        if not self._hooked:
            return response
        try:
            # the runner itself: Backend.call only forwards, one frame less per call
            await self.backend.runner.call("allocate", devices=list(physical), response=response)
        except BackendError as e:
            log.error("%s", e, extra={"resource": self.name, "devices": show_ids(ids)})
            raise AllocationError(
                f"{self.name}: backend {self.backend.name!r} failed to allocate "
                f"{show_ids(ids)}: {e}",
                code="INTERNAL",
            ) from e
        # Built from records the gate passed at discovery; an allocate hook may add more:
        # what it added or changed is judged (everything, if the default did not pass).
        # Nodes the default holds were judged (lstat/realpath) when it was built, once
        # per state generation, not on every call.
        problems = response_problems(response, passed=default if clean else None)
        if self.undefined_cdi is not None and response.cdi_devices != default.cdi_devices:
            added = [n for n in response.cdi_devices if n not in default.cdi_devices]
            problems += [
                f"cdiDevices: {n!r} is defined by no CDI spec written"
                for n in self.undefined_cdi(added)
            ]
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
            await self.backend.call("pre_start_container", devices=physical)
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
