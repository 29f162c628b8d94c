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
