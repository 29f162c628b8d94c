"""A value from a config file, a flag or a backend, shown in a message: bounded in depth,
items and characters, and built without rendering the whole value first.

A YAML alias bomb (nine levels of nine aliases, 476 bytes of text) reads as a small
graph of shared lists whose ``repr`` is 9**9 items long: cutting that ``repr`` to 60
characters afterwards spent gigabytes and a minute first. :func:`shown` walks at most
``MAX_LEVEL`` levels and ``MAX_ITEMS`` items of each (:mod:`reprlib`, which stops at the
limits rather than cutting afterwards), so its cost does not depend on the value.
"""

from __future__ import annotations

import reprlib
from typing import Any

LIMIT = 60  # characters of a value in a message
MAX_LEVEL = 3
MAX_ITEMS = 6
_DIGITS = 40  # an integer longer than this is shown by its size


class _Bounded(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = MAX_LEVEL
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = MAX_ITEMS
        self.maxdict = self.maxdeque = self.maxarray = MAX_ITEMS
        self.maxstring = self.maxother = LIMIT + 2

    def repr_int(self, x: int, level: int) -> str:
        # str() of an int of more than 4,300 digits raises (and is quadratic below that)
        if x.bit_length() > _DIGITS * 10 // 3:
            return f"<an integer of {len(bin(abs(x))) - 2} bits>"
        return repr(x)

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            text = repr(x)
        except Exception:  # a backend's object whose repr raises
            return f"<{type(x).__name__} object>"
        return text if len(text) <= self.maxother else text[: self.maxother - 3] + "..."


_REPR = _Bounded()


def shown(value: Any, limit: int = LIMIT) -> str:
    """``value`` as ``repr`` would show it, cut to ``limit`` characters (``...`` at
    the end), nested containers shown ``MAX_LEVEL`` deep and ``MAX_ITEMS`` wide."""
    # a string, the common case: only its start is ever looked at
    text = repr(value[: limit + 1]) if isinstance(value, str) else _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
