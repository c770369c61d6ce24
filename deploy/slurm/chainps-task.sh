#!/bin/bash
# One task of a chainps job under Slurm: started by chainps.sbatch through srun, it turns
# Slurm's view of the task (SLURM_PROCID, SLURM_JOB_ID) into chainps's (CHAINPS_ROLE,
# CHAINPS_RANK, CHAINPS_DATA_DIR) and execs the role's process, so the task's PID is the
# process's own and a kill of the task is a kill of the server or worker.
#
# usage: chainps-task.sh scheduler|server|worker [PROGRAM ARGS...]   (worker: the training
#        program)
# env (set by chainps.sbatch): CHAINPS_BIN, CHAINPS_SCHEDULER, CHAINPS_NUM_SERVERS,
#        CHAINPS_NUM_WORKERS, CHAINPS_SECRET_FILE, CHAINPS_SLURM_BASE (node-local directory
#        of this job), optional CHAINPS_SLURM_RANK (a restarted server's rank: its step's
#        SLURM_PROCID is 0), CHAINPS_MODE, CHAINPS_REPLICAS.
# Each task writes its PID to $CHAINPS_SLURM_BASE/<role>-<rank>.pid on its node.
set -euo pipefail

role=${1:-}
shift || true
die() {
    echo "chainps-task: $*" >&2
    exit 2
}
: "${SLURM_JOB_ID:?chainps-task.sh runs as a task of a Slurm job (srun)}"
: "${CHAINPS_SLURM_BASE:?CHAINPS_SLURM_BASE is not set (chainps.sbatch sets it)}"
: "${CHAINPS_BIN:?CHAINPS_BIN is not set (chainps.sbatch sets it)}"
: "${CHAINPS_SCHEDULER:?CHAINPS_SCHEDULER is not set (chainps.sbatch sets it)}"
[[ -x $CHAINPS_BIN ]] || die "CHAINPS_BIN=$CHAINPS_BIN is not an executable on $(hostname)"
[[ -r ${CHAINPS_SECRET_FILE:-} ]] ||
    die "the job secret ${CHAINPS_SECRET_FILE:-(unset)} is not readable on $(hostname)"

rank=${CHAINPS_SLURM_RANK:-${SLURM_PROCID:?no SLURM_PROCID: not started by srun}}
[[ $rank =~ ^[0-9]+$ ]] || die "bad rank '$rank'"
[[ -d $CHAINPS_SLURM_BASE ]] || mkdir -m 700 "$CHAINPS_SLURM_BASE"
echo $$ >"$CHAINPS_SLURM_BASE/$role-$rank.pid"

case $role in
scheduler)
    export CHAINPS_ROLE=scheduler
    opts=(--port "${CHAINPS_SCHEDULER##*:}" --data "$CHAINPS_SLURM_BASE"
        --join-timeout "${CHAINPS_SLURM_JOIN_TIMEOUT:-120}")
    [[ -n ${CHAINPS_MODE:-} ]] && opts+=(--mode "$CHAINPS_MODE")
    [[ -n ${CHAINPS_REPLICAS:-} ]] && opts+=(--replicas "$CHAINPS_REPLICAS")
    exec "$CHAINPS_BIN" scheduler "${opts[@]}"
    ;;
server)
    export CHAINPS_ROLE=server CHAINPS_RANK=$rank
    export CHAINPS_DATA_DIR="$CHAINPS_SLURM_BASE/server-$rank"
    # A restarted server finds its directory again when it comes back on the same node; a
    # fresh one elsewhere rejoins empty and copies its ranges from their tails.
    exec "$CHAINPS_BIN" server --rank "$rank" --data "$CHAINPS_DATA_DIR" \
        --join-timeout "${CHAINPS_SLURM_JOIN_TIMEOUT:-120}"
    ;;
worker)
    [[ $# -gt 0 ]] || die "worker: no training program given"
    export CHAINPS_ROLE=worker CHAINPS_RANK=$rank
    exec "$@"
    ;;
*)
    die "unknown role '$role' (scheduler, server or worker)"
    ;;
esac
