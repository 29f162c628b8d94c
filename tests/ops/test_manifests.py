"""Every DaemonSet we ship (NVIDIA, udev, the `hetero-dp new` template) wires the
operations side the same way: the HTTP probes ask the port the daemon serves on (from
HETERO_DP_METRICS_ADDRESS), and the label dir (HETERO_DP_LABELS_DIR) is a writable hostPath
mount of the same path on the host."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hetero_dp.cli import scaffold
from hetero_dp.ops.probes import parse_address

ROOT = Path(__file__).resolve().parents[2]
NFD_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def _template_daemonset(tmp: Path) -> Path:
    values = {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/acme*"}
    project, _ = scaffold.generate(values, tmp / "proj")
    return project / "deploy" / "daemonset.yaml"


@pytest.mark.parametrize("which", ["nvidia", "udev", "template"])
def test_probes_port_and_label_dir_agree(which, tmp_path):
    path = {
        "nvidia": ROOT / "deploy/nvidia/nvidia-device-plugin.yml",
        "udev": ROOT / "deploy/udev/daemonset.yaml",
    }.get(which) or _template_daemonset(tmp_path)
    ds = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}

    host, port = parse_address(env["HETERO_DP_METRICS_ADDRESS"])
    if pod.get("hostNetwork"):
        # In the host network "all interfaces" are the node's: bind the node's own IP
        # (downward API), which is also the pod IP the kubelet probes.
        assert host == "$(NODE_IP)", "in the host network, listen on the node's IP only"
        [node_ip] = [e for e in c["env"] if e["name"] == "NODE_IP"]
        assert node_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
        assert c["env"].index(node_ip) < list(env).index("HETERO_DP_METRICS_ADDRESS")
    else:
        assert host is None, "the kubelet probes the pod's IP: listen on all interfaces"
    # in the host network a declared port is a host port, which would keep a surge
    # rollout's new pod off the node: no ports there, and readiness is the pod's own
    # ready file (tests/deploy/test_nvidia_values.py checks it), not /readyz
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    probes = (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"))
    if pod.get("hostNetwork"):
        assert not ports
        probes = probes[:1]
        assert "exec" in c["readinessProbe"]
    else:
        assert ports["metrics"] == port
    for probe, target in probes:
        get = c[probe]["httpGet"]
        assert get["path"] == target
        assert ports.get(get["port"], get["port"]) == port

    labels_dir = env["HETERO_DP_LABELS_DIR"]
    assert labels_dir == NFD_DIR
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == labels_dir]
    assert not mount.get("readOnly", False)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["hostPath"] == {"path": NFD_DIR, "type": "DirectoryOrCreate"}
