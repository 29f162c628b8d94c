"""Finding backends and loading them.

Backends are pluggy plugins: found by name through the entry-point group
``hetero_dp`` (bundled and third-party alike), whose entry point names the backend's
instance (``acme = "acme_npu:plugin"``), or loaded from a ``.py`` file (the same
module a test imports, when the file is importable; its ``plugin`` instance when it
has one, as the project template's module does, else the module's own functions).
Each is checked for mistakes at load (a marked function that is no hook, an argument
its hook does not have) and wrapped in a :class:`~hetero_dp.engine.backend.Backend`.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from hetero_dp import hookspecs
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.claims import ENTRY_POINT_GROUP, instance_in
from hetero_dp.kits.entrypoints import entry_points
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import closest
from hetero_dp.model.options import default_problems

log = logging.getLogger(__name__)


def available_backends() -> dict[str, str]:
    """Backends installed through the entry-point group: name -> module path."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def importable_name(path: Path) -> str | None:
    """The name ``import`` would give the file at ``path`` (resolved) through the
    current ``sys.path`` (``acme`` for ``acme.py`` in a dir on it, ``pkg.acme`` inside
    a package there), or None when no entry reaches it under a valid name."""
    for entry in sys.path:
        try:
            base = Path(entry or ".").resolve()
            rel = path.relative_to(base)
        except (OSError, ValueError):
            continue
        parts = [*rel.parts[:-1], rel.stem]
        if not all(p.isidentifier() for p in parts):
            continue
        if all((base.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
            return ".".join(parts)
    return None


def _same_file(module: ModuleType, path: Path) -> bool:
    file = getattr(module, "__file__", None)
    try:
        return file is not None and Path(file).resolve() == path
    except OSError:
        return False


def _finds(name: str, path: Path) -> bool:
    """Whether importing ``name`` now would load the file at ``path``."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    origin = None if spec is None else spec.origin
    return origin is not None and Path(origin).resolve() == path


def _load_file(path: Path) -> ModuleType:
    """The module of the plugin file at ``path`` (resolved).

    When the file is importable by a name (its dir is on ``sys.path``, as pytest
    puts a test's dir), that is the module: the one already imported, or imported
    now under that name, so a test that imports the plugin sees the same module
    (its state, its globals) that the daemon runs, not a second copy. Otherwise it
    is loaded under ``hetero_dp_file_<stem>``.
    """
    real = importable_name(path)
    if real is not None:
        module = sys.modules.get(real)
        if module is not None and _same_file(module, path):
            return module
        if module is None and _finds(real, path):
            try:
                module = importlib.import_module(real)
            except Exception as e:
                raise ConfigError(f"importing {path} failed: {e!r}", field="backend") from e
            if _same_file(module, path):
                return module
    name = f"hetero_dp_file_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load {path} as a Python module", field="backend")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"importing {path} failed: {e!r}", field="backend") from e
    return module


def resolve(spec: str | ModuleType | object) -> tuple[str, object]:
    """A backend given by entry-point name, ``.py`` path or object -> (name, plugin)."""
    if not isinstance(spec, str):
        name = (
            getattr(spec, "hetero_dp_name", None)
            or getattr(spec, "__name__", type(spec).__name__).rsplit(".", 1)[-1]
        )
        return name, spec
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"no such plugin file: {spec}", field="backend")
        return path.stem, instance_in(_load_file(path.resolve()))
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == spec:
            try:
                loaded = ep.load()
                # an entry point naming a module (installed before the bundled backends
                # named their instances) gets the module's ``plugin`` instance
                return spec, instance_in(loaded) if inspect.ismodule(loaded) else loaded
            except Exception as e:
                raise ConfigError(f"loading backend {spec!r} failed: {e!r}", field="backend") from e
    installed = sorted(available_backends())
    known = ", ".join(installed) or "none installed"
    close = closest(spec, installed)
    if close:  # a typo of an installed name: no package to install
        raise ConfigError(
            f"unknown backend {spec!r}; did you mean {close!r}? (installed: {known})",
            field="backend",
        )
    hint = install_hint(spec)
    raise ConfigError(
        f"unknown backend {spec!r} (installed: {known}; or give a path to a .py file){hint}",
        field="backend",
    )


#: The bundled backends (this repository's vendors/<name>/) are the distributions
#: ``hetero-dp-<name>`` whose ``hetero_dp`` entry point is ``<name>``
#: (tests/core/test_config.py checks that every one keeps to it).
BUNDLED_PREFIX = "hetero-dp-"
#: A source checkout's bundled backends, one directory each (not there in a wheel install).
VENDORS_DIR = Path(__file__).resolve().parents[2] / "vendors"


def install_hint(name: str) -> str:
    """What to install for the backend ``name`` that is not installed: definite when this
    is a source checkout that has it in vendors/, the naming convention otherwise."""
    package = f"{BUNDLED_PREFIX}{name}"
    if (VENDORS_DIR / name / "pyproject.toml").is_file():
        return (
            f"; it is the package {package}: pip install {package}, or from this source "
            f"checkout pip install -e vendors/{name} (make demo installs it)"
        )
    return (
        f"; a bundled backend is the package {BUNDLED_PREFIX}<name>: pip install {package} "
        f"if it is one, or from a source checkout pip install -e vendors/{name}"
    )


def _where(function: Any) -> str:
    """``file:line`` of a function, for messages that send an author to the code."""
    try:
        path = inspect.getsourcefile(function) or "?"
        line = inspect.getsourcelines(function)[1]
    except (OSError, TypeError):
        return "?"
    return f"{path}:{line}"


def _function_at(name: str, function: Any, attr: str) -> str:
    # only for a mistake: finding the line reads and tokenizes the source file, which
    # for every hook of a backend was ~5 ms of each start (issue 35)
    return f"backend {name!r}: {_where(function)}: function {attr}"


def _spec_argnames(pm: pluggy.PluginManager) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for hook_name in dir(pm.hook):
        caller = getattr(pm.hook, hook_name)
        spec = getattr(caller, "spec", None)
        if not hook_name.startswith("_") and spec is not None:
            out[hook_name] = tuple(spec.argnames)
    return out


def hook_mistakes(name: str, plugin: object, pm: pluggy.PluginManager) -> list[str]:
    """What is wrong with ``plugin``'s ``@hookimpl`` functions, one line each.

    pluggy registers a marked function whose name is no hook without a word (it
    would only ever be called if such a hook existed), so a misspelt
    ``check_heath`` leaves health unchecked; it refuses unknown argument names,
    but in a message that names neither the file nor the fix. Here both are
    caught before registering, with the closest hook or argument name.
    """
    specs = _spec_argnames(pm)
    problems = []
    for attr in sorted(dir(plugin)):
        try:
            function = getattr(plugin, attr)
        except Exception:
            continue
        opts = pm.parse_hookimpl_opts(plugin, attr)
        if opts is None or not callable(function):
            continue
        hook = opts.get("specname") or attr
        if hook not in specs:
            close = closest(hook, specs)
            hint = f"did you mean {close}?" if close else "hooks: " + ", ".join(sorted(specs))
            where = _function_at(name, function, attr)
            problems.append(f"{where} is marked @hookimpl but {hook!r} is no hook; {hint}")
            continue
        allowed = specs[hook]
        instance = _instance_mistake(function, hook, allowed)
        if instance:
            problems.append(f"{_function_at(name, function, attr)}: {instance}")
            continue
        try:
            params = inspect.signature(function).parameters
        except (TypeError, ValueError):
            continue
        for arg in params:
            if arg in allowed or params[arg].default is not inspect.Parameter.empty:
                continue  # pluggy passes only the hook's arguments; defaults may stay
            if params[arg].kind in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                continue
            close = closest(arg, allowed)
            if close:
                hint = f"did you mean {close}?"
            else:
                hint = f"{hook} takes " + (", ".join(allowed) or "no arguments")
            where = _function_at(name, function, attr)
            problems.append(f"{where}: argument {arg!r} is not an argument of hook {hook}; {hint}")
    return problems


def _instance_mistake(function: Any, hook: str, allowed: tuple[str, ...]) -> str:
    """A hook written as a method without ``self``, or as a staticmethod with one.

    Python binds a method's first parameter to the instance, so ``def check_health(device)``
    in a class takes the instance as ``device`` and pluggy's call fails on every device
    ("got multiple values for argument 'device'"). pluggy drops a first parameter named
    ``self`` of a function defined in a class even when it is a staticmethod (its
    ``varnames``), and the call then lacks it. Both are found here, at load."""
    inner = getattr(function, "__func__", None)
    if inspect.ismethod(function) and inner is not None and not isinstance(function.__self__, type):
        try:
            first = next(iter(inspect.signature(inner).parameters.values()), None)
        except (TypeError, ValueError):
            return ""
        if first is None:
            return (
                f"method {hook}() takes no 'self': a method's first parameter is the "
                f"instance; write def {hook}(self{', ' if allowed else ''}{', '.join(allowed)})"
            )
        if first.name != "self" and first.name in allowed:
            rest = [first.name, *[a for a in allowed if a != first.name]]
            return (
                f"method {hook}({first.name}, ...) has no 'self', so the instance arrives "
                f"as {first.name!r} and every call fails; write def {hook}(self, "
                f"{', '.join(rest) if len(rest) > 1 else first.name})"
            )
        return ""
    if inspect.isfunction(function) and "." in getattr(function, "__qualname__", ""):
        try:
            first = next(iter(inspect.signature(function).parameters.values()), None)
        except (TypeError, ValueError):
            return ""
        if first is not None and first.name == "self":
            return (
                f"{hook} is a staticmethod with a 'self' parameter, which nothing passes; "
                "drop @staticmethod (a method) or drop 'self'"
            )
    return ""


def unmarked_hooks(name: str, plugin: object, pm: pluggy.PluginManager) -> list[str]:
    """Functions the plugin defines with a hook's name but without ``@hookimpl``: pluggy
    never calls them, and a ``check_health`` that never runs leaves every device
    Healthy in silence. Almost certainly a mistake, so each is warned about at load."""
    specs = _spec_argnames(pm)
    home = getattr(plugin, "__name__", None) if isinstance(plugin, ModuleType) else None
    found = []
    for attr in sorted(specs):
        function = getattr(plugin, attr, None)
        if function is None or pm.parse_hookimpl_opts(plugin, attr) is not None:
            continue
        if not (inspect.isfunction(function) or inspect.ismethod(function)):
            continue
        if home is not None and getattr(function, "__module__", None) != home:
            continue  # imported from elsewhere, not the plugin's own
        found.append(
            f"backend {name!r}: {_where(function)}: function {attr} has the name of a hook "
            "but no @hookimpl, so it is never called; mark it @hookimpl (or rename it)"
        )
    return found


def check_plugin(name: str, plugin: object, pm: pluggy.PluginManager) -> None:
    """ConfigError naming every hook mistake in ``plugin`` (see :func:`hook_mistakes`);
    a warning for each function named like a hook but not marked."""
    problems = hook_mistakes(name, plugin, pm)
    if problems:
        raise ConfigError("; ".join(problems), field="backend")
    for warning in unmarked_hooks(name, plugin, pm):
        log.warning("%s", warning)


def new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("hetero_dp")
    pm.add_hookspecs(hookspecs)
    return pm


def load_backends(
    specs: Iterable[str | ModuleType | object], *, timeout: float = 10.0
) -> list[Backend]:
    """Load and register each backend; ConfigError for unknown names or bad files."""
    pm = new_manager()
    backends = []
    names: set[str] = set()
    for spec in specs:
        name, plugin = resolve(spec)
        if name in names:
            raise ConfigError(f"backend {name!r} given twice", field="backend")
        names.add(name)
        check_plugin(name, plugin, pm)
        try:
            pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as e:
            raise ConfigError(
                f"backend {name!r} is not a valid plugin: {e}", field="backend"
            ) from e
        backend = Backend(name, plugin, pm, timeout=timeout)
        if backend.schema is not None and (wrong := default_problems(backend.schema)):
            backend.close()
            where = _where(backend.schema)
            raise ConfigError(f"backend {name!r}: {where}: " + "; ".join(wrong), field="backend")
        backends.append(backend)
    return backends


def sections_of(backends: Iterable[Backend]) -> dict[str, dict[str, str]]:
    """The config sections each backend claims (``load_config(sections=...)``)."""
    return {b.name: claims for b in backends if (claims := b.config_sections())}
