"""Run mpifed several times, one run after another, inside one MPI job: ``mpirun -n N python
tests/mpi_series.py RUNS.json``, RUNS.json a list of argument lists. Every rank starts Python and
PyTorch once for all the runs (``mpifed.entry.main.main`` is re-entrant). Rank 0 writes the runs' exit
codes to RUNS.codes.json; a run that fails does not stop the next (unless it ends the job)."""
import json
import sys
from pathlib import Path

from mpi4py import MPI

from mpifed.entry.main import main

runs = Path(sys.argv[1])
codes = [main(args) for args in json.loads(runs.read_text())]
if MPI.COMM_WORLD.Get_rank() == 0:
    runs.with_suffix(".codes.json").write_text(json.dumps(codes))
