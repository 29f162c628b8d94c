"""The DaemonSet manifest and Helm chart: valid offline, least privilege, and in step."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import find_helm

from .minihelm import referenced_values

DEPLOY = Path(__file__).resolve().parents[2] / "deploy/nvidia"
CHART = DEPLOY / "helm/hetero-dp-nvidia"
PLAIN = DEPLOY / "nvidia-device-plugin.yml"
RELEASE = {"Name": "hetero-dp-nvidia", "Namespace": "kube-system"}
K8S = "1.32"
NAMESPACE = ("--namespace", RELEASE["Namespace"])
NFD_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def chart_values(**overrides):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values.update(overrides)
    return values


def helm() -> str:
    """A real helm, found as the deployment checks find it (tests/deploy/conftest.py)."""
    return find_helm()


def helm_template(values, *, check=True) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        return subprocess.run(
            [helm(), "template", RELEASE["Name"], str(CHART), "-f", f.name, *NAMESPACE],
            capture_output=True,
            text=True,
            check=check,
        )


def render_chart(values):
    """The chart rendered by a real helm with exactly ``values``."""
    return [d for d in yaml.safe_load_all(helm_template(values).stdout) if d]


def validate(docs):
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)


def container(docs):
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    return ds, ds["spec"]["template"]["spec"]["containers"][0]


def env(c):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_plain_manifest_validates_with_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "-k", K8S, "--strict", str(PLAIN)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "passed" in out.stdout + out.stderr


def test_chart_with_default_values_renders_the_plain_manifest():
    """Alike but for what NVIDIA's own two differ in: the chart selects GPU nodes by
    node affinity and so fails on init errors (NVIDIA's default); the static
    manifest runs on every node, so a node without a GPU must not crash-loop."""
    [chart] = [d for d in render_chart(chart_values()) if d["kind"] == "DaemonSet"]
    [plain] = [d for d in yaml.safe_load_all(PLAIN.read_text()) if d]
    pod = chart["spec"]["template"]["spec"]
    terms = pod.pop("affinity")["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]]
    assert keys == [
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/cpu-model.vendor_id",
        "nvidia.com/gpu.present",
    ]
    assert env(container([plain])[1])["FAIL_ON_INIT_ERROR"] == "false"
    # the chart leaves it unset (the backend's default: true, NVIDIA's), so a config decides
    assert "FAIL_ON_INIT_ERROR" not in env(pod["containers"][0])
    for c in (pod["containers"][0], container([plain])[1]):
        c["env"] = [e for e in c["env"] if e["name"] != "FAIL_ON_INIT_ERROR"]
    assert chart == plain


@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts", "cdi-cri", "cdi-annotations"])
def test_values_file_per_strategy_renders_valid_and_mounts_cdi(strategy):
    values = chart_values(**yaml.safe_load((CHART / f"values-{strategy}.yaml").read_text()))
    docs = render_chart(values)
    validate(docs)
    ds, c = container(docs)
    assert env(c)["DEVICE_LIST_STRATEGY"] == strategy
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    if strategy.startswith("cdi-"):
        assert mounts["/var/run/cdi"] is False and mounts["/driver-root"] is True
        assert vols["cdi-root"]["hostPath"]["path"] == "/var/run/cdi"
        assert vols["driver-root"]["hostPath"]["path"] == "/"
    else:
        assert "/var/run/cdi" not in mounts and "cdi-root" not in vols


def test_config_map_without_default_uses_its_only_entry_or_refuses_a_wrong_default():
    docs = render_chart(chart_values(config={"map": {"a100": "version: v1\n"}, "default": ""}))
    assert env(container(docs)[1])["CONFIG_FILE"] == "/config/a100"
    # no API access needed (the Job is the uninstall clean-up hook)
    assert {d["kind"] for d in docs} == {"DaemonSet", "ConfigMap", "Job"}
    wrong = {"map": {"a": "version: v1\n"}, "default": "z"}
    out = helm_template(chart_values(config=wrong), check=False)
    assert out.returncode != 0 and 'config.default "z" is not a key of config.map' in out.stderr


def test_several_configs_are_chosen_per_node_by_the_config_manager():
    two = {"map": {"a100": "version: v1\n", "h100": "version: v1\n"}, "default": "a100"}
    docs = render_chart(chart_values(config=two))
    validate(docs)
    ds, c = container(docs)  # the plugin stays the first container
    pod = ds["spec"]["template"]["spec"]
    assert env(c)["CONFIG_FILE"] == "/config/config.yaml"
    init = pod["initContainers"][0]
    sidecar = next(x for x in pod["containers"] if x["name"] == "config-manager")
    assert init["command"] == ["hetero-dp-nvidia-config-manager", "--oneshot"]
    assert sidecar["command"] == ["hetero-dp-nvidia-config-manager"]
    for x in (init, sidecar):
        e = {v["name"]: v.get("value") for v in x["env"]}
        assert e["NODE_LABEL"] == "nvidia.com/device-plugin.config"
        assert e["DEFAULT_CONFIG"] == "a100" and e["CONFIG_FILE_DST"] == "/config/config.yaml"
        assert x["securityContext"]["readOnlyRootFilesystem"] is True
    # only the config manager gets an API token; the plugin does not
    assert pod["automountServiceAccountToken"] is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert token in {m["mountPath"] for m in sidecar["volumeMounts"]}
    assert token not in {m["mountPath"] for m in c["volumeMounts"]}
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_cdi_hook_path_value_reaches_nvidias_env_var():
    docs = render_chart(chart_values(cdi={"nvidiaHookPath": "/usr/local/bin/nvidia-cdi-hook"}))
    assert env(container(docs)[1])["NVIDIA_CDI_HOOK_PATH"] == "/usr/local/bin/nvidia-cdi-hook"


def test_values_and_templates_stay_in_step():
    values = chart_values()
    used = set()
    for template in [*(CHART / "templates").glob("*.yaml"), CHART / "templates/_helpers.tpl"]:
        used |= referenced_values(template.read_text())
    top_used = {u.split(".")[0] for u in used}
    assert top_used == set(values), "values.yaml keys unused by templates, or missing"
    for path in used:  # every reference resolves
        node = values
        for part in path.split("."):
            assert part in node, f".Values.{path} missing from values.yaml"
            node = node[part]


def test_least_privilege_by_default():
    ds, c = container(render_chart(chart_values()))
    sc = c["securityContext"]
    assert "privileged" not in sc
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    pod = ds["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["automountServiceAccountToken"] is False
    assert "hostNetwork" not in pod and "hostPID" not in pod
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}
    assert mounts == {
        "/var/lib/kubelet/device-plugins": False,
        "/driver-root/dev": True,
        NFD_DIR: False,  # the node label file
        "/var/lib/kubelet/pod-resources": True,  # attribution: who holds which GPU
        "/host/proc": True,  # attribution: the pod of a PID NVML reports
        "/var/log/containers": True,  # attribution: a container ID's container
    }
    assert env(c)["HETERO_DP_PROC_ROOT"] == "/host/proc"


def test_pass_device_specs_makes_it_privileged():
    docs = render_chart(chart_values(compatWithCPUManager=True))
    validate(docs)
    _, c = container(docs)
    assert c["securityContext"] == {
        "privileged": True,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert env(c)["PASS_DEVICE_SPECS"] == "true"


@pytest.mark.parametrize(
    ("values", "expected_env"),
    [
        (
            {
                "migStrategy": "mixed",
                "deviceListStrategy": "volume-mounts",
                "deviceIDStrategy": "index",
                "failOnInitError": False,
            },
            {
                "MIG_STRATEGY": "mixed",
                "DEVICE_LIST_STRATEGY": "volume-mounts",
                "DEVICE_ID_STRATEGY": "index",
                "FAIL_ON_INIT_ERROR": "false",
            },
        ),
        (
            {"nvidiaDriverRoot": "/run/nvidia/driver"},
            {"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver", "CONTAINER_DRIVER_ROOT": "/driver-root"},
        ),
    ],
)
def test_values_reach_nvidias_env_vars(values, expected_env):
    docs = render_chart(chart_values(**values))
    validate(docs)
    ds, c = container(docs)
    assert expected_env.items() <= env(c).items()
    if "nvidiaDriverRoot" in values:
        vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        assert vols["driver-dev"]["hostPath"]["path"] == "/run/nvidia/driver/dev"


def test_config_map_tolerations_node_selector_and_runtime_class():
    nvidia_config = "version: v1\nflags:\n  migStrategy: mixed\n"
    docs = render_chart(
        chart_values(
            config={"map": {"default": nvidia_config}, "default": "default"},
            nodeSelector={"nvidia.com/gpu.present": "true"},
            tolerations=[{"key": "gpu", "operator": "Exists"}],
            runtimeClassName="nvidia",
            resources={"limits": {"memory": "256Mi"}},
        )
    )
    validate(docs)
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["data"] == {"default": nvidia_config}
    ds, c = container(docs)
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["runtimeClassName"] == "nvidia"
    assert env(c)["CONFIG_FILE"] == "/config/default"
    assert {"name": "config", "mountPath": "/config", "readOnly": True} in c["volumeMounts"]
    assert c["resources"] == {"limits": {"memory": "256Mi"}}


def test_probes_metrics_port_and_label_dir_by_default():
    ds, c = container(render_chart(chart_values()))
    assert env(c)["HETERO_DP_METRICS_ADDRESS"] == ":9435"
    assert env(c)["HETERO_DP_LABELS_DIR"] == NFD_DIR
    assert c["ports"] == [{"name": "metrics", "containerPort": 9435, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert vols["node-labels"]["hostPath"] == {"path": NFD_DIR, "type": "DirectoryOrCreate"}


def test_metrics_port_and_labels_are_configurable():
    docs = render_chart(chart_values(metrics={"port": 9500}, labels={"enabled": False}))
    validate(docs)
    ds, c = container(docs)
    assert env(c)["HETERO_DP_METRICS_ADDRESS"] == ":9500"
    assert c["ports"][0]["containerPort"] == 9500
    assert "HETERO_DP_LABELS_DIR" not in env(c)
    assert NFD_DIR not in {m["mountPath"] for m in c["volumeMounts"]}
    assert "node-labels" not in {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}

    docs = render_chart(chart_values(labels={"enabled": True, "hostPath": "/var/lib/nfd"}))
    validate(docs)
    ds, c = container(docs)
    assert env(c)["HETERO_DP_LABELS_DIR"] == "/var/lib/nfd"
    assert {"name": "node-labels", "mountPath": "/var/lib/nfd"} in c["volumeMounts"]


def test_config_file_in_the_chart_is_accepted_by_the_backend():
    """The example config in values.yaml's comment parses with the backend's option rules."""
    from hetero_dp_nvidia.options import parse_options

    text = (CHART / "values.yaml").read_text()
    block = text.split("#       default: |\n", 1)[1].split("#     default: default", 1)[0]
    doc = yaml.safe_load("\n".join(line[10:] for line in block.splitlines()))
    assert doc["version"] == "v1"
    assert parse_options(doc["flags"], {}).mig_strategy == "mixed"


def test_dockerfile_installs_core_and_backend_and_runs_nvidia():
    text = (DEPLOY / "Dockerfile").read_text()
    assert "COPY vendors/nvidia ./vendors/nvidia" in text
    assert 'ENTRYPOINT ["hetero-dp", "run", "nvidia"]' in text
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in text


def test_more_of_nvidias_values_gds_discovery_existing_config_map_pull_secrets():
    docs = render_chart(
        chart_values(
            gdsEnabled=True,
            mofedEnabled=False,
            deviceDiscoveryStrategy="nvml",
            config={"name": "site-configs", "map": {}, "default": "a100"},
            imagePullSecrets=[{"name": "registry"}],
        )
    )
    validate(docs)
    ds, c = container(docs)
    e = env(c)
    assert e["GDS_ENABLED"] == "true" and e["MOFED_ENABLED"] == "false"
    assert e["DEVICE_DISCOVERY_STRATEGY"] == "nvml" and "GDRCOPY_ENABLED" not in e
    assert "ConfigMap" not in {d["kind"] for d in docs}  # config.name: it exists already
    pod = ds["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["available-configs"]["configMap"]["name"] == "site-configs"
    assert e["CONFIG_FILE"] == "/config/config.yaml"  # chosen per node by the label
    assert pod["imagePullSecrets"] == [{"name": "registry"}]


def test_mps_values_mount_the_root_and_shm_as_nvidias_chart():
    off = render_chart(chart_values())
    assert "MPS_ROOT" not in env(container(off)[1])
    docs = render_chart(chart_values(mps={**chart_values()["mps"], "enabled": True}))
    validate(docs)
    ds, c = container(docs)
    assert env(c)["MPS_ROOT"] == "/run/nvidia/mps"
    assert env(c)["MPS_CONTROL_DAEMON"] == "managed"
    assert env(c)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # it runs the daemon
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/mps"] == "mps-root" and mounts["/dev/shm"] == "mps-shm"
    volumes = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["mps-root"] == "/run/nvidia/mps"
    assert volumes["mps-shm"] == "/run/nvidia/mps/shm"
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    external = {**chart_values()["mps"], "enabled": True, "controlDaemon": "external"}
    ds, c = container(render_chart(chart_values(mps=external)))
    assert env(c)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "hostPID" not in ds["spec"]["template"]["spec"]


def test_pod_security_context_values_keep_seccomp_unless_they_name_a_profile():
    pod = container(render_chart(chart_values(podSecurityContext={"runAsNonRoot": True})))[0]
    sc = pod["spec"]["template"]["spec"]["securityContext"]
    assert sc == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    own = {"type": "Localhost", "localhostProfile": "profiles/hetero-dp.json"}
    pod = container(render_chart(chart_values(podSecurityContext={"seccompProfile": own})))[0]
    assert pod["spec"]["template"]["spec"]["securityContext"] == {"seccompProfile": own}


def test_attribution_off_mounts_neither_the_pod_resources_dir_nor_proc():
    ds, c = container(render_chart(chart_values(attribution={"enabled": False})))
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert not mounts & {"/var/lib/kubelet/pod-resources", "/host/proc", "/var/log/containers"}
    assert "HETERO_DP_PROC_ROOT" not in env(c)
    volumes = {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert not volumes & {"pod-resources", "host-proc", "container-logs"}
