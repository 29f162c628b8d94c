"""Reading a config file and ``-o`` values: YAML into mappings, each refusal naming
the file (or flag), the line or field, and the reason. What the mapping means is
:mod:`hetero_dp.engine.config`.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from hetero_dp.model.errors import ConfigError

log = logging.getLogger(__name__)


# A config of 500 resources is ~50 KiB. PyYAML's pure-Python reader takes 3.3 s for
# 1 MiB of blank lines on a loaded 2-core machine (0.8 s for 256 KiB): a larger file
# is refused unread, so a reload is decided within 2 s whatever the file holds.
MAX_CONFIG_BYTES = 256 * 1024


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML config file into a mapping; ConfigError naming the file otherwise.

    Read with bounds (:mod:`hetero_dp.kits.yamlread`): a regular file (a FIFO does not
    block), at most MAX_CONFIG_BYTES, aliases and nesting bounded, a key given twice
    refused; a number YAML 1.1 reads unlike its digits (``12:30:00``, ``0x10``) is
    warned about, naming its field."""
    from hetero_dp.kits.foreign import ForeignFileError, read_foreign
    from hetero_dp.kits.yamlread import YamlRefused, load_yaml

    p = Path(path)
    try:
        data = read_foreign(p, max_bytes=MAX_CONFIG_BYTES, follow=True)
    except ForeignFileError as e:
        raise ConfigError(f"cannot read config file: {e}", source=str(p)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (bad byte at offset {e.start})", source=str(p)) from None
    try:
        doc, surprises = load_yaml(text)
    except YamlRefused as e:
        where = f" at line {e.line}" if e.line else ""
        raise ConfigError(f"{e.reason}{where}", field=e.field, source=str(p)) from None
    for surprise in surprises:
        log.warning("%s: %s", p, surprise)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"top level must be a mapping, got {type(doc).__name__}", source=str(p))
    return doc


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
        from hetero_dp.kits.yamlread import YamlRefused, load_yaml

        try:  # ~11 ms and 0.9 MiB to import: only for values that need a YAML parser
            parsed = load_yaml(value)[0] if value else ""
        except YamlRefused:
            parsed = value
    node = overrides.setdefault("backends", {}).setdefault(backend, {})
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = parsed
