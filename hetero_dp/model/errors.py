"""Errors a backend or a user meets, each with a message that says what to fix."""

from __future__ import annotations

from hetero_dp.model.shown import shown


class HeteroDPError(Exception):
    """Base of every error hetero-dp raises on purpose."""


class ConfigError(HeteroDPError):
    """A configuration problem: names the file, the field and the reason."""

    def __init__(self, reason: str, *, field: str = "", source: str = "") -> None:
        self.reason = reason
        self.field = field
        self.source = source
        # a field is made of the file's keys: shown whole up to a long valid path only
        shown_field = f"field {shown(field, 400)}" if field else ""
        where = ", ".join(p for p in (source, shown_field) if p)
        super().__init__(f"{where}: {reason}" if where else reason)


class StartError(ConfigError):
    """A backend could not start: its ``configure`` hook failed (a missing driver, say),
    as opposed to refusing its options. It stops start-up as a ConfigError does, but the
    configuration is not the problem, and messages do not say it is."""


class AllocationError(HeteroDPError):
    """A refused Allocate or GetPreferredAllocation; the message names the device IDs.

    ``code`` is the gRPC status name to answer with (``INVALID_ARGUMENT`` or
    ``FAILED_PRECONDITION``; ``INTERNAL`` for an answer the container gate refused,
    ``RESOURCE_EXHAUSTED`` for one larger than the kubelet receives).
    """

    def __init__(self, message: str, *, code: str = "INVALID_ARGUMENT") -> None:
        self.code = code
        super().__init__(message)


class BackendError(HeteroDPError):
    """A backend hook raised, timed out or returned garbage. ``device``: the device ID
    a per-device call (``check_health``) was about, when there is one."""

    device: str | None = None
