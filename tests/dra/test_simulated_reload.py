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
