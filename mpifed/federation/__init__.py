"""Realistic federations: the server's optimiser, and (in time) the virtual clock, traces and selection."""
