"""``hetero-dp new``: render a plugin project from a cookiecutter-format template.

The template (``templates/device-plugin``) is plain cookiecutter: a ``cookiecutter.json``
and one ``{{cookiecutter.project_slug}}`` directory, so ``cookiecutter`` renders it too.
Our renderer understands only what the template uses: ``{{ cookiecutter.KEY }}`` with
the filters ``upper``, ``lower`` and ``replace('a', 'b')``. Anything else (``{%``, ``{#``,
an unknown key or filter) is an error naming the template file, never silent output.

Every input is validated before a byte is written, the whole project is rendered in
memory first, and each file lands atomically, so a refused or failed run leaves no
half-written tree.
"""

from __future__ import annotations

import json
import keyword
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from hetero_dp.kits.atomic import write_atomic
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import is_dns_label, resource_name_problem

TEMPLATE = "device-plugin"
SOURCE = ""  # errors name the flag; the command prefixes "hetero-dp new:"

# Values the user gives, in prompt order; the rest of cookiecutter.json is derived.
FLAGS = {
    "vendor_domain": "--vendor-domain",
    "resource": "--resource",
    "device_glob": "--device-glob",
    "package_name": "--package",
    "project_name": "--project-name",
    "image": "--image",
}
REQUIRED = ("vendor_domain", "resource", "device_glob")

_TAG = re.compile(r"\{\{(.*?)\}\}", re.S)
_EXPR = re.compile(r"^\s*cookiecutter\.([A-Za-z_]\w*)\s*(.*?)\s*$", re.S)
_FILTER = re.compile(r"\|\s*(\w+)\s*(?:\(\s*'([^']*)'\s*,\s*'([^']*)'\s*\))?\s*")

_PACKAGE = re.compile(r"^[a-z_][a-z0-9_]*$")
_GLOB = re.compile(r"^/[A-Za-z0-9_./*?\[\]!:+@%=,-]*$")
_ENV_VAR = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9_.-]{1,128})?(@sha256:[a-f0-9]{64})?$")
_VERSION = re.compile(r"^\d+(\.\d+)+([a-z0-9.+-]*)$")
_WHEEL = re.compile(r"^[A-Za-z0-9_.+-]+\.whl$")
_FORBIDDEN_PACKAGES = {"hetero_dp", "tests", "test", "conftest", "setup", "pytest", "pluggy"}


