"""hetero-dp NVIDIA backend: NVML discovery, MIG, XID health with recovery, topology.

The hookimpls live in :mod:`hetero_dp_nvidia.backend` (entry point ``nvidia``).
"""

__version__ = "0.1.0"
