"""Structured logs: text for people, JSON lines for machines, with resource and
device IDs as fields (pass them as ``extra={"resource": ..., "device": ...}``)."""

from __future__ import annotations

import json
import logging
import sys
import time

FIELDS = ("resource", "device", "devices", "backend", "hook", "kind", "reason")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.getMessage()}"
        extras = " ".join(
            f"{k}={getattr(record, k)}"
            for k in FIELDS
            if getattr(record, k, None) not in (None, "")
        )
        line = f"{base}  [{extras}]" if extras else base
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k in FIELDS:
            v = getattr(record, k, None)
            if v not in (None, ""):
                out[k] = v
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
