"""The house keeps its shape: imports only go down the layers named in
pyproject.toml ([tool.hetero_dp.layers]); no module imports another in a circle,
run-time or type-checking imports alike; no module imports a private name (``_x``)
from another module or reaches into another object's private names (``obj._x``
where ``obj`` is not ``self`` or ``cls``), the test kit included; no class is over
300 lines and no hand-written module over 600; and the core (hetero_dp/ outside the
test kit) names no hardware vendor: what only a vendor knows lives in its backend.

Where files other work is still splitting break a rule, an allow-list below names
them, with why; it may only shrink (a test fails when an entry is no longer needed)."""

from __future__ import annotations

import ast
import re
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


def circles(
    mods: dict[str, Path],
    *,
    type_checking: bool = False,
    allowed: frozenset[tuple[str, str]] = frozenset(),
) -> list[list[str]]:
    """Cycles among modules through run-time imports (and TYPE_CHECKING ones with
    ``type_checking``), leaving out the import edges in ``allowed``."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for imp in imports_of(path):
            if imp.type_only and not type_checking:
                continue
            target = imp.target
            while target and target not in mods:
                target = target.rpartition(".")[0]
            # importing a package's module runs the package's __init__ first, but a
            # module's own package is not a dependency of it in the sense of a circle
            own_package = mod.startswith(target + ".")
            if target and target != mod and not own_package and (mod, target) not in allowed:
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


FRONT_ENDS = ("hetero_dp.deviceplugin", "hetero_dp.dra")


def cross_front_end_imports(mods: dict[str, Path]) -> list[str]:
    """Imports from one front end's package into the other's, type-checking ones too:
    what both use lives below them (kits/sockets, kits/decoding, engine/pluginwatcher)."""
    problems = []
    for mod, path in mods.items():
        own = next((f for f in FRONT_ENDS if mod == f or mod.startswith(f + ".")), None)
        if own is None:
            continue
        for imp in imports_of(path):
            other = next(
                (
                    f
                    for f in FRONT_ENDS
                    if f != own and (imp.target == f or imp.target.startswith(f + "."))
                ),
                None,
            )
            if other is not None:
                problems.append(f"{mod}:{imp.line} imports {imp.target}")
    return problems


def test_the_front_ends_import_nothing_of_each_other():
    assert cross_front_end_imports(modules()) == []


def test_no_import_circles():
    assert circles(modules()) == []


# Import edges that close a circle through TYPE_CHECKING imports (none left: config.py
# asks engine/claims.py for installed backends' sections, not the loader).
CIRCLE_EDGES_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def test_no_import_circles_counting_type_checking_imports():
    mods = modules()
    assert circles(mods, type_checking=True, allowed=CIRCLE_EDGES_ALLOWED) == []
    for edge in CIRCLE_EDGES_ALLOWED:  # the allow-list only shrinks
        rest = CIRCLE_EDGES_ALLOWED - {edge}
        assert circles(mods, type_checking=True, allowed=rest), f"{edge}: no longer needed"


def test_no_private_names_imported_across_modules():
    assert private_imports(modules()) == []


def _module_names(tree: ast.AST) -> set[str]:
    """Names bound to an imported module (``import os``, ``import grpc.aio as aio``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in node.names}
    return out


def private_reaches(mods: dict[str, Path]) -> list[str]:
    """``obj._x`` where ``obj`` is not ``self`` or ``cls`` (or an imported module, whose
    underscore names such as ``os._exit`` are its documented API)."""
    problems = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        modules_here = _module_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls", *modules_here}:
                continue
            problems.append(f"{mod}:{node.lineno} reaches into {ast.unparse(node)}")
    return problems


# Reaches per module still allowed (none now; a new entry needs a reason beside it).
PRIVATE_REACHES_ALLOWED: dict[str, int] = {}


def test_no_reach_into_another_objects_private_names():
    per_module: dict[str, list[str]] = {}
    for problem in private_reaches(modules()):
        per_module.setdefault(problem.split(":")[0], []).append(problem)
    assert {
        m: found
        for m, found in per_module.items()
        if len(found) > PRIVATE_REACHES_ALLOWED.get(m, 0)
    } == {}
    assert set(PRIVATE_REACHES_ALLOWED) <= set(per_module), "shrink PRIVATE_REACHES_ALLOWED"


MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 600

# Over the limits, each with why; named, not sized. An entry must go once its class
# or module is under the limit, so the list only shrinks.
OVERSIZED_ALLOWED: set[str] = set()


def oversized_code(mods: dict[str, Path]) -> dict[str, int]:
    """Classes over MAX_CLASS_LINES and modules over MAX_MODULE_LINES -> their lines."""
    out = {}
    for mod, path in mods.items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            out[mod] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    out[f"{mod}.{node.name}"] = size
    return out


def test_no_class_over_300_lines_and_no_module_over_600():
    found = oversized_code(modules())
    assert {k: v for k, v in found.items() if k not in OVERSIZED_ALLOWED} == {}
    stale = OVERSIZED_ALLOWED - set(found)
    assert not stale, f"no longer over the limit, take off OVERSIZED_ALLOWED: {stale}"


# --- the bundled vendors (vendors/*/hetero_dp_*/) keep the same size rules ---------

# Over the limits in the vendors, each with why; it may only shrink.
VENDOR_OVERSIZED_ALLOWED: dict[str, str] = {}


def vendor_modules() -> dict[str, Path]:
    """The bundled backends' own modules (their tests live in tests/<vendor>/)."""
    return {module_name(p): p for p in sorted((ROOT / "vendors").glob("*/hetero_dp_*/**/*.py"))}


