"""What doctor finds (a ``Finding`` per check), where it looks (``DoctorSettings``), and how
findings are shown (text, JSON) and turned into an exit code."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

STATUSES = ("pass", "warn", "fail", "skip")


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
