#!/usr/bin/env bash
# Run mpifed with N ranks (1 server + N-1 workers) on this machine.
#
#   launch/local.sh N [mpifed arguments...]
#   launch/local.sh 11 --config configs/quickstart.yaml --set train.rounds=5
#
# A thin wrapper around the Python launcher, `python -m mpifed.launch -n N ...` (also
# `mpifed launch -n N ...`), which adds what the machine needs (with Open MPI): its root
# variables only when run as root, --oversubscribe and --bind-to none when N exceeds the
# cores, --bind-to none inside a Slurm job; and makes Ctrl-C a clean stop (checkpoint, then
# exit code 75; a second Ctrl-C ends the job). PYTHON selects the interpreter (default python3).
set -euo pipefail

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    echo "usage: $0 N [mpifed arguments...]   (N = number of ranks: 1 server + N-1 workers)" >&2
    exit 2
fi
n=$1
shift
export MPIFED_LAUNCH_SCRIPT="$0"   # the resume command rank 0 prints starts with it
exec "${PYTHON:-python3}" -m mpifed.launch -n "$n" "$@"
