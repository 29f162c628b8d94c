"""Front end 2: the daemon's backends served as DRA drivers (``hetero-dp run --mode dra``).

:class:`DRAFrontEnd` is a :class:`~hetero_dp.engine.frontend.FrontEnd` over the same
engine as the device-plugin front end: discovery, health polling, watch hooks and
rediscovery work exactly as in device-plugin mode, and every publish of a
backend's devices goes to one :class:`DRADriver` per resource name.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_dp.allocation.sharing import advertise
from hetero_dp.dra.checkpoint import holders
from hetero_dp.dra.claimread import ClaimError, ClaimRef
from hetero_dp.dra.driver import (
    DEFAULT_PLUGINS_DIR,
    DEFAULT_RESYNC_INTERVAL,
    DRADriver,
    DriverSettings,
)
from hetero_dp.dra.names import driver_name_for, driver_name_problem
from hetero_dp.dra.slices import VERSIONS
from hetero_dp.dra.stopping import StopBudget
from hetero_dp.engine.cdi_publisher import CDIWriter
from hetero_dp.engine.config import Config
from hetero_dp.engine.frontend import Attached, Engine
from hetero_dp.engine.resource import Resource
from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.model.device import Device, is_replica, replica_base
from hetero_dp.model.errors import BackendError, ConfigError
from hetero_dp.model.names import path_problem
from hetero_dp.usage.view import ClaimHolder

log = logging.getLogger(__name__)


@dataclass
class DRAOptions:
    """What DRA mode needs beyond the common config.

    ``driver_names``: resource -> driver name; the key ``""`` is a bare
    ``--driver-name`` (allowed while the daemon serves one resource).
    """

    node_name: str = ""
    driver_names: dict[str, str] = field(default_factory=dict)
    plugins_dir: Path = Path(DEFAULT_PLUGINS_DIR)
    cdi_dir: Path | None = None
    resync_interval: float = DEFAULT_RESYNC_INTERVAL
    api_versions: tuple[str, ...] = VERSIONS
    instance: str = ""  # the pod UID, for rolling updates (env POD_UID)

    @classmethod
    def from_flags(
        cls,
        *,
        node_name: str | None,
        driver_names: Sequence[str] = (),
        plugins_dir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> DRAOptions:
        env = os.environ if env is None else env
        node = node_name or env.get("HETERO_DP_NODE_NAME") or env.get("NODE_NAME") or ""
        names: dict[str, str] = {}
        for item in driver_names:
            resource, sep, name = item.rpartition("=")
            key = resource if sep else ""
            problem = driver_name_problem(name)
            if problem:
                raise ConfigError(
                    problem, field="dra.driverNames", source="flag --driver-name or config"
                )
            names[key] = name
        opts = cls(node_name=node, driver_names=names)
        opts.instance = env.get("HETERO_DP_POD_UID") or env.get("POD_UID") or ""
        if plugins_dir:
            problem = path_problem(plugins_dir)
            if problem:  # a relative one is made absolute by the command line
                raise ConfigError(problem, field="pluginsDir", source="flag --dra-plugins-dir")
            opts.plugins_dir = Path(plugins_dir)
        return opts


def make_front_end(cfg: Config, options: Mapping[str, Any]) -> DRAFrontEnd:
    """The DRA front end (registered as ``dra``, see
    :data:`hetero_dp.engine.frontend.FRONT_END_GROUP`), from the config's ``dra``
    section (the file, its env vars, ``hetero-dp run``'s flags ``--node-name``,
    ``--driver-name``, ``--dra-plugins-dir``, ``--api-server``, ``--kubeconfig``), or
    a test runner's options over it (``node_name``, ``driver_names`` as a mapping,
    ``plugins_dir``; ``api_client``, ``env``, ``resync_interval``, ``api_versions``,
    ``instance`` besides)."""
    section = cfg.dra
    names = options.get("driver_names") or section.driver_names
    if isinstance(names, Mapping):  # resource -> name ("": a bare name)
        names = [f"{r}={n}" if r else n for r, n in names.items()]
    dra = DRAOptions.from_flags(
        node_name=options.get("node_name") or section.node_name,
        driver_names=names,
        plugins_dir=options.get("plugins_dir") or str(section.plugins_dir),
        env=options.get("env"),  # the environment's NODE_NAME, POD_UID (default: os.environ)
    )
    if not dra.node_name:
        raise ConfigError(
            "DRA mode needs the node's name: --node-name (config dra.nodeName), or "
            "NODE_NAME from the downward API",
            field="dra.nodeName",
            source="flag --node-name",
        )
    if "resync_interval" in options:
        dra.resync_interval = float(options["resync_interval"])
    if options.get("api_versions"):
        dra.api_versions = tuple(options["api_versions"])
    if "instance" in options:
        dra.instance = str(options["instance"])
    client = options.get("api_client")
    if client is None:
        from hetero_dp.dra.api import make_api_client

        try:
            client = make_api_client(
                options.get("api_server") or section.api_server or None,
                options.get("kubeconfig") or section.kubeconfig or None,
            )
        except (ValueError, OSError) as e:  # no cluster, an unreadable kubeconfig, a bad CA
            raise ConfigError(
                f"cannot configure the API server client: {e}", field="kubeconfig"
            ) from None
    return DRAFrontEnd(dra, client)


class DRAFrontEnd(Attached):
    name = "dra"

    def __init__(self, options: DRAOptions, api_client: Any) -> None:
        self.dra = options
        self.api_client = api_client
        self.drivers: dict[str, DRADriver] = {}  # resource -> driver
        self._served: dict[str, set[str]] = {}  # backend -> resources it had devices for
        self._dra_started = False
        self._errors: list[ConfigError] = []
        self._stop_budget = StopBudget(api_client)  # how long a stop waits on the server

    def attach(self, engine: Engine) -> None:
        super().attach(engine)
        engine.add_publisher(self._publish_dra)

    def driver_name(self, resource: str) -> str:
        names = self.dra.driver_names
        if resource in names:
            return names[resource]
        if "" in names:
            others = [r for r in self.drivers if r != resource and r not in names]
            if others:
                raise ConfigError(
                    f"--driver-name {names['']} without RESOURCE= fits one resource, but the "
                    f"backends serve {others[0]} and {resource}; use RESOURCE=NAME",
                    field="driverName",
                    source="flag --driver-name",
                )
            return names[""]
        return driver_name_for(resource)

    def _driver(self, resource: str) -> DRADriver:
        driver = self.drivers.get(resource)
        if driver is None:
            settings = DriverSettings(
                driver=self.driver_name(resource),
                node=self.dra.node_name,
                plugins_dir=self.dra.plugins_dir,
                registry_dir=self.engine.config.plugins_registry_dir,
                cdi_dir=self._cdi_dir(self.engine.config),
                resync_interval=self.dra.resync_interval,
                api_versions=self.dra.api_versions,
                resource=resource,
                instance=self.dra.instance,
            )
            taken = {d.name: r for r, d in self.drivers.items()}
            if settings.driver in taken:
                raise ConfigError(
                    f"resources {taken[settings.driver]} and {resource} would share the DRA "
                    f"driver name {settings.driver}; give one a --driver-name RESOURCE=NAME",
                    field="driverName",
                )
            driver = DRADriver(settings, self.api_client)
            driver.preparer.on_prepare = self._prepare_hook
            driver.preparer.on_unprepare = self._unprepare_hook
            driver.preparer.spec_edits = self._spec_edits_hook
            self.drivers[resource] = driver
        return driver

    async def _publish_dra(self, rt: BackendRuntime) -> None:
        by_resource: dict[str, list[Device]] = {}
        for d in rt.published.values():
            by_resource.setdefault(d.resource, []).append(d)
        for d in (await self.engine.claim_hooks.partitions(rt)).values():
            by_resource.setdefault(d.resource, []).append(d)
        gone = self._served.get(rt.backend.name, set()) - set(by_resource)
        for resource in gone:
            by_resource[resource] = []
        self._served[rt.backend.name] = set(by_resource) - gone
        for resource, devices in by_resource.items():
            try:
                driver = self._driver(resource)
            except ConfigError as e:
                # publishers' exceptions are only logged by the daemon: keep it for start()
                self._errors.append(e)
                log.error("DRA mode cannot serve resource %s: %s", resource, e)
                continue
            await driver.update(devices, self._shares(devices))
            if self._dra_started and not driver.running:
                await driver.start()

    @staticmethod
    def _claim(ref: ClaimRef) -> dict[str, str]:
        return {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}

    async def _prepare_hook(
        self, ref: ClaimRef, devices: dict[str, Device], config: list[dict[str, Any]]
    ) -> list[Device]:
        """The backends' ``prepare`` hooks, through the engine; a failure fails the claim."""
        try:
            return await self.engine.claim_hooks.prepare(self._claim(ref), devices, config)
        except BackendError as e:
            raise ClaimError(str(e)) from None

    async def _spec_edits_hook(self, kind: str, devices: list[Device]) -> dict[str, Any]:
        """The spec-wide edits (driver files, hooks) for a claim's spec, through the
        engine: the same a device-plugin spec of theirs holds. A failure fails the claim."""
        try:
            return await self.engine.claim_hooks.spec_edits(kind, devices)
        except BackendError as e:
            raise ClaimError(str(e)) from None

    async def _unprepare_hook(self, ref: ClaimRef, device_ids: list[str]) -> None:
        """The backends' ``unprepare`` hooks, through the engine."""
        try:
            await self.engine.claim_hooks.unprepare(self._claim(ref), device_ids)
        except BackendError as e:
            raise ClaimError(str(e)) from None

    def _shares(self, devices: list[Device]) -> dict[str, int]:
        """Device ID -> replicas the sharing config makes of it (time-slicing); DRA
        publishes each device once and maps the replicas onto consumable capacity."""
        counts: dict[str, int] = {}
        for d in advertise(devices, self.engine.config.sharing):
            if is_replica(d.id):
                base = replica_base(d.id)
                counts[base] = counts.get(base, 0) + 1
        return counts

    def session(self, resource: str) -> None:
        """No device-plugin session: a DRA driver is not registered per resource."""
        return None

    def claim_holders(self) -> list[ClaimHolder]:
        """Who holds the claims the drivers prepared (:func:`.checkpoint.holders`)."""
        return [
            h
            for d in self.drivers.values()
            for h in holders(d.name, d.checkpoint, d.reservations.reserved_for())
        ]

    async def refresh_claim_holders(self, gap: float) -> None:
        """Re-read who each prepared claim is reserved for, each claim at most once per
        ``gap`` seconds (:mod:`.reservations`; the attribution loop calls this)."""
        for d in list(self.drivers.values()):
            await d.reservations.refresh(gap)

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, one line per driver): a driver is ready when the kubelet registered
        it and its pool is on the API server without refusals."""
        lines, ok = [], True
        for resource, d in sorted(self.drivers.items()):
            what = f"{d.name} ({resource})"
            problem = ""
            if not d.registered.is_set():
                problem = d.registration_error or "not registered with the kubelet"
            elif not d.api_ready:
                problem = "API server not reachable"
            elif d.publisher.errors:
                problem = "ResourceSlice refused: " + next(iter(d.publisher.errors.values()))
            if problem:
                ok = False
                lines.append(f"{what}: not ready: {problem}")
            else:
                n = len(d.publisher.devices or [])
                role = "" if d.publisher.active else ", standing by: a newer instance publishes"
                lines.append(
                    f"{what}: ready ({n} devices, generation {d.publisher.generation}{role})"
                )
        if not lines:
            lines.append("no resources: no backend found devices")
        return ok, lines

    async def open(self) -> None:
        """The drivers named on the command line exist before the first publish."""
        for resource in self.dra.driver_names:
            if resource:
                self._driver(resource)

    def add_resource(self, resource: Resource) -> None:
        """Nothing per resource: each gets its driver when devices are published to it."""

    async def serve(self) -> None:
        if self._errors:
            raise self._errors[0]
        await self._stop_budget.start(self._start_drivers(), self.engine.wait_stopped())
        self._dra_started = True

    async def _start_drivers(self) -> None:
        for driver in self.drivers.values():
            await driver.start()

    def restart(self, names: Mapping[str, str]) -> None:
        """A driver follows its devices on every publish: nothing to restart."""

    async def stop(self) -> None:
        # first: a publish still in flight must not start a driver stopped meanwhile
        self._dra_started = False
        self._stop_budget.arm()
        try:
            for driver in self.drivers.values():
                try:
                    await driver.stop()
                except Exception:
                    log.exception("stopping DRA driver %s failed", driver.name)
        finally:
            self._stop_budget.done()

    # --- reload (engine/frontend.py Reloadable) ---------------------------------

    def _cdi_dir(self, cfg: Config) -> Path:
        return self.dra.cdi_dir or Path(cfg.cdi.dir)

    async def prepare(self, old: Config, new: Config) -> None:
        """A new ``cdi.dir`` is checked (made if missing, takes files) before anything
        changes: the claims prepared after the reload have their specs there."""
        if self._cdi_dir(new) == self._cdi_dir(old):
            return
        writer = CDIWriter(self._cdi_dir(new))
        try:
            await asyncio.to_thread(writer.check, "cdi.dir")
        except ConfigError as e:
            raise ConfigError(e.reason, field=e.field, source=new.source) from None

    async def discard(self) -> None:
        pass

    async def apply(self, old: Config, new: Config) -> None:
        """Every driver writes the specs of claims it prepares from now on in the new
        ``cdi.dir``; a claim prepared before keeps its spec where it was written (the
        checkpoint names it: unprepare removes it there)."""
        cdi_dir = self._cdi_dir(new)
        for driver in self.drivers.values():
            driver.follow_cdi_dir(cdi_dir)
