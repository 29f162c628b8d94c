"""DRA mode's holder series: hetero_dp_claim_allocation_info from the claims this
node prepared, one per device and pod in the claim's reservedFor (issue #34 point 5)."""

from __future__ import annotations

import logging

from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, make_claim
from tests.ops.helpers import scrape, value

from .backend import DRIVER, Npus

N0, N1 = device_name("NPU-0000"), device_name("NPU-0001")
INFO = "hetero_dp_claim_allocation_info"


async def test_prepared_claims_name_their_pods_and_leave_with_unprepare(dra, kubelet, api_server):
    daemon = await dra.start(Npus(2), config={"metrics": {"address": "127.0.0.1:0"}})
    await kubelet.wait_registered(DRIVER)
    shared = ClaimRef.of(
        api_server.add_claim(
            make_claim(
                "shared",
                [("npu", N0)],
                driver=DRIVER,
                pool="node-a",
                namespace="ml",
                reserved_for=["trainer-0", "trainer-1"],
            )
        )
    )
    lone = ClaimRef.of(
        api_server.add_claim(make_claim("lone", [("npu", N1)], driver=DRIVER, pool="node-a"))
    )
    response = await kubelet.node_prepare(DRIVER, [shared, lone])
    assert all(c.error == "" for c in response.claims.values())
    m = await scrape(daemon)
    base = {"driver": DRIVER, "pool": "node-a"}
    for pod in ("trainer-0", "trainer-1"):
        labels = dict(base, device=N0, namespace="ml", claim="shared", pod=pod)
        assert value(m, INFO, **labels) == 1
    assert value(m, INFO, **base, device=N1, namespace="default", claim="lone", pod="") == 1
    assert sum(1 for (name, _l) in m if name == INFO) == 3

    await kubelet.node_unprepare(DRIVER, [shared])
    m = await scrape(daemon)
    assert {dict(labels)["claim"] for (name, labels) in m if name == INFO} == {"lone"}


async def test_a_pod_added_later_to_a_shared_claim_appears(dra, kubelet, api_server):
    """reservedFor is re-read on the attribution interval: the scheduler reserving a
    prepared claim for one more pod (no new NodePrepareResources on this node) shows
    in the holder series."""
    daemon = await dra.start(
        Npus(2),
        config={"metrics": {"address": "127.0.0.1:0"}, "attribution": {"interval": 0.1}},
    )
    await kubelet.wait_registered(DRIVER)
    kw = {"driver": DRIVER, "pool": "node-a", "namespace": "ml"}
    claim = api_server.add_claim(make_claim("shared", [("npu", N0)], **kw, reserved_for=["p0"]))
    response = await kubelet.node_prepare(DRIVER, [ClaimRef.of(claim)])
    assert all(c.error == "" for c in response.claims.values())
    m = await scrape(daemon)
    assert {dict(labels)["pod"] for (name, labels) in m if name == INFO} == {"p0"}

    uid = claim["metadata"]["uid"]
    api_server.add_claim(
        make_claim("shared", [("npu", N0)], **kw, uid=uid, reserved_for=["p0", "p1"])
    )
    path = "/namespaces/ml/resourceclaims/shared"
    since = len(api_server.requests)

    def reads() -> int:
        return sum(1 for r in api_server.requests[since:] if r.path.endswith(path))

    # one read after the change, and one more: the loop reads a claim after the last
    # read's answer was taken in
    await api_server.wait_for(lambda: reads() >= 2)
    m = await scrape(daemon)
    pods = {dict(labels)["pod"] for (name, labels) in m if name == INFO}
    assert pods == {"p0", "p1"}


async def test_a_claim_that_cannot_be_read_again_keeps_its_pods_with_one_warning(
    dra, kubelet, api_server, caplog
):
    daemon = await dra.start(
        Npus(2),
        config={"metrics": {"address": "127.0.0.1:0"}, "attribution": {"interval": 0.1}},
    )
    await kubelet.wait_registered(DRIVER)
    kw = {"driver": DRIVER, "pool": "node-a", "namespace": "ml"}
    claim = api_server.add_claim(make_claim("shared", [("npu", N0)], **kw, reserved_for=["p0"]))
    response = await kubelet.node_prepare(DRIVER, [ClaimRef.of(claim)])
    assert all(c.error == "" for c in response.claims.values())
    caplog.set_level(logging.INFO, logger="hetero_dp.dra")
    path = "/namespaces/ml/resourceclaims/shared"
    with api_server.store.cond:
        del api_server.claims[("ml", "shared")]  # gone from the server: 404 from now on
        since = len(api_server.requests)

    def failed_reads() -> int:
        return sum(
            1 for r in api_server.requests[since:] if r.path.endswith(path) and r.status == 404
        )

    await api_server.wait_for(lambda: failed_reads() >= 3)
    m = await scrape(daemon)
    assert {dict(labels)["pod"] for (name, labels) in m if name == INFO} == {"p0"}
    lines = [r.getMessage() for r in caplog.records if "re-reading" in r.getMessage()]
    assert len(lines) == 1 and "ml/shared" in lines[0], lines
