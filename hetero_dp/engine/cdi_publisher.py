"""The CDI spec files this daemon keeps: :class:`CDIWriter` writes and removes them in
a spec dir, :class:`CDIPublisher` keeps them in step with every publish, and
:func:`make_cdi_publisher` builds the publisher from the config's ``cdi`` section
(the one factory both start-up and a reload use).

What a spec holds is built by the pure functions of :mod:`hetero_dp.allocation.cdi`;
this module is where the files are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hetero_dp.allocation.cdi import (
    DEFAULT_CDI_DIR,
    SPEC_FILE_PREFIX,
    SPEC_MODE,
    SUPERSEDED_SUFFIX,
    build_spec,
    merge_edits,
    render_spec,
    spec_file_name,
    with_edits,
)
from hetero_dp.allocation.gate import Refused, edits_problems
from hetero_dp.kits.atomic import create_unique, write_atomic
from hetero_dp.kits.foreign import Complaints, ForeignFileError, load_foreign, read_foreign
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError, ConfigError

if TYPE_CHECKING:
    from hetero_dp.engine.settings import CdiSection, ResourceSettings

log = logging.getLogger(__name__)


class CDIWriter:
    """Writes and removes this daemon's spec files in a CDI spec dir.

    Only files named ``hetero-dp_*.json`` (and the temp files of their atomic
    writes) are ever touched. Specs are deliberately left in place at shutdown:
    the runtime resolves CDI names at every container (re)start, so a spec must
    outlive a plugin restart while containers that use it run.
    """

    def __init__(self, directory: str | os.PathLike[str] = DEFAULT_CDI_DIR) -> None:
        self.dir = Path(directory)
        # another's file in the dir that cannot be read as a spec: said once, not at
        # every publish (a FIFO, a socket, a spec nested 50,000 deep, kits/foreign.py)
        self.complaints = Complaints(log)

    def path_for(self, kind: str) -> Path:
        """Where the spec of ``kind`` lives."""
        return self.dir / spec_file_name(kind)

    def check_name(self, field: str = "cdi.dir") -> None:
        """The checks that create, write and remove nothing: the dir is an absolute
        path the OS takes, neither it nor the nearest part of it that exists is a
        file. Raises ConfigError naming the path otherwise."""
        if not self.dir.is_absolute():
            raise ConfigError(
                f"CDI spec dir {str(self.dir)!r} must be an absolute path (runtimes read "
                "/etc/cdi and /var/run/cdi)",
                field=field,
            )
        try:
            # the dir itself, or the nearest part of its path that exists
            existing = next(p for p in (self.dir, *self.dir.parents) if p.exists())
            is_file = not existing.is_dir()
        except (OSError, ValueError) as e:  # a name too long, a NUL
            raise ConfigError(
                f"CDI spec dir {str(self.dir)!r} is unusable: {e}", field=field
            ) from e
        if is_file:
            what = "" if existing == self.dir else f": {str(existing)!r} is a file"
            raise ConfigError(
                f"CDI spec dir {str(self.dir)!r} is not a directory{what}", field=field
            )

    def check(self, field: str = "cdi.dir") -> None:
        """Start-up check: the dir exists (created if missing) and takes new files.

        Also removes temp files that a killed write left behind. Raises
        ConfigError naming the path otherwise.
        """
        self.check_name(field)
        try:
            self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"CDI spec dir {str(self.dir)!r} is missing and cannot be created: "
                f"{e.strerror or e}",
                field=field,
            ) from e
        try:
            # A real file, not os.access(): root passes access() on read-only mounts.
            fd, probe = create_unique(self.dir, f".{SPEC_FILE_PREFIX}probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise ConfigError(
                f"CDI spec dir {str(self.dir)!r} is not writable: {e.strerror or e}", field=field
            ) from e
        # Hidden ".hetero-dp_*" files are ours and transient: temp files of atomic
        # writes (".<spec name>.<random>.tmp") and probes that a killed process left.
        for p in self.dir.glob(f".{SPEC_FILE_PREFIX}*"):
            if p.is_file():
                p.unlink(missing_ok=True)

    def write(self, kind: str, devices: Sequence[Device]) -> Path | None:
        """Write the spec of ``kind`` for ``devices`` atomically; skip if unchanged.

        With no devices the spec is removed (CDI rejects a spec without devices).
        Returns the spec's path, or None when there is none.
        """
        if not devices:
            self.remove(kind)
            return None
        return self.write_spec(kind, build_spec(kind, devices))

    def write_spec(self, kind: str, spec: Mapping[str, Any]) -> Path:
        """Write an already built spec of ``kind`` atomically; skip if unchanged."""
        path = self.path_for(kind)
        text = render_spec(spec)
        try:  # whatever sits under our name (a FIFO, a link) is replaced, never read
            same = read_foreign(path, max_bytes=len(text.encode()) + 1) == text.encode()
        except ForeignFileError:
            same = False
        if not same:
            write_atomic(path, text, SPEC_MODE)
        self.set_aside_conflicts(kind, spec)  # a replaced plugin's spec may be back
        return path

    def set_aside_conflicts(self, kind: str, spec: Mapping[str, Any]) -> list[Path]:
        """Rename other specs in the dir that define devices of ``spec`` again.

        Two specs of one dir that define the same ``kind=name`` make the CDI cache
        drop that device as conflicting, so every container asking for it fails: the
        usual case is the spec a replaced plugin left behind (a vendor's own plugin
        writes ``k8s.device-plugin.<vendor domain>-gpu.json``, docs/cdi.md). Such a
        file is renamed to
        ``<name>.hetero-dp-superseded`` (runtimes load only ``*.json``/``*.yaml``, and
        nothing is lost), with a warning naming it. Returns the new paths.
        """
        ours = {str(d.get("name")) for d in spec.get("devices", ())}
        moved = []
        for other in sorted(self.dir.iterdir()):
            if other.name.startswith((SPEC_FILE_PREFIX, ".")) or other.suffix not in (
                ".json",
                ".yaml",
            ):
                continue
            try:
                data = load_foreign(other, follow=True)  # the runtime follows links too
            except ForeignFileError as e:  # the runtime skips it as well
                self.complaints.say(other, str(e), "CDI dir: %s is not read as a spec: %s")
                continue
            self.complaints.clear(other)
            if not isinstance(data, Mapping) or data.get("kind") != kind:
                continue
            names = {str(d.get("name")) for d in data.get("devices") or () if isinstance(d, dict)}
            clash = sorted(ours & names)
            if not clash:
                continue
            target = other.with_name(other.name + SUPERSEDED_SUFFIX)
            try:
                other.rename(target)
            except OSError as e:
                log.error(
                    "CDI spec %s defines %d devices of %s again (e.g. %s), so the runtime "
                    "refuses them, and it cannot be renamed: %s; remove it",
                    other,
                    len(clash),
                    kind,
                    clash[0],
                    e.strerror or e,
                )
                continue
            log.warning(
                "CDI spec %s defined %d devices of %s again (e.g. %s), which makes the runtime "
                "refuse them; renamed to %s",
                other,
                len(clash),
                kind,
                clash[0],
                target.name,
            )
            moved.append(target)
        return moved

    def remove(self, kind: str) -> bool:
        """Delete the spec of ``kind``; True if there was one."""
        try:
            self.path_for(kind).unlink()
        except FileNotFoundError:
            return False
        return True

    def read(self, kind: str) -> dict[str, Any] | None:
        """The spec of ``kind`` as written, or None."""
        path = self.path_for(kind)
        if not path.exists():
            return None
        data: dict[str, Any] = load_foreign(path)
        return data


def _spec_view(devices: Sequence[Device]) -> list[tuple[Any, ...]]:
    """What of the devices a CDI spec is built from (health and attributes are not)."""
    return [(d.id, d.nodes, d.mounts, dict(d.env)) for d in devices]


class _Backend(Protocol):
    """What :class:`CDIPublisher` calls on a backend (``plugins.Backend``)."""

    @property
    def name(self) -> str: ...

    def implements(self, hook: str) -> bool: ...

    async def call(self, hook: str, **kwargs: Any) -> Any: ...


async def spec_wide_edits(backend: _Backend, kind: str, devices: list[Device]) -> dict[str, Any]:
    """The spec-wide edits (driver files, hooks) ``backend``'s ``cdi_spec_edits`` adds
    to the spec of ``kind`` holding ``devices``, checked by the container gate; raises
    BackendError (the hook failed) or ConfigError (the gate refused what it returned).
    Used for the device-plugin specs here and for DRA claim specs."""
    edits: dict[str, Any] = await backend.call("cdi_spec_edits", kind=kind, devices=devices)
    problems = edits_problems(edits)
    if problems:  # the container gate, for what the spec adds to every device
        raise ConfigError(
            "its cdi_spec_edits hold what may not go into a container: " + "; ".join(problems[:3]),
            field="cdi_spec_edits",
        )
    return edits


class _Runtime(Protocol):
    """What :class:`CDIPublisher` reads of the daemon's per-backend runtime."""

    @property
    def backend(self) -> _Backend: ...

    published: dict[str, Device]
    resources: dict[str, set[str]]
    discoveries: int


