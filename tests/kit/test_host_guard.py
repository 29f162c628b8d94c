"""The suite keeps off the host: tests/hostguard.py fails a test that writes to the
host's CDI or kubelet dirs, and the fixtures point every host path a daemon would use
by default into their temp dirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.hostguard import HOST_DIRS, HostGuard, changes, snapshot

INNER_TESTS = """
import pytest
from pathlib import Path

HOST = Path({host!r})


def test_innocent(tmp_path):
    (tmp_path / "x").write_text("mine")


def test_writes_a_spec():
    (HOST / "cdi").mkdir(exist_ok=True)
    (HOST / "cdi" / "acme.json").write_text("{{}}")


@pytest.fixture
def leaves_a_socket():
    yield
    (HOST / "kubelet.sock").write_text("")


def test_whose_fixture_writes_at_teardown(leaves_a_socket):
    pass


def test_changes_one():
    (HOST / "seed").write_text("changed, longer")


def test_leaves_nothing_behind():
    (HOST / "gone.json").write_text("{{}}")  # readable by a runtime meanwhile
    (HOST / "gone.json").unlink()


def test_makes_a_missing_dir():
    (HOST.parent / "absent").mkdir()
"""


def run_inner(
    tmp_path: Path, roots: list[Path], tests: str, *pytest_args: str, private: bool = False
) -> subprocess.CompletedProcess[str]:
    """A pytest run of ``tests`` with only a HostGuard over ``roots`` registered."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(
        "from pathlib import Path\n"
        "from tests.hostguard import HostGuard\n\n"
        "def pytest_configure(config):\n"
        f"    roots = [{', '.join(f'Path({str(r)!r})' for r in roots)}]\n"
        f"    config.pluginmanager.register(HostGuard(roots, private={private}), 'guard')\n"
    )
    (inner / "test_inner.py").write_text(tests)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, "-p", "no:cacheprovider", str(inner)],
        cwd=inner,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_guard_fails_exactly_the_tests_that_write(tmp_path: Path):
    host = tmp_path / "host"
    host.mkdir()
    missing = tmp_path / "absent"  # a root that is not there until a test makes it
    (host / "seed").write_text("as found")
    proc = run_inner(tmp_path, [host, missing], INNER_TESTS.format(host=str(host)), "-q")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "6 passed, 5 errors" in out, out
    assert f"created {host}/cdi/acme.json" in out and f"created {host}/cdi\n" in out
    assert f"created {host}/kubelet.sock" in out
    assert f"changed {host}/seed" in out
    assert f"created {missing}\n" in out and f"changed {host}\n" in out
    errors = [ln for ln in out.splitlines() if ln.startswith("ERROR ")]
    assert sorted(e.split("::")[1].split()[0] for e in errors) == [
        "test_changes_one",
        "test_leaves_nothing_behind",
        "test_makes_a_missing_dir",
        "test_whose_fixture_writes_at_teardown",
        "test_writes_a_spec",
    ]


