"""Simulated accelerators for hetero-dp: demos, tests and end-to-end runs without hardware."""

from .backend import SimulatedBackend, plugin

__all__ = ["SimulatedBackend", "plugin"]
