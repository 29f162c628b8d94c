"""``hetero-dp doctor``: the troubleshooting chain of an accelerator node, in order.

Hardware and driver first (the backends' own ``doctor`` checks), then the
devices, then the container runtime, then the kubelet side (``kubelet.sock``
and the plugin's sockets beside it), then the running daemon (``/readyz``),
then what the daemon writes (CDI specs, the node label file). The scheduler
comes last because it is almost never the culprit. Each finding is ``pass``,
``warn``, ``fail`` or ``skip`` (not applicable here) and says how to fix it.

Every path is read under ``root`` (``--root``), so tests run the whole chain
against a fake node tree.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import re
import socket
import stat
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from hetero_dp.allocation.cdi import device_name_problem, kind_problem
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.model.errors import BackendError, ConfigError
from hetero_dp.model.names import KUBELET_SOCKET
from hetero_dp.ops.labels import file_name, label_problem
from hetero_dp.ops.probes import parse_address

try:
    import tomllib
except ImportError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

STATUSES = ("pass", "warn", "fail", "skip")
CONNECT_TIMEOUT = 1.0
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


@dataclass
class Finding:
    step: str
    name: str
    status: str
    message: str
    fix: str = ""


@dataclass
class DoctorSettings:
    """Where doctor looks. Every path is taken under ``root``."""

    root: Path = Path("/")
    containerd_config: str = "/etc/containerd/config.toml"
    docker_config: str = "/etc/docker/daemon.json"
    cdi_dirs: Sequence[str] = ()  # default: the config's cdi.dir and /etc/cdi
    daemon_address: str = ""  # default: the config's metrics.address
    http_timeout: float = 3.0

    def path(self, p: str | Path) -> Path:
        return Path(self.root) / str(p).lstrip("/")


# --- the chain -------------------------------------------------------------------------------


async def run_doctor(
    config: Config, backends: Sequence[Backend], settings: DoctorSettings
) -> list[Finding]:
    """Walk the chain; never raises for what it finds (that is what findings are for)."""
    out: list[Finding] = []
    out += await _driver(config, backends)
    device_findings, resources = await _devices(config, backends)
    out += device_findings
    needs = _needs(config, backends, resources)  # resources: name -> effective settings
    out += _runtime(settings, needs)
    out += _kubelet(config, settings)
    out += _daemon(config, settings)
    out += _cdi_specs(config, settings, needs)
    out += _labels(config, settings, backends)
    return out


def _needs(
    config: Config, backends: Sequence[Backend], resources: Mapping[str, Mapping[str, Any]]
) -> set[str]:
    """What the runtime must offer: ``cdi`` and/or ``nvidia``."""
    needs = set()
    if config.cdi.get("enabled"):
        needs.add("cdi")
    for settings in [*resources.values(), *config.resources.values()]:
        deliver = settings.get("deliver") or []
        deliver = [deliver] if isinstance(deliver, str) else deliver
        if any(str(s).startswith("cdi") for s in deliver):
            needs.add("cdi")
    if any(b.name == NVIDIA_RUNTIME for b in backends) or any(
        r.startswith("nvidia.com/") for r in resources
    ):
        needs.add("nvidia")
    return needs


async def _driver(config: Config, backends: Sequence[Backend]) -> list[Finding]:
    if not backends:
        return [
            Finding(
                "driver",
                "backend checks",
                "skip",
                "no backend given, so no driver checks",
                "name the backends the node runs: hetero-dp doctor nvidia",
            )
        ]
    out = []
    for b in backends:
        if not b.implements("doctor"):
            out.append(Finding("driver", b.name, "skip", f"backend {b.name!r} offers no checks"))
            continue
        try:
            options = b.read_options_from(config)
        except ConfigError as e:
            out.append(
                Finding(
                    "driver",
                    b.name,
                    "fail",
                    f"backend {b.name!r} refuses its options: {e}",
                    "fix the option the message names (where it was written: "
                    f"backends.{b.name}, or NVIDIA's flags); hetero-dp list --options {b.name} "
                    "lists them all",
                )
            )
            continue
        try:
            checks = await b.doctor(options)
        except BackendError as e:
            out.append(
                Finding(
                    "driver",
                    b.name,
                    "fail",
                    f"the backend's own checks crashed: {e.__cause__ or e}",
                    f"run hetero-dp list {b.name} for the backend's error; check its driver",
                )
            )
            continue
        for c in checks:
            status = c.status if c.status in STATUSES else "warn"
            out.append(Finding("driver", f"{b.name}: {c.name}", status, c.message, c.fix))
    return out


async def _devices(
    config: Config, backends: Sequence[Backend]
) -> tuple[list[Finding], dict[str, dict[str, Any]]]:
    """Configure and discover each backend once; also each resource's effective settings
    (the backend's ``resource_defaults`` under the config's section)."""
    out: list[Finding] = []
    resources: dict[str, dict[str, Any]] = {}
    for b in backends:
        try:
            try:
                await b.configure_from(config)
            except ConfigError as e:
                out.append(
                    Finding(
                        "devices",
                        b.name,
                        "fail",
                        f"backend {b.name!r} refuses its options: {e}",
                        f"fix the named field of backends.{b.name} in the config",
                    )
                )
                continue
            try:
                devices = await b.discover()
            except BackendError as e:
                out.append(
                    Finding(
                        "devices",
                        b.name,
                        "fail",
                        f"discovery failed: {e.__cause__ or e}",
                        "fix the driver problem above first; then hetero-dp list " + b.name,
                    )
                )
                continue
            for name in sorted({d.resource for d in devices}):
                try:
                    defaults = await b.resource_defaults(name)
                except BackendError:
                    defaults = {}
                resources[name] = {**defaults, **config.resource_settings(name)}
        finally:
            with contextlib.suppress(BackendError):
                await b.call("shutdown", timeout=5)
        if not devices:
            out.append(
                Finding(
                    "devices",
                    b.name,
                    "fail",
                    f"backend {b.name!r} found no devices",
                    "check that the hardware is present (lspci) and its driver is loaded "
                    "(the driver checks above); hetero-dp list " + b.name,
                )
            )
            continue
        counts: dict[str, int] = {}
        for d in devices:
            counts[d.resource] = counts.get(d.resource, 0) + 1
        summary = ", ".join(f"{r}: {n}" for r, n in sorted(counts.items()))
        sick = [d for d in devices if not d.healthy]
        if sick:
            shown = "; ".join(f"{d.id}: {d.reason or 'unhealthy'}" for d in sick[:5])
            out.append(
                Finding(
                    "devices",
                    b.name,
                    "warn",
                    f"{len(devices)} devices ({summary}); {len(sick)} unhealthy: {shown}",
                    "the reasons name the fault; the plugin advertises these as Unhealthy",
                )
            )
        else:
            out.append(Finding("devices", b.name, "pass", f"{len(devices)} devices ({summary})"))
    return out, resources


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


def _runtime(settings: DoctorSettings, needs: set[str]) -> list[Finding]:
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


# --- kubelet and plugin sockets --------------------------------------------------------------


def socket_listens(path: Path) -> bool | None:
    """True if something accepts connections on the unix socket, False if it is stale,
    None if ``path`` is not a socket."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return None
    except FileNotFoundError:
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(CONNECT_TIMEOUT)
    try:
        s.connect(str(path))
        return True
    except OSError as e:
        # refused: stale; anything else (a full backlog, a timeout): someone is there
        return e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        s.close()


