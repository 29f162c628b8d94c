"""The config sections installed backends claim (their ``config_sections`` hook), for
reading a config file before the backends that will run are known, or beside them: a
section an installed backend claims is not refused as unknown even when that backend
is not run (the file may be shared with the program it replaces).

Here, not in :mod:`hetero_dp.engine.loading`, so that the config reader can ask without
depending on the loader (which depends on the config's types): the hook is called on
each installed backend's entry-point target through a plugin manager of its own.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from types import ModuleType

import pluggy

from hetero_dp import hookspecs
from hetero_dp.engine import results
from hetero_dp.kits.entrypoints import entry_points

ENTRY_POINT_GROUP = "hetero_dp"
INSTANCE = "plugin"  # the name a backend module gives its instance (its entry point's target)

# backend name -> {key as written in the file (dotted) -> where in its options ("" = spread)}
Sections = Mapping[str, Mapping[str, str]]


def installed_names() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def instance_in(module: ModuleType) -> object:
    """The backend a module holds: the instance it names ``plugin`` (what an entry point
    ``name = "module:plugin"`` loads), or else the module itself, whose module-level
    functions are the hooks."""
    instance = getattr(module, INSTANCE, None)
    if instance is None or inspect.ismodule(instance) or inspect.isclass(instance):
        return module
    return module if inspect.isroutine(instance) else instance


@functools.cache
def _claims(name: str) -> tuple[tuple[str, str], ...]:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name != name:
            continue
        try:
            plugin = ep.load()
            if inspect.ismodule(plugin):  # an entry point naming a module: its instance
                plugin = instance_in(plugin)
            pm = pluggy.PluginManager("hetero_dp")
            pm.add_hookspecs(hookspecs)
            pm.register(plugin, name=name)
            return tuple(
                results.sections(name, "config_sections", pm.hook.config_sections()).items()
            )
        except Exception:  # one that does not load claims nothing here;
            return ()  # running it names its error
    return ()


def installed_claims(name: str) -> dict[str, str]:
    """The config sections the installed backend ``name`` claims ({} when none is
    installed under that name, or it does not load). Looked up once per process."""
    return dict(_claims(name))


def installed_sections() -> dict[str, dict[str, str]]:
    """The config sections every installed backend claims."""
    return {name: claims for name in installed_names() if (claims := installed_claims(name))}
