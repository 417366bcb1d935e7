"""Preparing a config's data: which folder it reads (spec) and writing it (build)."""