def test_the_bundled_vendors_have_no_class_over_300_lines_and_no_module_over_600():
    found = oversized_code(vendor_modules())
    assert {k: v for k, v in found.items() if k not in VENDOR_OVERSIZED_ALLOWED} == {}
    stale = set(VENDOR_OVERSIZED_ALLOWED) - set(found)
    assert not stale, f"no longer over the limit, take off VENDOR_OVERSIZED_ALLOWED: {stale}"


def vendor_imports(mods: dict[str, Path]) -> list[str]:
    """Imports of a vendor module that go past ``hetero_dp``'s public face (a
    ``hetero_dp.x`` submodule, the test kit aside) or into another vendor's package."""
    problems = []
    for mod, path in mods.items():
        own = next(p for p in mod.split(".") if p.startswith("hetero_dp_"))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                inside = target != "hetero_dp" and not target.startswith("hetero_dp.testing")
                if (top == "hetero_dp" and inside) or (top.startswith("hetero_dp_") and top != own):
                    problems.append(f"{mod}:{node.lineno} imports {target}")
    return problems


def test_the_bundled_vendors_import_only_the_public_face():
    assert vendor_imports(vendor_modules()) == []


VENDORS = re.compile(r"\b(nvidia|amd|intel|habana|xilinx|ascend)\b", re.IGNORECASE)

# Vendor names left in core files, with their counts (none now: keep it so; an entry
# would need a reason, and the test fails when one is no longer needed).
VENDOR_NAMES_ALLOWED: dict[str, int] = {}


def vendor_names(mods: dict[str, Path]) -> dict[str, int]:
    out = {}
    for mod, path in mods.items():
        if mod.startswith("hetero_dp.testing"):
            continue  # the test kit's fakes model real devices
        n = len(VENDORS.findall(path.read_text()))
        if n:
            out[mod] = n
    return out


def test_core_code_names_no_vendor():
    found = vendor_names(modules())
    too_many = {m: n for m, n in found.items() if n > VENDOR_NAMES_ALLOWED.get(m, 0)}
    assert too_many == {}, "vendor names in core code (move them into the backend)"
    assert set(VENDOR_NAMES_ALLOWED) <= set(found), "shrink VENDOR_NAMES_ALLOWED"


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


def test_checker_finds_a_type_checking_circle(fake_root):
    mods = _tree(
        fake_root,
        {
            "hetero_dp/__init__.py": "",
            "hetero_dp/engine/__init__.py": "",
            "hetero_dp/engine/a.py": "from hetero_dp.engine.b import x\n",
            "hetero_dp/engine/b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from hetero_dp.engine.a import y\n"
            ),
        },
    )
    assert circles(mods) == []
    cycle = ["hetero_dp.engine.a", "hetero_dp.engine.b", "hetero_dp.engine.a"]
    assert circles(mods, type_checking=True) == [cycle]
    allowed = frozenset({("hetero_dp.engine.b", "hetero_dp.engine.a")})
    assert circles(mods, type_checking=True, allowed=allowed) == []


def test_checker_finds_a_private_reach_but_not_self_or_a_module(fake_root):
    mods = _tree(
        fake_root,
        {
            "hetero_dp/__init__.py": "",
            "hetero_dp/engine/__init__.py": "",
            "hetero_dp/engine/a.py": (
                "import os\n"
                "class A:\n"
                "    def f(self, other):\n"
                "        self._mine = other._theirs\n"
                "        os._exit(0)\n"
                "        return other.__class__\n"
            ),
        },
    )
    assert private_reaches(mods) == ["hetero_dp.engine.a:4 reaches into other._theirs"]


def test_checker_counts_class_and_module_lines_and_vendor_names(fake_root):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    mods = _tree(
        fake_root,
        {
            "hetero_dp/__init__.py": "",
            "hetero_dp/engine/__init__.py": "",
            "hetero_dp/engine/big.py": f"class Big:\n{body}\n" + "\n" * MAX_MODULE_LINES,
            "hetero_dp/engine/gpu.py": "# NVIDIA's layout; intelRdt is a CDI field\n",
            "hetero_dp/testing/fake.py": "# a fake NVIDIA GPU\n",
        },
    )
    found = oversized_code(mods)
    assert found["hetero_dp.engine.big.Big"] == MAX_CLASS_LINES + 1
    assert found["hetero_dp.engine.big"] > MAX_MODULE_LINES
    assert vendor_names(mods) == {"hetero_dp.engine.gpu": 1}


def test_checker_finds_one_front_end_importing_the_other(fake_root):
    mods = _tree(
        fake_root,
        {
            "hetero_dp/__init__.py": "",
            "hetero_dp/deviceplugin/__init__.py": "",
            "hetero_dp/deviceplugin/endpoint.py": "from hetero_dp.kits.sockets import x\n",
            "hetero_dp/dra/__init__.py": "",
            "hetero_dp/dra/driver.py": "from hetero_dp.deviceplugin.endpoint import x\n",
        },
    )
    assert cross_front_end_imports(mods) == [
        "hetero_dp.dra.driver:1 imports hetero_dp.deviceplugin.endpoint"
    ]


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


def test_checker_finds_a_vendor_import_past_the_public_face(fake_root):
    mods = _tree(
        fake_root,
        {
            "vendors/a/hetero_dp_a/x.py": (
                "from hetero_dp import Device\n"
                "from hetero_dp.engine.daemon import Daemon\n"
                "import hetero_dp_b\n"
                "from . import y\n"
                "from hetero_dp_a.y import z\n"
            ),
        },
    )
    assert vendor_imports(mods) == [
        "vendors.a.hetero_dp_a.x:2 imports hetero_dp.engine.daemon",
        "vendors.a.hetero_dp_a.x:3 imports hetero_dp_b",
    ]
