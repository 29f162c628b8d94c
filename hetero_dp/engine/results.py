"""Checking what a backend's hooks return.

Pure functions, one per hook whose result the engine reads: each takes the
backend's name and the raw result, and returns it in the engine's shape or raises
a :class:`~hetero_dp.model.errors.BackendError` (a ConfigError for ``parse_args``,
which runs before start-up) that names the backend, the hook and what came back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from hetero_dp.model.device import Check, Device, Link, Sample
from hetero_dp.model.errors import BackendError, ConfigError

T = TypeVar("T")


def _what(result: Any) -> str:
    """What came back, for a message: ``one Device ('npu0')``, ``int 3``."""
    if isinstance(result, Device):
        return f"one Device ({result.id!r})"
    return f"{type(result).__name__} {result!r}"[:120]


def devices(name: str, result: Any) -> list[Device]:
    """``discover``: Devices with unique IDs (None: none)."""
    if result is None:
        return []
    if not isinstance(result, Iterable) or isinstance(result, str | bytes):
        raise BackendError(
            f"backend {name!r} discover returned {_what(result)}; expected an iterable of "
            "Device (return a list of them, or yield each one)"
        )
    found = list(result)
    bad = [d for d in found if not isinstance(d, Device)]
    if bad:
        raise BackendError(
            f"backend {name!r} discover returned items that are not Device: "
            f"{', '.join(_what(b) for b in bad[:3])}; expected Device(id, resource, ...)"
        )
    dupes = sorted(i for i, n in Counter(d.id for d in found).items() if n > 1)
    if dupes:
        raise BackendError(f"backend {name!r} discover returned duplicate IDs: {dupes}")
    return found


def health_verdict(name: str, result: Any) -> tuple[bool, str]:
    """``check_health``: (healthy, reason) from True/None, False, a reason string or a
    (bool, reason) pair."""
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
        f"backend {name!r} check_health returned {result!r}; "
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


def links(name: str, result: Any) -> list[Link]:
    return _all_of(Link, name, "links", result)


def labels(name: str, result: Any) -> dict[str, str]:
    if result is None:
        return {}
    if not isinstance(result, Mapping):
        raise BackendError(
            f"backend {name!r} labels returned {_what(result)}; expected a mapping of "
            "label names to values"
        )
    return {str(k): str(v) for k, v in result.items()}


def samples(name: str, result: Any) -> list[Sample]:
    return _all_of(Sample, name, "metrics", result)


def checks(result: Any) -> list[Check]:
    """``doctor``: the Checks (anything else is dropped)."""
    return [c for c in (result or []) if isinstance(c, Check)]


def mapping(name: str, hook: str, result: Any) -> dict[str, Any]:
    """A hook that returns a mapping or None (``cdi_spec_edits``, ``resource_defaults``)."""
    if result is None:
        return {}
    if not isinstance(result, Mapping):
        raise BackendError(f"backend {name!r} {hook} returned {_what(result)}; expected a mapping")
    return dict(result)


def parsed_args(name: str, result: Any) -> dict[str, Any]:
    """``parse_args``: options by backend section (None: none)."""
    if result is None:
        return {}
    if not isinstance(result, Mapping):
        raise ConfigError(
            f"backend {name!r} parse_args returned {type(result).__name__}",
            source="command line",
        )
    return dict(result)


def sections(name: str, result: Any) -> dict[str, str]:
    """``config_sections``: file key (dotted) -> option key ("" = the section's keys)."""
    if result is None:
        return {}
    if not isinstance(result, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in result.items()
    ):
        raise ConfigError(
            f"backend {name!r} config_sections returned {result!r}; expected a mapping "
            "of config keys to option keys (strings)",
            field="backend",
        )
    return dict(result)
