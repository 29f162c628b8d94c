"""Author helpers: sysfs facts of a PCI device, per-device settings, and
``hetero-dp run FILE --fake-kubelet``; and the kubelet dir checks of ``run``."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_dp import ConfigError, device_settings, pci_address_of, pci_facts
from hetero_dp.testing import short_tempdir
from tests.conftest import ROOT

ADDRESS = "0000:3b:00.0"


def fake_sysfs(root: Path, *, numa: str = "1\n", driver: bool = True) -> Path:
    """A PCI device's sysfs dir, in the kernel's layout (Documentation/ABI/testing/
    sysfs-bus-pci; sysfs-kernel-iommu_groups; sysfs-dev). The values are made up: an
    NVIDIA H100 (vendor 0x10de, device 0x2330, class 0x030200, "3D controller", as
    lspci -n shows one); each file ends in a newline, as the kernel writes it."""
    device = root / "sys/devices/pci0000:3a/0000:3a:00.0" / ADDRESS
    device.mkdir(parents=True)
    for name, value in {
        "vendor": "0x10de\n",
        "device": "0x2330\n",
        "subsystem_vendor": "0x10de\n",
        "subsystem_device": "0x16c1\n",
        "class": "0x030200\n",
        "numa_node": numa,  # -1 is NUMA_NO_NODE (drivers/pci/pci-sysfs.c)
    }.items():
        (device / name).write_text(value)
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True)
    (bus / ADDRESS).symlink_to(os.path.relpath(device, bus))  # bus/pci/devices/* are links
    drivers = root / "sys/bus/pci/drivers/nvidia"
    drivers.mkdir(parents=True)
    if driver:  # driver -> ../../../../bus/pci/drivers/<name>, absent when none is bound
        (device / "driver").symlink_to(os.path.relpath(drivers, device))
    group = root / "sys/kernel/iommu_groups/42"
    group.mkdir(parents=True)
    (device / "iommu_group").symlink_to(os.path.relpath(group, device))
    # a char device under the GPU, as drm's cards are: /sys/dev/char/M:m is a link to
    # the class device, whose "device" link is its parent (sysfs-dev). M:m here is
    # /dev/null's 1:3 (Documentation/admin-guide/devices.txt), so the test can stat a
    # real node; on a real host 1:3 leads to no PCI device.
    card = device / "drm/card0"
    card.mkdir(parents=True)
    (card / "device").symlink_to(os.path.relpath(device, card))
    chars = root / "sys/dev/char"
    chars.mkdir(parents=True)
    (chars / "1:3").symlink_to(os.path.relpath(card, chars))
    return device


def test_pci_facts_read_the_kernels_files(tmp_path):
    fake_sysfs(tmp_path)
    facts = pci_facts(ADDRESS, root=tmp_path)
    assert (facts.vendor, facts.device, facts.pci_class) == ("0x10de", "0x2330", "0x030200")
    assert (facts.subsystem_vendor, facts.subsystem_device) == ("0x10de", "0x16c1")
    assert facts.numa_node == 1 and facts.numa_nodes == (1,)
    assert facts.driver == "nvidia"
    assert facts.iommu_group == 42
    assert pci_facts(ADDRESS.upper(), root=tmp_path).address == ADDRESS


def test_pci_facts_without_numa_or_driver(tmp_path):
    fake_sysfs(tmp_path, numa="-1\n", driver=False)
    facts = pci_facts(ADDRESS, root=tmp_path)
    assert facts.numa_node is None and facts.numa_nodes == ()
    assert facts.driver is None


def test_pci_facts_name_a_bad_or_missing_address(tmp_path):
    with pytest.raises(ValueError, match="not a PCI address"):
        pci_facts("3b:00", root=tmp_path)
    with pytest.raises(FileNotFoundError, match=ADDRESS):
        pci_facts(ADDRESS, root=tmp_path)


def test_pci_address_of_a_device_node(tmp_path):
    fake_sysfs(tmp_path)
    assert pci_address_of("/dev/null", root=tmp_path) == ADDRESS
    assert pci_address_of("/dev/null", root=tmp_path / "nothing") is None


def test_device_settings_merge_globs_then_the_exact_id():
    options = {
        "devices": {
            "npu7": {"clock": 900},
            "*": {"clock": 1200, "mode": "x"},
            "npu[0-3]": {"partition": "a"},
        }
    }
    assert device_settings(options, "npu7") == {"clock": 900, "mode": "x"}
    assert device_settings(options, "npu2") == {"clock": 1200, "mode": "x", "partition": "a"}
    assert device_settings({}, "npu2") == {}
    with pytest.raises(ConfigError) as e:
        device_settings({"devices": {"npu1": 3}}, "npu1")
    assert e.value.field == "devices.npu1"
    with pytest.raises(ConfigError):
        device_settings({"devices": ["npu1"]}, "npu1")


async def _line(stream: asyncio.StreamReader, want: str, seen: list[str]) -> None:
    while True:
        raw = await asyncio.wait_for(stream.readline(), 30)
        assert raw, f"output ended before {want!r}: {seen}"
        seen.append(raw.decode().rstrip())
        if want in seen[-1]:
            return


async def test_run_fake_kubelet_prints_what_the_kubelet_sees(tmp_path, cli_env, hetero_dp_cmd):
    for i in range(2):
        (tmp_path / f"acme{i}").touch()
    env = dict(cli_env, ACME_DEV_GLOB=str(tmp_path / "acme*"))
    proc = await asyncio.create_subprocess_exec(
        *hetero_dp_cmd,
        "run",
        str(ROOT / "docs/examples/acme.py"),
        "--fake-kubelet",
        "--health-interval",
        "0.05",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    seen: list[str] = []
    try:
        await _line(proc.stdout, "fake kubelet at ", seen)
        kubelet_dir = Path(seen[-1].split(" at ", 1)[1])
        await _line(proc.stdout, "acme.example.com/npu: registered", seen)
        await _line(proc.stdout, "2 devices (2 healthy): npu0, npu1", seen)
        os.remove(tmp_path / "acme1")
        await _line(proc.stdout, "acme.example.com/npu: npu1 is Unhealthy", seen)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    rest = (await proc.stdout.read()).decode()
    err = (await proc.stderr.read()).decode()
    assert code == 0, err
    assert "stopping" in rest and "npu0 is Unhealthy" not in rest
    assert not kubelet_dir.exists()  # its temp dir is removed


def _run(cmd, env, *args, user=()):
    return subprocess.run(
        [*user, *cmd, "run", str(ROOT / "docs/examples/acme.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_missing_kubelet_dir_is_an_error_unless_asked_to_create(tmp_path, cli_env, hetero_dp_cmd):
    missing = tmp_path / "device-plugins-typo"
    result = _run(hetero_dp_cmd, cli_env, "--kubelet-dir", str(missing))
    assert result.returncode == 2
    assert f"{missing} does not exist" in result.stderr
    assert "--create-kubelet-dir" in result.stderr
    assert "Traceback" not in result.stderr
    assert not missing.exists()


def test_create_kubelet_dir_creates_it(tmp_path):
    from hetero_dp.deviceplugin.frontend import check_kubelet_dir
    from hetero_dp.engine.config import load_config

    missing = tmp_path / "a" / "dp"
    cfg = load_config(raw={"kubeletDir": str(missing)}, env={})
    check_kubelet_dir(cfg, create=True)
    assert missing.is_dir()


def _as_nobody(cli_env: dict[str, str]) -> tuple[list[str], list[str], dict[str, str]]:
    """Run hetero-dp as uid 65534: setpriv, and the system's python of this version
    with this venv's packages (the venv's own python may sit under /root)."""
    if os.geteuid() != 0:
        return [], [sys.executable, "-m", "hetero_dp"], cli_env
    python = shutil.which(
        f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin"
    )
    setpriv = shutil.which("setpriv")
    if python is None or setpriv is None:
        pytest.skip("needs setpriv and /usr/bin/python3.x to drop root")
    site = [p for p in sys.path if p.endswith("site-packages") and p.startswith(str(ROOT))]
    env = dict(cli_env, PYTHONPATH=os.pathsep.join([str(ROOT), *site]))
    user = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run(
        [*user, python, "-c", "import hetero_dp, grpc, click"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:  # e.g. the packages live under /root, closed to uid 65534
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"uid 65534 cannot load this environment's packages: {last}")
    return user, [python, "-m", "hetero_dp"], env


def test_an_unwritable_kubelet_dir_names_the_path_and_the_fix(cli_env):
    root = short_tempdir()
    try:
        root.chmod(0o755)  # others may look in, not write
        dp = root / "dp"
        dp.mkdir(mode=0o755)
        if os.geteuid() != 0:
            dp.chmod(0o555)
        user, cmd, env = _as_nobody(cli_env)
        result = _run(cmd, env, "--kubelet-dir", str(dp), user=user)
        assert result.returncode == 2, result.stderr
        assert f"{dp} is not writable by this user" in result.stderr
        assert "Traceback" not in result.stderr
        nested = dp / "new"
        result = _run(cmd, env, "--kubelet-dir", str(nested), "--create-kubelet-dir", user=user)
        assert result.returncode == 2, result.stderr
        assert f"cannot create {nested}: Permission denied" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_run_fake_kubelet_leaves_no_temp_dir_after_a_config_error(tmp_path, cli_env, hetero_dp_cmd):
    plugin = tmp_path / "broken.py"
    plugin.write_text(
        "from hetero_dp import hookimpl\n\n@hookimpl\ndef discover(dev):\n    return []\n"
    )
    before = set(Path("/tmp").glob("hdp-try-*"))
    result = subprocess.run(
        [*hetero_dp_cmd, "run", str(plugin), "--fake-kubelet"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "argument 'dev' is not an argument of hook discover" in result.stderr
    assert set(Path("/tmp").glob("hdp-try-*")) <= before


async def test_run_fake_kubelet_keeps_cdi_specs_off_the_host(tmp_path, cli_env, hetero_dp_cmd):
    """A trial on a laptop must not advertise its devices to the laptop's own container
    runtime: the CDI spec goes beside the fake kubelet, not into /var/run/cdi (the
    suite's host guard fails this test if it does)."""
    config = tmp_path / "cdi.yaml"
    config.write_text("resources:\n  hetero-dp.io/sim:\n    deliver: [cdi-cri]\n")
    proc = await asyncio.create_subprocess_exec(
        *hetero_dp_cmd,
        "run",
        "simulated",
        "--fake-kubelet",
        "-c",
        str(config),
        env=cli_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    seen: list[str] = []
    try:
        await _line(proc.stdout, "fake kubelet at ", seen)
        root = Path(seen[-1].split(" at ", 1)[1]).parent
        await _line(proc.stdout, "4 devices (4 healthy)", seen)
        assert [p.name for p in (root / "cdi").iterdir()] == ["hetero-dp_hetero-dp.io_sim.json"]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert not root.exists()
