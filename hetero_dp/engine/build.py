"""The daemon from its pieces: :func:`build_daemon`, which the one assembly
(:func:`hetero_dp.ops.assembly.assemble`, for the CLI's ``run`` and both test
runners) calls once it has loaded the backends, read the config and built the
front end.

The engine knows neither front end nor the day-two pieces: the caller passes the
front end (one registered in :data:`hetero_dp.engine.frontend.FRONT_END_GROUP`)
and the extensions to attach (``hetero_dp.ops.operations.day_two``: metrics,
probes, labels, reload).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.engine.daemon import Daemon
from hetero_dp.engine.frontend import FrontEnd

Attach = Callable[[Daemon], object]


def build_daemon(
    config: Config,
    backends: list[Backend],
    front_end: FrontEnd,
    *,
    extensions: Sequence[Attach],
) -> Daemon:
    """A daemon serving ``backends`` through ``front_end``, with each of ``extensions``
    (a function that plugs an extension into the daemon) attached, in order."""
    for b in backends:
        b.timeout = config.hook_timeout
    daemon = Daemon(config, backends, front_end)
    for attach in extensions:
        attach(daemon)
    return daemon
