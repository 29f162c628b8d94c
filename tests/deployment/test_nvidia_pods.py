"""The NVIDIA image, started as the chart (each values file, and an NVIDIA user's values)
and the static manifest render it, under a real container runtime.

The node: the project's fake kubelet serves the device-plugin dir; the driver root
(its /dev with the GPU nodes) is a temp dir made from a fake-NVML scenario; the
node's NVIDIA container runtime, which injects the driver's libnvidia-ml.so.1 into
the plugin's container (NVIDIA_VISIBLE_DEVICES=all in the image), is stood in by
mounting the fake libnvidia-ml.so.1 (tests/fakenvml) at the library path.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.nvidia.fake_nodes import FakeNodes

from .conftest import ROOT, KubeletThread, by_kind, free_port, helm_render, wait_http
from .podkit import Pod

CHART = ROOT / "deploy/nvidia/helm/hetero-dp-nvidia"
STATIC = ROOT / "deploy/nvidia/nvidia-device-plugin.yml"
GPU = "nvidia.com/gpu"
CONTAINERD_16 = (
    'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n'
)

# What an NVIDIA chart user brings (values of NVIDIA's chart, v0.17/v0.20 key names):
# a named config from a file (--set-file), node affinity and tolerations as NVIDIA's.
NVIDIA_USER_VALUES: dict[str, Any] = {
    "nameOverride": "",
    "fullnameOverride": "",
    "migStrategy": None,
    "failOnInitError": None,
    "deviceListStrategy": None,
    "compatWithCPUManager": None,
    "updateStrategy": {"type": "RollingUpdate"},
    "podAnnotations": {"example.com/team": "ml"},
    "gfd": {"enabled": False},
    "config": {"name": "", "default": "", "fallbackStrategies": ["named", "single"]},
}
USER_CONFIG = (
    "version: v1\nflags:\n  failOnInitError: true\n  plugin:\n    deviceIDStrategy: index\n"
)


def render(*args: str) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """(the DaemonSet's pod template, ConfigMaps by name) of ``helm template`` with args."""
    docs = helm_render(["nv", str(CHART), "-n", "kube-system", *args])
    [ds] = by_kind(docs, "DaemonSet")
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in by_kind(docs, "ConfigMap")}
    return ds["spec"]["template"], maps


def metrics_port(template: dict[str, Any]) -> int:
    return int(template["spec"]["containers"][0]["ports"][0]["containerPort"])


def start_pod(engine, template, node, workdir, pods, configmaps=None, **kw) -> Pod:
    pod = Pod(engine, template, node, workdir, configmaps=configmaps, **kw)
    pods.append(pod)
    try:
        pod.start()
    except Exception:
        for s in pod.started:
            print(f"--- {s.container}:\n{pod.logs(s.container)}")
        raise
    return pod


def check_serves_and_stops(
    pod: Pod, kubelet: KubeletThread, port: int, resource: str = GPU, count: int = 8
) -> Any:
    """Registered, advertising ``count`` healthy devices, ready, Allocate answered; then
    SIGTERM ends it well within the grace period, its sockets gone. Returns the Allocate."""
    name = pod.spec["containers"][0]["name"]
    try:
        res = wait_registered(pod, kubelet, resource)
        devices = kubelet.call(
            kubelet.kubelet.wait_devices(resource, lambda d: len(d) == count, timeout=30)
        )
        assert all(d.healthy for d in devices.values()), devices
        wait_http(f"http://127.0.0.1:{port}/readyz")
        first = sorted(devices)[0]
        response = kubelet.call(kubelet.kubelet.allocate(resource, [first]))
        assert kubelet.plugin_sockets(), "the plugin serves a socket in the device-plugin dir"
    except BaseException:
        print(pod.logs(name))
        raise
    took, code = pod.stop(name)
    assert code == 0 and took < pod.grace, (took, code, pod.logs(name))
    assert kubelet.plugin_sockets() == [], "the plugin's socket is left behind"
    assert res.name == resource
    return response


