"""``sharing.mps``: NVIDIA's MPS block parsed by the core (replicas, renaming,
the strategy), MIG refused. What makes it MPS at run time is the NVIDIA
backend's (tests/nvidia/test_mps*.py)."""

from __future__ import annotations

import pytest
import yaml

from hetero_dp import AllocationError, ConfigError, Device
from hetero_dp.allocation.sharing import MPS, TIME_SLICING, advertise, parse_sharing
from hetero_dp.engine.config import load_config

GPU = "nvidia.com/gpu"

# The example of NVIDIA's README ("With CUDA MPS"), in shape.
NVIDIA_MPS_CONFIG = """
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def gpus(n: int) -> list[Device]:
    return [Device(f"GPU-{i}", GPU, index=i) for i in range(n)]


def test_nvidia_mps_config_is_accepted_unchanged() -> None:
    config = parse_sharing(yaml.safe_load(NVIDIA_MPS_CONFIG)["sharing"], "mps.yaml")
    assert config.strategy == MPS and config.block == "sharing.mps"
    (entry,) = config.resources
    assert (entry.name, entry.replicas, entry.field) == (GPU, 10, "sharing.mps.resources[0]")
    # NVIDIA keeps "the historical MPS behavior": one replica per request.
    assert config.fail_requests_greater_than_one
    ids = [d.id for d in advertise(gpus(2), config)]
    assert ids[:2] == ["GPU-0::0", "GPU-0::1"] and len(ids) == 20


def test_mps_renames_and_selects_like_time_slicing() -> None:
    block = {
        "renameByDefault": True,
        "failRequestsGreaterThanOne": False,
        "resources": [{"name": "gpu", "replicas": 4, "devices": [1]}],
    }
    config = parse_sharing({"mps": block})
    assert not config.fail_requests_greater_than_one
    out = advertise(gpus(2), config)
    assert [(d.id, d.resource) for d in out] == [("GPU-0", GPU)] + [
        (f"GPU-1::{n}", "nvidia.com/gpu.shared") for n in range(4)
    ]


def test_time_slicing_keeps_its_strategy_and_default() -> None:
    config = parse_sharing({"timeSlicing": {"resources": [{"name": GPU, "replicas": 2}]}})
    assert config.strategy == TIME_SLICING and not config.fail_requests_greater_than_one


def test_mps_refuses_two_replicas_in_one_request_by_default() -> None:
    config = parse_sharing({"mps": {"resources": [{"name": GPU, "replicas": 2}]}})
    with pytest.raises(AllocationError, match=r"sharing\.mps\.failRequestsGreaterThanOne"):
        config.check_request(GPU, ["GPU-0::0", "GPU-0::1"])
    config.check_request(GPU, ["GPU-0::1"])


def test_mps_refuses_mig_devices_naming_the_entry() -> None:
    mig = [Device("MIG-1", "nvidia.com/mig-1g.10gb", parent="GPU-0", index=0)]
    config = parse_sharing({"mps": {"resources": [{"name": "mig-1g.10gb", "replicas": 2}]}}, "c")
    with pytest.raises(ConfigError) as err:
        config.validate_devices(mig)
    assert err.value.field == "sharing.mps.resources[0].name"
    assert "MPS sharing is not supported for MIG devices" in str(err.value)
    # Time-slicing MIG devices stays allowed.
    ts = parse_sharing({"timeSlicing": {"resources": [{"name": "mig-1g.10gb", "replicas": 2}]}})
    ts.validate_devices(mig)


def test_config_file_hands_the_sharing_block_to_the_nvidia_backend(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(NVIDIA_MPS_CONFIG)
    cfg = load_config(path, env={})
    assert cfg.sharing.strategy == MPS
    assert cfg.backend_options("nvidia")["sharing"]["mps"]["resources"][0]["replicas"] == 10
