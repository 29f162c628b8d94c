"""Per-device settings from a backend's options (read only).

A backend's section of the config file is its own; this is a convention for
settings that differ per device, and the helper that reads it::

    backends:
      acme:
        devices:
          "*": {clock: 1200}          # every device
          "npu[0-3]": {partition: a}  # a glob over device IDs
          npu7: {clock: 900}          # one device

Entries whose key matches the device's ID (:mod:`fnmatch` globs, or the ID
itself) merge in the order of the file, an exact ID last, so the most specific
setting wins. Nothing here changes how the config is parsed or validated.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from hetero_dp.model.errors import ConfigError
from hetero_dp.model.shown import shown

DEVICES_KEY = "devices"


def device_settings(options: Mapping[str, Any], device_id: str) -> dict[str, Any]:
    """The settings for ``device_id`` from ``options["devices"]`` (see the module).

    ConfigError (naming the field) when ``devices`` or one of its entries is not a
    mapping; an empty dict when there is no ``devices`` section or nothing matches.
    """
    section = options.get(DEVICES_KEY)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"must map device IDs or globs to settings, got {type(section).__name__}",
            field=DEVICES_KEY,
        )
    merged: dict[str, Any] = {}
    exact: Mapping[str, Any] | None = None
    for key, value in section.items():
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"must be a mapping of settings, got {shown(value)}", field=f"{DEVICES_KEY}.{key}"
            )
        if str(key) == device_id:
            exact = value
        elif fnmatch.fnmatchcase(device_id, str(key)):
            merged.update(value)
    if exact is not None:
        merged.update(exact)
    return merged
