"""Privileges of everything we ship: seccomp RuntimeDefault on every container, and a
security scanner's findings over the rendered chart and the manifests, each one that
stays named in an allow-list with the reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from .objects import chart_renderings, run, seccomp_gaps, static_objects

#: checkov findings that stay, each with why, and where it may fire (a regex on
#: "<file> <resource>"; files are named after what was rendered: the chart with a values
#: case, deploy/..., the scaffold's DaemonSet). Anything else fails the scan, and so does
#: an entry no finding needs any more.
ALLOWED: dict[str, tuple[str, str]] = {
    "CKV_K8S_23": (
        "root: the plugin binds its socket in the kubelet's device-plugin dir (root-owned, "
        "0750 on most nodes) and writes CDI specs in /var/run/cdi; no capabilities, no "
        "privilege escalation, read-only root filesystem",
        ".",
    ),
    "CKV_K8S_40": ("the same root user (CKV_K8S_23)", "."),
    "CKV_K8S_43": (
        "images are tagged by release; a digest is the operator's pin (image.tag / the "
        "manifest's image accept one)",
        ".",
    ),
    "CKV_K8S_15": (
        "IfNotPresent on purpose: a node-critical plugin must start again after a reboot "
        "while the registry is unreachable",
        ".",
    ),
    "CKV_K8S_11": (
        "no CPU limit on purpose: throttling a device plugin delays Allocate and pod "
        "admission; requests are set where the footprint is known (udev, scaffold)",
        ".",
    ),
    "CKV_K8S_10": (
        "the NVIDIA chart leaves resources to the operator (values `resources`, as NVIDIA's "
        "chart: managed MPS daemons run in the same container and vary)",
        "hetero-dp-nvidia|nvidia-device-plugin",
    ),
    "CKV_K8S_12": ("as CKV_K8S_10", "hetero-dp-nvidia|nvidia-device-plugin"),
    "CKV_K8S_13": ("as CKV_K8S_10", "hetero-dp-nvidia|nvidia-device-plugin"),
    "CKV_K8S_19": (
        "host network for the udev DaemonSet only: hotplug uevents are netlink multicasts "
        "in the host's network namespace; it listens on the node's own IP only",
        "^deploy-udev-daemonset",
    ),
    "CKV2_K8S_6": (
        "node agents with one listener (/metrics and probes); which scrapers may reach it "
        "is the cluster's NetworkPolicy, not the plugin's",
        ".",
    ),
    "CKV_K8S_16": (
        "privileged only with compatWithCPUManager=true (NVIDIA's PASS_DEVICE_SPECS needs "
        "it, as in NVIDIA's chart)",
        "^hetero-dp-nvidia-with-privileged",
    ),
    "CKV_K8S_20": ("privileged implies escalation (CKV_K8S_16)", "-with-privileged"),
    "CKV_K8S_28": ("privileged implies every capability (CKV_K8S_16)", "-with-privileged"),
    "CKV_K8S_37": ("privileged implies every capability (CKV_K8S_16)", "-with-privileged"),
    "CKV_K8S_8": (
        "the config manager's sidecar (NVIDIA's has none either): a file copier; the "
        "plugin container beside it has both probes; and the clean-up DaemonSet's "
        "container, which only holds its pod Ready once the clean-up (its init "
        "container) has succeeded",
        "-with-config-manager|^deploy-cleanup",
    ),
    "CKV_K8S_9": ("as CKV_K8S_8", "-with-config-manager|^deploy-cleanup"),
}


def test_every_container_of_every_object_runs_under_seccomp_runtime_default(
    helm: str, tmp_path: Path
):
    """Init containers and hook Jobs included; the chart with every values file."""
    seen, gaps = 0, []
    for where, docs in [*chart_renderings(helm), *static_objects(tmp_path)]:
        for doc in docs:
            seen += 1
            gaps += [f"{where}: {gap}" for gap in seccomp_gaps(doc)]
    assert seen > 20, seen
    assert not gaps, "no seccomp RuntimeDefault:\n" + "\n".join(gaps)


def test_the_seccomp_check_sees_init_containers_and_overrides():
    pod = {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [{"name": "init"}],
        "containers": [
            {"name": "a", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        ],
    }
    job = {"kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": pod}}}
    assert seccomp_gaps(job) == ["Job/j container a"]
    del pod["securityContext"]
    assert seccomp_gaps(job) == ["Job/j container init", "Job/j container a"]
    assert seccomp_gaps({"kind": "ConfigMap", "metadata": {"name": "c"}}) == []


@pytest.mark.parametrize("kind", ["Pod", "CronJob"])
def test_the_seccomp_check_finds_pods_in_every_workload(kind):
    pod = {"containers": [{"name": "c"}]}
    spec = {
        "Pod": pod,
        "CronJob": {"jobTemplate": {"spec": {"template": {"spec": pod}}}},
    }[kind]
    assert seccomp_gaps({"kind": kind, "metadata": {"name": "x"}, "spec": spec})


def _scanned(tmp_path: Path, helm: str) -> Path:
    out = tmp_path / "scan"
    out.mkdir()
    renderings = [*chart_renderings(helm), *static_objects(tmp_path)]
    for where, docs in renderings:
        if where.startswith("docs/"):
            continue  # examples of use (a workload pod, a privileged DRA driver), not ours
        name = re.sub(r"[^A-Za-z0-9.]+", "-", where).strip("-").removesuffix(".yaml")
        (out / f"{name}.yaml").write_text(yaml.safe_dump_all(docs))
    return out


def test_security_scan_finds_only_what_the_allow_list_explains(
    helm: str, checkov: str, tmp_path: Path
):
    scanned = _scanned(tmp_path, helm)
    out = run(
        [
            checkov,
            "-d",
            str(scanned),
            "--framework",
            "kubernetes",
            "--quiet",
            "--compact",
            "--skip-download",
            "--output",
            "json",
        ],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BC_SKIP_MAPPING": "TRUE"},
    )
    assert out.returncode in (0, 1), out.stderr[-2000:]  # 1: there are findings
    reports = json.loads(out.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    findings = [
        (f["check_id"], f"{f['file_path'].lstrip('/')} {f['resource']}", f["check_name"])
        for r in reports
        for f in r["results"]["failed_checks"]
    ]
    passed = sum(r["summary"]["passed"] for r in reports)
    assert passed > 100, f"checkov checked almost nothing ({passed} passed)"
    unexplained = [
        f"{check} {where}: {name}"
        for check, where, name in findings
        if check not in ALLOWED or not re.search(ALLOWED[check][1], where)
    ]
    assert not unexplained, "security findings not in the allow-list:\n" + "\n".join(unexplained)
    stale = sorted(set(ALLOWED) - {check for check, _, _ in findings})
    assert not stale, f"allow-list entries no finding needs any more: {stale}"