def _kubelet(config: Config, settings: DoctorSettings) -> list[Finding]:
    step = "kubelet"
    kdir = settings.path(config.kubelet_dir)
    if not kdir.is_dir():
        return [
            Finding(
                step,
                "device-plugin dir",
                "fail",
                f"{kdir} does not exist",
                "is this a Kubernetes node? Mount the host's /var/lib/kubelet/device-plugins "
                "into the plugin pod (hostPath) and keep kubeletDir equal to the kubelet's "
                "--root-dir plus /device-plugins",
            )
        ]
    out = []
    sock = kdir / KUBELET_SOCKET
    listens = socket_listens(sock)
    if config.registration == "watcher":
        reg = settings.path(config.plugins_registry_dir)
        if reg.is_dir():
            out.append(Finding(step, "plugins_registry", "pass", f"{reg} exists (watcher mode)"))
        else:
            out.append(
                Finding(
                    step,
                    "plugins_registry",
                    "fail",
                    f"{reg} does not exist (registration: watcher)",
                    "mount the host's /var/lib/kubelet/plugins_registry into the plugin pod",
                )
            )
    elif listens is None:
        out.append(
            Finding(
                step,
                "kubelet.sock",
                "fail",
                f"no kubelet.sock in {kdir}: the kubelet is not running, or this is not "
                "the dir it serves",
                "systemctl status kubelet; check that the pod mounts the host's "
                f"device-plugin dir at {config.kubelet_dir}",
            )
        )
    elif not listens:
        out.append(
            Finding(
                step,
                "kubelet.sock",
                "fail",
                f"{sock} exists but nobody listens on it (stale): the kubelet is down",
                "systemctl restart kubelet; journalctl -u kubelet says why it stopped",
            )
        )
    else:
        out.append(Finding(step, "kubelet.sock", "pass", f"the kubelet listens on {sock}"))

    prefix = config.socket_prefix + "-"
    ours = sorted(p for p in kdir.iterdir() if p.name.startswith(prefix) and p.suffix == ".sock")
    if not ours:
        out.append(
            Finding(
                step,
                "plugin sockets",
                "warn",
                f"no {prefix}*.sock beside kubelet.sock in {kdir}: the plugin is not serving here",
                f"is the daemon running with kubeletDir {config.kubelet_dir} and socketPrefix "
                f"{config.socket_prefix}? Its log says why it did not start",
            )
        )
    for p in ours:
        state = socket_listens(p)
        if state is None:
            out.append(
                Finding(
                    step,
                    p.name,
                    "fail",
                    f"{p} is not a socket",
                    f"remove it (rm {p}); the plugin creates its own sockets",
                )
            )
        elif not state:
            out.append(
                Finding(
                    step,
                    p.name,
                    "fail",
                    f"stale plugin socket {p}: nobody listens (a plugin died without cleaning "
                    "up, or it runs with another kubeletDir); the kubelet's dial-back fails",
                    f"restart the plugin (it replaces stale sockets at start) or rm {p}",
                )
            )
        else:
            out.append(Finding(step, p.name, "pass", f"the plugin listens on {p}"))
    return out


