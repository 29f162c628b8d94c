"""The kubelet side: the device-plugin gRPC API, registration and restart watching."""
