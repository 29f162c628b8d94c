"""The NVIDIA CDI spec carries the driver (docs/sources.md#nvidia-cdi-spec): libraries of the
running driver version found through the driver root's ld cache or the usual lib
dirs, utilities, the persistenced socket, GSP firmware, control nodes with
major/minor, nvidia-ctk createContainer hooks and NVIDIA's env. Files that are not
there are left out. The fake driver root is built by tests/nvidia/driver_root.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hetero_dp_nvidia import ldcache
from hetero_dp_nvidia.backend import NvidiaBackend
from hetero_dp_nvidia.driver_files import find_files, spec_edits
from hetero_dp_nvidia.options import parse_options

from tests.cdi.schema_check import assert_valid_cdi_spec
from tests.nvidia.driver_root import (
    FIRMWARE,
    SONAMES,
    VERSION,
    add_persistenced_socket,
    build_ld_cache,
    make_driver_root,
)

KIND = "k8s.device-plugin.nvidia.com/gpu"


def read_spec(cdi_dir: Path) -> dict:
    [path] = cdi_dir.glob("*.json")
    return assert_valid_cdi_spec(json.loads(path.read_text()))


def by_container_path(spec: dict) -> dict[str, dict]:
    return {m["containerPath"]: m for m in spec["containerEdits"].get("mounts", [])}


def hook_args(spec: dict) -> dict[str, list[str]]:
    return {h["args"][2]: h["args"] for h in spec["containerEdits"].get("hooks", [])}


async def test_spec_carries_the_driver_found_through_the_ld_cache(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    node = fake_node("h100-8x.scn")
    driver = node.root / "driver"
    # An unusual lib dir that only the ld cache can point at.
    make_driver_root(driver, lib_dir="/opt/nvidia/lib64")
    build_ld_cache(driver)
    sock = add_persistenced_socket(driver)
    # A real character device where nvidiactl is: major/minor come from stat().
    (driver / "dev/nvidiactl").unlink()
    os.symlink("/dev/null", driver / "dev/nvidiactl")
    null = os.stat("/dev/null")
    # A plain file where nvidia-uvm is: no type, major, minor (the runtime stats the host).
    (driver / "dev/nvidia-uvm").unlink()
    (driver / "dev/nvidia-uvm").touch()
    cdi_dir = tmp_path / "cdi"
    env = {
        "DEVICE_LIST_STRATEGY": "cdi-cri",
        # The host sees the driver at /run/nvidia/driver; we read it where it is mounted.
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
        "DRIVER_ROOT_CTR_PATH": str(driver),
    }
    try:
        await plugin_runner.start(
            NvidiaBackend(environ=env),
            config={"cdi": {"dir": str(cdi_dir)}},  # enabled unset: written for CDI strategies
            options={"nvidia": node.options},
        )
        await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
        r = await fake_kubelet.allocate("nvidia.com/gpu", [node.uuid(2)])
    finally:
        sock.close()
    assert [c.name for c in r.cdi_devices] == [f"{KIND}={node.uuid(2)}"]
    assert "NVIDIA_VISIBLE_DEVICES" not in r.envs  # CDI only: as NVIDIA's plugin answers

    spec = read_spec(cdi_dir)
    assert spec["kind"] == KIND
    edits = spec["containerEdits"]
    lib = "/opt/nvidia/lib64"
    assert set(edits["env"]) == {"NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={lib}"}
    mounts = by_container_path(spec)
    libs = {f"{lib}/{stem}.so.{VERSION}" for stem in SONAMES}
    utilities = {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-persistenced"}
    utilities.add("/usr/bin/nvidia-cuda-mps-control")
    firmware = {f"/lib/firmware/nvidia/{VERSION}/{n}" for n in FIRMWARE}
    socket_path = "/run/nvidia-persistenced/socket"
    assert set(mounts) == libs | utilities | firmware | {socket_path}
    assert f"{lib}/libcuda.so.535.104.05" not in mounts  # another version is never mounted
    for path, m in mounts.items():
        assert m["hostPath"] == "/run/nvidia/driver" + path
        assert {"ro", "nosuid", "nodev", "rbind"} <= set(m["options"])
    assert "noexec" in mounts[socket_path]["options"]

    nodes = {n["path"]: n for n in edits["deviceNodes"]}
    assert set(nodes) == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    ctl = nodes["/dev/nvidiactl"]
    assert (ctl["type"], ctl["major"], ctl["minor"]) == (
        "c",
        os.major(null.st_rdev),
        os.minor(null.st_rdev),
    )
    assert ctl["hostPath"] == "/run/nvidia/driver/dev/nvidiactl"
    assert "major" not in nodes["/dev/nvidia-uvm"]  # a plain file: the runtime stats the host
    per_device = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    [gpu_node] = per_device[node.uuid(2)]["deviceNodes"]
    assert gpu_node["hostPath"] == "/run/nvidia/driver/dev/nvidia2"

    hooks = hook_args(spec)
    assert {h["path"] for h in edits["hooks"]} == {"/usr/bin/nvidia-ctk"}
    assert {h["hookName"] for h in edits["hooks"]} == {"createContainer"}
    links = hooks["create-symlinks"][3:]
    assert links[0::2] == ["--link"] * (len(links) // 2)
    assert f"libcuda.so.{VERSION}::{lib}/libcuda.so.1" in links
    assert f"libnvidia-nvvm.so.{VERSION}::{lib}/libnvidia-nvvm.so.4" in links
    assert f"libcuda.so.1::{lib}/libcuda.so" in links
    assert hooks["enable-cuda-compat"][3:] == [f"--host-driver-version={VERSION}"]
    assert hooks["update-ldcache"][3:] == ["--folder", lib]
    assert "disable-device-node-modification" in hooks


def test_without_an_ld_cache_the_usual_lib_dirs_are_searched(tmp_path):
    root = make_driver_root(tmp_path / "root", lib_dir="/usr/lib64")
    opts = parse_options({"nvidiaDriverRoot": str(root)}, {})
    files = find_files(opts, VERSION)
    assert sorted(files.libraries) == sorted(f"/usr/lib64/{s}.so.{VERSION}" for s in SONAMES)
    assert files.sockets == []  # no persistenced running: no socket mount
    # Soname links come from the ld cache only; without one just libcuda.so is linked.
    assert files.links == [("libcuda.so.1", "/usr/lib64/libcuda.so")]


def test_missing_files_are_left_out_never_invented(tmp_path):
    root = make_driver_root(tmp_path / "root", libs=("libcuda",))
    for name in ("usr/bin", "lib/firmware"):
        for p in sorted((root / name).rglob("*"), reverse=True):
            p.unlink() if not p.is_dir() else p.rmdir()
    opts = parse_options({"nvidiaDriverRoot": str(root)}, {})
    edits = spec_edits(opts, VERSION)
    paths = [m["containerPath"] for m in edits["mounts"]]
    assert paths == [f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"]
    assert "deviceNodes" not in edits  # no /dev under this root
    # Another driver version on the node: nothing of this one is found.
    assert spec_edits(opts, "999.1.2").get("mounts") is None


def test_hook_path_and_disabled_hooks_follow_nvidia_settings(tmp_path):
    root = make_driver_root(tmp_path / "root")
    env = {
        "NVIDIA_CDI_HOOK_PATH": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        "CDI_DISABLE_HOOKS": "enable-cuda-compat,disable-device-node-modification",
    }
    opts = parse_options({"nvidiaDriverRoot": str(root)}, env)
    hooks = spec_edits(opts, VERSION)["hooks"]
    # nvidia-cdi-hook takes the hook name directly (no "hook" word, unlike nvidia-ctk)
    assert [h["args"][:2] for h in hooks] == [
        ["nvidia-cdi-hook", "create-symlinks"],
        ["nvidia-cdi-hook", "update-ldcache"],
    ]
    assert {h["path"] for h in hooks} == {env["NVIDIA_CDI_HOOK_PATH"]}
    opts = parse_options({"nvidiaDriverRoot": str(root)}, {"CDI_DISABLE_HOOKS": "all"})
    assert "hooks" not in spec_edits(opts, VERSION)
    # NVIDIA_CTK_PATH is the older name of the same setting
    opts = parse_options({"nvidiaDriverRoot": str(root)}, {"NVIDIA_CTK_PATH": "/opt/nvidia-ctk"})
    assert opts.cdi_hook_path == "/opt/nvidia-ctk"


async def test_cdi_disabled_writes_no_spec(fake_kubelet, plugin_runner, fake_node, tmp_path):
    node = fake_node("h100-8x.scn")
    cdi_dir = tmp_path / "cdi"
    await plugin_runner.start(
        NvidiaBackend(environ={"DEVICE_LIST_STRATEGY": "cdi-cri"}),
        config={"cdi": {"enabled": False, "dir": str(cdi_dir)}},
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert not cdi_dir.exists()  # the names are sent; the specs come from elsewhere


async def test_no_spec_and_no_dir_without_a_cdi_strategy(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    node = fake_node("h100-8x.scn")
    cdi_dir = tmp_path / "cdi"
    await plugin_runner.start(
        NvidiaBackend(environ={}),
        config={"cdi": {"dir": str(cdi_dir)}},
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert not cdi_dir.exists()


def test_ld_cache_rejects_other_data(tmp_path):
    with pytest.raises(ldcache.LdCacheError):
        ldcache.parse(b"ld.so-1.7.0\0\0\0\0")
    bad = tmp_path / "ld.so.cache"
    bad.write_bytes(b"glibc-ld.so.cache1.1" + b"\xff" * 28)  # claims 4 billion entries
    assert ldcache.read(bad) == []


async def test_a_reload_that_changes_the_hook_path_rewrites_the_spec(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    from hetero_dp.engine.config import load_config

    node = fake_node("h100-8x.scn")
    make_driver_root(node.root / "driver")
    cdi_dir = tmp_path / "cdi"
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "cdi": {"dir": str(cdi_dir)},
        "flags": {**node.options, "plugin": {"deviceListStrategy": "cdi-cri"}},
    }
    daemon = await plugin_runner.start(NvidiaBackend(environ={}), config=doc)
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert {h["path"] for h in read_spec(cdi_dir)["containerEdits"]["hooks"]} == {
        "/usr/bin/nvidia-ctk"
    }
    plugin = {"deviceListStrategy": "cdi-cri", "nvidiaCTKPath": "/opt/toolkit/nvidia-ctk"}
    doc = {**doc, "flags": {**node.options, "plugin": plugin}}
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    # the devices are the same: nothing restarts, but the spec follows the new path
    assert summary["restarted"] == [] and summary["reconfigured"] == ["nvidia"]
    assert {h["path"] for h in read_spec(cdi_dir)["containerEdits"]["hooks"]} == {
        "/opt/toolkit/nvidia-ctk"
    }


async def test_the_spec_nvidias_plugin_left_behind_is_set_aside(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    # Two specs of one kind in one dir defining the same device make the CDI cache drop
    # it as conflicting (container-device-interface pkg/cdi/cache.go): NVIDIA's plugin
    # saves its spec as <vendor>-<class>.json (GenerateNameForSpec) in /var/run/cdi.
    node = fake_node("h100-8x.scn")
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    leftover = cdi_dir / "k8s.device-plugin.nvidia.com-gpu.json"
    old = {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": [{"name": node.uuid(0), "containerEdits": {"env": ["A=1"]}}],
    }
    leftover.write_text(json.dumps(old))
    unrelated = cdi_dir / "other-vendor.json"  # same kind, other devices: no conflict
    unrelated.write_text(json.dumps({**old, "devices": [{"name": "x1", "containerEdits": {}}]}))
    other_kind = cdi_dir / "nvidia.yaml"  # nvidia-ctk's kind nvidia.com/gpu: untouched
    other_kind.write_text(
        f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '{node.uuid(0)}'\n"
    )
    await plugin_runner.start(
        NvidiaBackend(environ={"DEVICE_LIST_STRATEGY": "cdi-cri"}),
        config={"cdi": {"dir": str(cdi_dir)}},
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert not leftover.exists()
    kept = cdi_dir / "k8s.device-plugin.nvidia.com-gpu.json.hetero-dp-superseded"
    assert json.loads(kept.read_text()) == old  # nothing lost
    assert unrelated.exists() and other_kind.exists()
    assert (cdi_dir / "hetero-dp_k8s.device-plugin.nvidia.com_gpu.json").exists()


async def test_envvar_beside_cdi_cri_spec_has_device_nodes_response_has_no_device_specs(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    node = fake_node("h100-8x.scn")
    cdi_dir = tmp_path / "cdi"
    await plugin_runner.start(
        NvidiaBackend(environ={"DEVICE_LIST_STRATEGY": "envvar,cdi-cri"}),
        config={"cdi": {"dir": str(cdi_dir)}},
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    r = await fake_kubelet.allocate("nvidia.com/gpu", [node.uuid(4)])
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == node.uuid(4)  # as NVIDIA's: both ways
    assert [c.name for c in r.cdi_devices] == [f"{KIND}={node.uuid(4)}"]
    assert list(r.devices) == []  # no passDeviceSpecs: no DeviceSpecs
    per_device = {d["name"]: d["containerEdits"] for d in read_spec(cdi_dir)["devices"]}
    assert [n["path"] for n in per_device[node.uuid(4)]["deviceNodes"]] == ["/dev/nvidia4"]
