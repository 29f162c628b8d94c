"""The simulated backend in DRA mode (issue 31 point 6): every option takes effect on
a config reload; ``flipEvery`` set by a reload starts flipping (it waited forever when
the daemon had started with 0), and set back to 0 stops with the device healthy."""

from __future__ import annotations

import pytest

from hetero_dp.dra import device_name
from hetero_dp.engine.config import load_config

pytest.importorskip("hetero_dp_simulated")

SIM = "hetero-dp.io/sim"
SIM_DRIVER = "sim.hetero-dp.io"


async def test_flip_every_set_by_a_reload_flips_and_zero_stops_it_healthy(dra, api_server):
    from hetero_dp_simulated.backend import SimulatedBackend

    backend = SimulatedBackend()
    daemon = await dra.start(backend, options={"simulated": {"count": 2}})
    [driver] = daemon.front_end.drivers.values()
    first = device_name("sim0")

    def published() -> set[str]:
        return set(api_server.devices_of(driver.name))

    await api_server.wait_for(lambda: published() == {first, device_name("sim1")})

    raw = dict(daemon.config.raw)
    raw["backends"] = {"simulated": {"count": 3, "flipEvery": 0.05}}
    await daemon.apply_config(load_config(raw=raw, env={}))
    # the count took effect at the reload's rediscovery, the flips start at once
    await api_server.wait_for(lambda: device_name("sim2") in published())
    await api_server.wait_for(lambda: first not in published())  # flipped: withdrawn
    await api_server.wait_for(lambda: first in published())  # and back

    raw["backends"] = {"simulated": {"count": 3, "flipEvery": 0}}
    await daemon.apply_config(load_config(raw=raw, env={}))
    await api_server.wait_for(lambda: first in published())
    flips = len(api_server.writes())
    # no more flips: nothing is written however often health is polled
    for _ in range(3):
        await daemon.poll_health()
    assert len(api_server.writes()) == flips


async def test_resource_resources_and_numa_nodes_take_effect_on_reload(dra, api_server):
    """The other options, each set by a reload: ``numaNodes`` re-renders the devices'
    NUMA attribute, ``resource`` publishes under the new driver (the old pool is left
    with no devices), ``resources`` publishes ``count`` devices under each name."""
    from hetero_dp_simulated.backend import SimulatedBackend

    daemon = await dra.start(SimulatedBackend(), options={"simulated": {"count": 4}})

    def numa(driver: str) -> dict[str, int | None]:
        return {
            name: (d.get("attributes") or {}).get("numaNode", {}).get("int")
            for name, d in api_server.devices_of(driver).items()
        }

    sim2 = device_name("sim2")
    await api_server.wait_for(lambda: numa(SIM_DRIVER).get(sim2) == 1)  # boards over 2 nodes

    async def reload(options: dict[str, object]) -> None:
        raw = dict(daemon.config.raw)
        raw["backends"] = {"simulated": options}
        summary = await daemon.apply_config(load_config(raw=raw, env={}))
        assert summary == {"restarted": [], "reconfigured": ["simulated"]}

    await reload({"count": 4, "numaNodes": 1})
    await api_server.wait_for(lambda: set(numa(SIM_DRIVER).values()) == {0})
    await reload({"count": 4, "numaNodes": 0})
    await api_server.wait_for(lambda: set(numa(SIM_DRIVER).values()) == {None})

    await reload({"count": 2, "resource": "example.com/other"})
    other = "other.example.com"
    await api_server.wait_for(lambda: len(api_server.devices_of(other)) == 2)
    await api_server.wait_for(lambda: api_server.devices_of(SIM_DRIVER) == {})

    await reload({"count": 1, "resources": ["example.com/x", "example.com/y"]})
    await api_server.wait_for(
        lambda: (
            len(api_server.devices_of("x.example.com")) == 1
            and len(api_server.devices_of("y.example.com")) == 1
            and api_server.devices_of(other) == {}
        )
    )


async def test_a_cdi_dir_reload_moves_the_drivers_claim_specs(dra, kubelet, api_server):
    """``cdi.dir`` changed by a reload (the file rewritten on disk): a claim prepared
    after it has its CDI spec in the new dir; one prepared before is unprepared from
    where its spec was written. Before, each driver kept the dir it was created with."""
    import yaml

    from hetero_dp.ops.reload import ConfigReloader
    from hetero_dp.testing.dra import ClaimRef, make_claim

    from .backend import DRIVER, Npus

    daemon = await dra.start(Npus(2))
    await kubelet.wait_registered(DRIVER)
    await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)

    async def prepare(name: str, device: str) -> ClaimRef:
        claim = make_claim(name, [("npu", device_name(device))], driver=DRIVER, pool="node-a")
        ref = ClaimRef.of(api_server.add_claim(claim))
        entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
        assert entry.error == ""
        return ref

    def specs(directory) -> list[str]:
        return [p.name for p in directory.glob("*.json")]

    first = await prepare("first", "NPU-0000")
    assert specs(dra.cdi_dir) == [f"hetero-dp-dra_{DRIVER}_{first.uid}.json"]

    moved = dra.root / "cdi2"
    moved.mkdir()
    path = dra.root / "config.yaml"
    raw = dict(daemon.config.raw)
    path.write_text(yaml.safe_dump(raw))
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        path.write_text(yaml.safe_dump(dict(raw, cdi={**raw["cdi"], "dir": str(moved)})))
        results = await reloader.wait_results(1)
        assert results[0].startswith("applied"), results
    finally:
        await reloader.stop()
    second = await prepare("second", "NPU-0001")
    assert specs(moved) == [f"hetero-dp-dra_{DRIVER}_{second.uid}.json"]
    assert len(list(dra.cdi_dir.glob("*.json"))) == 1  # the first claim's, where it was
    response = await kubelet.node_unprepare(DRIVER, [first, second])
    assert all(c.error == "" for c in response.claims.values())
    assert list(dra.cdi_dir.glob("*.json")) == [] and list(moved.glob("*.json")) == []


async def test_a_rediscovery_keeps_a_health_flip_the_watch_made(dra, api_server):
    """A flip the backend's watch pushed is what the next discovery reports too: a
    rediscovery (a reload, a set change) does not bring the failed device back."""
    from hetero_dp_simulated.backend import SimulatedBackend

    backend = SimulatedBackend()
    daemon = await dra.start(backend, options={"simulated": {"count": 2}})
    [driver] = daemon.front_end.drivers.values()
    first = device_name("sim0")
    await api_server.wait_for(lambda: first in api_server.devices_of(driver.name))
    backend.set_health("sim0", False, "simulated fault")  # the watch's own path
    await api_server.wait_for(lambda: first not in api_server.devices_of(driver.name))
    await daemon.rediscover()
    assert first not in api_server.devices_of(driver.name)
    backend.set_health("sim0", True, "simulated recovery")
    await api_server.wait_for(lambda: first in api_server.devices_of(driver.name))
