"""Publishing: pushing one backend's effective devices to the resources they are
advertised under, creating those resources (and their front-end side) on first sight,
then calling every publisher (CDI specs, labels, DRA drivers).

:class:`Advertiser` owns what a resource is advertised with besides its devices: the
settings each resource gets (its backend's ``resource_defaults`` under the config's
section, asked once per resource and again when a reload changes the backend's
options) and which backend serves it. When a publish runs is the daemon's
(:mod:`.daemon`); the plan of what goes where is :mod:`.publishing`'s."""

from __future__ import annotations

import inspect
import logging
from typing import Protocol

from hetero_dp.allocation.cdi import spec_device_problems
from hetero_dp.allocation.gate import Refused, refusal
from hetero_dp.allocation.preferred import link_scores
from hetero_dp.engine.cdi_publisher import CDINames, CDIPublisher
from hetero_dp.engine.config import Config
from hetero_dp.engine.frontend import FrontEnd, Publisher
from hetero_dp.engine.publishing import OversizeHold, Plan, log_transitions, plan
from hetero_dp.engine.resource import Resource
from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.engine.settings import ResourceSettings, read_defaults
from hetero_dp.kits import observe
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError, ConfigError

log = logging.getLogger("hetero_dp.engine.daemon")  # read as the daemon's


class Host(Protocol):
    """What the advertiser uses of the daemon."""

    config: Config
    resources: dict[str, Resource]
    publishers: list[Publisher]
    front_end: FrontEnd
    cdi_off: str | None
    cdi_names: CDINames  # what the spec writer's specs define
    started: bool

    def hook_error(self, rt: BackendRuntime, hook: str, e: Exception) -> None: ...


