"""The way back (#36.6): the chart's uninstall hook and the clean-up DaemonSet run
`hetero-dp cleanup` on the dirs the plugin writes, with flags the command takes."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from click.testing import CliRunner

from hetero_dp.cli import main
from hetero_dp.testing import short_tempdir

from .conftest import DEPLOY
from .objects import pod_spec, render_values

CHART = DEPLOY / "nvidia/helm/hetero-dp-nvidia"
CLEANUP_DS = DEPLOY / "cleanup.yaml"


def hook(docs: list[dict]) -> dict | None:
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(jobs) <= 1
    return jobs[0] if jobs else None


def run_on_stand_in_node(container: dict, pod: dict) -> tuple[Path, str]:
    """Run the container's command with every hostPath it mounts stood in by a tmp dir
    (the real `hetero-dp cleanup`, in process), with a spec of ours and one of NVIDIA's
    in the CDI dir; returns the stand-in root and the output."""
    root = short_tempdir("hdp-hook-")
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mapped = {}
    for m in container["volumeMounts"]:
        local = root / host[m["name"]].lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        mapped[m["mountPath"]] = str(local)
    cdi = Path(mapped["/var/run/cdi"])
    (cdi / "hetero-dp_nvidia.com_gpu.json").write_text("{}")
    (cdi / "k8s.device-plugin.nvidia.com-gpu.json").write_text("{}")
    command = container["command"]
    assert command[:2] == ["hetero-dp", "cleanup"], command
    args = [mapped.get(a, a) for a in command[2:]]
    result = CliRunner().invoke(main, ["cleanup", *args])
    assert result.exit_code == 0, result.output
    return root, result.output


def test_chart_renders_a_post_delete_hook_job_that_cleans_each_node(helm: str):
    docs = render_values(helm, CHART, {"cleanup": {"nodes": 3}})
    job = hook(docs)
    assert job is not None
    notes = job["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "post-delete"  # the plugin is gone, or going
    assert set(notes["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
    }
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    pod = pod_spec(job)
    ds = pod_spec(next(d for d in docs if d["kind"] == "DaemonSet"))
    assert pod is not None and ds is not None
    # the plugin's nodes, one pod per node
    assert pod["tolerations"] == ds["tolerations"]
    assert pod["affinity"]["nodeAffinity"] == ds["affinity"]["nodeAffinity"]
    [spread] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert (
        spread["labelSelector"]["matchLabels"].items()
        <= job["spec"]["template"]["metadata"]["labels"].items()
    )
    [c] = pod["containers"]
    assert "--wait" in c["command"]
    root, output = run_on_stand_in_node(c, pod)
    try:
        cdi = root / "var/run/cdi"
        assert not (cdi / "hetero-dp_nvidia.com_gpu.json").exists()
        assert (cdi / "k8s.device-plugin.nvidia.com-gpu.json").exists()
        assert "removed" in output
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_chart_hook_can_be_turned_off_and_follows_the_label_dir(helm: str):
    assert hook(render_values(helm, CHART, {"cleanup": {"enabled": False}})) is None
    job = hook(render_values(helm, CHART, {"labels": {"enabled": False}}))
    assert job is not None
    command = pod_spec(job)["containers"][0]["command"]  # type: ignore[index]
    assert command[command.index("--labels-dir") + 1] == ""


def test_cleanup_daemonset_cleans_every_node_before_it_is_ready():
    [ds] = [d for d in yaml.safe_load_all(CLEANUP_DS.read_text()) if d]
    pod = pod_spec(ds)
    assert pod is not None
    assert {"operator": "Exists"} in pod["tolerations"]  # every node, tainted ones too
    [init] = pod["initContainers"]  # Ready (rollout status) only after it succeeded
    command = init["command"]
    cdi_dirs = [command[i + 1] for i, a in enumerate(command) if a == "--cdi-dir"]
    assert cdi_dirs == ["/etc/cdi", "/var/run/cdi"]
    root, _ = run_on_stand_in_node(init, pod)
    try:
        assert not (root / "var/run/cdi/hetero-dp_nvidia.com_gpu.json").exists()
        assert (root / "var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
