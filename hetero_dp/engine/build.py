"""One way to assemble a daemon: the CLI's ``run`` and both test runners
(:class:`hetero_dp.testing.runner.PluginRunner`, the DRA runner) call
:func:`build_daemon`, so tests run what production runs, day-two pieces included.

The engine knows neither front end nor the day-two pieces: the caller passes the
front end (:class:`hetero_dp.deviceplugin.frontend.DevicePluginFrontEnd` or
:class:`hetero_dp.dra.frontend.DRAFrontEnd`) and the extensions to attach
(``hetero_dp.ops.operations.attach``: metrics, probes, labels, reload).
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
