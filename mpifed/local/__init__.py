"""A worker's local computation: flat model state, optimisers, local steps, losses, inference copies, evaluation."""
