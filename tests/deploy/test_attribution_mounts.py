"""Every DaemonSet we ship (the NVIDIA chart, the static manifests, the scaffold's) gives
the plugin what attribution reads (docs/operations.md, "Attribution"): the kubelet's
pod-resources dir at its own path, where the default socket path points, the host's
/proc, with HETERO_DP_PROC_ROOT naming where it is mounted, and the kubelet's container
log links (/var/log/containers) at their own path, all read-only."""

from __future__ import annotations

from pathlib import Path

import yaml

from hetero_dp.cli import scaffold
from hetero_dp.engine.config import load_config

from .conftest import DEPLOY
from .objects import render_values

POD_RESOURCES = "/var/lib/kubelet/pod-resources"
LOGS = "/var/log/containers"


def daemonsets(helm: str, tmp: Path) -> dict[str, dict]:
    out = {
        "chart": render_values(helm, DEPLOY / "nvidia/helm/hetero-dp-nvidia", {}),
        "nvidia": list(
            yaml.safe_load_all((DEPLOY / "nvidia/nvidia-device-plugin.yml").read_text())
        ),
        "udev": list(yaml.safe_load_all((DEPLOY / "udev/daemonset.yaml").read_text())),
    }
    values = {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/acme*"}
    project, _ = scaffold.generate(values, tmp / "proj")
    out["scaffold"] = list(yaml.safe_load_all((project / "deploy/daemonset.yaml").read_text()))
    return {k: next(d for d in docs if d and d["kind"] == "DaemonSet") for k, docs in out.items()}


def test_every_daemonset_mounts_pod_resources_and_the_hosts_proc_read_only(
    helm: str, tmp_path: Path
):
    for name, ds in daemonsets(helm, tmp_path).items():
        pod = ds["spec"]["template"]["spec"]
        host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        c = pod["containers"][0]
        mounts = {host[m["name"]]: m for m in c["volumeMounts"] if m["name"] in host}
        assert mounts[POD_RESOURCES]["mountPath"] == POD_RESOURCES, name
        assert mounts[POD_RESOURCES].get("readOnly") is True, name
        assert mounts["/proc"].get("readOnly") is True, name
        # the kubelet's log links at their own path, where the default points
        assert mounts[LOGS]["mountPath"] == LOGS, name
        assert mounts[LOGS].get("readOnly") is True, name
        proc_at = mounts["/proc"]["mountPath"]
        assert proc_at != "/proc", f"{name}: the host's /proc over the container's own"
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        # the daemon reads what the manifest sets: procRoot where /proc is mounted, and
        # its default socket in the mounted dir
        cfg = load_config(raw={}, env=env)
        assert cfg.attribution.proc_root == proc_at, name
        assert str(Path(cfg.attribution.pod_resources_socket).parent) == POD_RESOURCES, name
        assert cfg.attribution.container_logs_dir == LOGS, name
        assert not pod.get("hostPID"), f"{name}: reading /proc/<pid>/cgroup needs no hostPID"
