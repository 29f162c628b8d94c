"""Step 3, the container runtime: containerd's or Docker's config, read for the runtimes it
defines, the default one and whether CDI is on."""

from __future__ import annotations

from hetero_dp.kits.runtimeconf import (
    RuntimeView,
    containerd_view,
    docker_view,
    runtime_cdi_off,
)
from hetero_dp.ops.doctor.findings import DoctorSettings, Finding

__all__ = ["RuntimeView", "check_runtime", "containerd_view", "docker_view", "runtime_cdi_off"]


NVIDIA_RUNTIME = "nvidia"
NVIDIA_CTK = (
    "nvidia-ctk runtime configure --runtime={runtime} --set-as-default, then restart {runtime}"
)
UNKNOWN_RUNTIME = (
    '"Unknown runtime specified nvidia" (Docker) or \'no runtime for "nvidia" is configured\' '
    "(containerd) means exactly this: something asks for the runtime named nvidia "
    "(default runtime, --runtime=nvidia or a RuntimeClass handler) but the runtime's config "
    "does not define it, or the runtime was not restarted after it was added"
)


# --- container runtime -----------------------------------------------------------------------


def _judge_runtime(view: RuntimeView, settings: DoctorSettings, needs: set[str]) -> Finding:
    name, where = view.name, view.path
    step = "runtime"
    enable_cdi = (
        f'set enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"] in {where} '
        "(containerd 1.7; 2.x has it on by default) and restart containerd"
        if name == "containerd"
        else f'add "features": {{"cdi": true}} to {where} and restart dockerd'
    )
    if view.default == NVIDIA_RUNTIME and NVIDIA_RUNTIME not in view.runtimes:
        return Finding(
            step,
            name,
            "fail",
            f"{where}: the default runtime is nvidia but no runtime named nvidia is defined. "
            + UNKNOWN_RUNTIME,
            NVIDIA_CTK.format(runtime=name),
        )
    binary = view.runtimes.get(NVIDIA_RUNTIME, "")
    if binary.startswith("/") and not settings.path(binary).exists():
        return Finding(
            step,
            name,
            "fail",
            f"{where}: the nvidia runtime points at {binary}, which does not exist",
            "install the NVIDIA Container Toolkit (package nvidia-container-toolkit)",
        )
    found = (
        f"runtimes: {', '.join(sorted(view.runtimes)) or 'none'}; default {view.default}; "
        f"CDI {'on' if view.cdi else 'off'}"
    )
    if "cdi" in needs and not view.cdi:
        return Finding(
            step,
            name,
            "fail",
            f"{where}: CDI delivery is configured but {name} has CDI off ({found})",
            enable_cdi,
        )
    if "nvidia" in needs and "cdi" not in needs:
        if view.default == NVIDIA_RUNTIME:
            return Finding(step, name, "pass", f"{where}: nvidia is the default runtime ({found})")
        if NVIDIA_RUNTIME in view.runtimes:
            return Finding(
                step,
                name,
                "warn",
                f"{where}: the nvidia runtime is defined but not the default ({found}); only "
                "pods with runtimeClassName: nvidia get GPU libraries",
                f"make it the default ({NVIDIA_CTK.format(runtime=name)}) or create a "
                "RuntimeClass nvidia and use it in GPU pods",
            )
        return Finding(
            step,
            name,
            "fail",
            f"{where}: no nvidia runtime and no CDI delivery ({found}): containers get the "
            "device nodes but not the driver libraries. " + UNKNOWN_RUNTIME,
            NVIDIA_CTK.format(runtime=name) + "; or deliver with CDI and " + enable_cdi,
        )
    what = "CDI delivery" if "cdi" in needs else "device-node delivery needs nothing special"
    return Finding(step, name, "pass", f"{where}: {what} ({found})")


def check_runtime(settings: DoctorSettings, needs: set[str]) -> list[Finding]:
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
        out.append(_judge_runtime(view, settings, needs))
    if not out:
        missing = ", ".join(str(settings.path(p)) for _, p in sources)
        status = "warn" if needs else "skip"
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