def test_snapshot_sees_creation_change_and_removal(tmp_path: Path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("1")
    before = snapshot([tmp_path, tmp_path / "missing"])
    (tmp_path / "a").write_text("22")
    (tmp_path / "b").unlink()
    (tmp_path / "c").write_text("")
    assert changes(before, snapshot([tmp_path])) == [
        f"created {tmp_path}/c",
        f"removed {tmp_path}/b",
        f"changed {tmp_path}",  # the root itself: its entries changed
        f"changed {tmp_path}/a",
    ]


def test_the_guard_watches_this_run(request):
    guards = [p for p in request.config.pluginmanager.get_plugins() if isinstance(p, HostGuard)]
    assert [g.roots for g in guards] == [HOST_DIRS]


async def test_the_fixtures_keep_every_host_path_of_the_daemon_in_temp_dirs(
    fake_kubelet, plugin_runner
):
    daemon = await plugin_runner.start("simulated", config={"labels": {"enabled": True}})
    cfg = daemon.config
    root = fake_kubelet.plugin_dir.parent
    for path in (cfg.kubelet_dir, cfg.plugins_registry_dir, cfg.cdi.dir, cfg.labels.dir):
        assert Path(path).is_relative_to(root), path
    # a path the test gives is kept
    other = await plugin_runner.start(
        "simulated", config={"cdi": {"dir": "/tmp/x-cdi"}, "socketPrefix": "other"}
    )
    assert other.config.cdi.dir == "/tmp/x-cdi"


NEIGHBOUR_TESTS = """
import os
import subprocess
from pathlib import Path

HOST = Path({host!r})
OUTSIDE = {outside!r}  # a process of the namespace the run started in


def neighbour_writes(name):
    # The kubelet on a node: another process, in the host's mount namespace, writing
    # under the guarded dir while the test runs.
    subprocess.run(
        ["nsenter", f"--mount=/proc/{{OUTSIDE}}/ns/mnt", "--", "sh", "-c",
         f"echo kubelet > {{HOST}}/{{name}}"],
        check=True,
    )


def test_a_neighbour_writes_while_the_test_runs():
    neighbour_writes("checkpoint")
    assert not (HOST / "checkpoint").exists()  # the run sees its private tmpfs


def test_the_test_itself_writes():
    (HOST / "device-plugins").mkdir()
"""


def test_a_private_guard_blames_the_test_and_never_a_neighbour(tmp_path: Path):
    """On a node the kubelet writes under /var/lib/kubelet while the suite runs (27
    tests failed there, each blamed for the kubelet's writes). With private=True the
    run's host dirs are a tmpfs of its own: another process's writes neither reach the
    run nor fail a test, the test's own writes still do, and the real dir is untouched."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        import pytest

        pytest.skip("a private mount namespace needs root (CAP_SYS_ADMIN) and nsenter")
    host = tmp_path / "host"
    host.mkdir()
    (host / "seed").write_text("as found")
    tests = NEIGHBOUR_TESTS.format(host=str(host), outside=os.getpid())
    proc = run_inner(tmp_path, [host], tests, "-rfE", private=True)
    out = proc.stdout
    assert "host guard: the host's CDI and kubelet dirs are private tmpfs mounts" in out, out
    assert "2 passed, 1 error" in out, out + proc.stderr  # the error: at teardown
    assert f"created {host}/device-plugins" in out
    assert "ERROR test_inner.py::test_the_test_itself_writes" in out
    # the neighbour's write landed on the real dir; the test's own did not
    assert (host / "checkpoint").read_text() == "kubelet\n"
    assert not (host / "device-plugins").exists()
    assert (host / "seed").read_text() == "as found"


LEAKY_TESTS = """
import shutil
import tempfile

import pytest

from hetero_dp.testing import short_tempdir


@pytest.fixture(scope="module")
def shared_dir():
    made = tempfile.mkdtemp(prefix="module-")  # lives until the module's last test
    yield made
    shutil.rmtree(made)


def test_uses_the_module_dir(shared_dir):
    assert shared_dir


def test_uses_it_again(shared_dir):
    assert shared_dir


def test_leaks_a_short_dir():
    short_tempdir("hdp-leak-")


def test_leaks_a_file():
    tempfile.mkstemp(prefix="leaked-")


def test_a_subprocess_leaks_a_short_dir():
    import subprocess, sys
    code = "from hetero_dp.testing import short_tempdir; short_tempdir('hdp-subleak-')"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def test_the_temp_guard_names_what_is_left_at_the_end_and_spares_wider_fixtures(tmp_path: Path):
    """A file or short_tempdir left behind fails the run, naming the test during which it
    appeared; a module-scoped fixture's dir, made at its first test and removed after its
    last, is not blamed (a per-test check once deleted such a dir under a live daemon)."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(
        "from tests.hostguard import TmpGuard\n\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(TmpGuard(config), 'tmp_guard')\n"
    )
    (inner / "test_inner.py").write_text(LEAKY_TESTS)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(inner)],
        cwd=inner,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "5 passed" in out and "files left in the temp dir" in out, out
    assert "(it appeared during test_inner.py::test_leaks_a_short_dir)" in out
    assert "(it appeared during test_inner.py::test_leaks_a_file)" in out
    # a process the test started (the smoke script's leak: five dirs a run)
    assert "(it appeared during test_inner.py::test_a_subprocess_leaks_a_short_dir)" in out
    assert "module-" not in out
    assert not list(Path("/tmp").glob("hdp-leak-*"))  # removed once reported
    assert not list(Path("/tmp").glob("hdp-subleak-*"))
