"""Every chart and manifest we ship, checked as a cluster would take them.

- Each Helm chart under deploy/ passes ``helm lint --strict`` and renders with a real
  ``helm template``, with its default values and with each values file shipped beside
  it (any ``values*.yaml`` or ``*-values.yaml`` under the backend's deploy/<backend>/
  folder, outside the chart's templates/, and any file under that folder that the docs
  pass to helm with ``-f``/``--values``).
- Every rendering, every static manifest under deploy/ and the DaemonSet that
  ``hetero-dp new`` writes validate strictly (``kubernetes-validate``) against every
  Kubernetes minor from 1.30 to the newest the installed kubernetes-validate bundles.
- Every DaemonSet in them can start and listens only where it should: the host's /dev
  is not mounted over /dev while the termination log is there (the runtime cannot
  create /dev/termination-log; docs/sources.md#termination-log), and a pod in the host
  network does not serve on every interface of the node.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from hetero_dp.cli import scaffold
from hetero_dp.ops.probes import parse_address

from .conftest import DEPLOY, ROOT

OLDEST = (1, 30)
MINORS = sorted(
    {
        f"{major}.{minor}"
        for major, minor in {tuple(map(int, v.split(".")[:2])) for v in all_versions()}
        if (major, minor) >= OLDEST
    },
    key=lambda v: tuple(map(int, v.split("."))),
)
CHARTS = sorted(p.parent for p in DEPLOY.glob("**/Chart.yaml"))


def _in_chart(path: Path) -> bool:
    return any(path.is_relative_to(chart) for chart in CHARTS)


def _is_values(path: Path) -> bool:
    return path.name.startswith("values") or path.name.endswith("-values.yaml")


# `helm ... -f FILE` / `--values FILE` in the docs: the values files we tell users to use
_DOCUMENTED = re.compile(r"(?:\s-f|--values)[ =]+(deploy/[\w./-]+\.ya?ml)")


def documented_values(texts: list[str] | None = None) -> set[Path]:
    if texts is None:
        pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        texts = [p.read_text() for p in [*pages, *sorted(DEPLOY.glob("**/*.md"))]]
    # only helm's -f (kubectl's -f names manifests, not values)
    commands = [ln for text in texts for ln in text.replace("\\\n", " ").splitlines()]
    lines = [ln for ln in commands if "helm " in ln]
    return {ROOT / m for ln in lines for m in _DOCUMENTED.findall(ln)}


def values_files(chart: Path) -> list[Path]:
    """The values files shipped for ``chart``: beside it in its deploy/<backend>/ folder,
    and any under deploy/<backend>/ that the docs pass to helm."""
    backend = DEPLOY / chart.relative_to(DEPLOY).parts[0]
    found = {
        p
        for p in backend.glob("**/*.yaml")
        if _is_values(p) and p != chart / "values.yaml" and "templates" not in p.parts
    }
    found |= {p for p in documented_values() if p.is_relative_to(backend) and p.is_file()}
    return sorted(found)


CASES = [
    pytest.param(chart, values, id=f"{chart.name}:{values.name if values else 'default'}")
    for chart in CHARTS
    for values in [None, *values_files(chart)]
]
MANIFESTS = sorted(
    p
    for p in [*DEPLOY.glob("**/*.yaml"), *DEPLOY.glob("**/*.yml")]
    if not _in_chart(p) and not _is_values(p)
)


def helm_args(chart: Path, values: Path | None) -> list[str]:
    return [str(chart), *(["--values", str(values)] if values else [])]


def render(helm: str, chart: Path, values: Path | None) -> list[dict]:
    out = subprocess.run(
        [helm, "template", "hetero-dp", "--namespace", "kube-system", *helm_args(chart, values)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert docs, "helm template rendered nothing"
    return docs


#: Custom resources kubernetes-validate has no schema for: the Prometheus Operator's
#: (tests/deploy/test_monitoring.py checks them: promtool, the selectors, the ports).
CUSTOM_GROUPS = ("monitoring.coreos.com/",)


def validate_everywhere(docs: list[dict], where: str) -> None:
    problems = []
    for doc in docs:
        if str(doc.get("apiVersion", "")).startswith(CUSTOM_GROUPS):
            continue
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        for version in MINORS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{where} {name} on Kubernetes {version}: {e.message}")
    assert not problems, "\n".join(problems)


def check_pods_start(docs: list[dict], where: str) -> None:
    for doc in docs:
        if doc.get("kind") != "DaemonSet":
            continue
        pod = doc["spec"]["template"]["spec"]
        host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        for c in pod["containers"]:
            mounts_dev = any(
                host_paths.get(m["name"]) == "/dev" and m["mountPath"].rstrip("/") == "/dev"
                for m in c.get("volumeMounts", [])
            )
            log = c.get("terminationMessagePath", "/dev/termination-log")
            assert not (mounts_dev and log.startswith("/dev/")), (
                f"{where}: container {c['name']} mounts the host's /dev over /dev and keeps "
                f"its termination log at {log}: the runtime cannot create it"
            )
            env = {e["name"]: e for e in c.get("env", [])}
            if pod.get("hostNetwork") and "HETERO_DP_METRICS_ADDRESS" in env:
                host, _ = parse_address(env["HETERO_DP_METRICS_ADDRESS"]["value"])
                assert host not in (None, "0.0.0.0", "::"), (
                    f"{where}: in the host network, /metrics would listen on every "
                    "interface of the node; bind the node's IP (downward API status.hostIP)"
                )


def test_kubernetes_minors_from_1_30_to_the_newest_bundled():
    assert MINORS[0] == "1.30" and len(MINORS) >= 2, MINORS


def test_documented_values_are_helms_not_kubectls_manifests():
    text = "helm install x c \\\n  -f deploy/nvidia/v.yaml\n"
    text += "kubectl apply -f deploy/udev/daemonset.yaml\n"
    assert documented_values([text]) == {ROOT / "deploy/nvidia/v.yaml"}


def test_every_documented_values_file_exists():
    missing = sorted(str(p.relative_to(ROOT)) for p in documented_values() if not p.is_file())
    assert not missing, f"the docs pass helm values files that do not exist: {missing}"


def test_every_chart_is_checked():
    assert CHARTS, "no Helm chart found under deploy/"
    assert MANIFESTS, "no manifest found under deploy/"


@pytest.mark.parametrize(("chart", "values"), CASES)
def test_chart_lints_strictly(helm: str, chart: Path, values: Path | None):
    out = subprocess.run(
        [helm, "lint", "--strict", *helm_args(chart, values)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(("chart", "values"), CASES)
def test_chart_renders_valid_manifests_that_start(helm: str, chart: Path, values: Path | None):
    docs = render(helm, chart, values)
    where = f"{chart.relative_to(ROOT)} with {values.name if values else 'default values'}"
    validate_everywhere(docs, where)
    check_pods_start(docs, where)


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_is_valid_and_starts(manifest: Path):
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    where = str(manifest.relative_to(ROOT))
    validate_everywhere(docs, where)
    check_pods_start(docs, where)


def test_scaffold_daemonset_is_valid_and_starts(tmp_path: Path):
    values = {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/acme*"}
    project, _ = scaffold.generate(values, tmp_path / "proj")
    docs = [d for d in yaml.safe_load_all((project / "deploy/daemonset.yaml").read_text()) if d]
    validate_everywhere(docs, "hetero-dp new's deploy/daemonset.yaml")
    check_pods_start(docs, "hetero-dp new's deploy/daemonset.yaml")


def test_the_start_check_catches_the_dev_mount():
    """The check above fails on the mistake it is there for."""
    pod = {
        "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
        "containers": [{"name": "c", "volumeMounts": [{"name": "dev", "mountPath": "/dev"}]}],
    }
    with pytest.raises(AssertionError, match="termination log"):
        check_pods_start([{"kind": "DaemonSet", "spec": {"template": {"spec": pod}}}], "x")
    pod["hostNetwork"] = True
    pod["containers"][0].update(
        terminationMessagePath="/run/log",
        env=[{"name": "HETERO_DP_METRICS_ADDRESS", "value": ":9435"}],
    )
    with pytest.raises(AssertionError, match="every interface"):
        check_pods_start([{"kind": "DaemonSet", "spec": {"template": {"spec": pod}}}], "x")
