"""Step 4, the kubelet side: its device-plugin dir, ``kubelet.sock`` and the plugin's sockets."""

from __future__ import annotations

from pathlib import Path

from hetero_dp.engine.config import Config
from hetero_dp.kits.sockets import socket_listens as listens
from hetero_dp.model.names import KUBELET_SOCKET
from hetero_dp.ops.doctor.findings import DoctorSettings, Finding

CONNECT_TIMEOUT = 1.0


# --- kubelet and plugin sockets --------------------------------------------------------------


def socket_listens(path: Path) -> bool | None:
    """True if something accepts connections on the unix socket, False if it is stale,
    None if ``path`` is not a socket (:func:`hetero_dp.kits.sockets.socket_listens`)."""
    return listens(path, CONNECT_TIMEOUT)


def check_kubelet(config: Config, settings: DoctorSettings) -> list[Finding]:
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
