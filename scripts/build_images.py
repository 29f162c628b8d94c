#!/usr/bin/env python3
"""Build every image we ship, where a container engine runs (``make images``).

- ``ghcr.io/hetero-dp/hetero-dp-nvidia:<version>`` from deploy/nvidia/Dockerfile
- ``ghcr.io/hetero-dp/hetero-dp-udev:<version>`` from deploy/udev/Dockerfile
  (both with the repository root as the build context, see .dockerignore)
- ``localhost/acme-npu-device-plugin:0.1.0``: the image of a project that
  ``hetero-dp new --wheels`` generates, built from that project's directory alone,
  with hetero-dp's wheel (``python -m build``) in wheels/

The engine is $CONTAINER_ENGINE, else docker, else podman; it must answer ``info``.
Where none does, this says plainly that it skipped and why, and exits 0: a machine
without an engine cannot build images, and that is not a failure of the images.
``--require`` (or CI=true) makes it exit 1 instead.

The base image. The Dockerfiles start from ``ARG PYTHON_IMAGE`` (an official Python
image). Where that image cannot be pulled (no registry reachable), this builds a
stand-in from Debian packages with ``mmdebstrap`` (Debian's python3, pip, venv and
ca-certificates; no ``EXTERNALLY-MANAGED`` marker, as the official images have none),
imports it into the engine and passes it as ``--build-arg PYTHON_IMAGE=...``, and says
so. The stand-in's tag carries a hash of everything that goes into it, so a machine
that keeps its image store reuses it (``--rebuild-base`` forces a new one).

podman details that matter on Debian 12 hosts (docs/deployment.md): ``--runtime runc``
where the cgroup hierarchy is not pure v2 (crun refuses hybrid cgroups), explicit
``--ulimit`` (podman's defaults exceed some hosts' hard limits), and ``--network host``
plus the host's CA bundle mounted, so pip inside a build reaches the package index
through whatever the host trusts. Both are harmless elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_BASE = "python:3.12.8-slim-bookworm"  # the Dockerfiles' ARG PYTHON_IMAGE
STANDIN_REPO = "localhost/hetero-dp-python-standin"
SUITE = "bookworm"
# What the stand-in holds: what the Dockerfiles run (python, pip) and need at run time
# (libudev for pyudev, CA certificates for pip), nothing else (minbase variant).
STANDIN_PACKAGES = (
    "python3",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "ca-certificates",
    "libudev1",
)
STANDIN_HOOKS = (
    # the official images have no PEP 668 marker: pip installs into the system Python
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
    # no docs, man pages or apt lists in an image
    'rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/var/lib/apt/lists/*',
)
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

NVIDIA_TAG = "ghcr.io/hetero-dp/hetero-dp-nvidia"
UDEV_TAG = "ghcr.io/hetero-dp/hetero-dp-udev"
SCAFFOLD_TAG = "localhost/acme-npu-device-plugin:0.1.0"
SCAFFOLD_VALUES = {
    "vendor_domain": "acme.example.com",
    "resource": "npu",
    "device_glob": "/dev/acme*",
}


def say(message: str) -> None:
    print(f"images: {message}", flush=True)


@dataclass
class Engine:
    """A container engine that answers, and the flags this host needs for it."""

    path: str
    kind: str  # "docker" or "podman"
    run_flags: list[str] = field(default_factory=list)  # for run and build
    build_flags: list[str] = field(default_factory=list)

    def cmd(self, *args: str) -> list[str]:
        return [self.path, *args]

    def has_image(self, ref: str) -> bool:
        out = subprocess.run(self.cmd("image", "inspect", ref), capture_output=True, timeout=60)
        return out.returncode == 0


def _cgroup_v2_only() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


def find_engine() -> tuple[Engine | None, str]:
    """(engine, "") or (None, the reason none answers)."""
    reasons = []
    names = [os.environ.get("CONTAINER_ENGINE", ""), "docker", "podman"]
    for name in dict.fromkeys(n for n in names if n):
        path = shutil.which(name)
        if path is None:
            reasons.append(f"no {name}")
            continue
        info = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        if info.returncode != 0:
            last = (info.stderr.strip().splitlines() or ["no answer"])[-1]
            reasons.append(f"{name} is installed but its engine does not answer ({last})")
            continue
        kind = (
            "podman" if "podman" in Path(path).name or "podman" in info.stdout[:4000] else "docker"
        )
        engine = Engine(path, kind)
        if kind == "podman":
            if not _cgroup_v2_only() and shutil.which("runc"):
                engine.run_flags += ["--runtime", "runc"]
            engine.run_flags += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
        engine.build_flags += ["--network", "host"]
        if HOST_CA.is_file() and kind == "podman":
            engine.build_flags += ["-v", f"{HOST_CA}:{HOST_CA}:ro"]
        return engine, ""
    return None, "; ".join(reasons)


def standin_tag() -> str:
    """The stand-in's tag: a hash of its inputs (suite, packages, hooks, variant)."""
    recipe = "\n".join([SUITE, "minbase", *STANDIN_PACKAGES, *STANDIN_HOOKS])
    return f"{STANDIN_REPO}:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def build_standin(engine: Engine, tag: str) -> None:
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise SystemExit(
            "images: the base image cannot be pulled and mmdebstrap (Debian package) is "
            "missing to build a stand-in; install it (make image-deps, as root)"
        )
    with tempfile.TemporaryDirectory(prefix="hetero-dp-base-") as tmp:
        tar = Path(tmp) / "base.tar"
        cmd = [
            mmdebstrap,
            "--quiet",
            "--variant=minbase",
            "--include=" + ",".join(STANDIN_PACKAGES),
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            *[f"--customize-hook={hook}" for hook in STANDIN_HOOKS],
            SUITE,
            str(tar),
        ]
        started = time.monotonic()
        subprocess.run(cmd, check=True)
        subprocess.run(
            engine.cmd(
                "import",
                "--change",
                'CMD ["python3"]',
                "--change",
                "ENV LANG=C.UTF-8",
                str(tar),
                tag,
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        say(f"stand-in base {tag} built in {time.monotonic() - started:.0f}s")


def base_image(engine: Engine, rebuild: bool = False) -> str:
    """The image to pass as PYTHON_IMAGE: the real one where it is there or can be
    pulled, else the stand-in (reused while its inputs are unchanged)."""
    wanted = os.environ.get("PYTHON_IMAGE", DEFAULT_BASE)
    if engine.has_image(wanted):
        return wanted
    pull = subprocess.run(
        engine.cmd("pull", "-q", wanted), capture_output=True, text=True, timeout=120
    )
    if pull.returncode == 0:
        return wanted
    why = (pull.stderr.strip().splitlines() or ["no answer"])[-1]
    tag = standin_tag()
    if not rebuild and engine.has_image(tag):
        say(
            f"{wanted} cannot be pulled ({why}); reusing the stand-in base {tag}, "
            "built from Debian packages (python3 of Debian 12)"
        )
        return tag
    say(
        f"{wanted} cannot be pulled ({why}); building a stand-in base {tag} from "
        "Debian packages with mmdebstrap (python3 of Debian 12)"
    )
    build_standin(engine, tag)
    return tag


IGNORED = {
    ".git",
    ".venv",
    ".cache",
    "dist",
    "build",
    "site",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
}
_COPY = re.compile(r"^COPY\s+(?!--from)(.+?)\s+\S+\s*$", re.M)


def copied(dockerfile: Path, context: Path) -> list[Path]:
    """The context paths a Dockerfile's COPY instructions take (and the Dockerfile)."""
    paths = [dockerfile]
    for sources in _COPY.findall(dockerfile.read_text()):
        paths += [context / s.rstrip("/") for s in sources.split()]
    return paths


def sources_id(paths: list[Path]) -> str:
    """A hash of the files under ``paths`` (caches and environments left out)."""
    digest = hashlib.sha256()
    files = []
    for path in paths:
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for path in files:
        if any(p in IGNORED or p.endswith(".egg-info") for p in path.parts):
            continue
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def revision(engine: Engine, tag: str) -> str | None:
    out = subprocess.run(
        engine.cmd("image", "inspect", "--format", "{{json .Config.Labels}}", tag),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        return None
    labels = json.loads(out.stdout.strip() or "null") or {}
    return labels.get("org.opencontainers.image.revision")


def build(engine: Engine, tag: str, dockerfile: Path, context: Path, base: str) -> float:
    """Build ``tag``, unless the engine has it from these very sources already.

    The sources' hash goes in as SOURCES_ID (label ``org.opencontainers.image.revision``).
    podman builds without its layer cache (``--layers=false``): buildah 1.28 (Debian 12)
    took cached COPY layers after the copied files changed, and a cached build stage
    left ``RUN --mount=type=bind,from=build`` without the stage's files. pip's cache
    mount still spares the downloads.
    """
    wanted = sources_id(copied(dockerfile, context))
    if revision(engine, tag) == wanted:
        say(f"{tag} is up to date (sources {wanted})")
        return 0.0
    say(f"building {tag} from {dockerfile} on {base}")
    started = time.monotonic()
    layers = ["--layers=false"] if engine.kind == "podman" else []
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    subprocess.run(
        engine.cmd(
            "build",
            *engine.run_flags,
            *engine.build_flags,
            "--build-arg",
            f"PYTHON_IMAGE={base}",
            *layers,
            "--build-arg",
            f"SOURCES_ID={wanted}",
            "-f",
            str(dockerfile),
            "-t",
            tag,
            str(context),
        ),
        check=True,
        env=env,
    )
    took = time.monotonic() - started
    say(f"built {tag} in {took:.0f}s")
    return took


def image_tags() -> dict[str, str]:
    from hetero_dp import __version__

    return {
        "nvidia": f"{NVIDIA_TAG}:{__version__}",
        "udev": f"{UDEV_TAG}:{__version__}",
        "scaffold": SCAFFOLD_TAG,
    }


def build_all(engine: Engine, which: list[str], rebuild_base: bool = False) -> dict[str, str]:
    """Build the images named in ``which`` (nvidia, udev, scaffold); returns name -> tag."""
    base = base_image(engine, rebuild_base)
    tags = image_tags()
    for backend in ("nvidia", "udev"):
        if backend in which:
            build(engine, tags[backend], ROOT / "deploy" / backend / "Dockerfile", ROOT, base)
    if "scaffold" in which:
        from hetero_dp.cli import scaffold

        with tempfile.TemporaryDirectory(prefix="hetero-dp-images-") as tmp:
            dist = Path(tmp) / "dist"
            # fixed timestamps in the wheel (SOURCE_DATE_EPOCH), so its hash is the sources'
            subprocess.run(
                [sys.executable, "-m", "build", "-q", "--wheel", "--outdir", str(dist), str(ROOT)],
                check=True,
                stdout=subprocess.DEVNULL,
                env=dict(os.environ, SOURCE_DATE_EPOCH="315532800"),
            )
            project, _ = scaffold.generate(SCAFFOLD_VALUES, Path(tmp) / "acme", wheels=dist)
            build(engine, tags["scaffold"], project / "Dockerfile", project, base)
    return {name: tags[name] for name in which}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--require",
        action="store_true",
        default=os.environ.get("CI", "").lower() == "true",
        help="fail where no engine runs (the default under CI=true)",
    )
    parser.add_argument("--rebuild-base", action="store_true", help="build a fresh stand-in base")
    parser.add_argument(
        "--base-tag",
        action="store_true",
        help="print the stand-in base's tag (what make images builds and uses) and exit",
    )
    parser.add_argument(
        "images",
        nargs="*",
        default=["nvidia", "udev", "scaffold"],
        help="which images (default: nvidia udev scaffold)",
    )
    args = parser.parse_args()
    if args.base_tag:
        print(standin_tag())
        return 0
    engine, why = find_engine()
    if engine is None:
        print(f"images: SKIPPED, no image was built: {why}", file=sys.stderr)
        return 1 if args.require else 0
    started = time.monotonic()
    built = build_all(engine, args.images, args.rebuild_base)
    say(
        f"all built with {engine.kind} in {time.monotonic() - started:.0f}s: "
        + ", ".join(built.values())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