# --- the running daemon ----------------------------------------------------------------------


def _daemon(config: Config, settings: DoctorSettings) -> list[Finding]:
    step = "daemon"
    address = settings.daemon_address or str(config.metrics.get("address") or "")
    if not address:
        return [
            Finding(
                step,
                "readyz",
                "skip",
                "no metrics.address configured, so there is no /readyz to ask",
                "set metrics.address (e.g. ':9435') or pass --daemon-address",
            )
        ]
    try:
        host, port = parse_address(address)
    except ConfigError as e:
        return [Finding(step, "readyz", "fail", str(e), "fix metrics.address")]
    if host in (None, "0.0.0.0", "::"):
        host = "127.0.0.1"
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=settings.http_timeout) as resp:
            body = resp.read().decode(errors="replace").strip()
            return [Finding(step, "readyz", "pass", f"{url}: {body.replace(chr(10), '; ')}")]
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace").strip().replace("\n", "; ")
        return [
            Finding(
                step,
                "readyz",
                "fail",
                f"{url} answers {e.code}: {body}",
                "a resource that is not registered or has no ListAndWatch stream: look at the "
                "kubelet checks above and the daemon's log for that resource",
            )
        ]
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return [
            Finding(
                step,
                "readyz",
                "fail",
                f"no daemon answers at {url}: {reason}",
                "is the plugin running (kubectl get pods -o wide on this node)? Its log says "
                "why it stopped; the address must match its metrics.address",
            )
        ]