class Advertiser:
    """Publishes backends' devices to their resources, and owns each resource's
    settings (defaults from its backend under the config file's section)."""

    def __init__(self, engine: Host) -> None:
        self.engine = engine
        self._oversize = OversizeHold()
        # resource -> the settings defaults its backend's resource_defaults gave, read
        self.resource_defaults: dict[str, ResourceSettings] = {}
        # resource -> (the file's entry, the defaults, those merged): merged once
        self._merged: dict[
            str, tuple[ResourceSettings, ResourceSettings | None, ResourceSettings]
        ] = {}

    def settings_for(self, name: str) -> ResourceSettings:
        """A resource's settings: the backend's defaults under the config file's section."""
        entry = self.engine.config.resource_settings(name)
        defaults = self.resource_defaults.get(name)
        kept = self._merged.get(name)
        if kept is not None and kept[0] is entry and kept[1] is defaults:
            return kept[2]
        merged = entry.over(defaults)
        self._merged[name] = (entry, defaults, merged)
        return merged

    @property
    def owner(self) -> dict[str, str]:
        """Advertised resource -> the name of the backend serving it."""
        return {name: res.backend.name for name, res in self.engine.resources.items()}

    async def renew_defaults(self, rt: BackendRuntime) -> None:
        """Ask ``rt``'s backend again for the defaults of every resource it serves (its
        options changed: its defaults may follow them)."""
        for name in [n for n, owner in self.owner.items() if owner == rt.backend.name]:
            self.resource_defaults.pop(name, None)
            await self.load_defaults(name, rt)

    def _wants_defaults(self, name: str, rt: BackendRuntime) -> bool:
        return name not in self.resource_defaults and rt.backend.implements("resource_defaults")

    async def load_defaults(self, name: str, rt: BackendRuntime) -> None:
        """Ask the backend for ``name``'s settings defaults, once, and read them as the
        file's entries are read (an error names the backend and the key)."""
        if not self._wants_defaults(name, rt):  # loaded already (by a concurrent publish too)
            return
        try:
            given = await rt.backend.call("resource_defaults", resource=name)
            entry = self.engine.config.resource_settings(name)
            defaults = read_defaults(given, name, rt.backend.name, entry)
        except (BackendError, ConfigError) as e:
            self.engine.hook_error(rt, "resource_defaults", e)
            defaults = ResourceSettings()
        self.resource_defaults[name] = defaults

    def _ensure_resource(self, name: str, rt: BackendRuntime) -> Resource | None:
        res = self.engine.resources.get(name)
        if res is not None:
            if res.backend.name == rt.backend.name:
                return res
            self._refuse_resource(
                rt,
                f"resource {name} is served by backend {res.backend.name!r} already; "
                f"ignoring {rt.backend.name!r}",
            )
            return None
        res = Resource(
            name,
            rt.backend,
            settings=self.settings_for(name),
            sharing=self.engine.config.sharing,
            cdi_off=self.engine.cdi_off,
            cdi_names=self.engine.cdi_names,
        )
        try:
            self.engine.front_end.add_resource(res)
        except ValueError as e:  # the front end cannot serve it (a socket path too long)
            self._refuse_resource(rt, f"resource {name}: {e}")
            return None
        self.engine.resources[name] = res
        return res

    def _refuse_resource(self, rt: BackendRuntime, msg: str) -> None:
        """A resource that cannot be served: a ConfigError at start-up, later an error logged."""
        if not self.engine.started:
            raise ConfigError(msg, field="resource", source=f"backend {rt.backend.name}")
        log.error(msg)

    async def publish(self, rt: BackendRuntime, again: bool = True) -> None:
        """Push the backend's effective devices to its resources."""
        # Load new resources' defaults first, then read the devices and update every
        # resource without awaiting: a publish that read them before an await could
        # finish after a newer one and put its stale view back.
        while True:
            effective = rt.effective()
            planned, invalid = plan(rt, effective, self.engine.config.sharing)
            refused = self._cdi_refusals(planned)
            if refused:  # out of the CDI spec: Unhealthy, so never allocated by CDI name
                effective = [refused.get(d.id, d) for d in effective]
                planned, invalid = plan(rt, effective, self.engine.config.sharing)
            missing = {
                name
                for phys, (_, grouped) in planned.items()
                for name in set(grouped) | rt.resources.get(phys, set())
                if self._wants_defaults(name, rt)
            }
            if not missing:
                break
            for name in sorted(missing):
                await self.load_defaults(name, rt)
        log_transitions(rt, effective)
        ids_changed = set(rt.published) != {d.id for d in effective}
        rt.published = {d.id: d for d in effective}
        for d in invalid:
            log.error(
                "backend %r: device %r has an invalid resource name %r; ignored",
                rt.backend.name,
                d.id,
                d.resource,
            )
        for phys, (physical_map, grouped) in planned.items():
            held = self._oversize.check(rt, grouped, ids_changed, self.engine.started)
            for name in set(grouped) | rt.resources.get(phys, set()):
                res = self._ensure_resource(name, rt)
                if res is None:
                    continue
                advertised = grouped.get(name, [])
                if name in held:  # the devices advertised before that are still there
                    advertised = [d for d in advertised if res.state.get(d.id) is not None]
                if res.state.update(advertised, physical_map):
                    observe.emit(
                        "devices_changed",
                        resource=name,
                        total=len(res.state.devices),
                        healthy=res.state.healthy_count,
                    )
            rt.resources[phys] = set(grouped) or rt.resources.get(phys, set())
        if ids_changed and rt.backend.implements("links"):
            await self._refresh_links(rt)
        for publish in list(self.engine.publishers):
            try:
                result = publish(rt)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("publisher %r failed", publish)
        cdi = self._cdi()
        if again and cdi is not None and cdi.failures_changed():
            # a spec that could not be written (or now could): its devices outside the
            # file turn Unhealthy (or serve again) at once, not at the next change
            await self.publish(rt, again=False)

    def _cdi(self) -> CDIPublisher | None:
        return next((p for p in self.engine.publishers if isinstance(p, CDIPublisher)), None)

    def _cdi_refusals(self, planned: Plan) -> dict[str, Device]:
        """Devices that cannot be in the CDI spec of a kind their resource delivers by,
        made Unhealthy with the reason (the spec is written for the others), and those
        a spec that could not be written leaves without a CDI name."""
        cdi = self._cdi()
        if cdi is None:
            return {}
        out: dict[str, Device] = {}
        for phys, (physical_map, grouped) in planned.items():
            try:
                kinds = cdi.kinds(phys, set(grouped))
            except ConfigError:
                continue  # the publisher logs it
            for kind in sorted(kinds):
                for d in physical_map.values():
                    if d.id in out or isinstance(d.reason, Refused):
                        continue
                    problems = spec_device_problems(kind, d)
                    if problems:
                        out[d.id] = d.with_health(False, refusal(problems))
                        continue
                    unwritten = cdi.unwritten(kind, d.id)
                    if unwritten and d.healthy:
                        out[d.id] = d.with_health(False, unwritten)
        return out

    async def _refresh_links(self, rt: BackendRuntime) -> None:
        try:
            links = await rt.backend.call("links", devices=list(rt.discovered.values()))
        except BackendError as e:
            self.engine.hook_error(rt, "links", e)
            return
        table = link_scores(links)
        for names in rt.resources.values():
            for name in names:
                if name in self.engine.resources:
                    self.engine.resources[name].links = table
