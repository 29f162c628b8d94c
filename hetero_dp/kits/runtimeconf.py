"""What a container runtime's config says: the runtimes it defines, its default one,
and whether CDI is on (containerd's config.toml, dockerd's daemon.json).

Read by the daemon (a CDI delivery the runtime would ignore falls back) and by
doctor's runtime step. Sources: containerd's config reference (docs/cri/config.md:
``enable_cdi`` under the CRI plugin; CDI on by default from config version 3,
containerd 2.0) and dockerd's daemon.json reference (``features.cdi``).
"""

from __future__ import annotations

import glob
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_dp.kits.foreign import parse_foreign, read_foreign
from hetero_dp.kits.mappings import deep_merge

try:
    import tomllib
except ImportError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MAX_RUNTIME_CONFIG = 4 * 1024 * 1024  # containerd's config.toml is a few KiB


def _read_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise ValueError("cannot read TOML on this Python (install tomli)")
    # the host's file, mounted: read as any file another wrote (a FIFO must not block)
    data = read_foreign(path, max_bytes=MAX_RUNTIME_CONFIG, follow=True)
    try:
        return dict(tomllib.loads(data.decode("utf-8")))
    except RecursionError:
        raise ValueError("nested too deeply") from None


@dataclass
class RuntimeView:
    """What a runtime config says: its runtimes (and binaries), the default one, CDI."""

    name: str
    path: Path
    runtimes: dict[str, str]  # runtime name -> binary ('' if not given)
    default: str
    cdi: bool


def containerd_view(path: Path, root: Path = Path("/")) -> RuntimeView:
    """Read containerd's config (v1, v2 or v3 schema, drop-in imports merged; their
    paths taken under ``root``)."""
    doc = _read_toml(path)
    for pattern in doc.get("imports") or []:
        for extra in sorted(glob.glob(str(root / str(pattern).lstrip("/")))):
            doc = deep_merge(doc, _read_toml(Path(extra)))
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
    raw = read_foreign(path, max_bytes=MAX_RUNTIME_CONFIG, follow=True)
    doc = parse_foreign(raw, as_json=True) if raw.strip() else {}
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
    calls it for ``cdi.runtimeConfig``; doctor's runtime step reads the same views.
    """
    root = Path("/")
    for tail in ("etc/containerd/config.toml", "etc/docker/daemon.json"):
        if str(path).endswith("/" + tail):
            root = Path(str(path)[: -len(tail)])
    try:
        view = docker_view(path) if path.suffix == ".json" else containerd_view(path, root)
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
