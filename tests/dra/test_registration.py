"""Registration through plugins_registry, with both wire versions."""

from __future__ import annotations

import grpc
import pytest

from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.dra import device_name, driver_name_for
from hetero_dp.model.errors import ConfigError
from hetero_dp.testing.dra import ClaimRef, FakeDRAKubelet, make_claim

from .backend import DRIVER, RES, Npus, npu


async def test_get_info_offers_both_versions_and_a_socket_under_the_driver_dir(dra, kubelet):
    daemon = await dra.start(Npus(1))
    plugin = await kubelet.wait_registered(DRIVER)
    assert plugin.supported_versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert plugin.version == "v1"  # the newest both speak
    assert plugin.endpoint == str(dra.plugins_dir / DRIVER / "dra.sock")
    assert plugin.registry_socket == str(dra.registry_dir / f"{DRIVER}-reg.sock")
    driver = daemon.front_end.drivers[RES]
    assert driver.registered.is_set() and driver.registration_error == ""
    # no device-plugin endpoint in DRA mode: nothing of the device-plugin front end runs
    assert daemon.front_end.name == "dra"
    assert not (dra.root / "dp").exists() or not any((dra.root / "dp").iterdir())


@pytest.mark.parametrize("kubelet_versions", [("v1beta1",), ("v1", "v1beta1")])
async def test_prepare_over_the_version_the_kubelet_chose(dra, api_server, kubelet_versions):
    kubelet = FakeDRAKubelet(dra.registry_dir, versions=kubelet_versions)
    await kubelet.start()
    try:
        await dra.start(Npus(1))
        plugin = await kubelet.wait_registered(DRIVER)
        assert plugin.version == kubelet_versions[0]
        name = next(iter(api_server.devices_of(DRIVER)))
        claim = api_server.add_claim(
            make_claim("c1", [("npu", name)], driver=DRIVER, pool="node-a")
        )
        response = await kubelet.node_prepare(DRIVER, [ClaimRef.of(claim)])
        entry = response.claims[claim["metadata"]["uid"]]
        assert entry.error == ""
        assert [d.device_name for d in entry.devices] == [name]
        # the response type is the chosen version's
        assert type(response).DESCRIPTOR.full_name == (
            f"k8s.io.kubelet.pkg.apis.dra.{kubelet_versions[0]}.NodePrepareResourcesResponse"
        )
    finally:
        await kubelet.stop()


async def test_kubelet_without_a_common_version_refuses_and_the_driver_says_why(dra):
    kubelet = FakeDRAKubelet(dra.registry_dir, versions=("v2",))  # a kubelet from the future
    try:
        await kubelet.start()
        daemon = await dra.start(Npus(1))
        await kubelet.wait_for(lambda: bool(kubelet.rejections))
        driver = daemon.front_end.drivers[RES]
        await kubelet.wait_for(lambda: bool(driver.registration_error))
        assert "none of the versions" in driver.registration_error
        assert not driver.registered.is_set()
    finally:
        await kubelet.stop()


async def test_deleted_registration_socket_is_offered_again(dra, kubelet):
    await dra.start(Npus(1))
    plugin = await kubelet.wait_registered(DRIVER)
    sock = dra.registry_dir / f"{DRIVER}-reg.sock"
    sock.unlink()
    await kubelet.wait_registered(DRIVER, after=1)
    assert plugin.registry_socket == str(sock) and sock.is_socket()


async def test_registration_answers_get_info_directly(dra):
    await dra.start(Npus(1))
    sock = dra.registry_dir / f"{DRIVER}-reg.sock"
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        info = await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=5)
    assert info.type == "DRAPlugin" and info.name == DRIVER


async def test_configured_driver_name_wins(dra, kubelet, api_server):
    await dra.start(Npus(1), driver_names={RES: "accel.example.org"})
    await kubelet.wait_registered("accel.example.org")
    assert len(api_server.devices_of("accel.example.org")) == 1
    assert api_server.slices_of(DRIVER) == []


async def test_bad_driver_name_stops_start_up_naming_the_field(dra):
    with pytest.raises(ConfigError, match="driverName"):
        await dra.start(Npus(1), driver_names={RES: "Not_A_DNS_Name"})


async def test_missing_node_name_stops_start_up(dra):
    with pytest.raises(ConfigError, match="nodeName"):
        await dra.start(Npus(1), node="")


