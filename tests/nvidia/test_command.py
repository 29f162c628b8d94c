"""``nvidia-device-plugin`` and ``hetero-dp run nvidia`` take NVIDIA's flags, env vars
and config file as NVIDIA's plugin v0.20 does (one mapping for both), served to the
fake kubelet over real sockets from a separate process on the fake NVML."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hetero_dp_nvidia.command import argv, help_text
from hetero_dp_nvidia.options import FLAGS, parse_command_line, parse_options

from hetero_dp import ConfigError
from tests.cdi.schema_check import assert_valid_cdi_spec

REPO = Path(__file__).resolve().parents[2]
KIND = "k8s.device-plugin.nvidia.com/gpu"


def child_env(fake_nvml_lib, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"CONFIG_FILE", "MIG_STRATEGY"}}
    env["LD_LIBRARY_PATH"] = str(Path(fake_nvml_lib._name).parent)
    env["PYTHONPATH"] = f"{REPO}:{REPO / 'vendors/nvidia'}"
    env.update(extra)
    return env


async def test_nvidia_device_plugin_serves_with_nvidia_flags_and_config_file(
    fake_kubelet, fake_node, fake_nvml_lib, tmp_path
):
    node = fake_node("a100-8x-nvlink.scn")
    cdi_dir = tmp_path / "cdi"
    config = tmp_path / "config.yaml"
    # NVIDIA's config file as its chart writes it (shared with GPU feature discovery),
    # plus the CDI dir of this test.
    config.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "flags": {
                    "migStrategy": "none",  # the command-line flag below wins
                    "failOnInitError": True,
                    "plugin": {"passDeviceSpecs": False, "deviceIDStrategy": "uuid"},
                    "gfd": {"oneshot": False, "sleepInterval": "60s"},
                },
                "resources": {"gpus": [{"pattern": "*A100*", "name": "a100"}]},
                "cdi": {"dir": str(cdi_dir)},
            }
        )
    )
    args = [
        *argv([]),
        "--mig-strategy",
        "mixed",
        "--device-list-strategy=cdi-cri",
        "--nvidia-driver-root",
        str(node.root / "driver"),
        "--config-file",
        str(config),
        "--kubelet-dir",
        str(fake_kubelet.plugin_dir),
        "-o",
        f"nvidia.sysfsRoot={node.root / 'sys'}",
        "-o",
        f"nvidia.procRoot={node.root / 'proc'}",
    ]
    env = child_env(fake_nvml_lib, FAKE_NVML_SCENARIO=str(node.scenario), MIG_STRATEGY="single")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        gpus = await fake_kubelet.wait_devices("nvidia.com/a100", lambda d: len(d) == 7, 30)
        assert set(gpus) == {g["uuid"] for g in node.gpus[1:]}  # GPU 0 is in MIG mode
        mig = node.mig_uuids(0)[2]
        await fake_kubelet.wait_devices("nvidia.com/mig-2g.10gb", lambda d: list(d) == [mig], 30)
        r = await fake_kubelet.allocate("nvidia.com/a100", [node.uuid(1)])
        assert [c.name for c in r.cdi_devices] == [f"{KIND}={node.uuid(1)}"]
        # written before the daemon serves its first device list (Daemon.start)
        spec_file = cdi_dir / "hetero-dp_k8s.device-plugin.nvidia.com_gpu.json"
        spec = assert_valid_cdi_spec(json.loads(spec_file.read_text()))
        assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()


def test_unknown_flag_is_refused_by_name(fake_nvml_lib):
    out = subprocess.run(
        [*argv(["--mig-strategy=none", "--frobnicate", "3"])],
        env=child_env(fake_nvml_lib),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--frobnicate" in out.stderr and "unknown flag" in out.stderr


def test_unimplemented_flags_are_accepted_with_a_warning_naming_each(caplog):
    env = parse_command_line(["--imex-channel-ids", "0,1", "--cdi-feature-flags=x"])
    with caplog.at_level("WARNING"):
        parse_options({"commandLine": env}, {"KUBELET_SOCKET": "/var/lib/kubelet/x.sock"})
    warned = " ".join(r.getMessage() for r in caplog.records)
    # each named as the user gave it: the flag, or the environment variable
    for name in ("flag --imex-channel-ids", "flag --cdi-feature-flags", "env KUBELET_SOCKET"):
        assert name in warned


def test_flags_env_and_file_precedence_as_nvidia():
    file = {"migStrategy": "single", "plugin": {"deviceIDStrategy": "index"}}
    env = {"MIG_STRATEGY": "mixed", "DEVICE_ID_STRATEGY": "uuid"}
    cli = parse_command_line(["--mig-strategy", "none", "--pass-device-specs"])
    o = parse_options({**file, "commandLine": cli}, env)
    assert o.mig_strategy == "none"  # flag > env > file
    assert o.device_id_strategy == "uuid"  # env > file
    assert o.pass_device_specs is True  # a bare boolean flag


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"DRIVER_ROOT_CTR_PATH": "/host"}, "/host"),
        ({"CONTAINER_DRIVER_ROOT": "/host2"}, "/host2"),
        ({"DRIVER_ROOT_CTR_PATH": "/a", "CONTAINER_DRIVER_ROOT": "/b"}, "/a"),  # NVIDIA's order
    ],
)
def test_driver_root_ctr_path_and_its_alias(env, want):
    assert parse_options({}, env).container_driver_root == want


def test_every_flag_has_an_env_var_and_the_aliases_parse():
    for flag in FLAGS:
        assert flag.env, flag.key
        for name in flag.flags:
            if flag.status == "core":
                with pytest.raises(ConfigError):
                    parse_command_line([f"--{name}", "x"])
                continue
            value = "true" if flag.kind is bool else "auto"
            assert parse_command_line([f"--{name}={value}"]) == {flag.env[0]: value}
    assert "--nvidia-ctk-path" in help_text() and "DRIVER_ROOT_CTR_PATH" in help_text()


def test_help_runs_without_a_driver():
    out = subprocess.run(
        [sys.executable, "-m", "hetero_dp_nvidia.command", "--help"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{REPO}:{REPO / 'vendors/nvidia'}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--mig-strategy [MIG_STRATEGY]" in out.stdout


def test_run_refuses_flags_no_backend_takes():
    from click.testing import CliRunner

    from hetero_dp.cli import main as cli_main

    result = CliRunner().invoke(cli_main, ["run", "simulated", "--mig-strategy", "mixed"])
    assert result.exit_code == 2
    assert "unknown arguments --mig-strategy mixed (no backend takes flags)" in result.output
    result = CliRunner().invoke(cli_main, ["run", "--mig-strategy", "mixed"])
    assert result.exit_code == 2 and "name at least one backend" in result.output
