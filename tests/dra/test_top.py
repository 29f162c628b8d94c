"""``hetero-dp top`` in DRA mode: a prepared claim's pods on the device they hold."""

from __future__ import annotations

import asyncio

from click.testing import CliRunner

from hetero_dp.cli import main
from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, make_claim
from tests.ops.helpers import port_of

from .backend import DRIVER, RES, Npus


async def test_top_shows_claim_holders_on_their_devices(dra, kubelet, api_server):
    daemon = await dra.start(Npus(2), config={"metrics": {"address": "127.0.0.1:0"}})
    await kubelet.wait_registered(DRIVER)
    claim = make_claim(
        "shared",
        [("npu", device_name("NPU-0000"))],
        driver=DRIVER,
        pool="node-a",
        namespace="ml",
        reserved_for=["trainer-0", "trainer-1"],
    )
    response = await kubelet.node_prepare(DRIVER, [ClaimRef.of(api_server.add_claim(claim))])
    assert all(c.error == "" for c in response.claims.values())
    url = f"127.0.0.1:{port_of(daemon)}"
    result = await asyncio.to_thread(CliRunner().invoke, main, ["top", "--once", "--url", url])
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.stdout.splitlines()[1:]]
    assert lines == [
        [RES, "NPU-0000", "Healthy", "ml/trainer-0", "(claim", "shared)", "-", "-"],
        ["ml/trainer-1", "(claim", "shared)", "-", "-"],
        [RES, "NPU-0001", "Healthy", "-", "-", "-"],
    ]
