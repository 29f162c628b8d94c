"""DRA mode: every backend also serves as a Dynamic Resource Allocation driver.

Needs the ``kubernetes`` client (``pip install 'hetero-dp[dra]'``). See ``docs/dra.md``.
"""

from __future__ import annotations

from hetero_dp.dra.names import device_name, driver_name_for

__all__ = ["device_name", "driver_name_for"]
