"""Monitoring that ships (#34.6): the alert rules (promtool checks and unit-tests them),
the Grafana dashboard (valid JSON, every expression parses and names a metric the code
exports), and the PodMonitors of the chart and of the udev DaemonSet (they select the
plugin's pods and reach the port the plugin listens on)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import DEPLOY, ROOT
from .objects import render_values, run

CHART = DEPLOY / "nvidia/helm/hetero-dp-nvidia"
RULES = CHART / "files/hetero-dp.rules.yaml"
DASHBOARD = CHART / "files/hetero-dp-dashboard.json"
RULES_TEST = Path(__file__).parent / "monitoring/rules_test.yaml"
UDEV = DEPLOY / "udev"
ALL_ON = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}
_NAME = re.compile(r"\b((?:hetero_dp|DCGM_FI)_[A-Za-z0-9_]+)")
_PREFIXED = re.compile(r"PREFIX \+ \"([a-z0-9_]+)\"")


def exported_metrics() -> set[str]:
    """Every metric name the code exports: literal names in hetero_dp/ and vendors/, and
    the framework's PREFIX + "..." names, with the suffixes prometheus_client adds
    (counters' _total, histograms' _bucket/_sum/_count)."""
    names = {"up"}
    for path in [*ROOT.glob("hetero_dp/**/*.py"), *ROOT.glob("vendors/*/*/**/*.py")]:
        text = path.read_text()
        names |= set(_NAME.findall(text))
        names |= {"hetero_dp_" + n for n in _PREFIXED.findall(text)}
    return {n + s for n in names for s in ("", "_total", "_bucket", "_sum", "_count")}


def used_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression (ours, DCGM's, and up)."""
    names = set(_NAME.findall(expr))
    if re.search(r"\bup\{", expr):
        names.add("up")
    return names


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def as_recording_rules(exprs: list[str], path: Path) -> Path:
    """Dashboard expressions as a rules file, so promtool parses every one (Grafana's
    variables replaced by what they stand for)."""
    subst = {"$__rate_interval": "5m", "$node": ".*", "$resource": ".*"}
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in subst.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard:panel_{i}", "expr": expr})
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


def promtool_check(promtool: str, path: Path) -> str:
    out = run([promtool, "check", "rules", str(path)])
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    return kinds


# --- the rules ---------------------------------------------------------------------


def test_rules_pass_promtool_check(promtool: str):
    assert f"SUCCESS: {len(rule_exprs())} rules found" in promtool_check(promtool, RULES)


def test_rules_unit_tests_fire_and_stay_silent_as_expected(promtool: str):
    out = run([promtool, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_unit_test_and_a_silent_neighbour():
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    firing = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case.get("exp_alerts")
    }
    assert firing == set(rule_exprs()), set(rule_exprs()) ^ firing
    # every test feeds more series than it expects alerts (a neighbour that must not fire)
    for t in tests:
        expected = max(len(c.get("exp_alerts") or []) for c in t["alert_rule_test"])
        assert len(t["input_series"]) > expected, t["name"]


def test_the_promtool_unit_tests_catch_a_wrong_threshold(promtool: str, tmp_path: Path):
    """The unit tests fail when a rule changes: 90 % made 99 %."""
    broken = tmp_path / "monitoring"
    broken.mkdir()
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.read_text().replace("> 0.9\n", "> 0.99\n"))
    assert rules.read_text() != RULES.read_text()
    spec = yaml.safe_load(RULES_TEST.read_text())
    spec["rule_files"] = [str(rules)]
    (broken / "t.yaml").write_text(yaml.safe_dump(spec))
    out = run([promtool, "test", "rules", "t.yaml"], cwd=broken)
    assert out.returncode != 0 and "HeteroDPSharedGPUMemoryHigh" in out.stdout + out.stderr


def test_rules_name_only_exported_metrics():
    exported = exported_metrics()
    unknown = {
        alert: sorted(used_metrics(expr) - exported)
        for alert, expr in rule_exprs().items()
        if used_metrics(expr) - exported
    }
    assert not unknown, unknown


# --- the dashboard -----------------------------------------------------------------


def test_dashboard_is_valid_json_with_panels_per_node_device_and_pod():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "node", "resource"} <= variables
    exprs = dashboard_exprs(dashboard)
    text = "\n".join(exprs)
    for what in ("node", "device", "pod"):
        assert f"{{{{{what}" in json.dumps(dashboard) or what in text, what
    used = set().union(*map(used_metrics, exprs))
    for series in (
        "hetero_dp_resource_ready",  # per node
        "hetero_dp_devices_healthy",  # health
        "hetero_dp_allocation_errors_total",
        "DCGM_FI_DEV_GPU_UTIL",  # per device
        "hetero_dp_device_allocation_info",  # holders
        "hetero_dp_container_memory_used_bytes",  # per pod
        "hetero_dp_container_utilization_ratio",
    ):
        assert series in used, series
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_dashboard_expressions_parse_and_name_exported_metrics(promtool: str, tmp_path: Path):
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    promtool_check(promtool, as_recording_rules(exprs, tmp_path / "dashboard.rules.yaml"))
    exported = exported_metrics()
    unknown = sorted({n for e in exprs for n in used_metrics(e)} - exported)
    assert not unknown, f"the dashboard names metrics nothing exports: {unknown}"


