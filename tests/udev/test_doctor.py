"""The udev backend's doctor checks: what a rule missed, said once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import pyudev
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.backend import options
from hetero_dp_udev.monitor import open_monitor
from hetero_dp_udev.testing import Testbed

from hetero_dp.engine.config import load_config
from hetero_dp.engine.loading import load_backends
from hetero_dp.ops.doctor import DoctorSettings, run_doctor

pytestmark = pytest.mark.umockdev


def _checks(backend: UdevBackend, rules: list[str]) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.message) for c in backend.doctor(options({"rules": rules}))}


def test_a_control_node_the_rule_did_not_find_is_named(testbed: Testbed, data: Path) -> None:
    # The tree as a real host has it, less one parentless control node.
    blocks = (data / "gaudi.umockdev").read_text().split("\n\n")
    testbed.add("\n\n".join(b for b in blocks if "accel_controlD1" not in b))
    checks = _checks(UdevBackend(), ["gaudi"])
    status, message = checks["habana.ai/gaudi companions"]
    assert status == "warn"
    assert message == (
        "expected companion nodes not found: 0000:9a:00.0: companions[1] (subsystem accel "
        "name accel_controlD*, anywhere, numbered 1)"
    )


def test_accelerators_no_rule_matched_are_named(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "gaudi.umockdev")
    checks = _checks(UdevBackend(), ["gaudi"])
    status, message = checks["unmatched accelerators"]
    assert status == "warn"
    # the Intel NPU (class processing accelerator) is not a Gaudi
    assert message == (
        "1 accelerator(s) on the PCI bus match no rule: 0000:00:0b.0 (vendor 0x8086, "
        "class 0x120000, intel_vpu): no shipped rule set: write a rule (docs/udev.md)"
    )
    assert "habana.ai/gaudi companions" not in checks


def test_gpu_audio_and_bmc_vga_are_not_accelerators(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "amd-gpu.umockdev")
    checks = _checks(UdevBackend(), ["amd-gpu"])
    assert "unmatched accelerators" not in checks
    checks = _checks(UdevBackend(), ["gaudi"])  # the AMD GPUs are now unmatched
    status, message = checks["unmatched accelerators"]
    assert status == "warn" and message.startswith("2 accelerator(s)")
    assert "0000:43:00.0 (vendor 0x1002, class 0x038000, amdgpu): AMD: shipped rule set" in message


def test_an_unbound_npu_without_id_is_not_lost(testbed: Testbed, data: Path) -> None:
    # Unbound at start-up an Ascend card has no dev_id, so no vendor ID: doctor says so.
    testbed.add_file(data / "ascend-npu.umockdev")
    npu = "/sys/devices/pci0000:80/0000:80:00.0/0000:82:00.0"
    testbed.unbind_driver(npu)
    testbed.set_attribute(npu, "dev_id", "", event=False)
    (testbed.root / npu.lstrip("/") / "dev_id").unlink()
    checks = _checks(UdevBackend(), ["ascend-npu"])
    assert (
        "0000:82:00.0 (vendor 0x19e5, class 0x120000, no driver)"
        in (checks["unmatched accelerators"][1])
    )


def test_an_empty_rule_is_reported_once(
    testbed: Testbed, data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    testbed.add_file(data / "gaudi.umockdev")
    caplog.set_level(logging.WARNING)
    cfg = load_config(raw={"backends": {"udev": {"rules": ["gaudi", "amd-gpu"]}}}, env={})
    loaded = load_backends([UdevBackend()])
    try:
        findings = asyncio.run(run_doctor(cfg, loaded, DoctorSettings(root=tmp_path)))
    finally:
        for b in loaded:
            b.close()
    said = [f.message for f in findings if "matches no device" in f.message]
    said += [r.getMessage() for r in caplog.records if "matches no device" in r.getMessage()]
    assert said == ["shipped rule set 'amd-gpu': resources[0] (amd.com/gpu) matches no device"]


def test_an_fpga_management_function_is_part_of_its_card(testbed: Testbed, data: Path) -> None:
    testbed.add_file(data / "xilinx-fpga.umockdev")
    checks = _checks(UdevBackend(), ["xilinx-fpga"])
    assert checks["xilinx.com/fpga-<VBNV>-<timestamp> devices"] == (
        "pass",
        "1 device(s): 0000:d8:00.1",
    )
    assert "unmatched accelerators" not in checks


MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "udev" / "daemonset.yaml"


def _empty_rule_records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "hetero_dp_udev" and "matches no device" in r.getMessage()
    ]


def test_an_empty_rule_warns_only_for_an_expected_resource(
    testbed: Testbed, data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A DaemonSet runs on nodes without some of its accelerators: a rule for a resource
    # the operator did not list in udev.expect says so at INFO, not as a warning.
    testbed.add_file(data / "gaudi.umockdev")
    caplog.set_level(logging.INFO, logger="hetero_dp_udev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["gaudi", "amd-gpu"], "expect": ["habana.ai/*"]}))
    assert len(backend.discover()) == 2  # the tree's two Gaudis
    assert _empty_rule_records(caplog) == [
        (
            logging.INFO,
            "shipped rule set 'amd-gpu': resources[0] (amd.com/gpu) matches no device at "
            "start-up (none on this node; not a warning, its resource is not in udev.expect)",
        )
    ]
    checks = _checks_with(backend, {"rules": ["gaudi", "amd-gpu"], "expect": []})
    assert checks["amd.com/gpu devices"][0] == "pass"
    caplog.clear()
    backend = UdevBackend()  # the default expects every resource: as before, a warning
    backend.configure(options({"rules": ["gaudi", "amd-gpu"]}))
    backend.discover()
    assert [level for level, _ in _empty_rule_records(caplog)] == [logging.WARNING]
    assert _checks_with(backend, {"rules": ["amd-gpu"]})["amd.com/gpu devices"][0] == "warn"


def test_the_shipped_configmap_warns_about_nothing_on_a_node_without_its_devices(
    testbed: Testbed, data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 37: deploy/udev/daemonset.yaml's ConfigMap as shipped, on a node with
    # neither an AMD GPU nor the example FPGA (a Gaudi node): nothing the operator did
    # not choose is a warning, and each empty rule is still said at INFO.
    import yaml

    testbed.add_file(data / "gaudi.umockdev")
    caplog.set_level(logging.INFO, logger="hetero_dp_udev")
    config_map = next(
        d for d in yaml.safe_load_all(MANIFEST.read_text()) if d["kind"] == "ConfigMap"
    )
    (tmp_path / "rules.yaml").write_text(config_map["data"]["rules.yaml"])
    udev = yaml.safe_load(config_map["data"]["config.yaml"])["backends"]["udev"]
    udev["rules"] = [
        str(tmp_path / "rules.yaml") if r == "/etc/hetero-dp/rules.yaml" else r
        for r in udev["rules"]
    ]
    udev["hostRoot"] = "/"  # the testbed's tree stands in for the host's
    backend = UdevBackend()
    backend.configure(options(udev))
    assert backend.discover() == []
    said = _empty_rule_records(caplog)
    assert len(said) == len(backend.rules) >= 2
    assert {level for level, _ in said} == {logging.INFO}
    # The hotplug monitor: the example rule's companion names no subsystem and, with no
    # such device present, none can be derived. Seen on a real 1.36 node as a WARNING
    # on every start; for a resource not expected here it is INFO too.
    caplog.clear()
    open_monitor(pyudev.Context(), backend.rules, backend.expect)
    monitor_said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert any("names no subsystem" in m for _, m in monitor_said), monitor_said
    assert {level for level, _ in monitor_said} == {logging.INFO}, monitor_said
    caplog.clear()
    open_monitor(pyudev.Context(), backend.rules)  # expecting every resource: a warning
    assert logging.WARNING in {r.levelno for r in caplog.records}


def _checks_with(backend: UdevBackend, raw: dict[str, object]) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.message) for c in backend.doctor(options(raw))}
