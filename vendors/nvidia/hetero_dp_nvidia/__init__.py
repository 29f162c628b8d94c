"""hetero-dp NVIDIA backend: NVML discovery, MIG, XID health with recovery, topology.

The entry point ``nvidia`` names the instance :data:`hetero_dp_nvidia.backend.plugin`.
"""

__version__ = "0.1.0"
