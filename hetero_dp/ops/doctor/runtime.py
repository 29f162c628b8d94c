"""Step 3, the container runtime: containerd's or Docker's config, read for the runtimes it
defines, the default one and whether CDI is on."""

from __future__ import annotations

import glob
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_dp.ops.doctor.findings import DoctorSettings, Finding

log = logging.getLogger(__name__)

try:
    import tomllib
except ImportError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]


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


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def _read_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise ValueError("cannot read TOML on this Python (install tomli)")
    with path.open("rb") as f:
        return dict(tomllib.load(f))


@dataclass
class RuntimeView:
    """What a runtime config says about the nvidia runtime and CDI."""

    name: str
    path: Path
    runtimes: dict[str, str]  # runtime name -> binary ('' if not given)
    default: str
    cdi: bool


def containerd_view(path: Path, settings: DoctorSettings) -> RuntimeView:
    """Read containerd's config (v1, v2 or v3 schema, drop-in imports merged)."""
    doc = _read_toml(path)
    for pattern in doc.get("imports") or []:
        for extra in sorted(glob.glob(str(settings.path(pattern)))):
            _deep_merge(doc, _read_toml(Path(extra)))
    version = int(doc.get("version", 1))
    runtimes: dict[str, str] = {}
    default = ""
    # containerd 2.x (config v3) turns CDI on by default; 1.7 (config v2) does not
    cdi = version >= 3
    for plugin_name, plugin in (doc.get("plugins") or {}).items():
        if not isinstance(plugin, Mapping) or "cri" not in plugin_name:
            continue
        if "enable_cdi" in plugin:
            cdi = bool(plugin["enable_cdi"])
        ctd = plugin.get("containerd") or {}
        default = str(ctd.get("default_runtime_name") or default)
        for rname, rt in (ctd.get("runtimes") or {}).items():
            options = rt.get("options") or {} if isinstance(rt, Mapping) else {}
            runtimes[rname] = str(options.get("BinaryName", ""))
    return RuntimeView("containerd", path, runtimes, default or "runc", cdi)


def docker_view(path: Path) -> RuntimeView:
    doc = json.loads(path.read_text() or "{}")
    if not isinstance(doc, dict):
        raise ValueError("the top level is not a JSON object")
    runtimes = {
        str(k): str(v.get("path", "")) if isinstance(v, Mapping) else ""
        for k, v in (doc.get("runtimes") or {}).items()
    }
    features = doc.get("features") or {}
    return RuntimeView(
        "docker",
        path,
        runtimes,
        str(doc.get("default-runtime") or "runc"),
        bool(features.get("cdi")),
    )


def runtime_cdi_off(path: Path) -> str | None:
    """Why the runtime whose config is ``path`` cannot consume CDI, or None when it can
    (or when ``path`` cannot be read: that is logged, and nothing is assumed).

    The same reading as the runtime step: containerd's config.toml (CDI on from config
    version 3, containerd 2.x; ``enable_cdi`` under the CRI plugin for 1.7; 1.6 has no
    CDI), or dockerd's daemon.json (``features.cdi``). A config mounted elsewhere
    (``/host/etc/containerd/config.toml``) has its imports read from there. The daemon
    calls it for ``cdi.runtimeConfig``.
    """
    root = Path("/")
    for tail in ("etc/containerd/config.toml", "etc/docker/daemon.json"):
        if str(path).endswith("/" + tail):
            root = Path(str(path)[: -len(tail)])
    try:
        if path.suffix == ".json":
            view = docker_view(path)
        else:
            view = containerd_view(path, DoctorSettings(root=root))
    except (ValueError, OSError, TypeError) as e:
        log.warning("cannot tell whether the container runtime has CDI: %s: %s", path, e)
        return None
    if view.cdi:
        return None
    fix = (
        'enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"] (containerd 1.7+)'
        if view.name == "containerd"
        else '"features": {"cdi": true} (docker 25+)'
    )
    return f"{view.name} has CDI off ({path}; to turn it on: {fix})"


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
            view = containerd_view(path, settings) if name == "containerd" else docker_view(path)
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
