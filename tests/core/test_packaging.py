"""The package list in pyproject.toml is written out (the template ships as
hetero_dp.templates); a new subpackage must not be forgotten there."""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, a dependency of hetero-dp there
    import tomli as tomllib  # type: ignore[no-redef]


def test_every_subpackage_is_listed(repo_root):
    listed = set(
        tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(repo_root).parts)
        for p in (repo_root / "hetero_dp").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_core_never_imports_a_vendor(repo_root):
    offenders = [
        str(p.relative_to(repo_root))
        for p in (repo_root / "hetero_dp").rglob("*.py")
        if "import hetero_dp_" in p.read_text() or "from hetero_dp_" in p.read_text()
    ]
    assert offenders == []
