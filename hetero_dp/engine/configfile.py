"""Reading a config file and ``-o`` values: YAML into mappings, each refusal naming
the file (or flag), the line or field, and the reason. What the mapping means is
:mod:`hetero_dp.engine.config`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from hetero_dp.model.errors import ConfigError


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML config file into a mapping; ConfigError naming the file otherwise."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file: {e.strerror}", source=str(p)) from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (bad byte at offset {e.start})", source=str(p)) from None
    import yaml  # only when there is a file: start-up without one skips ~15 ms of imports

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"invalid YAML{where}: {problem}", source=str(p)) from e
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigError("invalid YAML: nested too deeply", source=str(p)) from None
    _reject_cycles(data, str(p))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"top level must be a mapping, got {type(data).__name__}", source=str(p))
    return data


def _reject_cycles(
    value: Any,
    source: str,
    path: str = "",
    active: set[int] | None = None,
    done: set[int] | None = None,
) -> None:
    """A YAML alias can make a node contain itself; nothing downstream expects a cycle."""
    if not isinstance(value, dict | list):
        return
    active = set() if active is None else active
    done = set() if done is None else done
    if id(value) in done:  # shared (aliased) but already checked: keeps this linear
        return
    if id(value) in active:
        raise ConfigError(
            "a YAML alias refers to itself", field=path or "(top level)", source=source
        )
    active.add(id(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        _reject_cycles(child, source, f"{path}.{key}" if path else str(key), active, done)
    active.discard(id(value))
    done.add(id(value))


NOT_PLAIN = object()
_PLAIN_INT = re.compile(r"^(0|-?[1-9][0-9]*)$")
_PLAIN_WORD = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./*-]*$")
# the plain scalars YAML 1.1 (PyYAML) reads as booleans or null, not as strings
_YAML_WORDS = {
    **dict.fromkeys(["yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"], True),
    **dict.fromkeys(["no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"], False),
    **dict.fromkeys(["null", "Null", "NULL"], None),
}


def plain_scalar(value: str) -> Any:
    """``value`` as YAML would read it, for the common plain cases (a decimal integer,
    a word, a path), without importing a YAML parser; ``NOT_PLAIN`` otherwise."""
    if _PLAIN_INT.match(value):
        return int(value)
    if _PLAIN_WORD.match(value):
        return _YAML_WORDS.get(value, value)
    return NOT_PLAIN


def set_option(overrides: dict[str, Any], assignment: str) -> None:
    """Apply one ``-o backend.key=value`` (value parsed as YAML) to ``overrides``."""
    key, sep, value = assignment.partition("=")
    if not sep or "." not in key:
        raise ConfigError(
            f"expected BACKEND.KEY=VALUE, got {assignment!r}", field="option", source="flag -o"
        )
    backend, _, path = key.partition(".")
    parsed = plain_scalar(value)
    if parsed is NOT_PLAIN:
        import yaml  # ~11 ms and 0.9 MiB: only for values that need a YAML parser

        try:
            parsed = yaml.safe_load(value) if value else ""
        except (yaml.YAMLError, RecursionError):
            parsed = value
    node = overrides.setdefault("backends", {}).setdefault(backend, {})
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = parsed
