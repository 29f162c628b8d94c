"""What an Allocate or preferred answer is made of: validation of requested IDs,
the default response, sharing (replicas, renaming), topology-aware preference,
delivery modes and CDI specs. Pure functions over device records."""
