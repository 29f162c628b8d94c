"""The house keeps its shape: imports only go down the layers named in
pyproject.toml ([tool.hetero_dp.layers]), no module imports another in a circle,
and no module imports a private name (``_x``) from another module."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hetero_dp"


def layer_order() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(data["tool"]["hetero_dp"]["layers"]["order"])


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str, order: list[str]) -> int:
    """Index in ``order``; the package root and __main__ sit above every layer."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return len(order)
    if parts[1] not in order:
        raise AssertionError(f"{module} is in no layer; add its package to the layer order")
    return order.index(parts[1])


class Import:
    def __init__(self, target: str, names: list[str], line: int, type_only: bool) -> None:
        self.target, self.names, self.line, self.type_only = target, names, line, type_only


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> list[Import]:
    """Every import of a hetero_dp module in ``path``, anywhere in the file."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for n in child.body:
                    visit_stmt(n, True)
                for n in child.orelse:
                    visit_stmt(n, type_only)
                continue
            visit_stmt(child, type_only)

    def visit_stmt(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hetero_dp":
                    out.append(Import(alias.name, [], node.lineno, type_only))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "hetero_dp":
                names = [a.name for a in node.names]
                # "from pkg import module" imports that module
                for name in names:
                    sub = f"{target}.{name}"
                    if (ROOT / (sub.replace(".", "/") + ".py")).exists() or (
                        ROOT / sub.replace(".", "/") / "__init__.py"
                    ).exists():
                        out.append(Import(sub, [], node.lineno, type_only))
                        names = [n for n in names if n != name]
                if names or not node.names:
                    out.append(Import(target, names, node.lineno, type_only))
        else:
            visit(node, type_only)

    visit(ast.parse(path.read_text()), False)
    return out


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for p in sorted(PACKAGE.rglob("*.py"))
        if "hetero_dp/api/" not in p.as_posix()
    }


def upward_imports(mods: dict[str, Path], order: list[str]) -> list[str]:
    problems = []
    for mod, path in mods.items():
        mine = layer_of(mod, order)
        for imp in imports_of(path):
            if imp.target == "hetero_dp" and set(imp.names) <= {"__version__"}:
                continue  # the one source of the version, not an API
            if imp.target == "hetero_dp" and mod != "hetero_dp":
                problems.append(f"{mod}:{imp.line} imports the public face hetero_dp")
                continue
            theirs = layer_of(imp.target, order)
            if theirs > mine:
                problems.append(
                    f"{mod}:{imp.line} ({order[mine] if mine < len(order) else 'top'}) "
                    f"imports {imp.target} ({order[theirs] if theirs < len(order) else 'top'})"
                )
    return problems


def circles(mods: dict[str, Path]) -> list[list[str]]:
    """Cycles among modules through run-time imports (TYPE_CHECKING ones are not)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for imp in imports_of(path):
            if imp.type_only:
                continue
            target = imp.target
            while target and target not in mods:
                target = target.rpartition(".")[0]
            # importing a package's module runs the package's __init__ first, but a
            # module's own package is not a dependency of it in the sense of a circle
            if target and target != mod and not mod.startswith(target + "."):
                graph[mod].add(target)
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)
    return found


def private_imports(mods: dict[str, Path]) -> list[str]:
    problems = []
    for mod, path in mods.items():
        for imp in imports_of(path):
            if imp.target == mod:
                continue
            private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
            parts = imp.target.split(".")[1:]
            private += [p for p in parts if p.startswith("_") and p != "__main__"]
            if private:
                problems.append(f"{mod}:{imp.line} imports private {private} from {imp.target}")
    return problems


def test_imports_only_go_down_the_layers():
    assert upward_imports(modules(), layer_order()) == []


def test_no_import_circles():
    assert circles(modules()) == []


def test_no_private_names_imported_across_modules():
    assert private_imports(modules()) == []


def test_the_package_root_holds_only_the_face_the_contract_and_layers():
    order = set(layer_order())
    loose = sorted(
        p.name
        for p in PACKAGE.iterdir()
        if p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py", "hookspecs.py")
    )
    assert loose == []
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages - order <= {"templates"}, packages - order


# --- the checker itself finds what it must ------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {module_name(root / rel): root / rel for rel in files}


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return tmp_path


def test_checker_finds_an_upward_import(fake_root):
    mods = _tree(
        fake_root,
        {
            "hetero_dp/__init__.py": "",
            "hetero_dp/model/__init__.py": "",
            "hetero_dp/model/device.py": "from hetero_dp.engine.daemon import Daemon\n",
            "hetero_dp/engine/__init__.py": "",
            "hetero_dp/engine/daemon.py": "from ..model.device import x\n",
        },
    )
    problems = upward_imports(mods, ["model", "engine"])
    assert problems == ["hetero_dp.model.device:1 (model) imports hetero_dp.engine.daemon (engine)"]


def test_checker_finds_a_circle_but_not_a_type_checking_one(fake_root):
    mods = _tree(
        fake_root,
        {
            "hetero_dp/__init__.py": "",
            "hetero_dp/engine/__init__.py": "",
            "hetero_dp/engine/a.py": "def f():\n    from hetero_dp.engine import b\n",
            "hetero_dp/engine/b.py": "from hetero_dp.engine.a import f\n",
            "hetero_dp/engine/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from hetero_dp.engine.b import x\n"
            ),
        },
    )
    assert circles(mods) == [["hetero_dp.engine.a", "hetero_dp.engine.b", "hetero_dp.engine.a"]]


def test_checker_finds_a_private_import(fake_root):
    mods = _tree(
        fake_root,
        {
            "hetero_dp/__init__.py": "",
            "hetero_dp/engine/__init__.py": "",
            "hetero_dp/engine/a.py": "_secret = 1\n",
            "hetero_dp/engine/b.py": "from .a import _secret\n",
        },
    )
    assert private_imports(mods) == [
        "hetero_dp.engine.b:1 imports private ['_secret'] from hetero_dp.engine.a"
    ]
