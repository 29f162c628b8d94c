"""NodePrepareResources / NodeUnprepareResources: CDI IDs the written spec defines,
per-claim errors, idempotence, shared claims and the checkpoint."""

from __future__ import annotations

import json
import re

import pytest

from hetero_dp import hookimpl
from hetero_dp.dra import device_name
from hetero_dp.model.errors import ConfigError
from hetero_dp.testing.dra import ClaimRef, make_claim
from tests.cdi.schema_check import assert_valid_cdi_spec

from .backend import DRIVER, RES, Npus

N0, N1 = device_name("NPU-0000"), device_name("NPU-0001")


def claim(api, name, results, **kw):
    kw.setdefault("driver", DRIVER)
    kw.setdefault("pool", "node-a")
    return ClaimRef.of(api.add_claim(make_claim(name, results, **kw)))


def cdi_devices(dra) -> dict[str, dict]:
    """CDI name -> (spec, device) over every spec file in the CDI dir."""
    out = {}
    for path in sorted(dra.cdi_dir.glob("*.json")):
        spec = assert_valid_cdi_spec(path)
        for d in spec["devices"]:
            out[f"{spec['kind']}={d['name']}"] = {"spec": spec, "device": d}
    return out


async def test_prepared_claim_answers_cdi_ids_the_spec_defines(dra, kubelet, api_server):
    await dra.start(Npus(2))
    await kubelet.wait_registered(DRIVER)
    ref = claim(api_server, "one", [("npu", N1)])
    response = await kubelet.node_prepare(DRIVER, [ref])
    entry = response.claims[ref.uid]
    assert entry.error == ""
    [dev] = entry.devices
    assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["npu"], "node-a", N1)
    defined = cdi_devices(dra)
    assert list(dev.cdi_device_ids) == [f"{DRIVER}/claim={ref.uid}-{N1}"]
    found = defined[dev.cdi_device_ids[0]]
    edits = found["device"]["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/npu1", "permissions": "rw"}]
    assert edits["env"] == ["ACME_VISIBLE_DEVICES=1"]
    # shared nodes are the spec's common edits
    assert found["spec"]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/npu_ctl", "permissions": "rw"}
    ]


async def test_list_env_is_joined_per_request(dra, kubelet, api_server):
    await dra.start(Npus(3))
    await kubelet.wait_registered(DRIVER)
    n2 = device_name("NPU-0002")
    ref = claim(api_server, "multi", [("pair", N0), ("pair", N1), ("solo", n2)])
    entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert entry.error == ""
    defined = cdi_devices(dra)
    by_name = {d.device_name: list(d.cdi_device_ids) for d in entry.devices}
    for ids in by_name.values():
        assert all(i in defined for i in ids), (ids, list(defined))

    def env_of(ids):
        # what a runtime applies for a container given these CDI devices
        env = {}
        for i in ids:
            for kv in defined[i]["device"]["containerEdits"].get("env", []):
                k, _, v = kv.partition("=")
                env[k] = v
        return env

    pair = sorted({i for n in (N0, N1) for i in by_name[n]})
    assert env_of(pair)["ACME_VISIBLE_DEVICES"] == "0,1"
    assert env_of(by_name[n2])["ACME_VISIBLE_DEVICES"] == "2"


async def test_prepare_is_idempotent_and_reads_the_claim_once(dra, kubelet, api_server):
    await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    ref = claim(api_server, "again", [("npu", N0)])
    first = await kubelet.node_prepare(DRIVER, [ref])
    second = await kubelet.node_prepare(DRIVER, [ref])
    assert first == second and first.claims[ref.uid].error == ""
    reads = [r for r in api_server.requests if "resourceclaims/again" in r.path]
    assert len(reads) == 1


