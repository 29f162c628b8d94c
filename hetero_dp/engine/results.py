"""Checking what a backend's hooks return.

Pure functions, one per kind of result the engine reads, found by name in
:data:`CHECKS` from the ``result`` of a hook's row in
:data:`hetero_dp.hookspecs.POLICY` (the hook runner applies it to every call): each
takes the backend's name, the hook's name and the raw result, and returns it in the
engine's shape or raises a :class:`~hetero_dp.model.errors.BackendError` (a
ConfigError for the hooks run before start-up) that names the backend, the hook and
what came back. The first line of each docstring is the hook reference's
description of the check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from hetero_dp.model.device import Check, Device, Link, Sample
from hetero_dp.model.errors import BackendError, ConfigError
from hetero_dp.model.shown import shown
from hetero_dp.model.usage import ProcessUsage

T = TypeVar("T")


def _what(result: Any) -> str:
    """What came back, for a message: ``one Device ('npu0')``, ``int 3``."""
    if isinstance(result, Device):
        return f"one Device ({result.id!r})"
    return f"{type(result).__name__} {shown(result, 100)}"


def devices(name: str, hook: str, result: Any) -> list[Device]:
    """An iterable of Device with unique IDs (None: none)."""
    if result is None:
        return []
    if not isinstance(result, Iterable) or isinstance(result, str | bytes):
        raise BackendError(
            f"backend {name!r} {hook} returned {_what(result)}; expected an iterable of "
            "Device (return a list of them, or yield each one)"
        )
    found = list(result)
    bad = [d for d in found if not isinstance(d, Device)]
    if bad:
        raise BackendError(
            f"backend {name!r} {hook} returned items that are not Device: "
            f"{', '.join(_what(b) for b in bad[:3])}; expected Device(id, resource, ...)"
        )
    dupes = sorted(i for i, n in Counter(d.id for d in found).items() if n > 1)
    if dupes:
        raise BackendError(f"backend {name!r} {hook} returned duplicate IDs: {dupes}")
    return found


def health_verdict(name: str, hook: str, result: Any) -> tuple[bool, str]:
    """True/None (healthy), False or a reason string (unhealthy), or a (bool, reason)
    pair; read as (healthy, reason)."""
    if result is None or result is True:
        return True, ""
    if result is False:
        return False, "health check failed"
    if isinstance(result, str):
        return False, result
    if isinstance(result, tuple) and len(result) == 2:
        why = result[1]
        return bool(result[0]), why if isinstance(why, str) else str(why)
    raise BackendError(
        f"backend {name!r} {hook} returned {shown(result)}; "
        "expected True/None, False or a reason string"
    )


def _all_of(kind: type[T], name: str, hook: str, result: Any) -> list[T]:
    """An iterable of ``kind`` instances (None: none), as a list."""
    if result is not None and not isinstance(result, Iterable):
        raise BackendError(
            f"backend {name!r} {hook} returned {_what(result)}; "
            f"expected an iterable of {kind.__name__}"
        )
    found = list(result or [])
    if any(not isinstance(x, kind) for x in found):
        raise BackendError(f"backend {name!r} {hook} returned items that are not {kind.__name__}")
    return found


def links(name: str, hook: str, result: Any) -> list[Link]:
    """An iterable of Link (None: none)."""
    return _all_of(Link, name, hook, result)


def labels(name: str, hook: str, result: Any) -> dict[str, str]:
    """A mapping of label names to values (None: none), both read as strings."""
    if result is None:
        return {}
    if not isinstance(result, Mapping):
        raise BackendError(
            f"backend {name!r} {hook} returned {_what(result)}; expected a mapping of "
            "label names to values"
        )
    return {str(k): str(v) for k, v in result.items()}


def samples(name: str, hook: str, result: Any) -> list[Sample]:
    """An iterable of Sample (None: none)."""
    return _all_of(Sample, name, hook, result)


def process_usages(name: str, hook: str, result: Any) -> list[ProcessUsage]:
    """An iterable of ProcessUsage (None: none)."""
    return _all_of(ProcessUsage, name, hook, result)


def checks(name: str, hook: str, result: Any) -> list[Check]:
    """An iterable of Check (anything else in it is dropped)."""
    return [c for c in (result or []) if isinstance(c, Check)]


def check(name: str, hook: str, result: Any) -> list[Check]:
    """One Check or None, read as a list of it."""
    return checks(name, hook, [result] if isinstance(result, Check) else result)


def mapping(name: str, hook: str, result: Any) -> dict[str, Any]:
    """A mapping or None (none)."""
    if result is None:
        return {}
    if not isinstance(result, Mapping):
        raise BackendError(f"backend {name!r} {hook} returned {_what(result)}; expected a mapping")
    return dict(result)


def parsed_args(name: str, hook: str, result: Any) -> dict[str, Any]:
    """A mapping of options (None: none); anything else stops start-up."""
    if result is None:
        return {}
    if not isinstance(result, Mapping):
        raise ConfigError(
            f"backend {name!r} {hook} returned {type(result).__name__}",
            source="command line",
        )
    return dict(result)


def sections(name: str, hook: str, result: Any) -> dict[str, str]:
    """A mapping of config keys (dotted) to option keys, all strings (None: none);
    anything else stops start-up."""
    if result is None:
        return {}
    if not isinstance(result, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in result.items()
    ):
        raise ConfigError(
            f"backend {name!r} {hook} returned {shown(result)}; expected a mapping "
            "of config keys to option keys (strings)",
            field="backend",
        )
    return dict(result)


def resource_names(name: str, hook: str, result: Any) -> dict[str, str]:
    """Resource names, or a mapping of names to why (None: none); read as name -> why."""
    if result is None:
        return {}
    if isinstance(result, str | bytes) or not isinstance(result, Iterable):
        raise BackendError(
            f"backend {name!r} {hook} returned {_what(result)}; expected resource names "
            "(a list of strings, or a mapping of each name to why it is required)"
        )
    pairs = result.items() if isinstance(result, Mapping) else ((n, "") for n in result)
    out: dict[str, str] = {}
    for key, why in pairs:
        if not isinstance(key, str) or not key or not isinstance(why, str):
            raise BackendError(
                f"backend {name!r} {hook} returned {shown(result, 100)}; expected non-empty "
                "resource names (strings), each with why as a string"
            )
        out[key] = why
    return out


Check_ = Callable[[str, str, Any], Any]

#: The checks by the name a hook's row gives (``HookPolicy.result``).
CHECKS: dict[str, Check_] = {
    "devices": devices,
    "health_verdict": health_verdict,
    "links": links,
    "labels": labels,
    "samples": samples,
    "process_usages": process_usages,
    "checks": checks,
    "check": check,
    "mapping": mapping,
    "parsed_args": parsed_args,
    "sections": sections,
    "resource_names": resource_names,
}
