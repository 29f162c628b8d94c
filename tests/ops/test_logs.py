"""Structured logs: one line per health transition, with resource, device and reason."""

from __future__ import annotations

import json
import logging

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