# --- CDI specs -------------------------------------------------------------------------------

_SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
EDIT_KEYS = {
    "env",
    "deviceNodes",
    "hooks",
    "mounts",
    "intelRdt",
    "additionalGids",
    "netDevices",
}


def _edits_problems(edits: Any, where: str) -> list[str]:
    if not isinstance(edits, Mapping):
        return [f"{where}: containerEdits must be a mapping"]
    out = []
    unknown = sorted(set(edits) - EDIT_KEYS)
    if unknown:
        out.append(f"{where}: unknown containerEdits key {unknown[0]!r}")
    for i, env in enumerate(edits.get("env") or []):
        if not isinstance(env, str) or "=" not in env:
            out.append(f"{where}.env[{i}]: {env!r} is not KEY=VALUE")
    for i, node in enumerate(edits.get("deviceNodes") or []):
        if not isinstance(node, Mapping) or not str(node.get("path", "")).startswith("/"):
            out.append(f"{where}.deviceNodes[{i}]: needs an absolute path")
    for i, m in enumerate(edits.get("mounts") or []):
        if not isinstance(m, Mapping) or not m.get("hostPath") or not m.get("containerPath"):
            out.append(f"{where}.mounts[{i}]: needs hostPath and containerPath")
    return out


def spec_problems(doc: Any) -> list[str]:
    """Structural problems of one CDI spec (the fields runtimes refuse a spec for)."""
    if not isinstance(doc, Mapping):
        return ["the spec is not a mapping"]
    out = []
    version = doc.get("cdiVersion")
    if not isinstance(version, str) or not _SEMVER.match(version):
        out.append(f"cdiVersion {version!r} is not a version like '0.6.0'")
    problem = kind_problem(doc.get("kind"))  # the same rules our spec writer follows
    if problem:
        out.append(problem)
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        out.append("devices must be a non-empty list")
        devices = []
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        if not isinstance(dev, Mapping):
            out.append(f"devices[{i}] is not a mapping")
            continue
        name = dev.get("name")
        problem = device_name_problem(name)
        if problem:
            out.append(f"devices[{i}]: {problem}")
        elif name in seen:
            out.append(f"devices[{i}]: device {name!r} defined twice")
        else:
            seen.add(str(name))
        edits = dev.get("containerEdits")
        if not edits:
            out.append(f"devices[{i}] ({name}): containerEdits must not be empty")
        else:
            out.extend(_edits_problems(edits, f"devices[{i}]"))
    if doc.get("containerEdits"):
        out.extend(_edits_problems(doc["containerEdits"], "containerEdits"))
    return out