def test_the_metric_check_catches_a_misspelt_name(promtool: str, tmp_path: Path):
    assert "hetero_dp_devices_healthy" in exported_metrics()
    assert used_metrics('hetero_dp_devices_helthy{node=~"$node"}') - exported_metrics()
    bad = as_recording_rules(["sum(hetero_dp_devices"], tmp_path / "bad.yaml")
    assert run([promtool, "check", "rules", str(bad)]).returncode != 0


# --- the chart ---------------------------------------------------------------------


def test_chart_renders_no_monitoring_unless_asked(helm: str):
    kinds = by_kind(render_values(helm, CHART, {}))
    assert set(kinds) == {"DaemonSet", "Job"}, set(kinds)  # the Job: the clean-up hook


def test_chart_renders_pod_monitor_rules_and_dashboard(helm: str):
    kinds = by_kind(render_values(helm, CHART, ALL_ON))
    [ds], [monitor], [rule] = kinds["DaemonSet"], kinds["PodMonitor"], kinds["PrometheusRule"]
    [dashboard] = [c for c in kinds["ConfigMap"] if c["metadata"]["name"].endswith("dashboard")]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["hetero-dp.json"]) == json.loads(DASHBOARD.read_text())
    # the monitor selects the DaemonSet's pods, in its namespace, on a port they declare
    pod = ds["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [ds["metadata"]["namespace"]]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert endpoint["port"] in ports
    targets = {r.get("targetLabel") for r in endpoint["relabelings"]}
    assert {"node", "job"} <= targets


def test_chart_monitoring_labels_and_dashboard_namespace(helm: str):
    values = {
        "metrics": {
            "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}},
            "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kps"}},
            "dashboard": {"enabled": True, "namespace": "grafana"},
        }
    }
    kinds = by_kind(render_values(helm, CHART, values))
    assert kinds["PodMonitor"][0]["metadata"]["labels"]["release"] == "kps"
    assert kinds["PrometheusRule"][0]["metadata"]["labels"]["release"] == "kps"
    assert kinds["ConfigMap"][0]["metadata"]["namespace"] == "grafana"


# --- the udev DaemonSet's manifests ------------------------------------------------


def test_udev_monitoring_manifest_is_generated_from_the_chart_files():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen_monitoring.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    kinds = by_kind([d for d in yaml.safe_load_all((UDEV / "monitoring.yaml").read_text()) if d])
    assert kinds["PrometheusRule"][0]["spec"] == yaml.safe_load(RULES.read_text())


def test_udev_pod_monitor_reaches_the_host_network_pods():
    [ds] = [
        d
        for d in yaml.safe_load_all((UDEV / "daemonset.yaml").read_text())
        if d and d["kind"] == "DaemonSet"
    ]
    kinds = by_kind([d for d in yaml.safe_load_all((UDEV / "monitoring.yaml").read_text()) if d])
    [monitor] = kinds["PodMonitor"]
    pod = ds["spec"]["template"]
    assert pod["spec"]["hostNetwork"] is True
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [ds["metadata"]["namespace"]]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    # no container port is declared (surge in the host network), so the address is made
    # from the pod IP and the port the plugin binds
    assert "port" not in endpoint
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    port = env["HETERO_DP_METRICS_ADDRESS"].rsplit(":", 1)[1]
    addresses = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "__address__"]
    assert {r["replacement"] for r in addresses} == {f"$1:{port}", f"[$1]:{port}"}
    for r in addresses:  # IPv4 and IPv6 pod IPs each get exactly one address
        assert re.fullmatch(r["regex"], "10.0.0.7") or re.fullmatch(r["regex"], "fd00::7")
    assert not all(re.fullmatch(r["regex"], "fd00::7") for r in addresses)


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["default", "all-on"])
def test_rendered_rules_pass_promtool(helm: str, promtool: str, tmp_path: Path, values):
    docs = render_values(helm, CHART, values or {})
    for i, rule in enumerate(d for d in docs if d["kind"] == "PrometheusRule"):
        path = tmp_path / f"rule{i}.yaml"
        path.write_text(yaml.safe_dump(rule["spec"]))
        promtool_check(promtool, path)
