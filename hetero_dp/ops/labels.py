"""Node labels as a Node Feature Discovery feature file (``key=value`` lines).

Every resource gets generic ``<resource>.count`` (physical devices) and
``<resource>.product`` labels; a backend's ``labels`` hook adds its own and wins
on a clash (the bundled GPU backend's feature discovery names, for one). The file
is rewritten atomically, only when its content changes, after every publish of
the daemon; it is removed when the daemon stops, so a node without a running
plugin does not advertise devices it no longer serves.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetero_dp.kits import observe
from hetero_dp.kits.atomic import write_atomic
from hetero_dp.kits.foreign import Complaints
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError
from hetero_dp.model.names import is_dns_subdomain, is_qualified_name

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import BackendRuntime, Daemon

log = logging.getLogger(__name__)

_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_VALUE_BAD_CHARS = re.compile(r"[^-A-Za-z0-9_.]+")


def label_problem(key: str, value: str) -> str | None:
    """Why Kubernetes would refuse this label, or None."""
    prefix, sep, name = key.rpartition("/")
    if sep and not is_dns_subdomain(prefix):
        return f"label {key!r}: prefix {prefix!r} is not a lowercase DNS subdomain"
    if not is_qualified_name(name):
        return f"label {key!r}: name part {name!r} is not a qualified name of at most 63 characters"
    if len(value) > 63 or not _VALUE.match(value):
        return f"label {key!r}: value {value!r} is not a valid label value"
    return None


def label_value(text: str) -> str:
    """Make free text a valid label value: ``Acme N1 (80GB)`` -> ``Acme-N1-80GB``."""
    value = _VALUE_BAD_CHARS.sub("-", text.strip())[:63]
    return value.strip("-_.")


def generic_labels(resource: str, physical: Iterable[Device]) -> dict[str, str]:
    """``<resource>.count`` and, when the devices say, ``<resource>.product``."""
    devices = list(physical)
    labels = {f"{resource}.count": str(len(devices))}
    products = [str(d.attributes["product"]) for d in devices if d.attributes.get("product")]
    if products:
        # the most common product; on a tie, the first seen (as GPU feature discovery does)
        product = max(dict.fromkeys(products), key=products.count)
        value = label_value(product)
        if value:
            labels[f"{resource}.product"] = value
    return labels


def file_name(prefix: str, backends: Iterable[str]) -> str:
    """``hetero-dp-acme``: one file per daemon, so two daemons on a node (say a GPU
    one and a udev one) never overwrite each other's labels."""
    parts = [re.sub(r"[^A-Za-z0-9_.-]", "_", b) for b in sorted(backends)]
    return "-".join([prefix, *parts])


def render(labels: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def parse(text: str) -> dict[str, str]:
    """Read a feature file back (``#`` comments and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


class LabelWriter:
    """A daemon publisher that keeps the feature file in step with the devices."""

    def __init__(self, daemon: Daemon, directory: str | Path, file_name: str) -> None:
        self.daemon = daemon
        self.path = Path(directory) / file_name
        self._backend_labels: dict[str, dict[str, str]] = {}
        self._keys: dict[str, Any] = {}  # backend -> what its labels were computed from
        self._written: str | None = None
        self._identity: tuple[int, int] | None = None  # of the file last written
        self._complaints = Complaints(log, logging.ERROR)  # a write that fails: said once

    def _advertised(self, backend: str) -> list[Device]:
        return [
            d
            for res in self.daemon.resources.values()
            if res.backend.name == backend
            for d in res.state.devices
        ]

    async def __call__(self, rt: BackendRuntime) -> None:
        await self.refresh(rt)

    async def refresh(self, rt: BackendRuntime | None = None) -> None:
        """Recompute (one backend's, or every backend's) labels and write if changed."""
        runtimes = [rt] if rt is not None else list(self.daemon.runtimes.values())
        for r in runtimes:
            await self._refresh_backend(r)
        self.write()

    async def _refresh_backend(self, rt: BackendRuntime) -> None:
        b = rt.backend
        if not b.implements("labels"):
            return
        devices = self._advertised(b.name)
        # health flips do not change labels: ask the hook again only when the set does.
        # Each record owns its attributes dict (Device copies it and is frozen), so the
        # dicts themselves are the key: no per-device sorted copy on every publish.
        key = [(d.resource, d.id, d.attributes) for d in devices]
        if self._keys.get(b.name) == key:
            return
        try:
            labels = await b.call("labels", devices=devices)
        except BackendError as e:
            log.error("%s", e, extra={"backend": b.name, "hook": "labels"})
            observe.emit("hook_error", backend=b.name, hook="labels", error=str(e))
            return  # keep the last good labels
        good = {}
        for k, v in labels.items():
            problem = label_problem(k, v)
            if problem:
                log.error("backend %r: %s; label left out", b.name, problem)
            else:
                good[k] = v
        self._backend_labels[b.name] = good
        self._keys[b.name] = key

    def labels(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, res in sorted(self.daemon.resources.items()):
            for k, v in generic_labels(name, res.state.physical_devices).items():
                if label_problem(k, v) is None:
                    out[k] = v
        for backend in sorted(self._backend_labels):
            out.update(self._backend_labels[backend])  # the backend knows better
        return out

    def write(self) -> None:
        text = render(self.labels())
        if text == self._written:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, text)
        except (OSError, ValueError) as e:  # ValueError: a NUL in a path set by the API
            why = (e.strerror if isinstance(e, OSError) else None) or str(e)
            self._complaints.say(self.path, why, "cannot write the node label file %s: %s")
            return
        self._complaints.clear(self.path)
        self._written = text
        with contextlib.suppress(OSError):
            st = self.path.stat()
            self._identity = (st.st_dev, st.st_ino)
        log.info("wrote %d node labels to %s", text.count("\n"), self.path)

    def remove(self) -> None:
        """Remove the file, unless another instance wrote it since (a rolling update:
        the new pod writes the same file before the old one stops)."""
        with contextlib.suppress(FileNotFoundError):
            st = self.path.stat()
            if (st.st_dev, st.st_ino) == self._identity:
                self.path.unlink()
        self._written = None
        self._identity = None
