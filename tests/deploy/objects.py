"""Every Kubernetes object we ship or show, for the checks that look at all of them.

The chart rendered with its default values, with each values file shipped beside it and
with :data:`EXTRA_VALUES` (what the shipped files leave off: the config manager's init
container, monitoring, the clean-up hook); every static manifest under deploy/; the
DaemonSet ``hetero-dp new`` writes; the docs' ``<!-- run: k8s -->`` blocks.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from hetero_dp.cli import scaffold
from tests.kit.test_doc_blocks import PAGES, blocks

from .conftest import ROOT
from .test_manifests import CASES, MANIFESTS, render

#: Values that switch on what no shipped values file does (each rendered on its own).
EXTRA_VALUES: dict[str, dict[str, Any]] = {
    "config-manager": {"config": {"map": {"a": "version: v1\n", "b": "version: v1\n"}}},
    "privileged": {"compatWithCPUManager": True},
}

POD_KINDS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"}


def render_values(helm: str, chart: Path, values: dict[str, Any]) -> list[dict]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        return render(helm, chart, Path(f.name))


def chart_renderings(helm: str) -> Iterator[tuple[str, list[dict]]]:
    for case in CASES:
        chart, values = case.values
        yield (
            f"{chart.name} with {values.name if values else 'default values'}",
            render(helm, chart, values),
        )
        if values is None:
            for name, extra in EXTRA_VALUES.items():
                yield f"{chart.name} with {name}", render_values(helm, chart, extra)


def static_objects(tmp: Path) -> Iterator[tuple[str, list[dict]]]:
    for manifest in MANIFESTS:
        docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
        yield str(manifest.relative_to(ROOT)), docs
    values = {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/acme*"}
    project, _ = scaffold.generate(values, tmp / "proj")
    text = (project / "deploy/daemonset.yaml").read_text()
    yield "hetero-dp new's deploy/daemonset.yaml", [d for d in yaml.safe_load_all(text) if d]
    for page in PAGES:
        for block in blocks(page):
            if block.marker == "k8s":
                yield block.where, [d for d in yaml.safe_load_all(block.text) if d]


def pod_spec(doc: dict) -> dict | None:
    """The pod template's spec of a workload object (a Pod's own spec), else None."""
    kind = doc.get("kind")
    if kind == "Pod":
        return doc["spec"]
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if kind in POD_KINDS:
        return doc["spec"]["template"]["spec"]
    return None


def seccomp_gaps(doc: dict) -> list[str]:
    """Containers (init containers too) of ``doc`` whose seccomp profile is not
    RuntimeDefault: neither their own nor, without one of their own, the pod's."""
    pod = pod_spec(doc)
    if pod is None:
        return []
    pod_profile = ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    gaps = []
    for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
        own = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if (own or pod_profile) != "RuntimeDefault":
            gaps.append(f"{doc['kind']}/{doc['metadata'].get('name')} container {c['name']}")
    return gaps


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
