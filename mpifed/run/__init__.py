"""A run on disk: its directory, records, checkpoints and provenance, what an existing one allows."""
