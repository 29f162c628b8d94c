"""What a CDI spec must carry so that a CUDA container works: the driver's files.

What NVIDIA's plugin puts into its CDI spec (through the container toolkit's CDI
library, pkg/nvcdi; docs/sources.md#nvidia-cdi-spec) is rebuilt here from the files that
exist under the driver root: the user-space libraries of the running driver
version (found through the driver root's ld cache, then the usual lib dirs), the
utilities, the persistenced socket, the GSP firmware, the control device nodes
with their major/minor numbers, ``createContainer`` hooks run through
``nvidia-ctk``, and the env. A file that is not there is left out, never
invented.

Paths: files are looked up where the driver root is visible to this process
(``Options.visible_driver_root``, NVIDIA's ``DRIVER_ROOT_CTR_PATH``); the spec's
``hostPath`` is the same file under the host's driver root
(``nvidiaDriverRoot``) and its container path is the path inside the root.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import ldcache
from .discovery import CONTROL_NODES
from .options import Options

# The driver's user-space libraries a CUDA container needs, as NVIDIA's CDI spec
# lists them (docs/sources.md#nvidia-cdi-spec): each is looked for as <stem>.so.<driver version>.
DRIVER_LIBRARIES = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvcuvid",
    "libnvidia-encode",
    "libnvidia-opticalflow",
    "libnvidia-allocator",
    "libnvidia-cfg",
    "libnvidia-gpucomp",
    "libnvidia-opencl",
    "libnvidia-pkcs11*",
)
UTILITIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# Where the container toolkit looks for binaries and libraries when the ld cache
# does not name them (the usual FHS and Debian/Red Hat multiarch dirs).
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
LIB_DIRS = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib",
    "/lib",
)
PERSISTENCED_SOCKETS = ("/run/nvidia-persistenced/socket", "/var/run/nvidia-persistenced/socket")
FIRMWARE_DIRS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
LD_CACHE = "/etc/ld.so.cache"
# Mount options of NVIDIA's spec for driver files (read-only binds, no devices, no setuid).
FILE_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
SOCKET_OPTIONS = [*FILE_OPTIONS, "noexec"]


@dataclass
class DriverFiles:
    """The driver files found under one root, as container paths."""

    version: str
    libraries: list[str] = field(default_factory=list)
    utilities: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)
    firmware: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (target, link path)

    @property
    def lib_dirs(self) -> list[str]:
        return list(dict.fromkeys(posixpath.dirname(p) for p in self.libraries))

    @property
    def libcuda_dir(self) -> str:
        return next(
            (posixpath.dirname(p) for p in self.libraries if "/libcuda.so." in p),
            "",
        )


class Root:
    """Paths inside a driver root, read where the root is visible to us."""

    def __init__(self, visible: str) -> None:
        self.visible = visible or "/"

    def real(self, path: str) -> str:
        return os.path.join(self.visible, path.lstrip("/"))

    def resolve(self, path: str) -> str:
        """``path`` with symlinks followed inside the root (absolute targets re-rooted)."""
        path = posixpath.normpath(path)
        for _ in range(40):
            try:
                target = os.readlink(self.real(path))
            except OSError:
                return path
            base = posixpath.dirname(path)
            path = posixpath.normpath(target if target.startswith("/") else f"{base}/{target}")
        return path

    def is_file(self, path: str) -> bool:
        return os.path.isfile(self.real(path))

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.real(path)))
        except OSError:
            return []


def find_files(opts: Options, version: str) -> DriverFiles:
    """The driver files of ``version`` that exist under the options' driver root."""
    root = Root(opts.visible_driver_root)
    found = DriverFiles(version=version)
    if not version:
        return found
    cache = ldcache.read(root.real(LD_CACHE))
    dirs = _library_dirs(root, cache)
    for stem in DRIVER_LIBRARIES:
        wanted = f"{stem}.so.{version}"
        for d in dirs:
            names = [n for n in root.listdir(d) if fnmatch.fnmatchcase(n, wanted)]
            paths = [f"{d}/{n}" for n in names if root.is_file(f"{d}/{n}")]
            if paths:
                found.libraries.extend(paths)
                break
    libs = set(found.libraries)
    for soname, path in cache:  # soname links the ld cache knows, for mounted files only
        target = root.resolve(path)
        pair = (posixpath.basename(target), f"{posixpath.dirname(target)}/{soname}")
        if target in libs and pair[1] != target and pair not in found.links:
            found.links.append(pair)
    cuda_dir = found.libcuda_dir
    if cuda_dir:  # what CUDA's development tools link against
        found.links.append(("libcuda.so.1", f"{cuda_dir}/libcuda.so"))
    for name in UTILITIES:
        found.utilities += [f"{d}/{name}" for d in BIN_DIRS if root.is_file(f"{d}/{name}")][:1]
    for sock in PERSISTENCED_SOCKETS:
        if os.path.exists(root.real(sock)):
            found.sockets.append(sock)
            break
    for d in FIRMWARE_DIRS:
        fw = f"{d}/{version}"
        names = [n for n in root.listdir(fw) if fnmatch.fnmatchcase(n, "gsp*.bin")]
        if names:
            found.firmware.extend(f"{fw}/{n}" for n in names)
            break
    return found


