#!/usr/bin/env python3
"""Build every image we ship, where a container engine runs (``make images``).

- ``ghcr.io/hetero-dp/hetero-dp-nvidia:<version>`` from deploy/nvidia/Dockerfile
- ``ghcr.io/hetero-dp/hetero-dp-udev:<version>`` from deploy/udev/Dockerfile
  (both with the repository root as the build context, see .dockerignore)
- the image of a project that ``hetero-dp new --wheels`` generates, built from that
  project's directory alone, with hetero-dp's wheel (``python -m build``) in wheels/

The engine is docker, else podman (or $CONTAINER_ENGINE); it must answer ``info``.
Where none does, this says plainly that it skipped and why, and exits 0: a machine
without an engine cannot build images, and that is not a failure of the images.
``--require`` makes it exit 1 instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def engine() -> tuple[str | None, str]:
    """(engine command, or None with the reason)."""
    reasons = []
    names = [os.environ.get("CONTAINER_ENGINE", ""), "docker", "podman"]
    for name in [n for n in names if n]:
        path = shutil.which(name)
        if path is None:
            reasons.append(f"no {name}")
            continue
        info = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        if info.returncode == 0:
            return path, ""
        last = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        reasons.append(f"{name} is installed but its engine does not answer ({last})")
    return None, "; ".join(reasons)


def build(tool: str, tag: str, dockerfile: Path, context: Path) -> None:
    print(f"images: building {tag} from {dockerfile}", flush=True)
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    subprocess.run(
        [tool, "build", "-f", str(dockerfile), "-t", tag, str(context)], check=True, env=env
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--require", action="store_true", help="fail where no engine runs")
    args = parser.parse_args()
    tool, why = engine()
    if tool is None:
        print(f"images: SKIPPED, no image was built: {why}", file=sys.stderr)
        return 1 if args.require else 0

    from hetero_dp import __version__, scaffold

    for backend in ("nvidia", "udev"):
        tag = f"ghcr.io/hetero-dp/hetero-dp-{backend}:{__version__}"
        build(tool, tag, ROOT / "deploy" / backend / "Dockerfile", ROOT)
    with tempfile.TemporaryDirectory(prefix="hetero-dp-images-") as tmp:
        dist = Path(tmp) / "dist"
        subprocess.run(
            [sys.executable, "-m", "build", "-q", "--wheel", "--outdir", str(dist), str(ROOT)],
            check=True,
        )
        values = {
            "vendor_domain": "acme.example.com",
            "resource": "npu",
            "device_glob": "/dev/acme*",
        }
        project, _ = scaffold.generate(values, Path(tmp) / "acme", wheels=dist)
        build(tool, "localhost/acme-npu-device-plugin:0.1.0", project / "Dockerfile", project)
    print("images: all built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
