"""Structured logs: one line per health transition, with resource, device and reason."""

from __future__ import annotations

import json
import logging

import pytest

from hetero_dp.kits.logs import JsonFormatter, TextFormatter
from tests.core.scripted import Scripted, make_devices

RES = "example.com/accel"


async def test_one_line_per_health_transition_with_its_reason(fake_kubelet, plugin_runner, caplog):
    backend = Scripted(make_devices(RES, 3))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    caplog.set_level(logging.INFO, logger="hetero_dp.engine.daemon")
    caplog.clear()

    backend.unhealthy["dev2"] = "XID 48: double-bit ECC error"
    await daemon.poll_health()
    await daemon.poll_health()  # still unhealthy: no second line
    del backend.unhealthy["dev2"]
    await daemon.poll_health()

    lines = [r for r in caplog.records if getattr(r, "device", None)]
    assert [(r.device, r.levelname) for r in lines] == [("dev2", "WARNING"), ("dev2", "INFO")]
    down, up = lines
    assert down.resource == RES and down.reason == "XID 48: double-bit ECC error"
    assert "dev2 is now Unhealthy: XID 48: double-bit ECC error" in down.getMessage()
    assert "dev2 is now Healthy" in up.getMessage()

    record = json.loads(JsonFormatter().format(down))
    assert record["level"] == "warning"
    assert record["resource"] == RES and record["device"] == "dev2"
    assert record["reason"] == "XID 48: double-bit ECC error"
    text = TextFormatter().format(down)
    assert "resource=example.com/accel" in text and "device=dev2" in text
    assert "\n" not in text  # one line


def test_every_extra_field_the_code_logs_is_a_structured_field(repo_root):
    import re

    from hetero_dp.kits.logs import FIELDS

    used = set()
    for path in (repo_root / "hetero_dp").rglob("*.py"):
        for extra in re.findall(r"extra=\{([^}]*)\}", path.read_text()):
            used |= set(re.findall(r'"([a-z_]+)":', extra))
    assert used and used <= set(FIELDS), used - set(FIELDS)


async def test_an_allocate_of_100000_unknown_ids_logs_a_few_kb_at_most(
    fake_kubelet, plugin_runner, caplog
):
    """Issue 13: one Allocate with 100,000 unknown IDs wrote a 1,000,218-character line
    (the ``devices`` field held every ID). Each line now stays within a few KB and
    still says how many IDs there were."""
    import grpc

    await plugin_runner.start(Scripted(make_devices(RES, 2)))
    await fake_kubelet.wait_registered(RES)
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    ids = [f"unknown-device-{i:06d}" for i in range(100_000)]
    try:
        await fake_kubelet.allocate(RES, ids)
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    else:
        raise AssertionError("an Allocate of unknown IDs was accepted")
    with_ids = [r for r in caplog.records if getattr(r, "devices", None)]
    assert with_ids, "the refusal was not logged with its IDs"
    for record in caplog.records:
        text = TextFormatter().format(record)
        data = JsonFormatter().format(record)
        assert len(text) < 4096 and len(data) < 4096, (len(text), len(data))
    record = with_ids[0]
    assert "devices=100000:unknown-device-000000," in TextFormatter().format(record)
    shown = json.loads(JsonFormatter().format(record))["devices"]
    assert shown["count"] == 100_000 and shown["first"][0] == "unknown-device-000000"


def test_a_long_message_field_and_traceback_are_clipped():
    long = "x" * 1_000_000
    try:
        raise ValueError(long)
    except ValueError:
        import sys

        exc = sys.exc_info()
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "%s", (long,), exc)
    record.reason = long
    record.devices = ["a", "b"]
    for line in (TextFormatter().format(record), JsonFormatter().format(record)):
        assert len(line) < 16_384
        assert "more characters" in line
    assert "devices=a,b" in TextFormatter().format(record)  # a short list shown whole
    assert "ValueError" in TextFormatter().format(record)  # the traceback's end is kept


@pytest.mark.parametrize("sep", ["\n", "\r\n", "\u2028", "\x85"])
def test_an_exception_message_with_a_line_break_cannot_forge_a_log_line(sep):
    """Issue #29: the text log escapes the message and fields, but a traceback kept
    its lines raw, so an exception whose text holds a requested ID such as
    'dev0<newline>12:00:00 INFO forged' wrote a line of its own at column 0 (a Unicode
    line separator too: the traceback's lines were split with splitlines). Every
    traceback line is now indented and escaped."""
    try:
        raise ValueError(f"dev0{sep}12:00:00 INFO    forged\x1b[2J")
    except ValueError:
        import sys

        exc = sys.exc_info()
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "Allocate failed", (), exc)
    text = TextFormatter().format(record)
    first, *rest = text.split("\n")
    assert first.endswith("Allocate failed") and rest
    assert all(line.startswith("  ") for line in rest), rest
    assert "\x1b" not in text and "\r" not in text and "\u2028" not in text
    assert "ValueError: dev0" in text and "forged" in text  # nothing of it is lost
