"""``hostRoot``: the plugin sees the host's /dev somewhere else (a pod that mounts it at
/host/dev), looks for nodes there, and still names the host's paths, which is what the
kubelet and a CDI runtime open on the host.

The testbed's own /dev nodes stay in place throughout: a check that looked at libudev's
paths (umockdev's /dev) would call every device healthy, so each verdict here comes from
the directory standing in for the host's /dev. The backend only asks whether a node
exists (health.py), so plain files stand in for the nodes (no mknod: these tests run
unprivileged too); tests/deployment/test_udev_cdi.py uses real nodes under podman.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.backend import options
from hetero_dp_udev.testing import Testbed

from hetero_dp import ConfigError

pytestmark = pytest.mark.umockdev

# the amd-gpu tree's nodes (tests/udev/data/amd-gpu.umockdev)
NODES = ["dev/dri/card1", "dev/dri/card2", "dev/dri/renderD128", "dev/dri/renderD129", "dev/kfd"]


def host_dev(root: Path) -> Path:
    for node in NODES:
        (root / node).parent.mkdir(parents=True, exist_ok=True)
        (root / node).touch()
    return root


def backend_for(testbed: Testbed, data: Path, host_root: str) -> UdevBackend:
    testbed.add_file(data / "amd-gpu.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["amd-gpu"], "hostRoot": host_root}))
    return backend


def test_nodes_are_looked_for_under_host_root_and_named_by_their_host_paths(
    testbed: Testbed, data: Path, tmp_path: Path
) -> None:
    host = host_dev(tmp_path / "host")
    backend = backend_for(testbed, data, str(host))
    first, second = backend.discover()
    assert all(d.healthy for d in (first, second)), [d.reason for d in (first, second)]
    # the kubelet and the runtime get the host's paths, never the plugin's view of them
    assert [n.host_path for n in first.nodes] == [
        "/dev/dri/card2",
        "/dev/dri/renderD129",
        "/dev/kfd",
    ]

    (host / "dev/dri/renderD129").unlink()
    assert os.path.exists("/dev/dri/renderD129")  # the testbed's node (libudev's view) stays
    seen = host / "dev/dri/renderD129"
    assert (
        backend.check_health(first)
        == f"device node /dev/dri/renderD129 (looked for at {seen}) is gone"
    )
    assert backend.check_health(second) is True

    (host / "dev/kfd").unlink()
    devices = backend.discover()
    assert [d.healthy for d in devices] == [False, False]
    assert all(
        f"shared node /dev/kfd (looked for at {host}/dev/kfd) is missing" in d.reason
        for d in devices
    )


def test_an_empty_host_root_leaves_every_device_unhealthy(
    testbed: Testbed, data: Path, tmp_path: Path
) -> None:
    """The host's /dev not mounted where hostRoot says: nothing is advertised healthy."""
    (tmp_path / "host").mkdir()
    devices = backend_for(testbed, data, str(tmp_path / "host")).discover()
    assert [d.healthy for d in devices] == [False, False]
    assert "device node /dev/dri/card2 (looked for at" in devices[0].reason


@pytest.mark.parametrize("value", ["/", ""])
def test_the_default_host_root_is_the_plugins_own_root(
    testbed: Testbed, data: Path, value: str
) -> None:
    devices = backend_for(testbed, data, value).discover()
    assert [d.healthy for d in devices] == [True, True]


def test_a_relative_host_root_stops_start_up_naming_the_field(testbed: Testbed, data: Path) -> None:
    with pytest.raises(ConfigError, match=r"hostRoot.*absolute path.*'host'"):
        backend_for(testbed, data, "host")


def test_doctor_looks_under_host_root_and_says_where_to_mount(
    testbed: Testbed, data: Path, tmp_path: Path
) -> None:
    host = host_dev(tmp_path / "host")
    (host / "dev/kfd").unlink()
    testbed.add_file(data / "amd-gpu.umockdev")
    checks = {
        c.name: c
        for c in UdevBackend().doctor(options({"rules": ["amd-gpu"], "hostRoot": str(host)}))
    }
    nodes = checks["amd.com/gpu nodes"]
    assert (nodes.status, nodes.message) == ("fail", "missing nodes: /dev/kfd")
    assert nodes.fix.endswith(f"at {host}/dev (hostRoot)")
