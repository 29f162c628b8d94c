"""What doctor says about the container runtime for NVIDIA GPUs (``runtime_advice``).

A container gets the driver's libraries and utilities only through the NVIDIA
Container Toolkit: the runtime named ``nvidia`` (the default runtime, or a
RuntimeClass handler), or CDI specs. The message for the toolkit missing from the
runtime's config is the one users search for: Docker says "Unknown runtime
specified nvidia", containerd 'no runtime for "nvidia" is configured'
(NVIDIA Container Toolkit install guide, "Configuring containerd / Docker").
"""

from __future__ import annotations

from pathlib import Path

from hetero_dp import Check

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


def advice(runtime: object, needs_cdi: bool, root: str) -> Check | None:
    """The runtime as NVIDIA GPUs need it (``runtime``: a RuntimeView)."""
    name: str = runtime.name
    where = runtime.path
    runtimes: dict[str, str] = runtime.runtimes
    default: str = runtime.default
    cdi: bool = runtime.cdi
    check = "nvidia runtime"
    if default == NVIDIA_RUNTIME and NVIDIA_RUNTIME not in runtimes:
        return Check(
            check,
            "fail",
            f"{where}: the default runtime is nvidia but no runtime named nvidia is defined. "
            + UNKNOWN_RUNTIME,
            NVIDIA_CTK.format(runtime=name),
        )
    binary = runtimes.get(NVIDIA_RUNTIME, "")
    if binary.startswith("/") and not (Path(root) / binary.lstrip("/")).exists():
        return Check(
            check,
            "fail",
            f"{where}: the nvidia runtime points at {binary}, which does not exist",
            "install the NVIDIA Container Toolkit (package nvidia-container-toolkit)",
        )
    if needs_cdi:
        return None  # CDI specs carry the driver's files; the core checks CDI is on
    found = (
        f"runtimes: {', '.join(sorted(runtimes)) or 'none'}; default {default}; "
        f"CDI {'on' if cdi else 'off'}"
    )
    if default == NVIDIA_RUNTIME:
        return Check(check, "pass", f"{where}: nvidia is the default runtime ({found})")
    if NVIDIA_RUNTIME in runtimes:
        return Check(
            check,
            "warn",
            f"{where}: the nvidia runtime is defined but not the default ({found}); only "
            "pods with runtimeClassName: nvidia get GPU libraries",
            f"make it the default ({NVIDIA_CTK.format(runtime=name)}) or create a "
            "RuntimeClass nvidia and use it in GPU pods",
        )
    enable_cdi = (
        f'set enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"] in {where} '
        "(containerd 1.7; 2.x has it on by default) and restart containerd"
        if name == "containerd"
        else f'add "features": {{"cdi": true}} to {where} and restart dockerd'
    )
    return Check(
        check,
        "fail",
        f"{where}: no nvidia runtime and no CDI delivery ({found}): containers get the "
        "device nodes but not the driver libraries. " + UNKNOWN_RUNTIME,
        NVIDIA_CTK.format(runtime=name) + "; or deliver with CDI and " + enable_cdi,
    )
