"""The gate: what a backend or a rule may put into a container.

Everything a device record carries into a container (device nodes, mounts, env,
annotations) and everything an Allocate response holds after the backend's
``allocate`` hook (CDI names too) passes :func:`device_problems` or
:func:`response_problems`, whatever the delivery strategy. A device whose record
fails is made Unhealthy by the daemon with the reason, naming the field; the
other devices serve. ``docs/hooks.md`` ("What a backend may put into a
container") gives the rules and their public sources:

- device nodes (``DeviceSpec.host_path``): absolute and normalised, under ``/dev``
  (of the host, or of a driver root mounted at ``<root>/dev``, such as a
  driver container's ``/run/<vendor>/driver/dev``); where the plugin sees the path, symlinks are
  resolved and the target must still be under such a ``dev`` directory and be a
  character or block device. The kubelet passes ``host_path`` to the runtime as
  it is (device-plugin API ``DeviceSpec``), and runc bind-mounts or mknods what
  it finds there; a regular file behind it would be a host file in the container.
- container paths: absolute and normalised (no ``.``/``..``, no ``//``).
- mounts: host and container paths absolute and normalised, never ``/`` nor
  anything under ``/proc`` or ``/sys`` (proc(5), sysfs(5): the host's kernel
  interfaces; a container gets its own from the runtime).
- env: keys are what Kubernetes accepts as an env var name (``[-._a-zA-Z][-._a-zA-Z0-9]*``),
  values without NUL (execve(2) strings end there) or newline (env files and
  logs break lines); no dynamic-loader variable (``LD_*``, ld.so(8): they choose
  which code every program of the container runs) and no ``GCONV_PATH``.
- annotations: keys are Kubernetes annotation keys (``prefix/name``); values
  without NUL.
- sizes: each string at most :data:`MAX_STRING` bytes and one device's items at
  most :data:`MAX_DEVICE_BYTES`, so an Allocate response of a node's devices stays
  under the 4 MiB gRPC message limit the kubelet receives with.

Pure apart from ``os.lstat``/``os.path.realpath`` of node paths.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from typing import TypeVar

from hetero_dp.model.device import Device, DeviceNode, Mount
from hetero_dp.model.response import ContainerResponse

#: The longest path, env value or annotation value let through (bytes).
MAX_STRING = 16 * 1024
#: The most one device's nodes, mounts, env and annotations may add to a response.
MAX_DEVICE_BYTES = 64 * 1024
#: The most one Allocate response may hold (the kubelet's gRPC receive limit is
#: 4 MiB; the rest is room for the message framing).
MAX_RESPONSE_BYTES = 4 * 1024 * 1024 - 64 * 1024

_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"{_LABEL}(\.{_LABEL})*\Z")
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NONE = object()  # no value (a hook may set None)
T = TypeVar("T")
#: Variables the dynamic loader and glibc read to pick the code a program runs.
DENIED_ENV_PREFIXES = ("LD_",)
DENIED_ENV = frozenset({"GCONV_PATH", "HOSTALIASES", "LOCPATH", "NLSPATH", "RESOLV_HOST_CONF"})
#: Mount paths refused on either side: the host's root and its kernel interfaces.
DENIED_MOUNTS = ("/proc", "/sys")


def _path_problem(path: object) -> str | None:
    if not isinstance(path, str) or not path:
        return "must be a non-empty path"
    if _CONTROL.search(path):
        return f"{path!r} holds control characters"
    if len(path.encode(errors="replace")) > MAX_STRING:
        return f"is longer than {MAX_STRING} bytes"
    if not path.startswith("/"):
        return f"{path!r} is not absolute"
    if path != "/" and (os.path.normpath(path) != path or path.startswith("//")):
        return f"{path!r} is not normalised (write {os.path.normpath(path)!r})"
    return None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _dev_root(path: str) -> str | None:
    """The ``dev`` directory ``path`` lies in (``/dev``, ``<driver root>/dev``), or None."""
    if path.startswith("/dev/"):
        return "/dev"
    head, sep, _ = path.rpartition("/dev/")
    return head + "/dev" if sep and head else None


def node_problem(node: DeviceNode, roots: Sequence[str] = ()) -> str | None:
    """Why ``node`` may not go into a container, or None.

    ``roots``: directories where a test's fake device nodes live (the testing
    harness passes the temp dir): a path under one is allowed by name, and a plain
    file there stands for a node. ``/dev`` and any ``<root>/dev`` are allowed by name
    anyway (a driver root: a driver container's ``/run/<vendor>/driver/dev``).
    """
    host = node.host_path
    problem = _path_problem(host)
    if problem:
        return f"hostPath {problem}"
    problem = _path_problem(node.container_path)
    if problem:
        return f"containerPath {problem}"

    def allowed(p: str) -> bool:
        return (_dev_root(p) is not None and p not in ("/dev", "/dev/")) or any(
            _under(p, r) and p != r for r in roots
        )

    if not allowed(host):
        return f"hostPath {host!r} is not under /dev"
    try:
        os.lstat(host)
    except OSError:
        return None  # not visible here (the host's /dev is not mounted): judged by name
    real = os.path.realpath(host)
    if real != host and not allowed(real):
        return f"hostPath {host!r} resolves to {real!r}, which is not under /dev"
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return f"hostPath {host!r} resolves to {real!r}, which does not exist"
    fake = any(_under(real, r) and real != r for r in roots) and not stat.S_ISDIR(mode)
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or fake):
        return f"hostPath {host!r} is not a device node" + (
            f" (it resolves to {real!r})" if real != host else ""
        )
    return None


def mount_problem(mount: Mount) -> str | None:
    """Why ``mount`` may not go into a container, or None."""
    for side, path in (("hostPath", mount.host_path), ("containerPath", mount.container_path)):
        problem = _path_problem(path)
        if problem:
            return f"{side} {problem}"
        if path == "/":
            return f"{side} is '/': the whole file system"
        for denied in DENIED_MOUNTS:
            if _under(path, denied):
                return f"{side} {path!r} is under {denied}, the host kernel's interface"
    return None


def env_problem(key: object, value: object) -> str | None:
    """Why env ``key=value`` may not go into a container, or None."""
    if not isinstance(key, str) or not _ENV_NAME.match(key):
        return f"{key!r} is not a valid env var name ([-._a-zA-Z][-._a-zA-Z0-9]*)"
    if key.startswith(DENIED_ENV_PREFIXES) or key in DENIED_ENV:
        return f"{key} chooses the code programs load (ld.so(8)); backends may not set it"
    if not isinstance(value, str):
        return f"the value of {key} is not a string"
    if "\x00" in value or "\n" in value or "\r" in value:
        return f"the value of {key} holds a NUL or line break"
    if len(value.encode(errors="replace")) > MAX_STRING:
        return f"the value of {key} is longer than {MAX_STRING} bytes"
    return None


def annotation_problem(key: object, value: object) -> str | None:
    """Why annotation ``key: value`` may not go into a container's config, or None."""
    if not isinstance(key, str):
        return f"key {key!r} is not a string"
    prefix, slash, name = key.rpartition("/")
    if (
        len(name) > 63
        or not _NAME.match(name)
        or (slash and (len(prefix) > 253 or not _PREFIX.match(prefix)))
    ):
        return f"key {key[:100]!r} is not a Kubernetes annotation key ([prefix/]name)"
    if not isinstance(value, str):
        return f"the value of {key} is not a string"
    if "\x00" in value:
        return f"the value of {key} holds a NUL"
    if len(value.encode(errors="replace")) > MAX_STRING:
        return f"the value of {key} is longer than {MAX_STRING} bytes"
    return None


def _size(device: Device) -> int:
    def b(s: str) -> int:
        return len(s.encode(errors="replace"))

    total = sum(b(n.host_path) + b(n.container_path) + 8 for n in device.nodes)
    total += sum(b(m.host_path) + b(m.container_path) + 8 for m in device.mounts)
    total += sum(b(k) + b(v) + 8 for k, v in device.env.items())
    total += sum(b(k) + b(v) + 8 for k, v in device.annotations.items())
    return total


def _items(
    nodes: Iterable[tuple[int, DeviceNode]],
    mounts: Iterable[tuple[int, Mount]],
    env: Iterable[tuple[str, str]],
    annotations: Iterable[tuple[str, str]],
    roots: Sequence[str],
) -> list[str]:
    """The problems of the items, nodes and mounts given with their index."""
    out = []
    for i, node in nodes:
        problem = node_problem(node, roots)
        if problem:
            out.append(f"nodes[{i}]: {problem}")
    for i, mount in mounts:
        problem = mount_problem(mount)
        if problem:
            out.append(f"mounts[{i}]: {problem}")
    for key, value in env:
        problem = env_problem(key, value)
        if problem:
            out.append(f"env[{key!r}]: {problem}" if len(str(key)) < 100 else f"env: {problem}")
    for key, value in annotations:
        problem = annotation_problem(key, value)
        if problem:
            out.append(f"annotations: {problem}")
    return out


def device_problems(device: Device, roots: Sequence[str] = ()) -> list[str]:
    """What in ``device``'s record may not go into a container, each naming the field."""
    size = _size(device)
    if size > MAX_DEVICE_BYTES:
        return [
            f"nodes, mounts, env and annotations: {size} bytes, more than "
            f"{MAX_DEVICE_BYTES} per device (an Allocate response must stay under 4 MiB)"
        ]
    return _items(
        enumerate(device.nodes),
        enumerate(device.mounts),
        device.env.items(),
        device.annotations.items(),
        roots,
    )


class Refused(str):
    """The Unhealthy reason of a record the gate refused: it stays Unhealthy whatever
    health events or polls say, until a discovery returns a record that passes."""

    __slots__ = ()


def summary(problems: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` problems, joined, saying how many more there were."""
    more = f" (and {len(problems) - shown} more)" if len(problems) > shown else ""
    return "; ".join(problems[:shown]) + more


def refusal(problems: Sequence[str], shown: int = 3) -> Refused:
    """The Unhealthy reason for a refused record."""
    return Refused("refused by the container gate: " + summary(problems, shown))


def gate_device(device: Device, roots: Sequence[str] = ()) -> Device:
    """``device`` as it may be advertised: itself, or (refused) Unhealthy with the
    reason and without the items that may not go into a container, so that not
    even a health event that clears it can hand them out."""
    problems = device_problems(device, roots)
    if not problems:
        return device
    import dataclasses

    env = {k: v for k, v in device.env.items() if env_problem(k, v) is None}
    return dataclasses.replace(
        device,
        healthy=False,
        reason=refusal(problems),
        nodes=tuple(n for n in device.nodes if node_problem(n, roots) is None),
        mounts=tuple(m for m in device.mounts if mount_problem(m) is None),
        env=env,
        annotations={
            k: v for k, v in device.annotations.items() if annotation_problem(k, v) is None
        },
    )


def _new_items(items: list[T], passed: list[T]) -> list[tuple[int, T]]:
    """The items (with their index) that are not among ``passed`` (by identity)."""
    if not items:
        return []
    old = {id(x) for x in passed}
    return [(i, x) for i, x in enumerate(items) if id(x) not in old]


def _new_values(values: dict[str, str], passed: dict[str, str]) -> list[tuple[str, str]]:
    """The entries of ``values`` that ``passed`` does not hold alike."""
    if values == passed:
        return []
    return [(k, v) for k, v in values.items() if passed.get(k, _NONE) != v]


def response_problems(
    response: ContainerResponse,
    roots: Sequence[str] = (),
    known_cdi: Iterable[str] | None = None,
    *,
    passed: ContainerResponse | None = None,
) -> list[str]:
    """What in an Allocate response (after the backend's ``allocate`` hook) may not
    go into a container. ``known_cdi``: the CDI names a spec defines, when known.

    ``passed``: the response the hook started from, when it passed this check itself
    (the Allocate hot path): items of ``response`` still as they were there (the same
    node and mount objects, the same env and annotation values) are not judged again,
    and the size only when the hook added something. Same problems, same messages."""
    if passed is None:
        out = _items(
            enumerate(response.devices),
            enumerate(response.mounts),
            response.envs.items(),
            response.annotations.items(),
            roots,
        )
        added = True
    else:
        nodes = _new_items(response.devices, passed.devices)
        mounts = _new_items(response.mounts, passed.mounts)
        env = _new_values(response.envs, passed.envs)
        notes = _new_values(response.annotations, passed.annotations)
        out = _items(nodes, mounts, env, notes, roots)
        added = bool(
            nodes
            or mounts
            or env
            or notes
            or len(response.devices) > len(passed.devices)  # one added twice
            or len(response.mounts) > len(passed.mounts)
        )
    known = set(known_cdi) if known_cdi is not None else None
    for name in response.cdi_devices:
        if not isinstance(name, str) or _CONTROL.search(name) or "=" not in name:
            out.append(f"cdiDevices: {name!r} is not a CDI device name (vendor.com/class=name)")
        elif known is not None and name not in known:
            out.append(f"cdiDevices: {name!r} is defined by no CDI spec written")
    if added:  # else it holds no more than what passed
        size = sum(len(str(s).encode(errors="replace")) + 8 for s in _strings(response))
        if size > MAX_RESPONSE_BYTES:
            out.append(f"the response holds {size} bytes, more than {MAX_RESPONSE_BYTES}")
    return out


def edits_problems(edits: object) -> list[str]:
    """What in a backend's spec-wide CDI ``containerEdits`` (``cdi_spec_edits``) may not
    go into a container, each naming the field. Device nodes are judged by name only
    (a driver root's nodes are seen here under another path, and the CDI runtime stats
    the host path itself: a regular file is refused there); mounts and env as in a
    record; a hook's path must be absolute and normalised."""
    if not isinstance(edits, dict):
        return [f"containerEdits must be a mapping, got {type(edits).__name__}"]
    out = []
    for i, node in enumerate(edits.get("deviceNodes") or ()):
        if not isinstance(node, dict):
            out.append(f"deviceNodes[{i}]: not a mapping")
            continue
        container = node.get("path")
        host = node.get("hostPath", container)
        problem = _path_problem(host) or _path_problem(container)
        if problem is None and isinstance(host, str) and _dev_root(host) is None:
            problem = f"{host!r} is not under /dev"
        if problem:
            out.append(f"deviceNodes[{i}]: {problem}")
    for i, mount in enumerate(edits.get("mounts") or ()):
        if not isinstance(mount, dict):
            out.append(f"mounts[{i}]: not a mapping")
            continue
        host, container = mount.get("hostPath"), mount.get("containerPath")
        if not isinstance(host, str) or not isinstance(container, str):
            out.append(f"mounts[{i}]: hostPath and containerPath must be strings")
            continue
        problem = mount_problem(Mount(host, container))
        if problem:
            out.append(f"mounts[{i}]: {problem}")
    for i, entry in enumerate(edits.get("env") or ()):
        key, eq, value = str(entry).partition("=")
        problem = env_problem(key, value) if eq else f"{entry!r} is not KEY=VALUE"
        if problem:
            out.append(f"env[{i}]: {problem}")
    for i, hook in enumerate(edits.get("hooks") or ()):
        path = hook.get("path") if isinstance(hook, dict) else None
        problem = _path_problem(path)
        if problem:
            out.append(f"hooks[{i}].path {problem}")
    return out


def _strings(response: ContainerResponse) -> Iterable[str]:
    for n in response.devices:
        yield n.host_path
        yield n.container_path
    for m in response.mounts:
        yield m.host_path
        yield m.container_path
    for k, v in response.envs.items():
        yield k
        yield v
    for k, v in response.annotations.items():
        yield k
        yield v
    yield from response.cdi_devices