def test_default_driver_names():
    assert driver_name_for("acme.example.com/npu") == "npu.acme.example.com"
    assert driver_name_for("nvidia.com/gpu") == "gpu.nvidia.com"
    assert driver_name_for("nvidia.com/mig-1g.5gb") == "mig-1g.5gb.nvidia.com"
    assert driver_name_for("example.com/My_Accel") == "my-accel.example.com"
    with pytest.raises(ConfigError):
        driver_name_for("no-slash")


def test_device_names_are_stable_dns_labels():
    assert device_name("accel0") == "accel0"
    assert device_name("0") == "0"
    a, b = device_name("GPU-ab"), device_name("gpu-ab")
    assert b == "gpu-ab" and a != b and a.startswith("gpu-ab-")
    long = device_name("MIG-" + "x" * 80)
    assert len(long) <= 63 and long == device_name("MIG-" + "x" * 80)
    assert device_name("0:1") != device_name("0-1")


async def test_bare_driver_name_fits_one_resource_only(dra):
    other = Npus(1)
    other.hetero_dp_name = "other"
    other.devices = [npu(5, resource="acme.example.com/fpga")]
    with pytest.raises(ConfigError, match="RESOURCE=NAME"):
        await dra.start(Npus(1), other, driver_names={"": "one.example.com"})


def test_driver_name_flags():
    pytest.importorskip("kubernetes")
    from hetero_dp.dra.frontend import DRAOptions

    opts = DRAOptions.from_flags(
        node_name=None,
        driver_names=["x.example.com", "acme.example.com/fpga=fpga.example.org"],
        env={"NODE_NAME": "node-7"},
    )
    assert opts.node_name == "node-7"
    assert opts.driver_names == {"": "x.example.com", "acme.example.com/fpga": "fpga.example.org"}
    with pytest.raises(ConfigError, match="driverName"):
        DRAOptions.from_flags(node_name="n", driver_names=["UPPER.example.com"], env={})


async def test_a_restarted_kubelet_finds_the_driver_again(dra, kubelet, api_server):
    daemon = await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    await kubelet.restart()
    await kubelet.wait_registered(DRIVER, after=1)
    assert daemon.front_end.drivers[RES].registered.is_set()
    ref = ClaimRef.of(
        api_server.add_claim(
            make_claim("c", [("npu", device_name("NPU-0000"))], driver=DRIVER, pool="node-a")
        )
    )
    assert (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid].error == ""


async def test_readiness_says_what_is_missing(dra, api_server):
    daemon = await dra.start(Npus(2))  # no kubelet yet
    ok, lines = daemon.readiness()
    assert not ok and lines == [f"{DRIVER} ({RES}): not ready: not registered with the kubelet"]
    kubelet = FakeDRAKubelet(dra.registry_dir)
    await kubelet.start()
    try:
        await kubelet.wait_registered(DRIVER)
        await kubelet.wait_for(lambda: daemon.readiness()[0])
        assert daemon.readiness()[1] == [f"{DRIVER} ({RES}): ready (2 devices, generation 1)"]
        api_server.refuse_slices = "no"
        api_server.delete_slice(api_server.slices_of(DRIVER)[0]["metadata"]["name"])
        # the watch saw the delete and the sync it started was refused
        await api_server.wait_for(lambda: any(r.status == 403 for r in api_server.requests))
        await daemon.front_end.drivers[RES].resync()
        ok, [line] = daemon.readiness()
        assert not ok and "ResourceSlice refused: HTTP 403 Forbidden: no" in line
    finally:
        await kubelet.stop()


@pytest.mark.parametrize(
    ("socket", "method"),
    [
        ("reg", "/pluginregistration.Registration/NotifyRegistrationStatus"),
        ("dra", "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"),
        ("dra", "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"),
    ],
)
async def test_undecodable_requests_answer_invalid_argument(dra, caplog, socket, method):
    """Issue #29: a body protobuf cannot parse answered UNKNOWN after a multi-line
    traceback; on the DRA and registration sockets too it is INVALID_ARGUMENT now."""
    await dra.start(Npus(1))
    path = (
        dra.registry_dir / f"{DRIVER}-reg.sock"
        if socket == "reg"
        else dra.plugins_dir / DRIVER / "dra.sock"
    )
    async with grpc.aio.insecure_channel(f"unix://{path}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary(method)(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert not [r for r in caplog.records if r.exc_info]
