"""CDIWriter: start-up checks, atomic (re)writes, removal, and only our own files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from hetero_dp import ConfigError
from hetero_dp.engine.cdi_publisher import CDIWriter
from tests.cdi import samples
from tests.cdi.crash import REPO, FrozenWriter
from tests.cdi.schema_check import assert_valid_cdi_spec

KIND = "acme.com/accel"


def _names(spec: dict) -> list[str]:
    return [d["name"] for d in spec["devices"]]


def test_check_creates_a_missing_dir(tmp_path: Path) -> None:
    d = tmp_path / "run" / "cdi"
    CDIWriter(d).check()
    assert d.is_dir()


def test_check_missing_and_uncreatable_dir_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    d = tmp_path / "file" / "cdi"
    with pytest.raises(ConfigError) as e:
        CDIWriter(d).check(field="cdi.dir")
    assert str(d) in str(e.value) and "is a file" in str(e.value)
    assert e.value.field == "cdi.dir"
    with pytest.raises(ConfigError, match="is a file"):  # the check that writes nothing
        CDIWriter(d).check_name()
    assert not d.exists()


def test_check_name_creates_nothing(tmp_path: Path) -> None:
    d = tmp_path / "run" / "cdi"
    CDIWriter(d).check_name()
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="absolute"):
        CDIWriter("run/cdi").check_name()
    with pytest.raises(ConfigError, match="unusable"):
        CDIWriter(tmp_path / ("x" * 300) / "cdi").check_name()


def test_check_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "cdi").write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        CDIWriter(tmp_path / "cdi").check()


_CHECK_AS_NOBODY = textwrap.dedent(
    """
    import os, sys
    from hetero_dp import ConfigError
    from hetero_dp.engine.cdi_publisher import CDIWriter
    if os.getuid() == 0:  # root writes anywhere: check as an ordinary user
        os.setgid(65534)
        os.setuid(65534)
    try:
        CDIWriter(sys.argv[1]).check()
    except ConfigError as e:
        print("ConfigError", e.field, str(e))
    else:
        print("passed")
    """
)


def test_check_unwritable_dir_names_the_path() -> None:
    d = Path(tempfile.mkdtemp(prefix="hdp-cdi-ro-", dir="/tmp"))  # reachable by nobody
    try:
        os.chmod(d, 0o555)
        out = subprocess.run(
            [sys.executable, "-c", _CHECK_AS_NOBODY, str(d)],
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout.startswith("ConfigError cdi.dir"), out.stdout + out.stderr
        assert f"CDI spec dir '{d}' is not writable" in out.stdout
        assert list(d.iterdir()) == []
    finally:
        os.chmod(d, 0o755)
        d.rmdir()


def test_write_names_file_after_kind_and_is_valid(tmp_path: Path) -> None:
    w = CDIWriter(tmp_path)
    w.check()
    path = w.write(KIND, samples.accel_glob(2))
    assert path == tmp_path / "hetero-dp_acme.com_accel.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    spec = assert_valid_cdi_spec(path)
    assert _names(spec) == ["accel0", "accel1"]
    assert w.read(KIND) == spec


def test_unchanged_device_set_does_not_rewrite(tmp_path: Path) -> None:
    w = CDIWriter(tmp_path)
    path = w.write(KIND, samples.accel_glob(2))
    assert path is not None
    before = path.stat()
    assert w.write(KIND, samples.accel_glob(2)) == path
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_device_removal_rewrites_the_spec(tmp_path: Path) -> None:
    w = CDIWriter(tmp_path)
    w.write(KIND, samples.accel_glob(3))
    devices = samples.accel_glob(3)
    del devices[1]
    path = w.write(KIND, devices)
    assert path is not None
    assert _names(assert_valid_cdi_spec(path)) == ["accel0", "accel2"]
    # and back: a device coming back is added again
    assert _names(assert_valid_cdi_spec(w.write(KIND, samples.accel_glob(3)))) == [
        "accel0",
        "accel1",
        "accel2",
    ]


def test_no_devices_removes_the_spec(tmp_path: Path) -> None:
    w = CDIWriter(tmp_path)
    w.write(KIND, samples.accel_glob(1))
    assert w.write(KIND, []) is None
    assert not w.path_for(KIND).exists()


def test_remove(tmp_path: Path) -> None:
    w = CDIWriter(tmp_path)
    w.write(KIND, samples.accel_glob(1))
    assert w.remove(KIND) is True
    assert w.remove(KIND) is False
    assert list(tmp_path.iterdir()) == []


def test_bad_kind_is_refused_before_touching_the_dir(tmp_path: Path) -> None:
    w = CDIWriter(tmp_path)
    with pytest.raises(ConfigError, match="cdiKind"):
        w.write("not-a-kind", samples.accel_glob(1))
    assert list(tmp_path.iterdir()) == []


def test_only_our_own_files_are_touched(tmp_path: Path) -> None:
    others = {
        "nvidia.yaml": "cdiVersion: 0.5.0\n",
        "acme.com-accel.json": "{}",
        ".acme.com-accel.json.x1.tmp": "half",
        "hetero-dp.notes": "keep",
    }
    for name, text in others.items():
        (tmp_path / name).write_text(text)
    stale = tmp_path / ".hetero-dp_acme.com_accel.json.k3j2h1.tmp"
    stale.write_text('{"cdiVer')
    stamps = {n: (tmp_path / n).stat().st_mtime_ns for n in others}
    w = CDIWriter(tmp_path)
    w.check()
    assert not stale.exists()  # ours, left by a killed write
    w.write(KIND, samples.accel_glob(2))
    w.write("amd.com/gpu", samples.amd_gpus())
    w.write(KIND, samples.accel_glob(1))
    w.remove("amd.com/gpu")
    for name, text in others.items():
        assert (tmp_path / name).read_text() == text
        assert (tmp_path / name).stat().st_mtime_ns == stamps[name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*others, "hetero-dp_acme.com_accel.json"]
    )


def test_kill_between_write_and_rename_keeps_previous_spec(tmp_path: Path) -> None:
    w = CDIWriter(tmp_path)
    w.check()
    path = w.write(KIND, samples.accel_glob(3))
    assert path is not None
    before = path.read_bytes()
    child = FrozenWriter(
        "replace",
        "from hetero_dp.engine.cdi_publisher import CDIWriter\n"
        "from tests.cdi import samples\n"
        f"CDIWriter({str(tmp_path)!r}).write({KIND!r}, samples.accel_glob(1))\n",
    )
    (tmp,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert _names(json.loads(tmp.read_text())) == ["accel0"]  # the new spec, complete
    child.kill()
    assert path.read_bytes() == before
    assert _names(assert_valid_cdi_spec(path)) == ["accel0", "accel1", "accel2"]
    # A restarted plugin cleans up and carries on.
    w2 = CDIWriter(tmp_path)
    w2.check()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    w2.write(KIND, samples.accel_glob(1))
    assert _names(assert_valid_cdi_spec(path)) == ["accel0"]
