"""A new config applied to a running daemon, with the least disturbance.

Refused (ConfigError, the old config kept) when it changes where sockets live,
when the new sharing does not fit the devices, when an extension cannot follow it
(a probe address that cannot be bound), or when a backend refuses its new options
(those already re-configured are rolled back). Otherwise: only resources whose
settings changed restart (stop, serve, re-register); backends whose options
changed are re-configured and rediscover; every other ListAndWatch stream stays
open.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from hetero_dp.allocation.sharing import SharingConfig
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.cdi_publisher import CDIPublisher, make_cdi_publisher
from hetero_dp.engine.config import Config
from hetero_dp.engine.extension import Extension
from hetero_dp.model.errors import ConfigError

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import Daemon

log = logging.getLogger(__name__)

# Settings that decide where sockets live: changing them needs a restart of the daemon.
FIXED = {
    "kubelet_dir": "kubeletDir",
    "plugins_registry_dir": "pluginsRegistryDir",
    "registration": "registration",
    "socket_prefix": "socketPrefix",
}


def _sharing_view(sharing: SharingConfig, physical: str) -> tuple[Any, ...]:
    """What sharing does to one physical resource: its entry, its shared name, its rules."""
    entry = sharing.entry_for(physical)
    if entry is None:
        return (None,)
    entry = dataclasses.replace(entry, field="")  # where it sits in the file does not matter
    return (entry, sharing.shared_name(physical), sharing.fail_requests_greater_than_one)


def _sharing_affected(daemon: Daemon, old: Config, new: Config) -> set[str]:
    """Advertised resources (old and new names) whose sharing changed."""
    if old.sharing == new.sharing:
        return set()
    names: set[str] = set()
    for rt in daemon.runtimes.values():
        for physical, advertised in rt.resources.items():
            if _sharing_view(old.sharing, physical) != _sharing_view(new.sharing, physical):
                names |= {physical, *advertised, new.sharing.shared_name(physical)}
    return names


async def _configure_changed(daemon: Daemon, old: Config, new: Config) -> list[Backend]:
    """Re-configure the backends whose options changed; all or none (rolled back)."""
    changed = [
        b for b in daemon.backends if old.backend_options(b.name) != new.backend_options(b.name)
    ]
    done: list[Backend] = []
    for b in changed:
        try:
            await b.configure_from(new)
        except ConfigError:
            for ok in done:
                try:
                    await ok.configure_from(old)
                except ConfigError as e:
                    log.error("restoring the old options of backend %r failed: %s", ok.name, e)
            raise
        done.append(b)
    return changed


def _swap_cdi_publisher(daemon: Daemon, new: CDIPublisher | None) -> None:
    for old in [p for p in daemon.publishers if isinstance(p, CDIPublisher)]:
        daemon.publishers.remove(old)
        old.remove_specs()  # specs nobody keeps up to date any more
    if new is not None:
        daemon.publishers.append(new)


async def apply_config(daemon: Daemon, new: Config) -> dict[str, list[str]]:
    """Apply ``new`` to a running daemon; ConfigError (old config kept) if it cannot be.

    Returns what was done: ``{"restarted": [resources], "reconfigured": [backends]}``.
    """
    old = daemon.config
    for attr, key in FIXED.items():
        if getattr(old, attr) != getattr(new, attr):
            raise ConfigError(
                f"cannot change while running (was {getattr(old, attr)}, now "
                f"{getattr(new, attr)}); restart the daemon to apply it",
                field=key,
                source=new.source,
            )
    if new.sharing != old.sharing:  # the new sharing must fit the devices there are
        physical = [d for rt in daemon.runtimes.values() for d in rt.discovered.values()]
        try:
            new.sharing.validate_devices(physical)
        except ConfigError as e:
            raise ConfigError(e.reason, field=e.field, source=new.source) from None
    before = {name: daemon.settings_for(name) for name in daemon.resources}
    prepared: list[Extension] = []
    try:
        for ext in daemon.extensions:  # e.g. binds a new probe address, or refuses
            await ext.prepare(old, new)
            prepared.append(ext)
        # a publisher for the new ``cdi`` section, its dir checked before anything changes
        cdi = (
            make_cdi_publisher(new.cdi, daemon.settings_for, new.source)
            if old.cdi != new.cdi
            else None
        )
        changed = await _configure_changed(daemon, old, new)  # last: it rolls back itself
    except ConfigError:
        for ext in prepared:
            await ext.discard()
        raise

    # From here on nothing refuses.
    daemon.config = new
    for b in daemon.backends:
        b.timeout = new.hook_timeout
    for ep in daemon.endpoints.values():
        ep.stream_timeout = new.stream_timeout
    daemon.restart_loops(old, new)
    if (old.log_level, old.log_format) != (new.log_level, new.log_format):
        from hetero_dp.kits.logs import setup_logging

        setup_logging(new.log_level, new.log_format)

    # a re-configured backend may give other defaults (NVIDIA: deviceListStrategy -> deliver)
    for b in changed:
        rt = daemon.runtimes[b.name]
        for name in [n for n, owner in daemon.owner.items() if owner == b.name]:
            daemon.resource_defaults.pop(name, None)
            await daemon.load_defaults(name, rt)
    restart = {name for name in daemon.resources if daemon.settings_for(name) != before[name]}
    affected = _sharing_affected(daemon, old, new)
    for res in daemon.resources.values():
        res.sharing = new.sharing
        res.settings = daemon.settings_for(res.name)  # backend defaults under the new section
    restart |= affected & set(daemon.resources)
    if old.cdi != new.cdi:
        _swap_cdi_publisher(daemon, cdi)

    for b in changed:
        await daemon.rediscover(b.name)
    # publish again: CDI specs and labels follow new settings; streams wake only on change
    for rt in daemon.runtimes.values():
        if rt.backend not in changed:
            await daemon.publish(rt)
    for name in sorted(restart):
        if name in daemon.endpoints:
            daemon.endpoints[name].request_restart("its configuration changed")
    for ext in daemon.extensions:
        await ext.apply(old, new)
    summary = {"restarted": sorted(restart), "reconfigured": [b.name for b in changed]}
    log.info(
        "applied the new config from %s: restarted %s; re-configured %s",
        new.source,
        ", ".join(summary["restarted"]) or "no resources",
        ", ".join(summary["reconfigured"]) or "no backends",
    )
    return summary
