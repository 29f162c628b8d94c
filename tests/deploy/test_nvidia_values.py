"""What an NVIDIA chart user brings to hetero-dp's NVIDIA chart, rendered by a real helm.

The key paths below are those of NVIDIA's chart values
(github.com/NVIDIA/k8s-device-plugin, deployments/helm/nvidia-device-plugin/values.yaml
at tags v0.17.4 and v0.20.0): each is honoured, or refused by values.schema.json or the
chart's validation, with a message that names it. The strategy settings are left unset
by default (NVIDIA's chart: ``migStrategy: null`` ..., rendered only ``if typeIs
"string"``), so a config file decides.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import DEPLOY

CHART = DEPLOY / "nvidia/helm/hetero-dp-nvidia"
STRATEGY_ENV = (
    "MIG_STRATEGY",
    "FAIL_ON_INIT_ERROR",
    "DEVICE_LIST_STRATEGY",
    "DEVICE_ID_STRATEGY",
    "PASS_DEVICE_SPECS",
    "NVIDIA_DRIVER_ROOT",
)

# Every leaf key path of NVIDIA's values.yaml, v0.17.4 and v0.20.0 (v0.20 added
# gdrcopyEnabled, mps.enableHostPID, cdi.featureFlags; v0.17 had nfd.enableNodeFeatureApi),
# with NVIDIA's default. Lists and maps are leaves.
NVIDIA_DEFAULTS: dict[str, Any] = {
    "config.name": "",
    "config.map": {},
    "config.default": "",
    "config.fallbackStrategies": ["named", "single"],
    "compatWithCPUManager": None,
    "migStrategy": None,
    "failOnInitError": None,
    "deviceListStrategy": None,
    "deviceIDStrategy": None,
    "nvidiaDriverRoot": None,
    "gdrcopyEnabled": None,
    "gdsEnabled": None,
    "mofedEnabled": None,
    "deviceDiscoveryStrategy": None,
    "nameOverride": "",
    "fullnameOverride": "",
    "namespaceOverride": "",
    "selectorLabelsOverride": {},
    "allowDefaultNamespace": False,
    "imagePullSecrets": [],
    "image.repository": "nvcr.io/nvidia/k8s-device-plugin",
    "image.pullPolicy": "IfNotPresent",
    "image.tag": "",
    "updateStrategy.type": "RollingUpdate",
    "podAnnotations": {},
    "podSecurityContext": {},
    "securityContext": {},
    "resources": {},
    "nodeSelector": {},
    "affinity": {},
    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
    "priorityClassName": "system-node-critical",
    "runtimeClassName": None,
    "devicePlugin.enabled": True,
    "gfd.enabled": False,
    "gfd.nameOverride": "gpu-feature-discovery",
    "gfd.namespaceOverride": "",
    "gfd.noTimestamp": None,
    "gfd.sleepInterval": None,
    "gfd.securityContext": {"privileged": True},
    "nfd.nameOverride": "node-feature-discovery",
    "nfd.enableNodeFeatureApi": False,
    "nfd.master.serviceAccount.name": "node-feature-discovery",
    "nfd.master.serviceAccount.create": True,
    "nfd.master.config.extraLabelNs": ["nvidia.com"],
    "nfd.worker.tolerations": [],
    "nfd.worker.config.sources.pci.deviceClassWhitelist": ["02", "03"],
    "nfd.worker.config.sources.pci.deviceLabelFields": ["vendor"],
    "mps.root": "/run/nvidia/mps",
    "mps.enableHostPID": True,
    "cdi.nvidiaHookPath": None,
    "cdi.featureFlags": None,
}

# Values NVIDIA's chart accepts that this one refuses, and the words the refusal uses.
REFUSED = {
    "gfd.enabled": (True, "gfd.enabled: this chart does not deploy GPU feature discovery"),
    "nfd.enabled": (True, "nfd.enabled: this chart does not deploy Node Feature Discovery"),
    "cdi.featureFlags": (["feature-a"], "cdi.featureFlags: NVIDIA's CDI feature flags"),
}


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def template(helm: str, values: dict[str, Any] | None = None, *args: str, namespace="gpu"):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values or {}, f)
        f.flush()
        return subprocess.run(
            [helm, "template", "nv", str(CHART), "-n", namespace, "-f", f.name, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )


def rendered(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "DaemonSet")


def plugin_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    c = daemonset(docs)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_strategy_settings_are_unset_by_default_so_the_config_file_decides(helm: str):
    config = {"map": {"mixed": "version: v1\nflags:\n  migStrategy: mixed\n"}}
    for values in ({}, {"config": config}):
        env = plugin_env(rendered(template(helm, values)))
        assert not set(STRATEGY_ENV) & set(env), f"{values}: env beats the config file"
    env = plugin_env(rendered(template(helm, {"migStrategy": "mixed", "failOnInitError": False})))
    assert env["MIG_STRATEGY"] == "mixed" and env["FAIL_ON_INIT_ERROR"] == "false"


def test_nvidia_users_values_of_v0_17_and_v0_20_render(helm: str):
    """NVIDIA's defaults (the file an NVIDIA user starts from) render as they are."""
    docs = rendered(template(helm, nest(NVIDIA_DEFAULTS), "--set", "allowDefaultNamespace=false"))
    ds = daemonset(docs)
    c = ds["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "nvcr.io/nvidia/k8s-device-plugin:0.1.0"  # tag "": appVersion


@pytest.mark.parametrize("path", sorted(REFUSED))
def test_what_this_chart_cannot_honour_is_refused_by_name(helm: str, path: str):
    value, words = REFUSED[path]
    out = template(helm, nest({path: value}))
    assert out.returncode != 0 and words in out.stderr, out.stderr


def test_unknown_keys_and_wrong_types_are_refused_by_name(helm: str):
    out = template(helm, {"migStrategie": "mixed"})
    assert out.returncode != 0 and "'migStrategie' not allowed" in out.stderr, out.stderr
    out = template(helm, {"migStrategy": "all"})
    assert out.returncode != 0 and "/migStrategy" in out.stderr, out.stderr
    out = template(helm, nest({"config.fallbackStrategies": ["nearest"]}))
    assert out.returncode != 0 and "/config/fallbackStrategies" in out.stderr, out.stderr


def test_names_namespace_annotations_and_security_contexts_are_honoured(helm: str):
    values = {
        "fullnameOverride": "gpu-plugin",
        "namespaceOverride": "nvidia",
        "selectorLabelsOverride": {"app": "gpu"},
        "podAnnotations": {"example.com/owner": "ml"},
        "podSecurityContext": {"runAsNonRoot": False},
        "securityContext": {"privileged": True},
        "config": {"map": {"a": "version: v1\n", "b": "version: v1\n"}, "default": "a"},
    }
    docs = rendered(template(helm, values))
    ds = daemonset(docs)
    assert ds["metadata"]["name"] == "gpu-plugin" and ds["metadata"]["namespace"] == "nvidia"
    assert ds["spec"]["selector"]["matchLabels"] == {"app": "gpu"}
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"] == {"app": "gpu"}
    assert pod["metadata"]["annotations"] == {"example.com/owner": "ml"}
    # the chart's seccomp default stays beside what the user gives (RuntimeDefault, #36.8)
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["spec"]["containers"][0]["securityContext"] == {"privileged": True}
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["name"] == "gpu-plugin-config"
    assert {d["metadata"].get("namespace") for d in docs} <= {"nvidia", None}
    named = daemonset(rendered(template(helm, {"nameOverride": "dp"})))
    assert named["metadata"]["name"] == "nv-dp"
    assert not [d for d in rendered(template(helm, nest({"devicePlugin.enabled": False})))]
    refused = template(helm, {"allowDefaultNamespace": False}, namespace="default")
    assert refused.returncode != 0 and "allowDefaultNamespace" in refused.stderr


def test_set_file_puts_a_config_file_in_the_map(helm: str, tmp_path: Path):
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    docs = rendered(template(helm, None, "--set-file", f"config.map.config={config}"))
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["data"] == {"config": config.read_text()}
    assert plugin_env(docs)["CONFIG_FILE"] == "/config/config"


def test_config_default_must_name_an_entry_also_with_several(helm: str):
    two = {"map": {"a": "version: v1\n", "b": "version: v1\n"}, "default": "c"}
    out = template(helm, {"config": two})
    assert out.returncode != 0
    assert 'config.default "c" is not a key of config.map (keys: a, b)' in out.stderr
    two["default"] = "b"
    docs = rendered(template(helm, {"config": two}))
    init = daemonset(docs)["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["DEFAULT_CONFIG"] == "b" and env["FALLBACK_STRATEGIES"] == "named,single"


def test_manifests_roll_with_surge_and_pass_the_pod_uid(helm: str, tmp_path: Path):
    """The chart, every static manifest under deploy/ and the scaffold's roll with
    surge, name their sockets after the pod, and probe the pod's own readiness."""
    from hetero_dp.cli import scaffold

    project, _ = scaffold.generate(
        {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/acme*"},
        tmp_path / "acme",
    )
    sources = {
        "chart": rendered(template(helm)),
        "scaffold": list(yaml.safe_load_all((project / "deploy/daemonset.yaml").read_text())),
    }
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        # (deploy/cleanup.yaml is the clean-up DaemonSet, no device plugin)
        if "helm" not in path.relative_to(DEPLOY).parts and path.name != "cleanup.yaml":
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
            if any(d.get("kind") == "DaemonSet" for d in docs):
                sources[str(path.relative_to(DEPLOY))] = docs
    # before: the udev DaemonSet stopped the old pod first (maxUnavailable: 1)
    assert {"nvidia/nvidia-device-plugin.yml", "udev/daemonset.yaml"} <= set(sources)
    for name, docs in sources.items():
        docs = [d for d in docs if d]
        ds = daemonset(docs)
        assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {
            "maxSurge": 1,
            "maxUnavailable": 0,
        }, name
        c = ds["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("valueFrom") for e in c["env"]}
        assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}, name
        assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}, name
        own_readiness(name, ds, docs)


def own_readiness(name: str, ds: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """The readiness probe asks this pod's instance whether it is registered and
    advertising: /readyz over the pod's IP, or in the host network (where a surge
    pod shares the node's ports with the old pod) the ready file it keeps."""
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    probe = c["readinessProbe"]
    if not pod.get("hostNetwork"):
        assert probe["httpGet"]["path"] == "/readyz", name
        return
    # a declared port is a host port there: the scheduler would not place the surge pod
    assert "ports" not in c, name
    [ready_file] = probe["exec"]["command"][1:]
    assert probe["exec"]["command"][0] == "cat", name
    # the daemon's config (--config FILE, from a ConfigMap) keeps that file and waits
    # for the port the old pod holds instead of refusing to start
    config_path = Path(c["args"][c["args"].index("--config") + 1])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    cm_name = volumes[mounts[str(config_path.parent)]]["configMap"]["name"]
    [cm] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name]
    metrics = yaml.safe_load(cm["data"][config_path.name])["metrics"]
    assert metrics == {"waitForPort": True, "readyFile": ready_file}, name
    # on the pod's own writable volume (the root filesystem is read-only)
    assert "emptyDir" in volumes[mounts[str(Path(ready_file).parent)]], name