def _library_dirs(root: Root, cache: Iterable[tuple[str, str]]) -> list[str]:
    """Dirs holding driver libraries according to the ld cache, then the usual ones."""
    dirs: list[str] = []
    stems = tuple(s.rstrip("*") for s in DRIVER_LIBRARIES)
    for soname, path in cache:
        if soname.startswith(stems):
            dirs.append(posixpath.dirname(root.resolve(path)))
    return list(dict.fromkeys([*dirs, *LIB_DIRS]))


def _mount(opts: Options, path: str, options: list[str]) -> dict[str, Any]:
    return {
        "hostPath": os.path.join(opts.driver_root, path.lstrip("/")),
        "containerPath": path,
        "options": list(options),
    }


def control_device_nodes(opts: Options) -> list[dict[str, Any]]:
    """The control nodes present under the dev root, with type, major and minor."""
    out = []
    for name in CONTROL_NODES:
        path = f"/dev/{name}"
        try:
            st = os.stat(os.path.join(opts.visible_dev_root, "dev", name))
        except OSError:
            continue
        node: dict[str, Any] = {"path": path}
        host = os.path.join(opts.host_dev_root, "dev", name)
        if host != path:
            node["hostPath"] = host
        if stat.S_ISCHR(st.st_mode):
            # No fileMode: the CDI JSON schema (cncf-tags/container-device-interface,
            # schema/defs.json, copied in tests/cdi/schema) has none, and a
            # loader rejects unknown fields; the runtime takes the mode from the host.
            node.update(type="c", major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
        node["permissions"] = "rw"
        out.append(node)
    return out


def _hook(opts: Options, name: str, *args: str) -> dict[str, Any]:
    path = opts.cdi_hook_path
    base = posixpath.basename(path)
    # nvidia-cdi-hook takes the hook name directly; nvidia-ctk takes "hook <name>".
    argv = [base, name, *args] if base == "nvidia-cdi-hook" else [base, "hook", name, *args]
    return {"hookName": "createContainer", "path": path, "args": argv}


def hooks(opts: Options, files: DriverFiles) -> list[dict[str, Any]]:
    """The ``createContainer`` hooks NVIDIA's spec has, less those CDI_DISABLE_HOOKS names."""
    disabled = opts.cdi_disabled_hooks
    if "all" in disabled:
        return []
    out = []
    if files.links and "create-symlinks" not in disabled:
        link_args = [a for target, link in files.links for a in ("--link", f"{target}::{link}")]
        out.append(_hook(opts, "create-symlinks", *link_args))
    if files.version and files.libcuda_dir and "enable-cuda-compat" not in disabled:
        out.append(_hook(opts, "enable-cuda-compat", f"--host-driver-version={files.version}"))
    if files.lib_dirs and "update-ldcache" not in disabled:
        folders = [a for d in files.lib_dirs for a in ("--folder", d)]
        out.append(_hook(opts, "update-ldcache", *folders))
    if "disable-device-node-modification" not in disabled:
        out.append(_hook(opts, "disable-device-node-modification"))
    return out


def spec_edits(opts: Options, version: str) -> dict[str, Any]:
    """Spec-wide CDI ``containerEdits`` carrying the driver (see the module doc)."""
    files = find_files(opts, version)
    edits: dict[str, Any] = {}
    env = ["NVIDIA_VISIBLE_DEVICES=void"]
    if files.libcuda_dir:
        env.append(f"NVIDIA_CTK_LIBCUDA_DIR={files.libcuda_dir}")
    edits["env"] = env
    nodes = control_device_nodes(opts)
    if nodes:
        edits["deviceNodes"] = nodes
    mounts = [_mount(opts, p, FILE_OPTIONS) for p in files.libraries + files.utilities]
    mounts += [_mount(opts, p, SOCKET_OPTIONS) for p in files.sockets]
    mounts += [_mount(opts, p, FILE_OPTIONS) for p in files.firmware]
    if mounts:
        edits["mounts"] = mounts
    hook_list = hooks(opts, files)
    if hook_list:
        edits["hooks"] = hook_list
    return edits
