"""Names the kubelet checks, checked here exactly the same way, in one place."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping

from hetero_dp.model.device import REPLICA_SEPARATOR
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.shown import shown

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
# The longest unix socket path we bind or dial. sun_path is 108 bytes with the NUL
# (unix(7)), but grpcio refuses more than 105: a 106- or 107-byte path fails in
# add_insecure_port ("Path name should not have more than 107 characters", grpc's
# add_port.cc, which counts more than the path; measured with grpcio 1.85,
# tests/core/test_socket_paths.py binds both sides of the limit).
MAX_UNIX_PATH = 105
MAX_DEVICE_ID = 63  # what is safe everywhere (a CDI annotation key's name part)
# The longest device ID accepted at all, in UTF-8 bytes. The kubelet sets no limit;
# this one keeps a ListAndWatch message and each log line bounded, and is the
# longest file name Linux allows, which udev-style IDs come from.
MAX_DEVICE_ID_BYTES = 255

MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253
MAX_QUALIFIED_NAME = 63

#: One lowercase RFC 1123 label, as a regex fragment (every DNS-name check builds on it).
DNS_LABEL_PATTERN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(rf"^{DNS_LABEL_PATTERN}$")
_DNS_SUBDOMAIN = re.compile(rf"^{DNS_LABEL_PATTERN}(?:\.{DNS_LABEL_PATTERN})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_BAD_ID_CHAR = re.compile(r"[\x00-\x1f\x7f/]")


def is_dns_label(name: str) -> bool:
    """A lowercase RFC 1123 label of at most 63 characters (Kubernetes' DNS label)."""
    return len(name) <= MAX_DNS_LABEL and bool(_DNS_LABEL.match(name))


def is_dns_subdomain(name: str) -> bool:
    """Lowercase RFC 1123 labels joined by dots, at most 253 characters."""
    return len(name) <= MAX_DNS_SUBDOMAIN and bool(_DNS_SUBDOMAIN.match(name))


def is_qualified_name(name: str) -> bool:
    """The name part of a label key or resource name: at most 63 of [A-Za-z0-9._-],
    starting and ending alphanumeric."""
    return len(name) <= MAX_QUALIFIED_NAME and bool(_QUALIFIED_NAME.match(name))


def resource_name_problem(name: object) -> str | None:
    """Why the kubelet would refuse ``name`` as an extended resource name, or None.

    The kubelet's rules: the name has a ``/``; the prefix is a lowercase DNS
    subdomain (at most 253 characters); the name part is a qualified name of at most
    63 characters; it is not in the ``kubernetes.io/`` namespace and does not
    start with ``requests.``.
    """
    if not isinstance(name, str) or not name:
        return "a resource name must be a non-empty string"
    return _name_problem(name)


# A name in a message: longer than any valid name (253 + 1 + 63), shorter than junk
_SHOWN_NAME = 320


# Every publish checks every device's resource name: with 1,000 devices that was
# 40% of the publish (benchmarks/bench_core.py). A few names recur; remember them.
@functools.lru_cache(maxsize=1024)
def _name_problem(name: str) -> str | None:
    shown_name = shown(name, _SHOWN_NAME)  # a valid name is shorter: only junk is cut
    if "/" not in name:
        return f"{shown_name} has no vendor prefix: it must look like 'vendor.com/name'"
    if name.startswith("requests."):
        return f"{shown_name} must not start with 'requests.'"
    if "kubernetes.io/" in name:
        return f"{shown_name} is in the reserved kubernetes.io namespace"
    prefix, _, short = name.partition("/")
    if "/" in short:
        return f"{shown_name} has more than one '/'"
    if not is_dns_subdomain(prefix):
        return f"prefix {shown(prefix, 260)} of {shown_name} is not a lowercase DNS subdomain"
    if not short:
        return f"{shown_name} has an empty name part"
    if len(short) > 63:
        return f"name part of {shown_name} is longer than 63 characters"
    if not _QUALIFIED_NAME.match(short):
        return (
            f"name part {shown(short, 70)} of {shown_name} must be letters, digits, '-', '_' "
            "or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def device_id_problem(device_id: object) -> str | None:
    """Why ``device_id`` cannot be advertised to the kubelet, or None.

    Refused: an empty ID, one over :data:`MAX_DEVICE_ID_BYTES` bytes, a ``/`` (the
    kubelet's checkpoint and CDI names use IDs as name parts), and control
    characters such as NUL (C strings on the way end there; logs break lines), and
    the replica separator ``::`` (a shared device's replicas are ``<id>::<n>``: such
    an ID would be read as a replica of another device at Allocate).
    """
    if not isinstance(device_id, str) or not device_id:
        return "a device ID must be a non-empty string"
    bad = _BAD_ID_CHAR.search(device_id)
    if bad is not None:
        if bad.group() == "/":
            return "a device ID must not contain '/'"
        return f"a device ID must not contain control characters, found {bad.group()!r}"
    if REPLICA_SEPARATOR in device_id:
        return (
            f"a device ID must not contain {REPLICA_SEPARATOR!r}, the separator of "
            "time-slicing replicas (<id>::<n>)"
        )
    if len(device_id) * 4 > MAX_DEVICE_ID_BYTES:  # UTF-8 has at most 4 bytes a character
        try:
            size = len(device_id.encode())
        except UnicodeEncodeError:
            return "a device ID must be valid UTF-8"
        if size > MAX_DEVICE_ID_BYTES:
            return f"a device ID may have at most {MAX_DEVICE_ID_BYTES} bytes, this one has {size}"
    return None


def validate_resource_name(name: object, *, field: str = "", source: str = "") -> str:
    """Return ``name`` if the kubelet would accept it, else raise ConfigError."""
    problem = resource_name_problem(name)
    if problem:
        raise ConfigError(problem, field=field, source=source)
    assert isinstance(name, str)
    return name


def socket_name(prefix: str, resource: str, instance: str = "") -> str:
    """A socket file name for a resource: ``<prefix>-<vendor.com>_<name>.sock``, or
    ``<prefix>-<vendor.com>_<name>-<instance>.sock`` for one instance of several."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", resource.replace("/", "_"))
    return f"{prefix}-{safe}-{instance}.sock" if instance else f"{prefix}-{safe}.sock"


INSTANCE_TAG_LENGTH = 12


def instance_tag(env: Mapping[str, str]) -> str:
    """What names this instance's sockets, so that an old and a new pod of a
    DaemonSet never share one (a rolling update with ``maxSurge`` runs both).

    From the pod, through the downward API: ``POD_UID`` (its first 12 hex digits,
    which ``kubectl get pod -o jsonpath='{.metadata.uid}'`` starts with), else
    ``POD_NAME`` (as is when short, else 12 hex digits of its SHA-256);
    ``HETERO_DP_POD_UID`` wins over both. Neither set: a random tag, unique to
    this start (``u`` and 11 hex digits).
    """
    uid = env.get("HETERO_DP_POD_UID") or env.get("POD_UID") or ""
    hexdigits = re.sub(r"[^0-9a-f]", "", uid.lower())
    if hexdigits:
        return hexdigits[:INSTANCE_TAG_LENGTH]
    name = re.sub(r"[^a-z0-9-]", "", (env.get("POD_NAME") or "").lower())
    if name and len(name) <= 2 * INSTANCE_TAG_LENGTH:
        return name
    if name:
        import hashlib

        return hashlib.sha256(name.encode()).hexdigest()[:INSTANCE_TAG_LENGTH]
    # os.urandom is what secrets.token_hex reads; secrets itself imports hmac, hashlib
    # and random, a cost paid by every start that reaches this line (issue 35)
    return "u" + os.urandom(INSTANCE_TAG_LENGTH // 2).hex()[: INSTANCE_TAG_LENGTH - 1]


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name a mistyped ``name`` most likely meant (``check_heath`` ->
    ``check_health``), or None when none is close: for "did you mean" hints."""
    import difflib  # only for a mistake

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


# Linux's limits (linux/limits.h): a path passed to a system call has at most PATH_MAX
# bytes with its NUL, and one name in it at most NAME_MAX bytes; a C string ends at a NUL.
PATH_MAX = 4096
NAME_MAX = 255


def path_problem(path: str) -> str | None:
    """Why ``path`` (a path setting, not empty) cannot name a file on this node, or None:
    a NUL byte, not absolute (a relative path would depend on the daemon's working dir),
    longer than PATH_MAX, a part longer than NAME_MAX, or not encodable."""
    if "\0" in path:
        return "a path must not contain a NUL byte"
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        return "a path must be text the file system takes (not encodable)"
    if not raw.startswith(b"/"):
        return f"must be an absolute path, got {shown(path)}"
    if len(raw) >= PATH_MAX:
        return f"a path may have at most {PATH_MAX - 1} bytes, this one has {len(raw)}"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (
            f"a part of a path may have at most {NAME_MAX} bytes, one has {len(longest)} "
            f"({shown(os.fsdecode(longest), 30)})"
        )
    return None
