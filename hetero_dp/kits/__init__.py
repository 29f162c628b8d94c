"""Low-level kits with no knowledge of devices or the kubelet: async waiting that
never loses a cancellation, atomic file writes, inotify, the event bus the engine
publishes on, and logging."""
