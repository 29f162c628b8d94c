"""The renderer and the generated files, checked without running them."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hetero_dp.cli import scaffold
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import resource_name_problem

from .conftest import VALUES

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, a dependency of hetero-dp there
    import tomli as tomllib  # type: ignore[no-redef]

EXPECTED = {
    ".dockerignore",
    "Dockerfile",
    "README.md",
    "acme_npu.py",
    "deploy/daemonset.yaml",
    "pyproject.toml",
    "tests/test_plugin.py",
    "wheels/README.md",
}


def test_project_has_every_file_and_no_template_tags_left(project: Path):
    files = {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()}
    assert files == EXPECTED
    for name in files:
        text = (project / name).read_text()
        assert "{{" not in text and "cookiecutter" not in text, name


def test_readme_says_how_to_get_hetero_dp_where_no_index_serves_it(project: Path):
    """The README's "Try it" installs from wheels/ or an index; where neither has
    hetero-dp (generated from a checkout, no --wheels) it names the step that was
    printed for that case."""
    readme = " ".join((project / "README.md").read_text().split())
    origin = scaffold.Origin("source", Path("PATH/TO/hetero-dp"))
    printed = [s for s in scaffold.next_steps(project, origin, False) if "pip wheel" in s]
    assert printed and f"`{printed[0]}`" in readme


def test_pyproject_declares_the_entry_point_and_module(project: Path):
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "acme-npu-device-plugin"
    assert meta["project"]["entry-points"]["hetero_dp"] == {"acme_npu": "acme_npu:plugin"}
    assert meta["tool"]["setuptools"]["py-modules"] == ["acme_npu"]
    assert any(d.startswith("hetero-dp") for d in meta["project"]["dependencies"])


def test_plugin_module_is_small_and_names_the_resource(project: Path):
    source = (project / "acme_npu.py").read_text()
    assert len(source.splitlines()) <= 60  # typed options included
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Plugin"]
    hooks = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and n.decorator_list}
    assert hooks == {"configure", "discover", "check_health"}
    # one registration style: the entry point names the instance, no module-level hooks
    assert not [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "plugin = Plugin()" in source
    assert 'RESOURCE = "acme.example.com/npu"' in source
    assert resource_name_problem("acme.example.com/npu") is None


def test_daemonset_is_a_valid_manifest(project: Path):
    path = project / "deploy" / "daemonset.yaml"
    doc = yaml.safe_load(path.read_text())
    container = doc["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "acme_npu",
        "-o",
        "acme_npu.deviceGlob=/dev/acme*",
        "-o",
        "acme_npu.hostRoot=/host",
    ]
    assert {m["mountPath"] for m in container["volumeMounts"]} & {"/dev", "/host/dev"} == {
        "/host/dev"
    }
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/kubelet/device-plugins" in mounts
    if shutil.which("kubernetes-validate") is None:
        pytest.skip("kubernetes-validate not installed")
    run = subprocess.run(
        ["kubernetes-validate", "-k", "1.32", "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_generated_python_passes_ruff(project: Path):
    if shutil.which("ruff") is None:
        pytest.skip("ruff not installed")
    run = subprocess.run(
        ["ruff", "check", "--isolated", "--select", "E,F,W,I,B,UP", "--line-length", "100", "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_derived_values_follow_the_inputs(tmp_path: Path):
    values = {"vendor_domain": "npu.example.org", "resource": "card", "device_glob": "/dev/x*"}
    ctx = scaffold.build_context(values)
    assert ctx["package_name"] == "npu_card"
    assert ctx["project_slug"] == "npu-card-device-plugin"
    assert ctx["env_var"] == "NPU_CARD_VISIBLE_DEVICES"
    # named after what the user gave, not an upper-cased resource ("CARD device plugin")
    assert ctx["project_name"] == "npu.example.org/card device plugin"


def test_defaults_in_cookiecutter_json_are_valid():
    variables = scaffold.template_variables(scaffold.template_dir())
    plain = {k: v for k, v in variables.items() if "{{" not in v}
    ctx = scaffold.build_context(plain)
    for key, value in ctx.items():
        assert scaffold.problem(key, value, ctx) is None, key


def test_same_tree_as_cookiecutter(tmp_path: Path):
    """Our renderer and cookiecutter (Jinja2) agree byte for byte on the template."""
    cookiecutter_main = pytest.importorskip("cookiecutter.main")
    values = {**VALUES, "package_name": "acme_npu"}
    ours, _ = scaffold.generate(values, tmp_path / "ours" / "acme-npu-device-plugin")
    theirs = cookiecutter_main.cookiecutter(
        str(scaffold.template_dir()),
        no_input=True,
        extra_context=values,
        output_dir=str(tmp_path / "theirs"),
    )

    def tree(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert Path(theirs).name == ours.name
    assert tree(Path(theirs)) == tree(ours)


# -- the renderer on its own ----------------------------------------------------------


def test_render_filters():
    ctx = {"a": "x_y", "b": "Q"}
    text = "{{ cookiecutter.a|replace('_', '-')|upper }}/{{cookiecutter.b|lower}}"
    assert scaffold.render(text, ctx, "t") == "X-Y/q"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{% if x %}y{% endif %}", "'{%'"),
        ("{# note #}", "'{#'"),
        ("{{ cookiecutter.nope }}", "cookiecutter.nope"),
        ("{{ os.system('x') }}", "unsupported expression"),
        ("{{ cookiecutter.a|title }}", "'title'"),
        ("{{ cookiecutter.a|replace('_') }}", "unsupported filter"),
    ],
)
def test_render_refuses_what_it_does_not_understand(text: str, named: str):
    with pytest.raises(ConfigError) as e:
        scaffold.render(text, {"a": "x"}, "some/template/file")
    assert named in str(e.value) and "some/template/file" in str(e.value)


def _template(tmp_path: Path, rel: str) -> Path:
    tpl = tmp_path / "tpl"
    (tpl / "{{cookiecutter.project_slug}}").mkdir(parents=True)
    (tpl / "cookiecutter.json").write_text(json.dumps({"project_slug": "p", "name": "n"}))
    f = tpl / "{{cookiecutter.project_slug}}" / rel
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("x")
    return tpl


@pytest.mark.parametrize("value", ["..", ".", "a/../../b", "/etc/passwd", ""])
def test_rendered_paths_cannot_escape(tmp_path: Path, value: str):
    # The renderer's own guard, below input validation: a path component that renders
    # to '..', a separator or nothing is refused before anything is written.
    tpl = _template(tmp_path, "{{cookiecutter.name}}/f.txt")
    with pytest.raises(ConfigError, match="not a plain name"):
        scaffold.plan({"project_slug": "p", "name": value}, tpl)


def test_template_symlink_is_refused(tmp_path: Path):
    tpl = _template(tmp_path, "f.txt")
    (tpl / "{{cookiecutter.project_slug}}" / "link").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError, match="symlink"):
        scaffold.plan({"project_slug": "p", "name": "n"}, tpl)