class CDINames:
    """The CDI names this daemon's spec files define: each kind it writes, and the
    device IDs the spec of each kind written last holds. The spec writer
    (:class:`CDIPublisher`, a subscriber to publishes) fills it as it writes; the
    engine owns it (``daemon.cdi_names``, one across reloads) and a resource reads it
    to judge the CDI names an allocate hook adds: data, never a call up into the
    writer."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.written: dict[str, frozenset[str]] = {}

    def undefined(self, names: Sequence[str]) -> list[str]:
        """The CDI names among ``names`` of a kind this daemon writes that its spec
        does not define (names of other kinds come from other specs: not judged)."""
        out = []
        for name in names:
            kind, _, device = name.partition("=")
            if kind in self.kinds and device not in self.written.get(kind, ()):
                out.append(name)
        return out

    def clear(self) -> None:
        """Nothing is defined any more (the writer's specs were removed)."""
        self.kinds.clear()
        self.written.clear()


class CDIPublisher:
    """A daemon publisher that keeps CDI specs in step with the device records.

    After every publish of a backend it works out, per physical resource, which
    advertised resources deliver through CDI and under which kind (``cdiKind``, or
    the physical resource name, exactly as :func:`apply_delivery` names devices),
    and rewrites the spec of each kind with all physical devices under it (a
    renamed shared resource and the plain one share a spec). Backends that
    implement ``cdi_spec_edits`` add their spec-wide edits (driver files, hooks).
    Unchanged specs are not rewritten. Errors are logged and the previous spec is
    kept. Writes run in a worker thread, one at a time.

    ``check_first`` (``cdi.enabled`` left unset): the spec dir is checked (created,
    probed) only when a spec is first needed, so a daemon without CDI resources
    never touches it.
    """

    def __init__(
        self,
        writer: CDIWriter,
        settings_for: Callable[[str], ResourceSettings],
        *,
        check_first: bool = False,
        names: CDINames | None = None,
    ) -> None:
        self.writer = writer
        self.settings_for = settings_for
        self.check_first = check_first
        # The spec dir's check failed (a ConfigError naming cdi.dir), until one passes.
        self.unusable: ConfigError | None = None
        # kind -> physical resource -> its devices, across all backends
        self._devices: dict[str, dict[str, list[Device]]] = {}
        self._backends: dict[str, _Backend] = {}  # physical resource -> its backend
        self._edits: dict[str, dict[str, Any]] = {}  # kind -> backends' edits last written
        self._discoveries: dict[str, int] = {}  # backend -> its discovery count last seen
        # kind -> the device IDs its spec file defines (the last one written), and
        # kind -> why its newest spec could not be written (retried at every publish):
        # a device not in the file then has a CDI name that resolves to nothing, and
        # the daemon makes it Unhealthy (advertising.py) until a write succeeds.
        # what the specs define, as data the engine owns and reads (CDINames)
        self.names = CDINames() if names is None else names
        self.written = self.names.written
        self.failed: dict[str, str] = {}
        self._failed_seen: frozenset[str] = frozenset()
        self._lock = asyncio.Lock()

    def unwritten(self, kind: str, device_id: str) -> str | None:
        """Why ``device_id`` has no CDI name of ``kind`` although it should, or None."""
        why = self.failed.get(kind)
        if why is None or device_id in self.written.get(kind, ()):
            return None
        return f"CDI spec of {kind} not written: {why}"

    def failures_changed(self) -> bool:
        """Whether the kinds whose spec could not be written changed since last asked."""
        now = frozenset(self.failed)
        changed, self._failed_seen = now != self._failed_seen, now
        return changed

    def remove_specs(self) -> None:
        """Remove every spec this publisher wrote (it is being replaced)."""
        for kind in list(self._devices):
            with contextlib.suppress(OSError):
                self.writer.remove(kind)
        self._devices.clear()
        self.names.clear()

    def kinds(self, physical: str, advertised: set[str]) -> set[str]:
        """The CDI kinds whose specs hold the devices of ``physical``."""
        out = set()
        for name in advertised or {physical}:
            delivery = self.settings_for(name).delivery  # as configured: CDI off or not
            if delivery.uses_cdi:
                out.add(delivery.kind_for(physical))
        return out

    async def __call__(self, rt: _Runtime) -> None:
        changed = set()
        for physical, advertised in rt.resources.items():
            # A device the gate refused (a path, an ID that is no CDI name) is left out:
            # the spec is written for the others, and the refused one is Unhealthy.
            devices = [
                d
                for d in rt.published.values()
                if d.resource == physical and not isinstance(d.reason, Refused)
            ]
            self._backends[physical] = rt.backend
            try:
                kinds = self.kinds(physical, advertised)
            except ConfigError as e:
                log.error("CDI spec for %s not written: %s", physical, e)
                continue
            for kind, per_resource in self._devices.items():
                if kind not in kinds and per_resource.pop(physical, None) is not None:
                    changed.add(kind)
            for kind in kinds:
                if kind not in self._devices:
                    self.names.kinds.add(kind)
                per_resource = self._devices.setdefault(kind, {})
                before = per_resource.get(physical)
                per_resource[physical] = devices
                if before is None or _spec_view(before) != _spec_view(devices):
                    changed.add(kind)  # not for a health change: the spec has no health
        # After a discovery (not a health-only publish), kinds holding this backend's
        # devices are looked at again even when the devices did not change: its
        # spec-wide edits may have (options reloaded, driver files replaced).
        ours = set(rt.resources)
        fresh = self._discoveries.get(rt.backend.name) != rt.discoveries
        self._discoveries[rt.backend.name] = rt.discoveries
        if fresh and rt.backend.implements("cdi_spec_edits"):
            touched = {k for k, per in self._devices.items() if ours & set(per)}
        else:
            touched = set()
        changed |= set(self.failed) & set(self._devices)  # tried again
        async with self._lock:
            if (changed or touched) and self.check_first:
                try:
                    await asyncio.to_thread(self.writer.check, "cdi.dir")
                except ConfigError as e:
                    self.unusable = e  # at start-up the daemon exits with it (exit 2)
                    log.error("CDI specs not written: %s", e)
                    for kind in changed | touched:
                        self.failed[kind] = e.reason
                    return  # checked again at the next change
                self.unusable = None
                self.check_first = False
            for kind in sorted(changed | touched):
                per_resource = self._devices.get(kind, {})
                devices = [d for ds in per_resource.values() for d in ds]
                extra = await self._extra_edits(kind, per_resource) if devices else {}
                if extra is None:  # a backend failed: the previous spec stays
                    self.failed[kind] = "a backend's cdi_spec_edits failed (see the log)"
                    continue
                if kind not in changed and self._edits.get(kind) == extra:
                    continue
                self._edits[kind] = extra
                await asyncio.to_thread(self._write, kind, devices, extra)

    async def _extra_edits(
        self, kind: str, per_resource: Mapping[str, list[Device]]
    ) -> dict[str, Any] | None:
        """The spec-wide edits the kind's backends add, or None when one failed."""
        extra: dict[str, Any] = {}
        by_backend: dict[str, tuple[_Backend, list[Device]]] = {}
        for physical, devices in per_resource.items():
            backend = self._backends.get(physical)
            if devices and backend is not None and backend.implements("cdi_spec_edits"):
                by_backend.setdefault(backend.name, (backend, []))[1].extend(devices)
        for backend, devices in by_backend.values():
            try:
                extra = merge_edits(extra, await spec_wide_edits(backend, kind, devices))
            except (BackendError, ConfigError) as e:
                log.error(
                    "CDI spec of %s not updated (the previous one stays): backend %s: %s",
                    kind,
                    backend.name,
                    e,
                )
                return None
        return extra

    def _write(self, kind: str, devices: list[Device], extra: Mapping[str, Any]) -> None:
        try:
            if devices:
                path: Path | None = self.writer.write_spec(
                    kind, with_edits(build_spec(kind, devices), extra)
                )
            else:
                path = self.writer.write(kind, devices)
        except (ConfigError, OSError) as e:
            log.error(
                "CDI spec of %s not updated (the previous one stays): %s",
                kind,
                e,
                extra={"kind": kind, "devices": [d.id for d in devices]},
            )
            self.failed[kind] = str(e)
            return
        self.written[kind] = frozenset(d.id for d in devices)
        self.failed.pop(kind, None)
        log.info(
            "CDI spec of %s: %s",
            kind,
            f"{len(devices)} devices in {path}" if path else "removed (no devices)",
            extra={"kind": kind},
        )


def make_cdi_publisher(
    cdi: CdiSection,
    settings_for: Callable[[str], ResourceSettings],
    source: str,
    names: CDINames | None = None,
) -> CDIPublisher | None:
    """The publisher for a config's ``cdi`` section, or None when CDI is off.

    ``enabled: true`` checks the spec dir now (ConfigError naming ``cdi.dir`` and
    ``source``); unset checks now only what touches nothing (a relative path, a name
    the OS refuses, a file in the path: :meth:`CDIWriter.check_name`), so that such a
    mistake stops start-up before any port is bound, and the rest (creating the dir,
    writing a probe) when the first spec is needed, so a daemon without CDI
    resources never creates or writes it.
    """
    enabled = cdi.enabled
    if enabled is False:
        return None
    writer = CDIWriter(cdi.dir)
    try:
        if enabled:
            writer.check(field="cdi.dir")
        else:
            writer.check_name(field="cdi.dir")
    except ConfigError as e:
        raise ConfigError(e.reason, field=e.field, source=source) from None
    return CDIPublisher(writer, settings_for, check_first=enabled is None, names=names)


async def read_cdi_off(runtime_config: str) -> str | None:
    """Why the runtime whose config is ``runtime_config`` (``cdi.runtimeConfig``) cannot
    consume CDI: None when it can, when that cannot be told, or when none is set. Read
    in a thread, at start and on every reload."""
    if not runtime_config:
        return None
    from hetero_dp.kits.runtimeconf import runtime_cdi_off

    return await asyncio.to_thread(runtime_cdi_off, Path(runtime_config))
