"""The running daemon: backend loading and safe hook calls, configuration,
per-backend runtime state with its health overlays, publishing to resources, and
the daemon's lifecycle. Day-two pieces (hetero_dp.ops) build on its public surface;
the engine never imports them."""