async def test_bad_claims_fail_alone(dra, kubelet, api_server):
    await dra.start(Npus(2))
    await kubelet.wait_registered(DRIVER)
    good = claim(api_server, "good", [("npu", N0)])
    missing = ClaimRef("default", "ghost", "0b6c1e8e-0000-4000-8000-000000000001")
    stale = claim(api_server, "stale", [("npu", N0)])
    stale = ClaimRef(stale.namespace, stale.name, "11111111-2222-4333-8444-555555555555")
    foreign = claim(api_server, "foreign", [("npu", N1), ("npu", "npu-9999"), ("x", "d0")])
    other_pool = claim(api_server, "elsewhere", [("npu", N0)], pool="node-b")
    other_driver = claim(api_server, "theirs", [("gpu", "gpu-0")], driver="gpu.example.com")
    unallocated_claim = make_claim("pending", [], driver=DRIVER, pool="node-a")
    del unallocated_claim["status"]
    pending = ClaimRef.of(api_server.add_claim(unallocated_claim))
    refs = [good, missing, stale, foreign, other_pool, other_driver, pending]
    response = await kubelet.node_prepare(DRIVER, refs)
    assert set(response.claims) == {r.uid for r in refs}
    errors = {r.name: response.claims[r.uid].error for r in refs}
    assert errors["good"] == "" and response.claims[good.uid].devices
    assert "ResourceClaim default/ghost not found" in errors["ghost"]
    assert "has UID" in errors["stale"] and stale.uid in errors["stale"]
    assert "does not have: node-a/npu-9999, node-a/d0" in errors["foreign"]
    assert "node-b/" + N0 in errors["elsewhere"]
    assert f"no allocation results for driver {DRIVER}" in errors["theirs"]
    assert "is not allocated" in errors["pending"]
    # only the good claim left a spec and a checkpoint entry
    assert [p.name for p in dra.cdi_dir.glob("*.json")] == [
        f"hetero-dp-dra_{DRIVER}_{good.uid}.json"
    ]
    doc = json.loads((dra.plugins_dir / DRIVER / "checkpoint.json").read_text())
    assert list(doc["claims"]) == [good.uid]


async def test_unprepare_removes_spec_and_entry_and_is_idempotent(dra, kubelet, api_server):
    await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    ref = claim(api_server, "c", [("npu", N0)])
    await kubelet.node_prepare(DRIVER, [ref])
    assert list(dra.cdi_dir.glob("*.json"))
    for _ in range(2):
        response = await kubelet.node_unprepare(DRIVER, [ref])
        assert response.claims[ref.uid].error == ""
    assert list(dra.cdi_dir.glob("*.json")) == []
    doc = json.loads((dra.plugins_dir / DRIVER / "checkpoint.json").read_text())
    assert doc == {"version": 1, "claims": {}}
    never = ClaimRef("default", "never", "22222222-2222-4222-8222-222222222222")
    assert (await kubelet.node_unprepare(DRIVER, [never])).claims[never.uid].error == ""


async def test_shared_claim_is_prepared_once_and_unprepared_after_the_last_pod(
    dra, kubelet, api_server
):
    await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    ref = claim(api_server, "shared", [("npu", N0)])
    a = await kubelet.prepare_pod("pod-a", DRIVER, [ref])
    b = await kubelet.prepare_pod("pod-b", DRIVER, [ref])
    assert a == b and a[ref.uid].error == ""
    prepares = [c for c in kubelet.calls if c[0] == "NodePrepareResources"]
    assert prepares == [("NodePrepareResources", DRIVER, [ref.uid])]
    assert await kubelet.unprepare_pod("pod-a") == []
    assert list(dra.cdi_dir.glob("*.json"))  # pod-b still runs with it
    assert await kubelet.unprepare_pod("pod-b") == [ref.uid]
    assert list(dra.cdi_dir.glob("*.json")) == []


async def test_a_device_that_left_is_refused(dra, kubelet, api_server):
    backend = Npus(2)
    daemon = await dra.start(backend)
    await kubelet.wait_registered(DRIVER)
    del backend.devices[1]
    await daemon.rediscover()
    ref = claim(api_server, "late", [("npu", N1)])
    entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert "does not have" in entry.error and N1 in entry.error