def problem(key: str, value: object, context: Mapping[str, str] | None = None) -> str | None:
    """Why ``value`` cannot be used for template variable ``key``, or None."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "must not contain control characters or newlines"
    check = _CHECKS.get(key)
    return check(value, context or {}) if check else None


def _vendor_domain(v: str, _ctx: Mapping[str, str]) -> str | None:
    if len(v) > 253 or not all(is_dns_label(p) for p in v.split(".")):
        return (
            f"{v!r} is not a lowercase DNS subdomain (labels of a-z, 0-9 and '-', "
            "separated by dots, e.g. 'acme.example.com')"
        )
    return resource_name_problem(f"{v}/x")


def _resource(v: str, ctx: Mapping[str, str]) -> str | None:
    return resource_name_problem(f"{ctx.get('vendor_domain', 'example.com')}/{v}")


def _device_glob(v: str, _ctx: Mapping[str, str]) -> str | None:
    if not v.startswith("/"):
        return f"{v!r} must be an absolute path such as '/dev/acme*'"
    if ".." in v.split("/"):
        return f"{v!r} must not contain '..'"
    if len(v) > 255 or not _GLOB.match(v):
        return (
            f"{v!r} may hold only letters, digits and / _ . - * ? [ ] ! : + @ % = , "
            "(no spaces, quotes, braces or backslashes)"
        )
    return None


def _package_name(v: str, _ctx: Mapping[str, str]) -> str | None:
    if not _PACKAGE.match(v) or len(v) > 49:
        return (
            f"{v!r} is not a lowercase Python identifier of at most 49 characters "
            "(a-z, 0-9 and '_', not starting with a digit)"
        )
    if keyword.iskeyword(v) or keyword.issoftkeyword(v):
        return f"{v!r} is a Python keyword"
    if v in _FORBIDDEN_PACKAGES or v in sys.stdlib_module_names:
        return f"{v!r} would shadow an existing module; choose a vendor-specific name"
    return None


def _project_slug(v: str, _ctx: Mapping[str, str]) -> str | None:
    if not is_dns_label(v):
        return (
            f"{v!r} must be a DNS label (a-z, 0-9 and '-', at most 63 characters): "
            "it names the Python distribution and the DaemonSet"
        )
    return None


def _project_name(v: str, _ctx: Mapping[str, str]) -> str | None:
    bad = sorted(set(v) & set('"\\{}`$'))
    if bad or len(v) > 80:
        return f"{v!r} must be at most 80 characters without {' '.join(bad) or 'quotes'}"
    return None


def _env_var(v: str, _ctx: Mapping[str, str]) -> str | None:
    return None if _ENV_VAR.match(v) else f"{v!r} is not an upper-case environment variable name"


def _version(v: str, _ctx: Mapping[str, str]) -> str | None:
    return None if _VERSION.match(v) else f"{v!r} is not a release version such as '0.1.0'"


def _image(v: str, _ctx: Mapping[str, str]) -> str | None:
    if len(v) > 255 or not _IMAGE.match(v) or "//" in v:
        return f"{v!r} is not an image reference such as 'registry.example.com/acme:0.1.0'"
    return None


_CHECKS: dict[str, Callable[[str, Mapping[str, str]], str | None]] = {
    "vendor_domain": _vendor_domain,
    "resource": _resource,
    "device_glob": _device_glob,
    "package_name": _package_name,
    "project_slug": _project_slug,
    "project_name": _project_name,
    "env_var": _env_var,
    "image": _image,
    "hetero_dp_version": _version,
}


def validate(key: str, value: object, context: Mapping[str, str] | None = None) -> str:
    """Return ``value`` if usable for ``key``, else ConfigError naming the flag."""
    why = problem(key, value, context)
    if why:
        raise ConfigError(why, field=FLAGS.get(key, key), source=SOURCE)
    assert isinstance(value, str)
    return value


def default_device_glob(vendor_domain: str) -> str:
    """``acme.example.com`` -> ``/dev/acme*``: device nodes named for the vendor, the
    usual driver convention (a guess the prompt offers, never a silent value)."""
    label = re.sub(r"[^a-z0-9_-]+", "", vendor_domain.split(".")[0].lower())
    return f"/dev/{label or 'accel'}*"


def default_package(vendor_domain: str, resource: str) -> str:
    """``acme.example.com`` + ``npu`` -> ``acme_npu``."""
    base = f"{vendor_domain.split('.')[0]}_{resource}".lower()
    name = re.sub(r"[^a-z0-9_]+", "_", base).strip("_")
    return name if name and not name[0].isdigit() else f"dp_{name}"


# -- the renderer ---------------------------------------------------------------------


def render(text: str, context: Mapping[str, str], where: str) -> str:
    """Substitute ``{{ cookiecutter.KEY|filter }}`` tags; ConfigError on anything else."""
    for marker in ("{%", "{#"):
        if marker in text:
            raise ConfigError(f"unsupported template syntax {marker!r}", source=where)

    def one(match: re.Match[str]) -> str:
        expr = _EXPR.match(match.group(1))
        if not expr:
            raise ConfigError(f"unsupported expression {match.group(0)!r}", source=where)
        key, filters = expr.groups()
        if key not in context:
            raise ConfigError(f"unknown variable cookiecutter.{key}", source=where)
        value = context[key]
        pos = 0
        while pos < len(filters):
            f = _FILTER.match(filters, pos)
            if not f:
                raise ConfigError(f"unsupported filter in {match.group(0)!r}", source=where)
            name, old, new = f.groups()
            if name == "upper" and old is None:
                value = value.upper()
            elif name == "lower" and old is None:
                value = value.lower()
            elif name == "replace" and old is not None:
                value = value.replace(old, new)
            else:
                raise ConfigError(f"unsupported filter {name!r}", source=where)
            pos = f.end()
        return value

    return _TAG.sub(one, text)


# -- the template ---------------------------------------------------------------------


def template_dir(name: str = TEMPLATE) -> Path:
    """The template shipped with hetero-dp (in the package, or in a source checkout)."""
    package = Path(__file__).resolve().parent.parent  # hetero_dp/
    here = package
    # installed: hetero_dp/templates; in a source checkout: the top-level templates/
    for candidate in (package / "templates" / name, package.parent / "templates" / name):
        if (candidate / "cookiecutter.json").is_file():
            return candidate
    raise ConfigError(f"template {name!r} not found next to {here}", source=SOURCE)


def template_variables(template: Path) -> dict[str, str]:
    """``cookiecutter.json`` in order: name -> default (possibly a ``{{ }}`` expression)."""
    path = template / "cookiecutter.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read template variables: {e}", source=str(path)) from e
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ConfigError("expected a mapping of names to strings", source=str(path))
    return data


def build_context(values: Mapping[str, str | None], template: Path | None = None) -> dict[str, str]:
    """All template variables: given values, then defaults rendered in file order.

    Missing required values are an error; unknown names too. Every value is validated.
    """
    template = template or template_dir()
    variables = template_variables(template)
    given = {k: v for k, v in values.items() if v is not None}
    unknown = sorted(set(given) - set(variables))
    if unknown:
        raise ConfigError(f"unknown template variable {unknown[0]!r}", source=SOURCE)
    for key in REQUIRED:
        if key not in given:
            raise ConfigError(
                "is required (stdin is not a terminal, so nothing is asked)",
                field=FLAGS[key],
                source=SOURCE,
            )
    if "package_name" not in given and "vendor_domain" in given and "resource" in given:
        given["package_name"] = default_package(given["vendor_domain"], given["resource"])
    context: dict[str, str] = {}
    # Validate what the user gave first, in flag order, so the first error is theirs.
    for key in [k for k in FLAGS if k in given] + [k for k in given if k not in FLAGS]:
        validate(key, given[key], given)
    for key, default in variables.items():
        if key in given:
            context[key] = given[key]
        else:
            value = render(default, context, f"{template / 'cookiecutter.json'} ({key})")
            why = problem(key, value, context)
            if why:
                raise ConfigError(
                    f"value derived from the template's default {default!r}: {why}",
                    field=key,
                    source=SOURCE,
                )
            context[key] = value
    return context


@dataclass(frozen=True)
class PlannedFile:
    path: Path  # relative to the project directory
    content: bytes
    mode: int


def _safe_part(part: str, where: str) -> str:
    if part in ("", ".", "..") or "/" in part or "\\" in part or "\0" in part:
        raise ConfigError(f"rendered path component {part!r} is not a plain name", source=where)
    return part


def plan(context: Mapping[str, str], template: Path | None = None) -> list[PlannedFile]:
    """Render every file of the template in memory; paths relative to the project dir."""
    template = template or template_dir()
    roots = [p for p in template.iterdir() if p.is_dir() and "cookiecutter" in p.name]
    if len(roots) != 1:
        raise ConfigError(
            "expected exactly one '{{cookiecutter...}}' directory", source=str(template)
        )
    root = roots[0]
    files: list[PlannedFile] = []
    for src in sorted(root.rglob("*")):
        where = str(src)
        if src.is_symlink():
            raise ConfigError("template holds a symlink; refusing to follow it", source=where)
        if src.is_dir() or "__pycache__" in src.parts or src.suffix == ".pyc":
            continue
        rel = Path(
            *(_safe_part(render(p, context, where), where) for p in src.relative_to(root).parts)
        )
        raw = src.read_bytes()
        try:
            content = render(raw.decode("utf-8"), context, where).encode("utf-8")
        except UnicodeDecodeError:
            content = raw  # binary files are copied as they are
        files.append(PlannedFile(rel, content, src.stat().st_mode & 0o777))
    return files


def _is_inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def write(files: list[PlannedFile], target: Path, *, force: bool = False) -> list[Path]:
    """Write ``files`` under ``target``: refuses a non-empty dir unless ``force``.

    Every destination is checked before the first byte is written: a refusal leaves
    the disk as it was.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ConfigError(
            f"{target} exists and is not a directory", field="--output", source=SOURCE
        )
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ConfigError(
            f"{target} is not empty; pass --force to write into it anyway",
            field="--output",
            source=SOURCE,
        )
    root = target.resolve()
    destinations = [root / f.path for f in files]
    for dest in destinations:
        _check_destination(dest, root)
    target.mkdir(parents=True, exist_ok=True)
    for f, dest in zip(files, destinations):
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dest, f.content, mode=f.mode)
    return destinations


