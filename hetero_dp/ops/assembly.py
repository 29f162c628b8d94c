"""One assembly of a running daemon, for ``hetero-dp run`` and both test runners
(:class:`hetero_dp.testing.runner.PluginRunner`, the DRA runner): backends loaded,
the config read with the sections they claim, the front end looked up by name
(:func:`hetero_dp.engine.frontend.front_end_maker`) and built, the day-two pieces
attached with config reload wired to the same reader. Tests run what production
runs because there is one way to build it.

It sits in ``ops`` because it attaches ``ops``; the engine below knows none of it
(:func:`hetero_dp.engine.build.build_daemon` takes the pieces).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hetero_dp.engine.build import build_daemon
from hetero_dp.engine.frontend import front_end_maker
from hetero_dp.engine.loading import load_backends
from hetero_dp.ops import operations

if TYPE_CHECKING:
    from hetero_dp.engine.backend import Backend
    from hetero_dp.engine.config import Config
    from hetero_dp.engine.daemon import Daemon

#: Reads the config for the loaded backends (the sections they claim); called at
#: start-up and, with a config file, again for each reload.
ReadConfig = Callable[["list[Backend]"], "Config"]


def assemble(
    backends: Iterable[str | ModuleType | object],
    read_config: ReadConfig,
    *,
    mode: str = "device-plugin",
    front_end: Mapping[str, Any] | None = None,
    config_file: str | Path | None = None,
    fake_nodes: str | None = None,
    on_config: Callable[[Config], None] | None = None,
) -> Daemon:
    """A daemon serving ``backends`` (names, ``.py`` paths, modules or objects)
    through the front end registered as ``mode`` (built with ``front_end``, its own
    options), with metrics, probes, labels and, given ``config_file``, reload of that
    file through ``read_config`` attached. ``on_config`` sees the config first (the
    CLI sets up logging from it); ``fake_nodes`` is a dir whose plain files stand for
    device nodes (tests, trials). ConfigError for a bad setup; the backends loaded
    are closed then."""
    make_front_end = front_end_maker(mode)
    loaded = load_backends(backends)
    try:
        cfg = read_config(loaded)
        if on_config is not None:
            on_config(cfg)
        front = make_front_end(cfg, front_end or {})
        if config_file is not None:
            ops = operations.day_two(Path(config_file), lambda: read_config(loaded))
        else:
            ops = operations.day_two()
        daemon = build_daemon(cfg, loaded, front, extensions=[ops])
    except BaseException:
        for b in loaded:
            b.close()
        raise
    if fake_nodes is not None:
        daemon.accept_fake_nodes(fake_nodes)
    return daemon