async def test_unusable_cdi_dir_stops_start_up_naming_the_field(dra):
    dra.cdi_dir.parent.mkdir(parents=True, exist_ok=True)
    dra.cdi_dir.write_text("not a dir")
    with pytest.raises(ConfigError, match=r"cdi\.dir"):
        await dra.start(Npus(1))


async def test_corrupt_checkpoint_stops_start_up_naming_the_file(dra):
    path = dra.plugins_dir / DRIVER / "checkpoint.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        await dra.start(Npus(1))


async def test_unprepare_in_a_new_daemon_uses_the_checkpoint(dra, kubelet, api_server):
    daemon = await dra.start(Npus(2))
    await kubelet.wait_registered(DRIVER)
    ref = claim(api_server, "kept", [("npu", N0), ("npu", N1)])
    assert (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid].error == ""
    await dra.stop(daemon)
    api_server.claims.clear()  # the claim is gone from the API server by now
    await dra.start(Npus(2))
    await kubelet.wait_registered(DRIVER, after=1)
    # a prepare retry is answered from the checkpoint, without the API server
    again = await kubelet.node_prepare(DRIVER, [ref])
    assert again.claims[ref.uid].error == "" and len(again.claims[ref.uid].devices) == 2
    response = await kubelet.node_unprepare(DRIVER, [ref])
    assert response.claims[ref.uid].error == ""
    assert list(dra.cdi_dir.glob("*.json")) == []


async def test_prepare_unprepare_through_the_daemon_of_a_resource_with_two_drivers(
    dra, kubelet, api_server
):
    other = Npus(1)
    other.hetero_dp_name = "fpgas"
    other.devices = [
        d.__class__(**{**d.__dict__, "resource": "acme.example.com/fpga", "id": "FPGA-0"})
        for d in other.devices
    ]
    daemon = await dra.start(Npus(1), other)
    assert set(daemon.front_end.drivers) == {RES, "acme.example.com/fpga"}
    await kubelet.wait_registered("fpga.acme.example.com")
    fpga = device_name("FPGA-0")
    ref = claim(api_server, "f", [("fpga", fpga)], driver="fpga.acme.example.com")
    entry = (await kubelet.node_prepare("fpga.acme.example.com", [ref])).claims[ref.uid]
    assert entry.error == "" and entry.devices[0].device_name == fpga
    # the other driver does not take it
    wrong = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert "no allocation results" in wrong.error


async def test_a_cdi_write_failure_fails_that_claim_and_leaves_no_entry(dra, kubelet, api_server):
    await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    dra.cdi_dir.rmdir()  # made (empty) at start-up; someone replaced it since
    dra.cdi_dir.write_text("a file where the CDI dir should be")
    ref = claim(api_server, "c", [("npu", N0)])
    entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert "internal error: FileExistsError" in entry.error and str(dra.cdi_dir) in entry.error
    doc = json.loads((dra.plugins_dir / DRIVER / "checkpoint.json").read_text())
    assert doc["claims"] == {}
    # the kubelet retries once the dir is fixed
    dra.cdi_dir.unlink()
    entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert entry.error == "" and entry.devices


async def test_claims_are_read_through_v1beta1_on_an_old_api_server(dra, kubelet):
    from hetero_dp.testing.dra import FakeAPIServer

    with FakeAPIServer(versions=("v1beta1",)) as old:
        dra.api = old
        await dra.start(Npus(1))
        await kubelet.wait_registered(DRIVER)
        ref = claim(old, "beta", [("npu", N0)], version="v1beta1")
        entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
        assert entry.error == "" and entry.devices[0].device_name == N0
        assert any(
            "/v1beta1/namespaces/default/resourceclaims/beta" in r.path for r in old.requests
        )
        await dra.stop_all()


