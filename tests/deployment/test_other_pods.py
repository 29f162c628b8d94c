"""The udev DaemonSet and the scaffold's DaemonSet (``hetero-dp new``), started as
rendered under a real container runtime, with their own images.

The scaffold's plugin finds ``/dev/acme*`` under the host's /dev (mounted read-only at
/host/dev): a temp dir with two such files stands in for it. The udev backend reads the
host's sysfs and udev database through libudev: it gets this machine's own /sys and
/dev (read-only, as the DaemonSet mounts them: /dev at /host/dev, judged there through
``hostRoot: /host``) and a ConfigMap as shipped, so it
serves whatever accelerators the rules find here (usually none): the test checks it
starts under its securityContext, answers its probes and stops cleanly.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from hetero_dp.cli import scaffold

from .conftest import ROOT, KubeletThread, wait_http
from .podkit import Node, Pod
from .test_nvidia_pods import check_serves_and_stops, start_pod

SCAFFOLD = {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/acme*"}


def manifests(text: str) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    docs = [d for d in yaml.safe_load_all(text) if d]
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    return ds["spec"]["template"], maps


def scaffold_node(kubelet: KubeletThread, workdir: Path) -> tuple[dict[str, Any], Node, str]:
    """(the scaffold DaemonSet's pod template, a node whose /dev holds acme0 and acme1,
    the image the template names)."""
    project, _ = scaffold.generate(SCAFFOLD, workdir / "acme")
    template, _ = manifests((project / "deploy/daemonset.yaml").read_text())
    dev = workdir / "host-dev"
    dev.mkdir()
    for name in ("acme0", "acme1"):
        (dev / name).touch()
    node = Node(host_paths={"/var/lib/kubelet/device-plugins": kubelet.plugin_dir, "/dev": dev})
    return template, node, template["spec"]["containers"][0]["image"]


def test_scaffold_pod_serves_the_kubelet_and_stops_cleanly(
    image,
    kubelet: KubeletThread,
    engine,
    workdir: Path,
    pods,
):
    tag = image("scaffold")
    template, node, rendered = scaffold_node(kubelet, workdir)
    pod = start_pod(engine, template, node, workdir, pods, images={rendered: tag})
    r = check_serves_and_stops(pod, kubelet, 9435, "acme.example.com/npu", 2)
    assert [d.host_path for d in r.devices] == ["/dev/acme0"]


def test_udev_pod_starts_answers_its_probes_and_stops_cleanly(
    image,
    kubelet: KubeletThread,
    engine,
    workdir: Path,
    pods,
):
    tag = image("udev")
    template, maps = manifests((ROOT / "deploy/udev/daemonset.yaml").read_text())
    node = Node(
        host_paths={
            "/var/lib/kubelet/device-plugins": kubelet.plugin_dir,
            "/sys": Path("/sys"),
            "/dev": Path("/dev"),
        }
    )
    pod = Pod(engine, template, node, workdir, configmaps=maps, images={tag: tag})
    pods.append(pod)
    pod.start()
    name = template["spec"]["containers"][0]["name"]
    try:
        wait_http("http://127.0.0.1:9435/healthz")
        # the readiness probe as the kubelet runs it: its exec command in the container
        # (the ready file on the pod's emptyDir; no devices here is ready too)
        probe = template["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
        out = exec_until_ok(pod, name, probe)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.strip(), "the ready file holds /readyz's lines"
    except BaseException:
        print(pod.logs(name))
        raise
    took, code = pod.stop(name)
    assert code == 0 and took < pod.grace, (took, code, pod.logs(name))
    assert kubelet.plugin_sockets() == []


def exec_until_ok(
    pod: Pod, container: str, command: list[str], timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in the container as an exec probe does, every 0.5 s (the probe's
    own period is 2 s) until it succeeds or ``timeout`` passes; the last result."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            pod.engine.cmd("exec", pod.container_name(container), *command),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode == 0 or time.monotonic() > deadline:
            return out
        time.sleep(0.5)  # the probe period (shortened), not a synchronisation
