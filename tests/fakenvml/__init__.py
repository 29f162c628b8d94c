"""The fake libnvidia-ml.so.1 (fake_nvml.c), its scenarios and the pytest fixtures that load it."""
