"""Front end: the kubelet's device-plugin API (servicer, endpoint, registration, dir watch)."""
