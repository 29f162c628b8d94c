from .backend import DRIVER, Npus


async def test_smoke(dra, kubelet, api_server):
    daemon = await dra.start(Npus(2))
    plugin = await kubelet.wait_registered(DRIVER)
    assert plugin.version == "v1"
    print(api_server.slices_of(DRIVER))
    assert len(api_server.devices_of(DRIVER)) == 2
