"""mpifed: an MPI multi-process trainer for federated learning research on non-IID data."""

__version__ = "0.1.0"
