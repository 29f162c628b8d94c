"""Privileges of everything we ship: seccomp RuntimeDefault on every container, and a
security scanner's findings over the rendered chart and the manifests, each one that
stays named in an allow-list with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from .objects import chart_renderings, seccomp_gaps, static_objects


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