async def test_events_for_observers(dra, kubelet, api_server):
    from hetero_dp.kits import observe

    seen: list[tuple[str, dict]] = []
    unsubscribe = observe.subscribe(lambda event, fields: seen.append((event, fields)))
    try:
        await dra.start(Npus(1))
        await kubelet.wait_registered(DRIVER)
        await kubelet.wait_for(lambda: ("registered", {"resource": RES, "mode": "dra"}) in seen)
        good = claim(api_server, "good", [("npu", N0)])
        ghost = ClaimRef("default", "ghost", "33333333-3333-4333-8333-333333333333")
        await kubelet.node_prepare(DRIVER, [good, ghost])
        await kubelet.node_unprepare(DRIVER, [good])
    finally:
        unsubscribe()
    [prep] = [f for e, f in seen if e == "dra_prepare"]
    assert (prep["driver"], prep["claims"], prep["errors"]) == (DRIVER, 2, 1)
    assert prep["seconds"] > 0
    [unprep] = [f for e, f in seen if e == "dra_unprepare"]
    assert (unprep["claims"], unprep["errors"]) == (1, 0)


async def test_a_pod_with_a_failing_claim_holds_none_until_a_retry_works(dra, kubelet, api_server):
    await dra.start(Npus(2))
    await kubelet.wait_registered(DRIVER)
    good = claim(api_server, "good", [("npu", N0)])
    late = ClaimRef("default", "late", "44444444-4444-4444-8444-444444444444")
    first = await kubelet.prepare_pod("pod", DRIVER, [good, late])
    assert first[good.uid].error == "" and "not found" in first[late.uid].error
    assert kubelet.claim_pods == {}
    late = claim(api_server, "late", [("npu", N1)], uid=late.uid)
    second = await kubelet.prepare_pod("pod", DRIVER, [good, late])
    assert all(e.error == "" for e in second.values())
    # the good claim was not prepared twice
    assert [c[2] for c in kubelet.calls] == [[good.uid, late.uid], [late.uid]]
    assert await kubelet.unprepare_pod("pod") == [good.uid, late.uid]


class DriverFiles(Npus):
    """A backend whose device-plugin specs get spec-wide edits (a driver's library and
    a hook, as NVIDIA's cdi_spec_edits adds): its claim specs must hold them too, or a
    container started from a claim has the device's nodes and no driver."""

    def __init__(self, edits: dict, count: int = 2) -> None:
        super().__init__(count)
        self.edits = edits
        self.asked: list[tuple[str, list[str]]] = []

    @hookimpl
    def cdi_spec_edits(self, kind: str, devices: list) -> dict:
        self.asked.append((kind, [d.id for d in devices]))
        return self.edits


LIB = {"hostPath": "/opt/acme/lib/libacme.so.1", "containerPath": "/usr/lib/libacme.so.1"}
HOOK = {"hookName": "createContainer", "path": "/opt/acme/bin/acme-hook", "args": ["acme-hook"]}


async def test_a_claims_spec_holds_the_backends_spec_wide_edits(dra, kubelet, api_server):
    backend = DriverFiles({"mounts": [LIB], "hooks": [HOOK], "env": ["ACME_DRIVER=2.1"]})
    await dra.start(backend)
    await kubelet.wait_registered(DRIVER)
    ref = claim(api_server, "one", [("npu", N1)])
    entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert entry.error == ""
    spec = cdi_devices(dra)[entry.devices[0].cdi_device_ids[0]]["spec"]
    common = spec["containerEdits"]
    assert common["mounts"] == [LIB]
    assert common["hooks"] == [HOOK]
    assert common["env"] == ["ACME_DRIVER=2.1"]
    assert common["deviceNodes"] == [{"path": "/dev/npu_ctl", "permissions": "rw"}]  # kept
    assert backend.asked == [(f"{DRIVER}/claim", ["NPU-0001"])]  # the claim's devices only


async def test_spec_wide_edits_the_gate_refuses_fail_the_claim(dra, kubelet, api_server):
    await dra.start(DriverFiles({"env": ["LD_PRELOAD=/host/evil.so"]}))
    await kubelet.wait_registered(DRIVER)
    ref = claim(api_server, "one", [("npu", N1)])
    error = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid].error
    assert "backend npus: CDI spec edits" in error and "LD_PRELOAD" in error
    assert list(dra.cdi_dir.glob("*.json")) == []
