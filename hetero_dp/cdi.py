"""CDI spec generation from device records.

PLACEHOLDER on main until the cdi branch lands (it owns this file).
"""
