"""Opaque per-claim configuration reaches the backend's ``prepare`` hook (DRA mode)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hetero_dp import Device, hookimpl
from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, make_claim

from .backend import DRIVER, Npus

N0 = device_name("NPU-0000")


class Configurable(Npus):
    """Applies ``{"mode": ...}`` from the claim's config as an env variable."""

    def __init__(self) -> None:
        super().__init__(1)
        self.calls: list[tuple[dict, list[str], list[dict]]] = []

    @hookimpl
    def prepare(
        self, claim: dict[str, str], devices: list[Device], config: list[dict[str, Any]]
    ) -> list[Device]:
        self.calls.append((dict(claim), [d.id for d in devices], list(config)))
        mode = "shared"
        for entry in config:  # class first, claim last: later wins
            mode = (entry["parameters"] or {}).get("mode", mode)
        if mode == "broken":
            raise ValueError("mode 'broken' is not a mode this NPU has")
        return [dataclasses.replace(d, env={**d.env, "ACME_MODE": mode}) for d in devices]


def env_of_claim(dra, uid: str) -> list[str]:
    import json

    [path] = dra.cdi_dir.glob(f"*{uid}*.json")
    spec = json.loads(path.read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]


async def test_the_claims_opaque_config_reaches_the_hook_and_shapes_the_cdi_spec(
    dra, kubelet, api_server
):
    backend = Configurable()
    await dra.start(backend)
    await kubelet.wait_registered(DRIVER)
    claim = api_server.add_claim(
        make_claim(
            "c",
            [("npu", N0)],
            driver=DRIVER,
            pool="node-a",
            config=[("FromClaim", {"mode": "exclusive"}), ("FromClass", {"mode": "shared"})],
        )
    )
    uid = claim["metadata"]["uid"]
    [entry] = (await kubelet.prepare_pod("p", DRIVER, [ClaimRef.of(claim)])).values()
    assert entry.error == ""
    [(seen_claim, ids, config)] = backend.calls
    assert seen_claim == {"namespace": "default", "name": "c", "uid": uid}
    assert ids == ["NPU-0000"]
    assert [c["source"] for c in config] == ["FromClass", "FromClaim"]  # class first
    assert "ACME_MODE=exclusive" in env_of_claim(dra, uid)
    # a retry of a prepared claim answers from the checkpoint: no second call
    await kubelet.node_prepare(DRIVER, [ClaimRef.of(claim)])
    assert len(backend.calls) == 1


async def test_a_hook_that_refuses_fails_that_claim_with_its_message(dra, kubelet, api_server):
    await dra.start(Configurable())
    await kubelet.wait_registered(DRIVER)
    claim = api_server.add_claim(
        make_claim(
            "c",
            [("npu", N0)],
            driver=DRIVER,
            pool="node-a",
            config=[("FromClaim", {"mode": "broken"})],
        )
    )
    response = await kubelet.node_prepare(DRIVER, [ClaimRef.of(claim)])
    error = response.claims[claim["metadata"]["uid"]].error
    assert "mode 'broken' is not a mode this NPU has" in error
    assert not list(dra.cdi_dir.glob("*.json"))


async def test_config_for_other_drivers_is_not_passed(dra, kubelet, api_server):
    backend = Configurable()
    await dra.start(backend)
    await kubelet.wait_registered(DRIVER)
    doc = make_claim("c", [("npu", N0)], driver=DRIVER, pool="node-a")
    doc["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": "gpu.other.com", "parameters": {"x": 1}}}
    ]
    claim = api_server.add_claim(doc)
    await kubelet.node_prepare(DRIVER, [ClaimRef.of(claim)])
    [(_, _, config)] = backend.calls
    assert config == []


class Hostile(Configurable):
    """Hands a claim's container a host file, a loader variable and the host's root."""

    @hookimpl
    def prepare(
        self, claim: dict[str, str], devices: list[Device], config: list[dict[str, Any]]
    ) -> list[Device]:
        from hetero_dp import DeviceNode, Mount

        return [
            dataclasses.replace(
                d,
                nodes=(*d.nodes, DeviceNode("/etc/shadow", "/dev/shadow")),
                env={**d.env, "LD_PRELOAD": "/host/evil.so"},
                mounts=(Mount("/", "/host", read_only=False),),
            )
            for d in devices
        ]


async def test_what_the_prepare_hook_returns_passes_the_container_gate(dra, kubelet, api_server):
    """Issue #29, one gate whatever the delivery: the records a DRA prepare hook
    returned went into the claim's CDI spec unchecked (a device-plugin Allocate hook's
    answer was judged). The claim now fails naming the fields, and no spec is written."""
    await dra.start(Hostile())
    await kubelet.wait_registered(DRIVER)
    claim = api_server.add_claim(make_claim("c", [("npu", N0)], driver=DRIVER, pool="node-a"))
    response = await kubelet.node_prepare(DRIVER, [ClaimRef.of(claim)])
    error = response.claims[claim["metadata"]["uid"]].error
    assert "may not go into a container" in error
    assert "/etc/shadow" in error and "mounts[0]" in error and "LD_PRELOAD" in error
    assert not list(dra.cdi_dir.glob("*.json"))