def _cdi_specs(config: Config, settings: DoctorSettings, needs: set[str]) -> list[Finding]:
    step = "cdi"
    dirs = list(dict.fromkeys(settings.cdi_dirs or [str(config.cdi["dir"]), "/etc/cdi"]))
    files = [
        p
        for d in dirs
        if settings.path(d).is_dir()
        for p in sorted(settings.path(d).iterdir())
        if p.suffix in (".json", ".yaml", ".yml") and not p.name.startswith(".")
    ]
    where = ", ".join(str(settings.path(d)) for d in dirs)
    if not files:
        if "cdi" in needs:
            return [
                Finding(
                    step,
                    "cdi specs",
                    "fail",
                    f"CDI delivery is configured but there is no spec in {where}",
                    "the daemon writes its spec once it runs: check its log for CDI write "
                    "errors, and that cdi.dir is mounted from the host",
                )
            ]
        return [Finding(step, "cdi specs", "skip", f"no CDI specs in {where}; CDI is not used")]
    out = []
    good = []
    for p in files:
        try:
            text = p.read_text()
            doc = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as e:
            out.append(
                Finding(
                    step,
                    p.name,
                    "fail",
                    f"{p} does not parse: {e}",
                    "remove or regenerate it (restarting the plugin rewrites its own specs); "
                    "the runtime refuses every device of a broken spec",
                )
            )
            continue
        problems = spec_problems(doc)
        if problems:
            shown = "; ".join(problems[:5]) + (
                f" (+{len(problems) - 5} more)" * (len(problems) > 5)
            )
            out.append(
                Finding(
                    step,
                    p.name,
                    "fail",
                    f"{p} is not a valid CDI spec: {shown}",
                    "remove or regenerate it (restarting the plugin rewrites its own specs); "
                    "the runtime refuses every device of an invalid spec",
                )
            )
        else:
            good.append(f"{p.name} ({doc['kind']}, {len(doc['devices'])} devices)")
    if good:
        out.append(Finding(step, "cdi specs", "pass", "valid: " + ", ".join(good)))
    return out


# --- labels ----------------------------------------------------------------------------------


def _labels(config: Config, settings: DoctorSettings, backends: Sequence[Backend]) -> list[Finding]:
    step = "labels"
    if not config.labels.get("enabled"):
        return [Finding(step, "label file", "skip", "labels.enabled is false")]
    directory = settings.path(config.labels["dir"])
    prefix = config.socket_prefix
    if backends:
        paths = [directory / file_name(prefix, [b.name for b in backends])]
        missing = f"{paths[0]} does not exist"
    else:  # any daemon's file: <prefix>-<backends>
        paths = sorted(directory.glob(f"{prefix}-*")) if directory.is_dir() else []
        missing = f"no {prefix}-* label file in {directory}"
    paths = [p for p in paths if p.is_file()]
    if not paths:
        return [
            Finding(
                step,
                "label file",
                "fail",
                missing,
                "the daemon writes it once it publishes devices: check that it runs with "
                "labels.enabled (or --labels-dir) and that labels.dir is mounted from the "
                "host's /etc/kubernetes/node-feature-discovery/features.d",
            )
        ]
    return [_label_file(step, p) for p in paths]


def _label_file(step: str, path: Path) -> Finding:
    bad = []
    count = 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        problem = "not key=value" if not sep else label_problem(key, value)
        if problem:
            bad.append(f"line {n}: {problem}")
        count += 1
    if bad:
        return Finding(
            step,
            path.name,
            "fail",
            f"{path}: " + "; ".join(bad[:5]),
            "Node Feature Discovery skips invalid lines; remove the file and let the "
            "daemon rewrite it",
        )
    return Finding(step, path.name, "pass", f"{path}: {count} labels")


# --- output ----------------------------------------------------------------------------------


def exit_code(findings: Iterable[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0


def render_json(findings: Sequence[Finding]) -> str:
    first = next((f for f in findings if f.status == "fail"), None)
    return json.dumps(
        {
            "ok": first is None,
            "first_failure": asdict(first) if first else None,
            "checks": [asdict(f) for f in findings],
        },
        indent=2,
    )


def render_text(findings: Sequence[Finding]) -> str:
    lines = []
    width = max((len(f.step) for f in findings), default=0)
    for f in findings:
        lines.append(f"{f.status.upper():<4}  {f.step:<{width}}  {f.name}: {f.message}")
        if f.fix and f.status in ("warn", "fail"):
            lines.append(f"      {'':<{width}}  fix: {f.fix}")
    fails = [f for f in findings if f.status == "fail"]
    warns = sum(1 for f in findings if f.status == "warn")
    if fails:
        lines.append(
            f"{len(fails)} failed, {warns} warnings. Start with the first failure "
            f"({fails[0].step}: {fails[0].name}): later ones often follow from it."
        )
    else:
        lines.append(f"no failures, {warns} warnings.")
    return "\n".join(lines)
