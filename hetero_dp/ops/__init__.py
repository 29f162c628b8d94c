"""Day two, built on the engine's public surface: Prometheus metrics, health
probes, node labels, config reload and the troubleshooting chain (doctor)."""