def wait_registered(pod: Pod, kubelet: KubeletThread, resource: str, timeout: float = 90.0):
    """The kubelet's registration of ``resource``; fails at once if a container exited."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return kubelet.call(kubelet.kubelet.wait_registered(resource, timeout=3))
        except (TimeoutError, asyncio.TimeoutError):
            for s in pod.started:
                if s.container in [c["name"] for c in pod.spec["containers"]]:
                    state = pod.state(s.container)
                    assert state.get("Running"), f"{s.container} exited: {pod.logs(s.container)}"
            if time.monotonic() > deadline:
                raise


STRATEGY_FILES = ["", "values-envvar.yaml", "values-volume-mounts.yaml", "values-cdi-cri.yaml"]
STRATEGY_FILES += ["values-cdi-annotations.yaml"]


@pytest.mark.parametrize("values_file", STRATEGY_FILES)
def test_chart_pod_serves_the_kubelet_and_stops_cleanly(
    values_file, image, nvidia_node, kubelet, engine, workdir, pods
):
    tag = image("nvidia")
    port = free_port()
    args = ["--set", f"metrics.port={port}"]
    if values_file:
        args += ["-f", str(CHART / values_file)]
    template, maps = render(*args)
    node, fake = nvidia_node()
    pod = start_pod(engine, template, node, workdir, pods, maps, images={tag: tag})
    r = check_serves_and_stops(pod, kubelet, port)
    uuid0 = sorted(g["uuid"] for g in fake.gpus)[0]
    if values_file in ("", "values-envvar.yaml"):
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == uuid0
    elif values_file == "values-volume-mounts.yaml":
        assert [m.container_path for m in r.mounts] == [
            f"/var/run/nvidia-container-devices/{uuid0}"
        ]
    elif values_file == "values-cdi-cri.yaml":
        assert [c.name for c in r.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={uuid0}"]
        spec = json.loads(next((workdir / "cdi").glob("*.json")).read_text())
        assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    else:
        assert any(k.startswith("cdi.k8s.io/") for k in r.annotations), r.annotations


def test_static_manifest_pod_serves_the_kubelet_and_stops_cleanly(
    image, nvidia_node, kubelet, engine, workdir, pods
):
    tag = image("nvidia")
    [ds] = [d for d in yaml.safe_load_all(STATIC.read_text()) if d and d["kind"] == "DaemonSet"]
    template = ds["spec"]["template"]
    node, _ = nvidia_node()
    pod = start_pod(engine, template, node, workdir, pods, images={tag: tag})
    check_serves_and_stops(pod, kubelet, metrics_port(template))


def test_nvidia_users_values_with_a_set_file_config(
    image, nvidia_node, kubelet, engine, workdir, pods
):
    """An NVIDIA chart user's values and ``--set-file config.map.config=FILE``: the config
    file decides (deviceIDStrategy index), since the chart sets no strategy env."""
    tag = image("nvidia")
    values = workdir / "nvidia-values.yaml"
    values.write_text(yaml.safe_dump(NVIDIA_USER_VALUES))
    config = workdir / "config.yaml"
    config.write_text(USER_CONFIG)
    port = free_port()
    template, maps = render(
        "-f", str(values), "--set-file", f"config.map.config={config}",
        "--set", f"metrics.port={port}",
    )  # fmt: skip
    assert template["metadata"]["annotations"] == {"example.com/team": "ml"}
    node, fake = nvidia_node()
    pod = start_pod(engine, template, node, workdir, pods, maps, images={tag: tag})
    r = check_serves_and_stops(pod, kubelet, port)
    uuids = [g["uuid"] for g in fake.gpus]  # the first device allocated: the lowest UUID
    expected = str(uuids.index(min(uuids)))  # index: the config file's choice
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == expected


def test_cdi_delivery_on_a_runtime_without_cdi_falls_back_with_a_warning(
    image, nvidia_node, kubelet, engine, workdir, pods
):
    tag = image("nvidia")
    port = free_port()
    template, maps = render(
        "-f", str(CHART / "values-cdi-cri.yaml"), "--set", f"metrics.port={port}"
    )
    node, _ = nvidia_node(runtime_config=CONTAINERD_16)
    pod = start_pod(engine, template, node, workdir, pods, maps, images={tag: tag})
    r = check_serves_and_stops(pod, kubelet, port)
    logs_before_stop = pod.logs("hetero-dp-nvidia")
    assert list(r.cdi_devices) == []
    gpu_nodes = [d.host_path for d in r.devices if re.fullmatch(r"/dev/nvidia\d+", d.host_path)]
    assert len(gpu_nodes) == 1 and "/dev/nvidiactl" in [d.host_path for d in r.devices], r
    assert "needs CDI, but containerd has CDI off" in logs_before_stop


@pytest.fixture
def api_server() -> Iterator[tuple[FakeNodes, str]]:
    fake = FakeNodes()
    url = fake.start()
    yield fake, url
    fake.stop()


def test_config_manager_picks_the_named_config_and_follows_the_label(
    image, nvidia_node, kubelet, engine, workdir, pods, api_server
):
    """Two configs: the config manager (init container, then sidecar) picks the one the
    node label names, through an API server (the project's fake); the plugin follows a
    label change live; the MIG-mixed config gives nvidia.com/mig-* (the chart sets no
    MIG_STRATEGY env that would beat it); the sidecar ends at once on SIGTERM."""
    tag = image("nvidia")
    nodes, url = api_server
    port = free_port()
    whole = workdir / "whole.yaml"
    whole.write_text("version: v1\nflags:\n  migStrategy: none\n")
    mixed = workdir / "mixed.yaml"
    mixed.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    template, maps = render(
        "--set-file", f"config.map.whole={whole}", "--set-file", f"config.map.mixed={mixed}",
        "--set", "config.default=whole", "--set", f"metrics.port={port}",
    )  # fmt: skip
    node, _ = nvidia_node("a100-mig-mixed.scn")
    nodes.set_labels(node.name, {"nvidia.com/device-plugin.config": "mixed"})
    api = {"KUBERNETES_API_SERVER": url}
    pod = start_pod(
        engine,
        template,
        node,
        workdir,
        pods,
        maps,
        images={tag: tag},
        extra_env={"config-manager-init": api, "config-manager": api},
    )
    k = kubelet.kubelet
    try:
        for profile in ("1g.10gb", "2g.20gb", "3g.40gb"):  # the scenario's MIG devices
            wait_registered(pod, kubelet, f"nvidia.com/mig-{profile}")
        nodes.set_labels(node.name, {"nvidia.com/device-plugin.config": "whole"})
        kubelet.call(k.wait_devices(GPU, lambda d: len(d) == 4, timeout=60))
    except BaseException:
        print(pod.logs("hetero-dp-nvidia"), pod.logs("config-manager"))
        raise
    took, code = pod.stop("config-manager")
    assert code == 0 and took < 5, (took, code, pod.logs("config-manager"))
    took, code = pod.stop("hetero-dp-nvidia")
    assert code == 0 and took < pod.grace
