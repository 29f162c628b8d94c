"""The way back (docs/deployment.md, "Switching to hetero-dp and back"), under a real
container runtime: the scaffold's plugin runs and stops on a node whose CDI dir holds
hetero-dp's spec beside NVIDIA's; then deploy/cleanup.yaml's pod, with the udev image,
cleans the node in its init container: hetero-dp's spec, temp file and label file go,
NVIDIA's spec, GFD's label file and the kubelet's files stay."""

from __future__ import annotations

from pathlib import Path

import yaml

from hetero_dp.engine.cdi_publisher import CDIWriter
from tests.cdi import samples

from .conftest import ROOT, KubeletThread
from .podkit import Node, Pod
from .test_nvidia_pods import check_serves_and_stops, start_pod
from .test_other_pods import scaffold_node


def test_cleanup_pod_removes_hetero_dps_specs_and_keeps_nvidias(
    image, kubelet: KubeletThread, engine, workdir: Path, pods
):
    # a hetero-dp plugin ran on this node, and stopped
    template, plugin_node, rendered = scaffold_node(kubelet, workdir)
    plugin = start_pod(
        engine, template, plugin_node, workdir, pods, images={rendered: image("scaffold")}
    )
    check_serves_and_stops(plugin, kubelet, 9435, "acme.example.com/npu", 2)
    # what the node's dirs hold then: hetero-dp's files beside others'
    etc_cdi, run_cdi, labels = (workdir / n for n in ("etc-cdi", "run-cdi", "features.d"))
    for d in (etc_cdi, run_cdi, labels):
        d.mkdir()
    ours = CDIWriter(run_cdi).write("k8s.device-plugin.nvidia.com/gpu", samples.accel_glob(1))
    assert ours is not None
    temp = run_cdi / ".hetero-dp_x.json.1234.tmp"
    temp.write_text("{")
    nvidia = run_cdi / "k8s.device-plugin.nvidia.com-gpu.json"
    nvidia.write_text('{"cdiVersion": "0.5.0"}')
    own_label, gfd = labels / "hetero-dp-nvidia", labels / "gfd"
    own_label.write_text("nvidia.com/gpu.count=1\n")
    gfd.write_text("nvidia.com/gpu.count=1\n")
    checkpoint = kubelet.plugin_dir / "kubelet_internal_checkpoint"
    checkpoint.write_text("{}")

    [ds] = [d for d in yaml.safe_load_all((ROOT / "deploy/cleanup.yaml").read_text()) if d]
    template = ds["spec"]["template"]
    node = Node(
        host_paths={
            "/etc/cdi": etc_cdi,
            "/var/run/cdi": run_cdi,
            "/var/lib/kubelet/device-plugins": kubelet.plugin_dir,
            "/etc/kubernetes/node-feature-discovery/features.d": labels,
        }
    )
    named = template["spec"]["initContainers"][0]["image"]
    tag = image("udev")
    pod = Pod(engine, template, node, workdir, images={named: tag})
    pods.append(pod)
    pod.start()  # the init container, the clean-up, ran to exit 0
    assert not ours.exists() and not temp.exists() and not own_label.exists()
    assert nvidia.read_text() == '{"cdiVersion": "0.5.0"}'
    assert gfd.exists() and checkpoint.exists()
    assert pod.state("done")["Running"], pod.logs("done")
