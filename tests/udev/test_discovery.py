"""Each shipped rule set against its recorded device tree, through real libudev."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import pyudev
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.backend import options
from hetero_dp_udev.monitor import monitor_subsystems
from hetero_dp_udev.rules import load_rules
from hetero_dp_udev.testing import Testbed

from hetero_dp import ConfigError, Device
from hetero_dp.ops.labels import generic_labels

pytestmark = pytest.mark.umockdev

GAUDI_9A = "/sys/devices/pci0000:97/0000:97:01.0/0000:9a:00.0"
AMD_C3 = "/sys/devices/pci0000:c0/0000:c0:03.1/0000:c3:00.0"
ASCEND_82 = "/sys/devices/pci0000:80/0000:80:00.0/0000:82:00.0"


def _discover(testbed: Testbed, data: Path, name: str, rules: object = None) -> list[Device]:
    testbed.add_file(data / f"{name}.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": rules if rules is not None else [name]}))
    return backend.discover()


def _per_device(device: Device) -> list[str]:
    return [n.host_path for n in device.nodes if not n.shared]


def _shared(device: Device) -> list[str]:
    return [n.host_path for n in device.nodes if n.shared]


def test_amd_gpu(testbed: Testbed, data: Path) -> None:
    devices = _discover(testbed, data, "amd-gpu")
    # the ASPEED BMC VGA (card0) and the GPU's HDMI audio function are not GPUs
    assert [d.id for d in devices] == ["0000:43:00.0", "0000:c3:00.0"]
    first, second = devices
    # card numbering follows probe order, not PCI order: found through drm children
    assert _per_device(first) == ["/dev/dri/card2", "/dev/dri/renderD129"]
    assert _per_device(second) == ["/dev/dri/card1", "/dev/dri/renderD128"]
    assert _shared(first) == _shared(second) == ["/dev/kfd"]
    assert (first.numa_nodes, second.numa_nodes) == ((0,), (1,))
    assert first.env == {}
    assert all(d.healthy for d in devices)
    assert first.attributes["driver"] == "amdgpu"
    assert first.attributes["vendor"] == "0x1002" and first.attributes["device"] == "0x740f"
    assert first.attributes["product"] == "Aldebaran/MI200 [Instinct MI210]"


def test_ascend_npu_has_the_vendor_plugins_names(testbed: Testbed, data: Path) -> None:
    devices = _discover(testbed, data, "ascend-npu")
    # the Huawei NIC (class 0x0200) is not an NPU; names as Huawei's plugin gives them
    assert [(d.resource, d.id) for d in devices] == [
        ("huawei.com/Ascend910", "Ascend910-1"),
        ("huawei.com/Ascend910", "Ascend910-0"),
    ]
    # the davinci index comes from the driver's dev_id, not from PCI order
    assert [_per_device(d) for d in devices] == [["/dev/davinci1"], ["/dev/davinci0"]]
    assert [d.env for d in devices] == [
        {"ASCEND_VISIBLE_DEVICES": "1"},
        {"ASCEND_VISIBLE_DEVICES": "0"},
    ]
    assert [d.index for d in devices] == [1, 0]
    assert [d.attributes["pci"] for d in devices] == ["0000:81:00.0", "0000:82:00.0"]
    shared = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    assert all(_shared(d) == shared for d in devices)
    assert [d.numa_nodes for d in devices] == [(1,), (1,)]
    assert all(d.healthy for d in devices)


def test_ascend_npu_generic_names_switch(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "ascend-npu.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["ascend-npu"], "names": "generic"}))
    devices = backend.discover()
    assert [(d.resource, d.id) for d in devices] == [
        ("huawei.com/npu", "0000:81:00.0"),
        ("huawei.com/npu", "0000:82:00.0"),
    ]
    assert [d.env for d in devices] == [
        {"ASCEND_VISIBLE_DEVICES": "1"},
        {"ASCEND_VISIBLE_DEVICES": "0"},
    ]


def test_names_option_is_checked(testbed: Testbed) -> None:
    with pytest.raises(ConfigError, match=r"names.*vendor, generic"):
        UdevBackend().configure(options({"rules": ["gaudi"], "names": "habana"}))


def test_gaudi_every_node_and_env_of_habanas_plugin(testbed: Testbed, data: Path) -> None:
    devices = _discover(testbed, data, "gaudi")
    # the Intel NPU on the same accel subsystem has another vendor
    assert [d.id for d in devices] == ["0000:33:00.0", "0000:9a:00.0"]
    # the control node has no parent (/sys/devices/virtual/accel): paired by index
    assert _per_device(devices[0]) == ["/dev/accel/accel0", "/dev/accel/accel_controlD0"]
    assert _per_device(devices[1]) == ["/dev/accel/accel1", "/dev/accel/accel_controlD1"]
    # module IDs (the PCI function's module_id) are not the accel indices
    assert [d.env for d in devices] == [
        {
            "HABANA_VISIBLE_DEVICES": "0",
            "HABANA_VISIBLE_MODULES": "2",
            "HL_VISIBLE_DEVICES": "/dev/accel/accel0",
        },
        {
            "HABANA_VISIBLE_DEVICES": "1",
            "HABANA_VISIBLE_MODULES": "5",
            "HL_VISIBLE_DEVICES": "/dev/accel/accel1",
        },
    ]
    assert [d.numa_nodes for d in devices] == [(0,), (1,)]
    assert devices[0].attributes["driver"] == "habanalabs"
    assert all(d.healthy for d in devices)


@pytest.mark.parametrize(
    ("name", "syspath", "device_id"),
    [
        ("gaudi", GAUDI_9A, "0000:9a:00.0"),
        ("amd-gpu", AMD_C3, "0000:c3:00.0"),
        ("ascend-npu", ASCEND_82, "Ascend910-0"),
    ],
)
@pytest.mark.parametrize("driver", [None, "vfio-pci"])
def test_unusable_driver_at_start_up_is_listed_unhealthy(
    testbed: Testbed, data: Path, name: str, syspath: str, device_id: str, driver: str | None
) -> None:
    # docs/sources.md#unbound-device: after an unbind the function has no driver link, its
    # bridge still has pcieport; bound to vfio-pci it is not usable by containers.
    testbed.add_file(data / f"{name}.umockdev")
    if driver is None:
        testbed.unbind_driver(syspath)
    else:
        testbed.bind_driver(syspath, driver)
    backend = UdevBackend()
    backend.configure(options({"rules": [name]}))
    devices = {d.id: d for d in backend.discover()}
    sick = devices[device_id]
    bdf = syspath.rsplit("/", 1)[1]
    usable = {"gaudi": "habanalabs", "amd-gpu": "amdgpu", "ascend-npu": "devdrv_device_driver"}
    if driver is None:
        assert sick.reason == f"no driver bound to {bdf} (usable: {usable[name]})"
    else:
        assert sick.reason == f"{bdf} is bound to vfio-pci, not a usable driver ({usable[name]})"
    assert not sick.healthy
    assert [d.healthy for i, d in devices.items() if i != device_id] == [True]


def test_xilinx_fpga(testbed: Testbed, data: Path) -> None:
    devices = _discover(testbed, data, "xilinx-fpga")
    assert [d.id for d in devices] == ["0000:d8:00.1"]  # the user function, not mgmt
    # one resource per shell, named as Xilinx's plugin names it (VBNV-timestamp)
    assert devices[0].resource == "xilinx.com/fpga-xilinx_u250_gen3x16_xdma_shell_3_1-0"
    assert _per_device(devices[0]) == [
        "/dev/dri/renderD128",
        "/dev/xclmgmt55296",
        "/dev/xfpga/flash.m55296",
    ]
    assert devices[0].numa_nodes == (1,)
    assert {n.permissions for n in devices[0].nodes} == {"rwm"}  # as Xilinx's plugin


XILINX_USER = "/devices/pci0000:d7/0000:d7:00.0/0000:d8:00.1"


def test_xilinx_unbound_keeps_its_shell_name_unhealthy(
    testbed: Testbed, data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """xocl's rom subdevice (the shell's VBNV and timestamp) goes with the driver: a
    card unbound at run time keeps the resource it had, Unhealthy; one unbound since
    start-up has no name to read, and is skipped saying why."""
    testbed.add_file(data / "xilinx-fpga.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["xilinx-fpga"]}))
    (before,) = backend.discover()
    testbed.unbind_driver(XILINX_USER)
    rom = testbed.root / "sys" / XILINX_USER.lstrip("/") / "rom.u.55297"
    for name in ("VBNV", "timestamp"):
        (rom / name).unlink()
    rom.rmdir()
    (after,) = backend.discover()
    assert (
        after.resource
        == before.resource
        == ("xilinx.com/fpga-xilinx_u250_gen3x16_xdma_shell_3_1-0")
    )
    assert not after.healthy and "no driver bound to 0000:d8:00.1" in after.reason
    fresh = UdevBackend()
    fresh.configure(options({"rules": ["xilinx-fpga"]}))
    with caplog.at_level("WARNING", logger="hetero_dp_udev"):
        assert fresh.discover() == []
    assert "renders the resource name 'xilinx.com/fpga--'" in caplog.text
    assert "is its driver bound?" in caplog.text


def test_plain_dev_glob(testbed: Testbed, data: Path) -> None:
    devices = _discover(testbed, data, "dev-glob")
    by_resource: dict[str, list[Device]] = {}
    for device in devices:
        by_resource.setdefault(device.resource, []).append(device)
    serial = by_resource["hetero-dp.io/serial"]
    assert [d.id for d in serial] == ["ttyACM0", "ttyUSB0"]  # not the platform ttyS0
    assert [_per_device(d) for d in serial] == [["/dev/ttyACM0"], ["/dev/ttyUSB0"]]
    assert all(d.numa_nodes == () for d in devices)  # numa_node -1 means none
    assert serial[1].attributes["vendor"] == "0x0403"  # the adapter's IDs, not the xHCI's
    assert [d.id for d in by_resource["hetero-dp.io/video"]] == ["video0"]


def test_labels_count_and_product(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "amd-gpu.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["amd-gpu"]}))
    devices = backend.discover()
    # what the node gets: the framework's generic labels, the backend's on top
    assert {**generic_labels("amd.com/gpu", devices), **backend.labels(devices)} == {
        "amd.com/gpu.count": "2",
        "amd.com/gpu.product": "Aldebaran-MI200-Instinct-MI210",
    }


def test_labels_say_mixed_when_products_differ(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "dev-glob.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["dev-glob"]}))
    serial = [d for d in backend.discover() if d.resource == "hetero-dp.io/serial"]
    assert len({d.attributes["product"] for d in serial}) == 2
    assert backend.labels(serial) == {"hetero-dp.io/serial.product": "mixed"}


def test_id_choice_limit_and_templates(testbed: Testbed, data: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "resources:\n"
        "  - name: example.com/gpu\n"
        "    match: {subsystem: pci, vendor: '0x1002', driver: amdgpu}\n"
        "    id: serial\n"
        "    limit: 1\n"
        "    primaryNode: false\n"
        "    companions: [{subsystem: drm, sysname: 'renderD*'}]\n"
        "    env: {GPU_PCI: '{pci}', GPU_NODE: '{id}/{index}'}\n"
        "    annotations: {example.com/vendor: '{vendor}:{device}'}\n"
    )
    devices = _discover(testbed, data, "amd-gpu", rules=str(rules))
    assert [d.id for d in devices] == ["aa0f1c2e5e6b7d01"]
    assert devices[0].env == {"GPU_PCI": "0000:43:00.0", "GPU_NODE": "aa0f1c2e5e6b7d01/0"}
    assert devices[0].annotations == {"example.com/vendor": "0x1002:0x740f"}
    assert _per_device(devices[0]) == ["/dev/dri/renderD129"]


def test_rule_matching_nothing_warns_and_keeps_going(
    testbed: Testbed, data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "hetero_dp_udev")
    devices = _discover(testbed, data, "gaudi", rules=["gaudi", "amd-gpu"])
    assert [d.resource for d in devices] == ["habana.ai/gaudi"] * 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("shipped rule set 'amd-gpu'" in w and "amd.com/gpu" in w for w in warnings)


def test_missing_shared_node_makes_devices_unhealthy_and_doctor_fails(
    testbed: Testbed, data: Path
) -> None:
    testbed.add_file(data / "ascend-npu.umockdev")
    testbed.remove_node("/dev/hisi_hdc")
    backend = UdevBackend()
    backend.configure(options({"rules": ["ascend-npu"]}))
    devices = backend.discover()
    assert [d.healthy for d in devices] == [False, False]
    assert devices[0].reason == "shared node /dev/hisi_hdc is missing"
    checks = {c.name: c for c in backend.doctor(options({"rules": ["ascend-npu"]}))}
    assert checks["huawei.com/Ascend910 devices"].status == "pass"
    assert checks["huawei.com/Ascend910 nodes"].status == "fail"
    assert "/dev/hisi_hdc" in checks["huawei.com/Ascend910 nodes"].message


def test_doctor_warns_on_a_rule_without_devices(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "gaudi.umockdev")
    checks = UdevBackend().doctor(options({"rules": ["xilinx-fpga"]}))
    assert [(c.name, c.status) for c in checks] == [
        ("udev rules", "pass"),
        ("xilinx.com/fpga-<VBNV>-<timestamp> devices", "warn"),
        ("unmatched accelerators", "warn"),  # the Gaudis and the Intel NPU
    ]
    assert "matches no device" in checks[1].message


def test_device_without_nodes_is_healthy_unless_nodes_are_expected(
    testbed: Testbed, data: Path, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "resources:\n"
        "  - name: example.com/bare\n"
        "    match: {subsystem: pci, vendor: '0x1002', driver: amdgpu}\n"
        "  - name: example.com/expects\n"
        "    match: {subsystem: pci, vendor: '0x1002', driver: amdgpu}\n"
        "    companions: [{subsystem: drm, sysname: 'controlD*'}]\n"
    )
    devices = _discover(testbed, data, "amd-gpu", rules=str(rules))
    bare = [d for d in devices if d.resource == "example.com/bare"]
    expects = [d for d in devices if d.resource == "example.com/expects"]
    assert [(d.healthy, d.nodes) for d in bare] == [(True, ()), (True, ())]
    assert [d.healthy for d in expects] == [False, False]
    assert expects[0].reason == "no device nodes found (driver still loading?)"


@pytest.mark.parametrize("name", ["amd-gpu", "ascend-npu", "gaudi", "xilinx-fpga", "dev-glob"])
def test_cdi_spec_of_each_rule_set_validates(testbed: Testbed, data: Path, name: str) -> None:
    from hetero_dp.allocation.cdi import build_spec
    from tests.cdi.schema_check import assert_valid_cdi_spec

    devices = _discover(testbed, data, name)
    assert devices
    for resource in sorted({d.resource for d in devices}):
        mine = [d for d in devices if d.resource == resource]
        spec = build_spec(resource, mine)
        assert_valid_cdi_spec(spec)
        assert [d["name"] for d in spec["devices"]] == [d.id for d in mine]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("amd-gpu", {"pci", "drm"}),
        ("ascend-npu", {"pci"}),
        ("gaudi", {"pci", "accel"}),
        # the management nodes' entries name no subsystem: derived from the tree
        ("xilinx-fpga", {"pci", "drm", "xrt_mgmt", "xrt_flash"}),
        ("dev-glob", {"tty", "video4linux"}),
    ],
)
def test_the_kernel_side_filter_is_always_set(
    testbed: Testbed, data: Path, name: str, expected: set[str]
) -> None:
    testbed.add_file(data / f"{name}.umockdev")
    subsystems, unknown = monitor_subsystems(pyudev.Context(), load_rules([name]))
    assert (subsystems, unknown) == (expected, [])


def test_an_entry_without_subsystem_or_devices_is_named(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "gaudi.umockdev")
    rules = load_rules(["xilinx-fpga"])  # no FPGA here, so nothing to derive from
    subsystems, unknown = monitor_subsystems(pyudev.Context(), rules)
    assert subsystems == {"pci", "drm"}
    assert unknown == [
        "shipped rule set 'xilinx-fpga': resources[0] (xilinx.com/fpga-<VBNV>-<timestamp>) "
        "companions[1]",
        "shipped rule set 'xilinx-fpga': resources[0] (xilinx.com/fpga-<VBNV>-<timestamp>) "
        "companions[2]",
    ]
