"""The example DaemonSet: valid for Kubernetes 1.32 (offline schemas), and its
embedded config and rules load with the backend's own loader."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hetero_dp_udev.rules import parse_rules, shipped_rule_sets

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "udev" / "daemonset.yaml"


def test_manifest_validates_strictly_against_kubernetes_1_32() -> None:
    tool = shutil.which("kubernetes-validate")
    if tool is None:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    proc = subprocess.run(
        [tool, "-k", "1.32", "--strict", str(MANIFEST)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "daemonset/hetero-dp-udev" in proc.stdout + proc.stderr


def test_embedded_config_and_rules_load() -> None:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    rules = config["backends"]["udev"]["rules"]
    mount = next(
        m["mountPath"]
        for m in daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        if m["name"] == "config"
    )
    for item in rules:
        if "/" in item:  # a file from the ConfigMap, mounted at the config path
            assert item.startswith(mount + "/")
            name = item[len(mount) + 1 :]
            assert parse_rules(config_map["data"][name], source=name)
        else:
            assert item in shipped_rule_sets()
    assert daemonset["spec"]["template"]["spec"]["hostNetwork"] is True
