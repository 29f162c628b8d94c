"""Step 5, the running daemon: its ``/readyz``."""

from __future__ import annotations

import urllib.error
import urllib.request

from hetero_dp.engine.config import Config
from hetero_dp.model.errors import ConfigError
from hetero_dp.ops.doctor.findings import DoctorSettings, Finding
from hetero_dp.ops.probes import parse_address

# --- the running daemon ----------------------------------------------------------------------


def check_daemon(config: Config, settings: DoctorSettings) -> list[Finding]:
    step = "daemon"
    address = settings.daemon_address or config.metrics.address
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
