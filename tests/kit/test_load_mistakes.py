"""A plugin author's mistakes in hook names and arguments are refused at load, by a
real ``hetero-dp`` process, with the file, the function and the fix."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from hetero_dp.engine.loading import load_backends
from hetero_dp.model.errors import ConfigError

GOOD = """
from hetero_dp import Device, hookimpl

@hookimpl
def discover():
    return [Device("d0", "acme.example.com/npu")]
"""


def _plugin(tmp_path: Path, extra: str, name: str = "typo_plugin.py") -> Path:
    path = tmp_path / name
    path.write_text(GOOD + textwrap.dedent(extra))
    return path


def _list(cmd: list[str], env: dict[str, str], path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cmd, "list", str(path)], env=env, capture_output=True, text=True, timeout=60
    )


def test_misspelt_hook_is_refused_with_the_closest_name(tmp_path, cli_env, hetero_dp_cmd):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def check_heath(device):
            return "never called"
        """,
    )
    result = _list(hetero_dp_cmd, cli_env, path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "did you mean check_health?" in result.stderr
    assert f"{path}:" in result.stderr  # the file (and line) of the function
    assert "check_heath" in result.stderr
    assert "Traceback" not in result.stderr
    assert "d0" not in result.stdout  # nothing ran


def test_unknown_argument_is_refused_with_the_closest_name(tmp_path, cli_env, hetero_dp_cmd):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def check_health(dev):
            return True
        """,
    )
    result = _list(hetero_dp_cmd, cli_env, path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "argument 'dev' is not an argument of hook check_health" in result.stderr
    assert "did you mean device?" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_hook_with_no_near_name_lists_the_hooks(tmp_path):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def frobnicate():
            pass
        """,
    )
    with pytest.raises(ConfigError) as e:
        load_backends([str(path)])
    assert "'frobnicate' is no hook" in str(e.value)
    assert "discover" in str(e.value) and "check_health" in str(e.value)


