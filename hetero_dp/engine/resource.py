"""One advertised resource: its state, its backend, its settings, and the logic
behind the kubelet's calls (the gRPC side only translates)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar, cast

from hetero_dp.allocation.allocate import build_response, show_ids, validate_ids
from hetero_dp.allocation.delivery import apply_delivery, without_cdi
from hetero_dp.allocation.gate import response_problems
from hetero_dp.allocation.preferred import choose_preferred
from hetero_dp.allocation.sharing import SharingConfig, to_physical
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.cdi_publisher import CDINames
from hetero_dp.engine.settings import ResourceSettings
from hetero_dp.model.device import Device
from hetero_dp.model.errors import AllocationError, BackendError
from hetero_dp.model.response import ContainerResponse
from hetero_dp.model.state import ResourceState

log = logging.getLogger(__name__)

#: Answers one resource keeps (one per distinct request); past this the cache starts over.
MAX_ANSWERS = 256

T = TypeVar("T")
_NO_HOOK = object()  # the answer key of a resource whose backend has no allocate hook


class _Answer(Generic[T]):
    """One request's answer while the resource's stamp holds: per container, the
    physical devices, the response before the allocate hook and whether that passes
    the container gate; the allocate key it was built under, the responses and what
    the front end made of them (its message)."""

    __slots__ = ("key", "message", "prepared", "responses")

    def __init__(self, prepared: list[tuple[list[Device], ContainerResponse, bool]]) -> None:
        self.prepared = prepared
        self.key: object = None
        self.responses: list[ContainerResponse] | None = None
        self.message: T | None = None


class Resource:
    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        settings: ResourceSettings | None = None,
        sharing: SharingConfig | None = None,
        cdi_off: str | None = None,
        cdi_names: CDINames | None = None,
    ) -> None:
        self.name = name
        # the CDI names of the daemon's own kinds no spec written defines
        self.cdi_names = cdi_names
        self.backend = backend  # (whether it has an allocate hook: known from here on)
        # why the node's container runtime cannot consume CDI (None: it can, or unknown)
        self._cdi_off = cdi_off
        self.settings = settings or ResourceSettings()
        self.sharing = sharing or SharingConfig()
        self.state = ResourceState(name)
        self.links: dict[tuple[str, str], float] = {}
        # The one cache of Allocate answers: request -> its answer, valid while the
        # stamp (the records, the settings, the sharing config) holds; with an allocate
        # hook the answer is reused while the backend's allocate_key holds too.
        self._answers: dict[Hashable, _Answer[Any]] = {}
        self._answers_stamp: object = None

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
    def settings(self) -> ResourceSettings:
        return self._settings

    @settings.setter
    def settings(self, value: ResourceSettings) -> None:
        # parsed where they were read (the config, the backend's defaults); here only
        # the fallback where the runtime cannot consume CDI
        self._settings = value
        self._delivery = value.delivery
        if self._delivery.uses_cdi and self._cdi_off:
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
        return self.settings.preferred

    def _physical_devices(self, ids: Sequence[str]) -> list[Device]:
        devices = []
        for pid in to_physical(ids):
            d = self.state.physical(pid)
            if d is None:  # the advertised set and the physical map disagree: a bug
                raise AllocationError(f"{self.name}: no physical device {pid!r}", code="INTERNAL")
            devices.append(d)
        return devices

    def _stamp(self) -> tuple[int, ResourceSettings, SharingConfig, str | None]:
        # the records (every state update), the settings and whether the runtime takes
        # CDI (together: the delivery) and the sharing config decide the answer before
        # the hook
        return (self.state.generation, self._settings, self.sharing, self._cdi_off)

    def _allocate_key(self) -> object | None:
        """What the answers depend on besides the stamp: a constant without an
        allocate hook; the backend's ``allocate_key`` with one (None: the hook is asked
        on every call, as without such a hook or when it raises)."""
        if not self._hooked:
            return _NO_HOOK
        if self._answer_key is None:
            return None
        try:
            return self._answer_key()
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

    def _prepare(self, ids: Sequence[str]) -> tuple[list[Device], ContainerResponse, bool]:
        """The physical devices and the default response (delivery applied) for
        ``ids`` and, with an allocate hook, whether that response passes the container
        gate (then only what the hook changes is judged on each call), or
        AllocationError (never kept: a refusal is judged afresh)."""
        validate_ids(self.state, ids)
        self.sharing.check_request(self.name, ids)
        physical = self._physical_devices(ids)
        response = apply_delivery(build_response(physical), physical, self._delivery)
        # the records passed the gate at discovery; the joined env values may not
        clean = not self._hooked or not response_problems(response)
        return physical, response, clean

    def kept(self, request: Hashable) -> Any:
        """What :meth:`answer` made for ``request`` if it would give it again now, else
        None: the Allocate hot path, a plain call (no coroutine) when nothing changed."""
        if self._stamp() != self._answers_stamp:
            return None
        entry = self._answers.get(request)
        if entry is None:
            return None
        if not self._hooked:
            return entry.message
        key = self._allocate_key()
        return entry.message if key is not None and entry.key == key else None

    async def answer(
        self,
        request: Hashable,
        containers: Callable[[], Sequence[Sequence[str]]],
        convert: Callable[[list[ContainerResponse]], T],
    ) -> T:
        """The answer to one Allocate ``request`` (a key the front end makes of it, equal
        for equal requests) of ``containers()`` (each container's device IDs, asked for
        only when the answer is not kept), as ``convert`` makes it of the containers'
        responses: the one cache of answers.
        While the stamp holds, a request answered before is answered with what was made
        then (without an allocate hook, or while its ``allocate_key`` holds); with the
        hook asked again, only ``convert`` is saved when the responses are what they
        were. AllocationError to refuse (never kept)."""
        stamp = self._stamp()
        if stamp != self._answers_stamp:
            self._answers = {}
            self._answers_stamp = stamp
        key = self._allocate_key()
        entry = self._answers.get(request)
        if entry is not None and key is not None and entry.key == key:
            return cast(T, entry.message)
        requests = containers()
        if entry is None:
            entry = _Answer([self._prepare(ids) for ids in requests])
        responses = [await self._finish(p, ids) for p, ids in zip(entry.prepared, requests)]
        if entry.responses is not None and entry.responses == responses:
            message = cast(T, entry.message)
        else:
            message = convert(responses)
            # copies: what is compared must not change with the hook's objects
            entry.responses = [r.copy() for r in responses] if self._hooked else responses
            entry.message = message
        entry.key = key
        if self._stamp() == stamp and request not in self._answers:  # unchanged meanwhile
            if len(self._answers) >= MAX_ANSWERS:
                self._answers = {}
            self._answers[request] = entry
        return message

    async def allocate(self, ids: Sequence[str]) -> ContainerResponse:
        """The response for one container (not kept: :meth:`answer` keeps answers)."""
        return await self._finish(self._prepare(ids), ids)

    async def _finish(
        self, prepared: tuple[list[Device], ContainerResponse, bool], ids: Sequence[str]
    ) -> ContainerResponse:
        """One container's response from what :meth:`_prepare` made: the allocate hook
        on a copy of the default, and the container gate on what it changed."""
        physical, default, clean = prepared
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
        if self.cdi_names is not None and response.cdi_devices != default.cdi_devices:
            added = [n for n in response.cdi_devices if n not in default.cdi_devices]
            problems += [
                f"cdiDevices: {n!r} is defined by no CDI spec written"
                for n in self.cdi_names.undefined(added)
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
        policy = self.settings.policy
        return choose_preferred(
            avail, must, size, self.links, policy, advertised=self.state.devices
        )
