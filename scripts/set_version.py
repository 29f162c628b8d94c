#!/usr/bin/env python3
"""Set the release version everywhere it is written down, from its one source.

The source is ``__version__`` in ``hetero_dp/__init__.py`` (setuptools reads it for the
hetero-dp distribution). The copies that cannot read it at build time follow it:

- each ``vendors/*/pyproject.toml``: ``version`` and the compatible-release pin
  ``hetero-dp~=X.Y.Z`` (a vendor package works with the hetero-dp releases of its own
  minor series);
- ``vendors/*/*/__init__.py`` ``__version__`` where a vendor package has one;
- the Helm charts' ``appVersion`` and ``version`` and their ``image.tag``;
- the image tags ``ghcr.io/hetero-dp/<image>:X.Y.Z`` in ``deploy/`` manifests and
  Dockerfile comments;
- the scaffold template's default ``hetero_dp_version`` (``hetero-dp new`` always
  writes its own version; the default is what plain ``cookiecutter`` renders).

    python scripts/set_version.py 0.2.0     # write the new version everywhere
    python scripts/set_version.py --check   # exit 1 naming each copy that differs

``tests/deploy/test_versions.py`` runs the check in the test suite.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "hetero_dp" / "__init__.py"
_VERSION = r"\d+\.\d+\.\d+(?:[.-]?[A-Za-z0-9.]+)?"
VERSION_RE = re.compile(rf"^{_VERSION}$")
_SOURCE_RE = re.compile(rf'^__version__ = "({_VERSION})"$', re.M)

# (file glob, pattern with one group around the version)
COPIES: list[tuple[str, re.Pattern[str]]] = [
    ("vendors/*/pyproject.toml", re.compile(rf'^version = "({_VERSION})"$', re.M)),
    ("vendors/*/pyproject.toml", re.compile(rf'"hetero-dp~=({_VERSION})"')),
    ("vendors/*/*/__init__.py", _SOURCE_RE),
    ("deploy/**/Chart.yaml", re.compile(rf'^appVersion: "?({_VERSION})"?$', re.M)),
    ("deploy/**/Chart.yaml", re.compile(rf"^version: ({_VERSION})$", re.M)),
    ("deploy/**/values*.yaml", re.compile(rf'^  tag: "({_VERSION})"$', re.M)),
    ("deploy/**/*.y*ml", re.compile(rf"ghcr\.io/hetero-dp/[a-z0-9-]+:({_VERSION})\b")),
    ("deploy/**/Dockerfile", re.compile(rf"hetero-dp[a-z0-9-]*:({_VERSION})\b")),
    ("templates/*/cookiecutter.json", re.compile(rf'"hetero_dp_version": "({_VERSION})"')),
]


def source_version() -> str:
    match = _SOURCE_RE.search(SOURCE.read_text())
    if not match:
        sys.exit(f'{SOURCE}: no line __version__ = "X.Y.Z"')
    return match.group(1)


def copies() -> Iterator[tuple[Path, re.Pattern[str], re.Match[str]]]:
    """Every place a copy of the version is written: (file, pattern, match)."""
    for pattern_glob, pattern in COPIES:
        for path in sorted(ROOT.glob(pattern_glob)):
            for match in pattern.finditer(path.read_text()):
                yield path, pattern, match


def check(version: str) -> list[str]:
    """One line per copy that differs from ``version``."""
    return [
        f"{path.relative_to(ROOT)}: {match.group(0)!r} is not {version}"
        for path, _, match in copies()
        if match.group(1) != version
    ]


def write(version: str) -> list[Path]:
    text = SOURCE.read_text()
    SOURCE.write_text(_SOURCE_RE.sub(f'__version__ = "{version}"', text, count=1))
    changed = {SOURCE}
    for path, pattern in {(p, pat) for p, pat, _ in copies()}:
        old = path.read_text()

        def put(m: re.Match[str]) -> str:
            whole, start = m.group(0), m.start(1) - m.start(0)
            return whole[:start] + version + whole[start + len(m.group(1)) :]

        new = pattern.sub(put, old)
        if new != old:
            path.write_text(new)
            changed.add(path)
    return sorted(changed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", nargs="?", help="the new version, X.Y.Z")
    parser.add_argument("--check", action="store_true", help="only check the copies")
    args = parser.parse_args(argv)
    if args.check or not args.version:
        problems = check(source_version())
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    if not VERSION_RE.match(args.version):
        parser.error(f"{args.version!r} is not a version such as 0.2.0")
    for path in write(args.version):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