def test_every_mistake_is_named_at_once(tmp_path):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def labls(devices):
            return {}

        @hookimpl
        def allocate(devics, response):
            pass
        """,
    )
    with pytest.raises(ConfigError) as e:
        load_backends([str(path)])
    assert "did you mean labels?" in str(e.value)
    assert "did you mean devices?" in str(e.value)


def test_an_object_plugin_and_unmarked_helpers_are_fine(tmp_path):
    class Plugin:
        from hetero_dp import hookimpl

        @hookimpl
        def discover(self):
            return []

        @hookimpl
        def check_health(self, device, retries=3):  # a default: pluggy never passes it
            return True

        def check_heath(self):  # not marked: a helper, not a hook
            return True

    (backend,) = load_backends([Plugin()])
    assert backend.implements("check_health")
    backend.close()


def test_a_function_named_like_a_hook_without_hookimpl_is_warned_about(
    tmp_path, cli_env, hetero_dp_cmd
):
    path = _plugin(
        tmp_path,
        """
        def check_health(device):
            return False
        """,
        name="unmarked_plugin.py",
    )
    listed = _list(hetero_dp_cmd, cli_env, path)
    assert listed.returncode == 0, listed.stderr  # a warning, not a refusal
    assert f"{path}:8: function check_health has the name of a hook but no @hookimpl" in (
        listed.stderr
    )
    assert "Healthy" in listed.stdout  # indeed never called


def test_imported_functions_named_like_hooks_are_not_warned_about(tmp_path, caplog):
    path = _plugin(tmp_path, "from os.path import join as labels\n", name="imports.py")
    (backend,) = load_backends([str(path)])
    backend.close()
    assert "no @hookimpl" not in caplog.text


@pytest.mark.parametrize(
    ("declaration", "said"),
    [
        ('count: int = option("ninety")', "option 'count' (int) has the default 'ninety'"),
        (
            'count: int = option("90")',
            "option 'count' (int) has the default '90', which is not of type int",
        ),
        (
            "name: str = option(5)",
            "option 'name' (str) has the default 5, which is not of type str",
        ),
        ('enabled: bool = option("yes")', "option 'enabled' (bool) has the default 'yes'"),
    ],
)
def test_an_option_default_of_the_wrong_type_is_refused(tmp_path, declaration: str, said: str):
    path = tmp_path / "typed.py"
    path.write_text(
        "from dataclasses import dataclass\n\n"
        "from hetero_dp import Device, hookimpl, option\n\n\n"
        "@dataclass(frozen=True)\n"
        "class Options:\n"
        f"    {declaration}\n\n\n"
        "@hookimpl\n"
        "def configure(options: Options):\n"
        "    pass\n\n\n"
        "@hookimpl\n"
        "def discover():\n"
        "    return []\n"
    )
    with pytest.raises(ConfigError) as e:
        load_backends([str(path)])
    assert said in str(e.value)
    assert f"{path}:6" in str(e.value)  # the options class (its decorator line)


def test_defaults_of_matching_types_are_accepted(tmp_path):
    path = tmp_path / "fine.py"
    path.write_text(
        "from dataclasses import dataclass\n"
        "from pathlib import Path\n\n"
        "from hetero_dp import hookimpl, option\n\n\n"
        "@dataclass(frozen=True)\n"
        "class Options:\n"
        "    ratio: float = option(1)\n"
        '    root: Path = option("/dev")\n'
        "    names: list[str] = option([])\n"
        "    limit: int | None = option(None)\n\n\n"
        "@hookimpl\n"
        "def configure(options: Options):\n"
        "    pass\n\n\n"
        "@hookimpl\n"
        "def discover():\n"
        "    return []\n"
    )
    (backend,) = load_backends([str(path)])
    backend.close()


CLASS_PLUGINS = {
    "no_self": (
        """
        class Acme:
            @hookimpl
            def check_health(device):
                return True

        plugin = Acme()
        """,
        "has no 'self', so the instance arrives as 'device'",
        "write def check_health(self, device)",
    ),
    "no_arguments": (
        """
        class Acme:
            @hookimpl
            def labels():
                return {}

        plugin = Acme()
        """,
        "method labels() takes no 'self'",
        "write def labels(self, devices)",
    ),
    "static_with_self": (
        """
        class Acme:
            @hookimpl
            @staticmethod
            def check_health(self, device):
                return True

        plugin = Acme()
        """,
        "check_health is a staticmethod with a 'self' parameter",
        "drop @staticmethod (a method) or drop 'self'",
    ),
}


@pytest.mark.parametrize("case", sorted(CLASS_PLUGINS))
def test_a_hook_method_without_self_is_refused_at_load(tmp_path, cli_env, hetero_dp_cmd, case):
    """A method hook missing 'self' turned every device Unhealthy with "got multiple
    values for argument 'device'", without a line at load; now it is refused there with
    the file, line and fix, for list as for run."""
    body, problem, fix = CLASS_PLUGINS[case]
    path = _plugin(tmp_path, body.replace("plugin = Acme()", ""), name=f"{case}.py")
    path.write_text(
        path.read_text().replace("@hookimpl\ndef discover", "def discover", 1)
        + "\nplugin = Acme()\n"
    )
    result = _list(hetero_dp_cmd, cli_env, path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert problem in result.stderr and fix in result.stderr, result.stderr
    assert f"{path}:" in result.stderr
    assert "Traceback" not in result.stderr


def test_right_method_and_staticmethod_hooks_load(tmp_path):
    path = tmp_path / "fine.py"
    path.write_text(
        textwrap.dedent(
            """
            from hetero_dp import Device, hookimpl

            class Acme:
                @hookimpl
                def discover(self):
                    return [Device("d0", "acme.example.com/npu")]

                @hookimpl
                def check_health(self, device):
                    return True

                @staticmethod
                @hookimpl
                def labels(devices):
                    return {}

            plugin = Acme()
            """
        )
    )
    backends = load_backends([str(path)])
    assert [b.name for b in backends] == ["fine"]
    for b in backends:
        b.close()
