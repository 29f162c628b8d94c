"""Step 3, the container runtime: containerd's or Docker's config, read for the runtimes it
defines, the default one and whether CDI is on."""

from __future__ import annotations

from collections.abc import Sequence

from hetero_dp.engine.backend import Backend
from hetero_dp.kits.runtimeconf import (
    RuntimeView,
    containerd_view,
    docker_view,
    runtime_cdi_off,
)
from hetero_dp.model.device import Check
from hetero_dp.model.errors import BackendError
from hetero_dp.ops.doctor.findings import DoctorSettings, Finding

__all__ = ["RuntimeView", "check_runtime", "containerd_view", "docker_view", "runtime_cdi_off"]


# runtimes a runtime knows without a config entry (containerd and dockerd: runc)
BUILT_IN = frozenset({"runc"})


def _judge_runtime(
    view: RuntimeView,
    settings: DoctorSettings,
    needs_cdi: bool,
    advice: Sequence[Check],
) -> Finding:
    """One runtime's finding: a backend's failing advice first (it knows what its
    devices need), then what every device needs, then the backend's other advice."""
    name, where = view.name, view.path
    step = "runtime"
    for c in advice:
        if c.status == "fail":
            return Finding(step, name, "fail", c.message, c.fix)
    if view.default not in view.runtimes and view.default not in BUILT_IN:
        return Finding(
            step,
            name,
            "fail",
            f"{where}: the default runtime is {view.default} but no runtime of that name is "
            "defined: every container fails to start",
            f"define the runtime {view.default} in {where} or make a defined one the default, "
            f"then restart {name}",
        )
    for runtime, binary in sorted(view.runtimes.items()):
        if binary.startswith("/") and not settings.path(binary).exists():
            return Finding(
                step,
                name,
                "fail",
                f"{where}: the {runtime} runtime points at {binary}, which does not exist",
                f"install what provides {binary}, or remove the runtime {runtime}",
            )
    found = (
        f"runtimes: {', '.join(sorted(view.runtimes)) or 'none'}; default {view.default}; "
        f"CDI {'on' if view.cdi else 'off'}"
    )
    if needs_cdi and not view.cdi:
        enable_cdi = (
            f'set enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"] in {where} '
            "(containerd 1.7; 2.x has it on by default) and restart containerd"
            if name == "containerd"
            else f'add "features": {{"cdi": true}} to {where} and restart dockerd'
        )
        return Finding(
            step,
            name,
            "fail",
            f"{where}: CDI delivery is configured but {name} has CDI off ({found})",
            enable_cdi,
        )
    for c in advice:
        return Finding(step, name, c.status, c.message, c.fix)
    what = "CDI delivery" if needs_cdi else "device-node delivery needs nothing special"
    return Finding(step, name, "pass", f"{where}: {what} ({found})")


async def check_runtime(
    settings: DoctorSettings, needs_cdi: bool, backends: Sequence[Backend]
) -> list[Finding]:
    out = []
    sources = (("containerd", settings.containerd_config), ("docker", settings.docker_config))
    for name, rel in sources:
        path = settings.path(rel)
        if not path.exists():
            continue
        try:
            view = (
                containerd_view(path, settings.root) if name == "containerd" else docker_view(path)
            )
        except (ValueError, OSError, TypeError) as e:
            out.append(
                Finding(
                    "runtime",
                    name,
                    "fail",
                    f"{path} cannot be read: {e}",
                    f"fix the syntax of {path}; {name} itself refuses to start with it",
                )
            )
            continue
        advice = await _advice(backends, view, needs_cdi, settings)
        out.append(_judge_runtime(view, settings, needs_cdi, advice))
    if not out:
        missing = ", ".join(str(settings.path(p)) for _, p in sources)
        status = (
            "warn" if needs_cdi or any(b.implements("runtime_advice") for b in backends) else "skip"
        )
        out.append(
            Finding(
                "runtime",
                "container runtime",
                status,
                f"no container runtime config found ({missing})",
                "point --containerd-config / --docker-config at the runtime's config "
                "(CRI-O: check /etc/crio/crio.conf.d by hand)",
            )
        )
    return out


async def _advice(
    backends: Sequence[Backend], view: RuntimeView, needs_cdi: bool, settings: DoctorSettings
) -> list[Check]:
    """Each backend's advice on this runtime (its ``runtime_advice`` hook); a hook that
    fails is a failing check naming it."""
    out = []
    for b in backends:
        if not b.implements("runtime_advice"):
            continue
        try:
            out += await b.call(
                "runtime_advice", runtime=view, needs_cdi=needs_cdi, root=str(settings.root)
            )
        except BackendError as e:
            out.append(Check(f"{b.name} advice", "fail", f"the backend's advice crashed: {e}"))
    return out
