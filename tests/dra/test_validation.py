"""Validation as the API server does it, in the one place the publisher and the stand-in
API server share: bytes not characters, int64, canonical quantities, names, counts.

The cases come from issue 19 (a real 1.36 API server refused them); the rules from
Kubernetes ``pkg/apis/resource/validation/validation.go`` and the limits in
``staging/src/k8s.io/api/resource/*/types.go``.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys

import pytest

from hetero_dp.dra import device_name
from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.names import driver_name_problem
from hetero_dp.dra.slices import render_devices, render_slices
from hetero_dp.dra.validation import (
    canonical_quantity,
    device_problems,
    qualified_name_problem,
    quantity_value,
    slice_problems,
)
from hetero_dp.model.device import Device
from hetero_dp.testing.dra import FakeAPIServer

from .backend import DRIVER, RES, Npus, npu

# 46 characters, 81 bytes in UTF-8: the shape of the product name the real server refused
LONG_BYTES = "Acme 神经网络处理器 N1 第三代高性能计算加速 80GB HBM3 éditions!"
HUGE = 18446744073709551621  # the number in the issue: beyond int64


def test_the_issue_strings_are_what_they_claim():
    assert len(LONG_BYTES) == 46 and len(LONG_BYTES.encode()) == 81


def slice_with(device: dict, version: str = "v1") -> dict:
    [s] = render_slices(driver=DRIVER, node="node-a", devices=[device], generation=1)
    return s


# --- the stand-in API server refuses what the real one refuses -----------------------


def write(api: FakeAPIServer, body: dict) -> APIError | None:
    client = ResourceAPI(api.client(), "v1")
    try:
        client.create_slice(body)
    except APIError as e:
        return e
    return None


def test_server_counts_bytes_not_characters(api_server):
    device = {"name": "d0", "attributes": {"productName": {"string": LONG_BYTES}}}
    e = write(api_server, slice_with(device))
    assert e is not None and e.status == 422
    assert "attributes[productName].string: Too long: may not be more than 64 bytes" in e.message
    # 64 bytes exactly is accepted
    ok = {"name": "d0", "attributes": {"productName": {"string": "é" * 32}}}
    assert write(api_server, slice_with(ok)) is None


def test_server_cannot_decode_a_number_beyond_int64(api_server):
    device = {"name": "d0", "attributes": {"serial": {"int": HUGE}}}
    e = write(api_server, slice_with(device))
    assert e is not None and e.status == 400  # the decoder fails before validation
    assert f"cannot unmarshal number {HUGE}" in e.message and "int64" in e.message
    edge = {"name": "d0", "attributes": {"serial": {"int": 2**63 - 1}}}
    assert write(api_server, slice_with(edge)) is None


def test_server_stores_quantities_in_canonical_form(api_server):
    device = {"name": "d0", "capacity": {"memory": {"value": "16384Mi"}}}
    assert write(api_server, slice_with(device)) is None
    [stored] = api_server.devices_of(DRIVER).values()
    assert stored["capacity"] == {"memory": {"value": "16Gi"}}


@pytest.mark.parametrize(
    ("device", "field"),
    [
        ({"name": "Bad_Name"}, "spec.devices[0].name"),
        ({"name": "d", "attributes": {"a" * 33: {"int": 1}}}, "attributes[" + "a" * 33 + "]"),
        ({"name": "d", "attributes": {("x" * 60) + ".com/a": {"int": 1}}}, "domain"),
        ({"name": "d", "attributes": {"a": {"int": 1, "bool": True}}}, "exactly one value"),
        ({"name": "d", "attributes": {"v": {"version": "8.0"}}}, "semver"),
        ({"name": "d", "capacity": {"m": {"value": "16 GiB"}}}, "capacity[m].value"),
        (
            {"name": "d", "attributes": {f"a{i}": {"int": i} for i in range(33)}},
            "must not exceed 32",
        ),
        (
            {"name": "d", "taints": [{"key": "k", "effect": "Sometimes"}]},
            "taints[0].effect: Unsupported value",
        ),
        (
            {"name": "d", "capacity": {"m": {"value": "1", "requestPolicy": {}}}},
            "allowMultipleAllocations must be true",
        ),
        (
            {
                "name": "d",
                "consumesCounters": [
                    {"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)
                ],
            },
            "consumesCounters: Too many: 3",
        ),
    ],
)
def test_device_problems_name_the_field(device, field):
    problems = device_problems(device, "spec.devices[0]")
    assert any(field in p for p in problems), problems


def test_slice_limits_follow_the_advanced_fields():
    plain = [{"name": f"d{i}"} for i in range(128)]
    [s] = render_slices(driver=DRIVER, node="n", devices=plain, generation=1)
    assert slice_problems(s, "v1") == []
    taint = {"key": "k", "effect": "NoSchedule"}
    tainted = [{"name": f"d{i}", "taints": [taint]} for i in range(65)]
    s = render_slices(driver=DRIVER, node="n", devices=tainted, generation=1)[0]
    assert len(s["spec"]["devices"]) == 64  # the renderer cuts at 64 ...
    s["spec"]["devices"] = tainted  # ... and the server refuses 65
    assert any("Too many: 65: must have at most 64" in p for p in slice_problems(s, "v1"))
    s["spec"]["sharedCounters"] = [{"name": "gpu-0", "counters": {"memory": {"value": "1"}}}]
    assert any("only one of `sharedCounters` or `devices`" in p for p in slice_problems(s, "v1"))


def test_driver_names_are_limited_to_63_like_csi_driver_names():
    ok = "a" * 59 + ".com"
    assert len(ok) == 63 and driver_name_problem(ok) is None
    assert "at most 63" in (driver_name_problem("a" * 60 + ".com") or "")
    assert qualified_name_problem(f"{ok}/memory") is None
    assert "Too long" in (qualified_name_problem(f"{'a' * 60}.com/memory") or "")


# Expected forms: apimachinery's resource.Quantity canonicalisation (quantity_test.go),
# and "16384Mi" -> "16Gi" as a 1.36 server answered in the issue.
@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("16384Mi", "16Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("1024", "1024"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("0.5", "500m"),
        ("0.5Ki", "512"),
        ("1e3", "1e3"),
        ("0", "0"),
        ("-2Gi", "-2Gi"),
    ],
)
def test_canonical_quantities(given, canonical):
    assert canonical_quantity(given) == canonical
    assert quantity_value(given) == quantity_value(canonical)


# --- the publisher leaves out what cannot be published, never the pool ----------------


def test_a_long_string_drops_that_attribute_only_with_a_line_naming_it():
    notes: list[str] = []
    d = npu(0, productName=LONG_BYTES)
    [rendered] = render_devices([d], notes)
    assert "productName" not in rendered["attributes"]
    assert rendered["attributes"]["product"] == {"string": "Acme N1"}  # the rest stays
    [note] = notes
    assert "NPU-0000" in note and "attributes[productName]" in note and "81 bytes" in note


def test_an_integer_beyond_int64_drops_that_attribute_only():
    notes: list[str] = []
    [rendered] = render_devices([npu(0, serial=HUGE)], notes)
    assert "serial" not in rendered["attributes"]
    assert any("attributes[serial]" in n and "int64" in n for n in notes), notes


def test_colliding_attribute_names_are_reported():
    notes: list[str] = []
    d = npu(0, **{"clock-mhz": 1, "clock.mhz": 2})
    [rendered] = render_devices([d], notes)
    assert rendered["attributes"]["clock_mhz"] == {"int": 1}
    assert any("'clock-mhz' and 'clock.mhz'" in n and "clock_mhz" in n for n in notes), notes


def test_attributes_beyond_32_are_reported():
    notes: list[str] = []
    render_devices([npu(0, **{f"extra{i}": i for i in range(40)})], notes)
    assert any("attributes left out" in n and "at most 32" in n for n in notes), notes


def test_every_rendered_device_passes_the_servers_checks():
    odd = Device(
        id="GPU-é" * 20,
        resource=RES,
        attributes={
            "long": LONG_BYTES,
            "huge": HUGE,
            "nan": float("nan"),
            "neg": -(2**70),
            "memoryMiB": 2**60,  # bytes beyond int64: no capacity rather than a refusal
        },
    )
    devices = render_devices([odd, npu(1)])
    [s] = render_slices(driver=DRIVER, node="node-a", devices=devices, generation=1)
    assert slice_problems(s, "v1") == []


async def test_the_pool_is_published_without_the_bad_attribute_and_logged_once(
    dra, api_server, caplog
):
    backend = Npus(2)
    backend.devices[0] = dataclasses.replace(
        backend.devices[0],
        attributes={**backend.devices[0].attributes, "productName": LONG_BYTES, "serial": HUGE},
    )
    with caplog.at_level(logging.WARNING, logger="hetero_dp.dra"):
        daemon = await dra.start(backend)
        await daemon.rediscover()  # the same notes again: not logged again
    devices = api_server.devices_of(DRIVER)
    assert len(devices) == 2  # the whole pool, both devices
    d0 = devices[device_name("NPU-0000")]
    assert "productName" not in d0["attributes"] and "serial" not in d0["attributes"]
    assert daemon.front_end.drivers[RES].publisher.errors == {}
    lines = [r.getMessage() for r in caplog.records if "productName" in r.getMessage()]
    assert len(lines) == 1 and "64 bytes" in lines[0], lines
    assert not [r for r in api_server.requests if r.status >= 400]


def test_dra_mode_does_not_load_the_kubernetes_package():
    # The publisher's dicts go over the wire as JSON unchanged (no client-side model
    # that would drop unknown fields and hide a refusal), through http.client: the
    # kubernetes package cost ~2.4 s of CPU and 24 MiB per driver to import.
    code = (
        "import sys, hetero_dp.dra.frontend, hetero_dp.dra.api, hetero_dp.dra.publisher;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'urllib3')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
