"""DRA mode: every backend also serves as a Dynamic Resource Allocation driver.

No dependency beyond the core's: the API client is the standard library's
``http.client`` (:mod:`.client`). See ``docs/dra.md``.
"""

from __future__ import annotations

from hetero_dp.dra.names import device_name, driver_name_for

__all__ = ["device_name", "driver_name_for"]
