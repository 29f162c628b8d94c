"""A new config applied to a running daemon, with the least disturbance: a loop over
the components a config change touches, each implementing one reload protocol
(:class:`hetero_dp.engine.frontend.Reloadable`: prepare, then apply or discard), each
in its own file here; the front end and the extensions (``hetero_dp.ops``) are
components like the others.

Refused (ConfigError, the old config kept) when it changes where sockets live
(:mod:`.fixed`), when the new sharing does not fit the devices (:mod:`.resources`),
when the new CDI dir cannot take specs (:mod:`.cdi`), when the options reader refuses
a backend's new options (:mod:`.backends`), or when an extension cannot follow it (a
probe address that cannot be bound). Every component prepared before the refusal
discards what it prepared. Preparing touches no live state: no hook of a running
backend is called until every component has prepared; then the changed backends'
``configure`` hooks run (a backend may still refuse there: those re-configured are
rolled back and every component discards). Otherwise: only resources
whose settings changed restart (stop, serve, re-register); backends whose options
changed are re-configured and rediscover; every other ListAndWatch stream stays open.
"""

from __future__ import annotations

import logging

from hetero_dp.engine.config import Config
from hetero_dp.engine.frontend import Reloadable
from hetero_dp.engine.reconfigure.backends import BackendOptions
from hetero_dp.engine.reconfigure.cdi import CDISettings
from hetero_dp.engine.reconfigure.fixed import FixedSettings
from hetero_dp.engine.reconfigure.resources import ResourceChanges, Restarts
from hetero_dp.engine.reconfigure.runtime import RuntimeSettings
from hetero_dp.engine.reconfigure.target import Target
from hetero_dp.model.errors import ConfigError

log = logging.getLogger(__name__)


async def apply_config(engine: Target, new: Config) -> dict[str, list[str]]:
    """Apply ``new`` to a running daemon; ConfigError (old config kept) if it cannot be.

    Returns what was done: ``{"restarted": [resources], "reconfigured": [backends]}``.
    """
    old = engine.config
    backends = BackendOptions(engine)
    resources = ResourceChanges(engine, backends)
    # prepared in this order, applied in this order
    fixed = FixedSettings()
    components: list[Reloadable] = [
        fixed,
        RuntimeSettings(engine),
        engine.front_end,
        resources,
        CDISettings(engine),
        backends,
        Restarts(engine, resources),
        *engine.extensions,
    ]
    prepared: list[Reloadable] = []
    try:
        for component in components:
            await component.prepare(old, new)
            prepared.append(component)
        # everything checked: the one step a live backend hears of (it may refuse)
        await backends.commit(old, new)
    except ConfigError:
        for component in reversed(prepared):
            await component.discard()
        raise

    # From here on nothing refuses.
    engine.config = new
    for component in components:
        await component.apply(old, new)
    summary = {
        "restarted": sorted(resources.restart),
        "reconfigured": [b.name for b in backends.changed],
    }
    if fixed.next_start:  # said by key: these wait for the next start
        summary["next start"] = fixed.next_start
    log.info(
        "applied the new config from %s: restarted %s; re-configured %s",
        new.source,
        ", ".join(summary["restarted"]) or "no resources",
        ", ".join(summary["reconfigured"]) or "no backends",
    )
    return summary