def _check_destination(dest: Path, root: Path) -> None:
    """``dest`` can be written as a regular file without leaving ``root``."""
    # An existing symlink (under --force) must not carry a write out of the project.
    if not _is_inside(dest.resolve(), root) or dest.is_symlink():
        raise ConfigError(f"{dest} would be written outside {root}", source=SOURCE)
    if dest.is_dir():
        raise ConfigError(f"{dest} is a directory, not a file", source=SOURCE)
    for parent in dest.relative_to(root).parents:
        here = root / parent
        if here.exists() and not here.is_dir():
            raise ConfigError(f"{here} is in the way of {dest}: not a directory", source=SOURCE)


def _release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version: ``0.1.2rc1`` -> ``(0, 1, 2)``."""
    parts = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.end() != len(part):
            break
    return tuple(parts)


def compatible(candidate: str, pin: str) -> bool:
    """Whether ``candidate`` satisfies ``~=pin`` (release numbers only; pre-releases
    count as their release)."""
    want, got = _release(pin), _release(candidate)
    return len(want) >= 2 and got[: len(want) - 1] == want[:-1] and got >= want


def plan_wheels(source: str | Path, version: str, only: Path | None = None) -> list[PlannedFile]:
    """The wheels of ``source`` as files under ``wheels/`` of the project.

    Refused, before anything is written, unless ``source`` is a readable directory
    holding a hetero-dp wheel that satisfies ``hetero-dp~=version`` (the pin the
    generated project carries). Every ``*.whl`` there is taken, so a whole wheelhouse
    (hetero-dp and its dependencies, for a site without an index) works too.
    """
    where = Path(source)
    if not where.is_dir():
        raise ConfigError(f"{where} is not a directory", field="--wheels", source=SOURCE)
    try:
        wheels = sorted(p for p in where.iterdir() if p.name.endswith(".whl"))
        if only is not None:
            wheels = [p for p in wheels if p.name == only.name]
    except OSError as e:
        raise ConfigError(f"cannot list {where}: {e}", field="--wheels", source=SOURCE) from e
    ours = [p.name for p in wheels if p.name.startswith("hetero_dp-")]
    usable = [n for n in ours if compatible(n.split("-")[1], version)]
    if not usable:
        found = ", ".join(ours) or "no hetero_dp-*.whl"
        raise ConfigError(
            f"{where} holds no hetero-dp wheel for hetero-dp~={version} (found: {found}); "
            "build one with `python -m build` in the hetero-dp repository",
            field="--wheels",
            source=SOURCE,
        )
    files = []
    for wheel in wheels:
        if not _WHEEL.match(wheel.name) or not wheel.is_file():
            raise ConfigError(f"{wheel} is not a plain wheel file", field="--wheels", source=SOURCE)
        try:
            content = wheel.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read {wheel}: {e}", field="--wheels", source=SOURCE) from e
        files.append(PlannedFile(Path("wheels") / wheel.name, content, 0o644))
    return files


@dataclass(frozen=True)
class Origin:
    """Where the running hetero-dp was installed from (pip's ``direct_url.json``, PEP 610):
    ``index`` (a package index serves it: nothing to do), ``wheel`` (a wheel file that
    is still there: copied into the project) or ``source`` (a checkout: its wheel must
    be built into the project)."""

    kind: str
    path: Path | None = None


def hetero_dp_origin() -> Origin:
    """Where this hetero-dp came from, so that a project's next steps can get it too."""
    import importlib.metadata

    here = Path(__file__).resolve().parents[2]  # the dir holding hetero_dp/
    if (here / "pyproject.toml").is_file() and (here / "hetero_dp").is_dir():
        return Origin("source", here)  # a checkout: editable, or on PYTHONPATH
    try:
        text = importlib.metadata.distribution("hetero-dp").read_text("direct_url.json")
        direct = json.loads(text or "null")
    except (importlib.metadata.PackageNotFoundError, ValueError, OSError):
        direct = None
    url = str(direct.get("url", "")) if isinstance(direct, dict) else ""
    if not url.startswith("file:"):
        return Origin("index")
    path = Path(unquote(urlparse(url).path))
    if "dir_info" in direct:
        return Origin("source", path)
    if path.name.endswith(".whl") and path.is_file():
        return Origin("wheel", path)
    return Origin("index")


def next_steps(project: Path, origin: Origin, has_wheel: bool) -> list[str]:
    """The commands that take a new project to passing tests, in a fresh venv, as printed
    by ``hetero-dp new``. Where no index serves hetero-dp and the project carries no
    wheel of it, the first step builds one from the checkout this hetero-dp runs from."""
    steps = [f"cd {shlex.quote(str(project))}"]
    steps.append("python3 -m venv .venv && . .venv/bin/activate")
    if not has_wheel and origin.kind == "source" and origin.path is not None:
        checkout = shlex.quote(str(origin.path))
        steps.append(f"pip wheel --no-deps --wheel-dir wheels {checkout}")
    steps.append("pip install --find-links wheels -e '.[test]'")
    steps.append("pytest")
    return steps


def generate(
    values: Mapping[str, str | None],
    target: str | Path | None = None,
    *,
    force: bool = False,
    template: Path | None = None,
    wheels: str | Path | None = None,
) -> tuple[Path, list[Path]]:
    """Validate, render and write a project; returns (project dir, written files).

    The project pins ``hetero-dp~=`` this hetero-dp's version. ``wheels``: a directory
    whose wheels are copied into the project's ``wheels/`` (see :func:`plan_wheels`).
    """
    from hetero_dp import __version__

    template = template or template_dir()
    if values.get("hetero_dp_version") is None:
        values = {**values, "hetero_dp_version": __version__}
    context = build_context(values, template)
    files = plan(context, template)
    if wheels is not None:
        files += plan_wheels(wheels, context["hetero_dp_version"])
    elif values.get("hetero_dp_version") == __version__:
        # This hetero-dp came from a wheel file that is still there: the project takes
        # it along (pip and the Dockerfile find it in wheels/, no index needed).
        origin = hetero_dp_origin()
        if origin.kind == "wheel" and origin.path is not None:
            files += plan_wheels(origin.path.parent, context["hetero_dp_version"], only=origin.path)
    out = Path(target) if target is not None else Path.cwd() / context["project_slug"]
    return out, write(files, out, force=force)
