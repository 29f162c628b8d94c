"""The udev backend's CDI spec consumed by a real runtime (podman).

The spec names a node by its host path (``/dev/fuse``), and the runtime opens that path
on the host, so the device must be one this host really has: a umockdev testbed's nodes
exist only inside the testbed (its preload redirects this process's /dev, not the
runtime's), which is why this test reads the host's own sysfs through real libudev, as
the DaemonSet does, instead of a testbed.

The device is FUSE's: the kernel registers it as the misc device ``fuse``, char 10:229,
``/dev/fuse`` (fs/fuse/dev.c, ``fuse_miscdevice`` with ``FUSE_MINOR``;
Documentation/admin-guide/devices.txt, major 10 minor 229), so sysfs holds
``/sys/devices/virtual/misc/fuse`` on any host with FUSE. Handing /dev/fuse to
unprivileged pods is a common job of generic device plugins (squat's
generic-device-plugin and smarter-device-manager both show it).

The plugin sees the host's /dev where ``hostRoot`` says (a pod mounting it at
/host/dev): a temp dir stands in for it, holding a character node made with mknod with
the generic numbers 1:3 (those of /dev/null). The container must get 10:229, the host's
node, which shows that the spec and Allocate name the host's path, not the plugin's
view of it, while the plugin judged the device present from the stand-in.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from . import test_cdi_runtime
from .test_cdi_runtime import allocated_spec, claim_spec, dra_node, mknod, sees

runtime_cdi = test_cdi_runtime.runtime_cdi  # the fixture: podman with a private /etc/cdi

FUSE_SYSFS = Path("/sys/devices/virtual/misc/fuse")
RESOURCE = "example.com/fuse"

RULES = """\
resources:
  - name: example.com/fuse
    match:
      subsystem: misc
      sysname: fuse
    id: node
    permissions: rw
    env: {{FUSE_DEVICE: "{{node}}", FUSE_KIND: misc}}
    mounts:
      - hostPath: {tools}
        containerPath: /opt/fuse-tools
"""

SCRIPT = (
    'stat -c "%F %t:%T" /dev/fuse; : < /dev/fuse && echo opened; '
    'echo "device=$FUSE_DEVICE kind=$FUSE_KIND"; cat /opt/fuse-tools/README'
)


def host_fuse() -> None:
    """Skip where this host has no FUSE device (the runtime could not give one)."""
    try:
        mode = os.stat("/dev/fuse").st_mode
    except OSError:
        mode = 0
    if not (FUSE_SYSFS.is_dir() and stat.S_ISCHR(mode)):
        pytest.skip("this host has no FUSE misc device (/sys/devices/virtual/misc/fuse, /dev/fuse)")


def fuse_node(tmp: Path) -> dict[str, dict[str, str]]:
    """The plugin's side of the node: the stand-in for the host's /dev (hostRoot), the
    mount's host dir and the rules file: the udev backend's options."""
    host_fuse()
    seen = tmp / "host"  # the host's / as the plugin sees it (hostRoot)
    mknod(seen / "dev/fuse", 1, 3)
    tools = tmp / "fuse-tools"
    tools.mkdir()
    (tools / "README").write_text("fuse tools 1.0\n")
    rules = tmp / "rules.yaml"
    rules.write_text(RULES.format(tools=tools))
    return {"udev": {"rules": str(rules), "hostRoot": str(seen)}}


FUSE_SEES = ["character special file a:e5", "opened", "device=fuse kind=misc", "fuse tools 1.0"]


def baseline(engine) -> subprocess.CompletedProcess[str]:
    """A container started without the CDI device: podman gives no /dev/fuse by default,
    so the node seen below comes from the spec."""
    import build_images

    return subprocess.run(
        [*engine.cmd("run", "--rm"), *engine.run_flags, "--network", "none", "--pull",
         "never", build_images.base_image(engine), "sh", "-c", "test -e /dev/fuse"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


async def test_the_udev_backends_spec_gives_the_container_the_hosts_node_env_and_mount(
    engine, fake_kubelet, plugin_runner, tmp_path: Path, runtime_cdi
):
    from hetero_dp_udev import UdevBackend

    spec, name = await allocated_spec(
        fake_kubelet, plugin_runner, UdevBackend(), RESOURCE, "fuse", 1,
        options=fuse_node(tmp_path),
    )  # fmt: skip
    devices = await fake_kubelet.wait_devices(RESOURCE, lambda d: len(d) == 1)
    assert devices["fuse"].health == "Healthy"
    [device] = json.loads(spec.read_text())["devices"]
    assert [
        (n["path"], n.get("hostPath", n["path"])) for n in device["containerEdits"]["deviceNodes"]
    ] == [("/dev/fuse", "/dev/fuse")]
    assert baseline(engine).returncode == 1
    sees(runtime_cdi(spec, name, SCRIPT), FUSE_SEES)


async def test_the_udev_backends_dra_claim_spec_gives_the_container_the_hosts_node_env_and_mount(
    tmp_path: Path, runtime_cdi
):
    """DRA mode: the claim's spec NodePrepareResources writes for the FUSE device."""
    from hetero_dp_udev import UdevBackend

    options = fuse_node(tmp_path)
    async with dra_node() as (runner, kubelet):
        await runner.start(UdevBackend(), options=options)
        spec, name = await claim_spec(
            runner, kubelet, "fuse.example.com", "fuse", tmp_path / "spec"
        )
    sees(runtime_cdi(spec, name, SCRIPT), FUSE_SEES)
