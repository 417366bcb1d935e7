"""The ways in: the command lines (``python -m mpifed.X``, ``mpifed X``) and the Python API."""
