"""Structured logs: text for people, JSON lines for machines, with resource and
device IDs as fields (pass them as ``extra={"resource": ..., "device": ...}``).

Every line is bounded, whatever a request or a backend hands in: a field is clipped
to :data:`MAX_FIELD` characters, an ID list shows its count and its first
:data:`LISTED_IDS` IDs, the message to :data:`MAX_MESSAGE` and a traceback to
:data:`MAX_EXCEPTION` characters. One Allocate with 100,000 unknown IDs once wrote
a line of a million characters.

The text format escapes control characters (``\\n``, ``\\x00``, ``\\x1b``) in the
message and in every field: a device ID with a newline in a request must not forge
a log line, nor an escape sequence drive the reader's terminal. A traceback keeps
its lines, each indented (a log line starts at column 0 with its time, so an
exception's message that holds a line break cannot pass for one) and escaped. JSON
escapes them by its own rules.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Hashable

FIELDS = ("resource", "device", "devices", "backend", "hook", "kind", "reason")

MAX_FIELD = 256  # characters of one field's value
LISTED_IDS = 8  # IDs of a list that are shown; the count says how many there were
MAX_MESSAGE = 2048  # characters of the message
MAX_EXCEPTION = 8192  # characters of a traceback (its last part, where the error is)


_CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


class Repeats:
    """Which repeats of the same failure to log: the first at once, then at most one per
    window, the window doubling from ``first`` up to ``longest`` seconds while the
    failure goes on; a failure quiet for twice its window starts over. A hook
    that fails on every health poll thus logs once, then after 1, 2, 4 ... minutes."""

    def __init__(
        self,
        first: float = 60.0,
        longest: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first, self.longest, self.clock = first, longest, clock
        # key -> [next time a repeat may be logged, window, repeats left out, last seen]
        self._seen: dict[Hashable, list[float]] = {}

    def check(self, key: Hashable) -> tuple[bool, int]:
        """(log this one?, how many repeats were left out since the last one logged)."""
        now = self.clock()
        entry = self._seen.get(key)
        if entry is None or now - entry[3] > 2 * entry[1]:
            self._seen[key] = [now + self.first, self.first, 0, now]
            return True, 0
        entry[3] = now
        if now < entry[0]:
            entry[2] += 1
            return False, int(entry[2])
        window = min(entry[1] * 2, self.longest)
        left_out = int(entry[2])
        self._seen[key] = [now + window, window, 0, now]
        return True, left_out


def escape(text: str) -> str:
    """``text`` with control characters (and Unicode line separators) written as
    Python escapes, so that it stays on one line and drives no terminal."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def clip_tail(text: str, limit: int) -> str:
    """Like :func:`clip`, keeping the end (a traceback's last lines name the error)."""
    if len(text) <= limit:
        return text
    return f"({len(text) - limit} characters left out) ...{text[-limit:]}"


def clip_traceback(text: str) -> str:
    """Each line of a traceback clipped (an error's message can be huge), then its
    end kept, where the error is named."""
    lines = "\n".join(clip(line, MAX_MESSAGE) for line in text.splitlines())
    return clip_tail(lines, MAX_EXCEPTION)


def field_value(value: object) -> object:
    """A field as it is logged: strings clipped, lists as ``<count> [first few]``."""
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value) if not isinstance(value, set | frozenset) else sorted(value, key=str)
        shown = [clip(str(v), MAX_FIELD) for v in items[:LISTED_IDS]]
        if len(items) <= LISTED_IDS:
            return shown
        return {"count": len(items), "first": shown}
    if isinstance(value, str | int | float | bool):
        return clip(value, MAX_FIELD) if isinstance(value, str) else value
    return clip(str(value), MAX_FIELD)


def _text_value(value: object) -> str:
    shown = field_value(value)
    if isinstance(shown, dict):
        return escape(f"{shown['count']}:{','.join(shown['first'])},...")
    if isinstance(shown, list):
        return escape(",".join(shown))
    return escape(str(shown))


def _message(record: logging.LogRecord) -> str:
    return clip(record.getMessage(), MAX_MESSAGE)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = escape(_message(record))
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {message}"
        extras = " ".join(
            f"{k}={_text_value(getattr(record, k))}"
            for k in FIELDS
            if getattr(record, k, None) not in (None, "")
        )
        line = f"{base}  [{extras}]" if extras else base
        if record.exc_info:
            text = clip_traceback(self.formatException(record.exc_info))
            line += "".join(f"\n  {escape(part)}" for part in text.split("\n"))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _message(record),
        }
        for k in FIELDS:
            v = getattr(record, k, None)
            if v not in (None, ""):
                out[k] = field_value(v)
        if record.exc_info:
            out["exception"] = clip_traceback(self.formatException(record.exc_info))
        import json  # here: a start with text logs never loads it (issue 35)

        return json.dumps(out, default=str)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
