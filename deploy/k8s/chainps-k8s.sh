#!/bin/bash
# The entrypoint of every chainps pod (installed in the image as /usr/local/bin/chainps-k8s).
# It turns the pod's view of itself (its StatefulSet ordinal, its Job completion index, its
# stable DNS name) into chainps flags, makes a private copy of the job secret, and runs the
# role's process; the probes call it too.
#
# usage: chainps-k8s scheduler [chainps scheduler flags...]
#        chainps-k8s server    [chainps server flags...]   (adds --rank and --advertise)
#        chainps-k8s worker    PROGRAM [ARGS...]            (sets CHAINPS_RANK)
#        chainps-k8s probe ready|live                       (role from CHAINPS_ROLE)
#
# env (from the manifests): CHAINPS_ROLE, CHAINPS_SCHEDULER (host:port),
#   CHAINPS_SECRET_MOUNT (the Secret's file, read-only, as Kubernetes mounts it),
#   CHAINPS_SECRET_FILE (the private copy made here, mode 0600),
#   servers: POD_NAME, POD_NAMESPACE, CHAINPS_SERVER_SERVICE (the headless Service),
#            CHAINPS_POD_INDEX (the pod-index label, Kubernetes >= 1.28; else the ordinal is
#            taken from the end of POD_NAME),
#   scheduler: POD_IP (its own address, for the probes; default 127.0.0.1),
#   workers: JOB_COMPLETION_INDEX (set by Kubernetes for an indexed Job),
#   CHAINPS_FINISHED_MARK (file written when the job has ended; default
#            /run/chainps/finished; chainps.pid beside it holds the scheduler's or
#            server's PID).
#
# Why a copy of the secret: chainps refuses a secret file that group or others may read, and
# Kubernetes mounts a Secret with the pod's fsGroup added and group read (0440) whatever
# defaultMode says. The copy lives on a memory-backed emptyDir owned by the pod's user.
#
# Why the scheduler is killed, not terminated, when its pod is deleted: see `scheduler)` below.
#
# Why the scheduler and the servers do not exit when the job ends: a Deployment and a
# StatefulSet restart any container that exits, even with status 0, and a restart after the
# end would rejoin a finished job. So once `chainps scheduler`/`chainps server` exits 0 this
# script writes the finished mark and waits (probes pass) until the pod is deleted. A non-zero
# exit is passed on, and Kubernetes restarts the container on the same volume: a restarted
# scheduler resumes the job from its view, a restarted server rejoins and copies its ranges
# back.
set -euo pipefail

die() {
    echo "chainps-k8s: $*" >&2
    exit 2
}
log() { echo "chainps-k8s: $*" >&2; }

CHAINPS=${CHAINPS_BIN:-chainps}
mark=${CHAINPS_FINISHED_MARK:-/run/chainps/finished}
# The PID of the chainps process, beside the mark (kubectl exec ... kill -9 $(cat ...)).
pidfile=$(dirname "$mark")/chainps.pid

# Copy the mounted Secret to CHAINPS_SECRET_FILE with mode 0600 (see above).
private_secret() {
    local from=${CHAINPS_SECRET_MOUNT:-} to=${CHAINPS_SECRET_FILE:-}
    [[ -n $to ]] || die "CHAINPS_SECRET_FILE is not set (the ConfigMap sets it)"
    [[ -n $from ]] || return 0 # a secret file given directly
    [[ -r $from ]] || die "the job secret $from is not readable (is the Secret mounted?)"
    local dir
    dir=$(dirname "$to")
    [[ -d $dir && -w $dir ]] || die "$dir (for CHAINPS_SECRET_FILE) is not a writable directory"
    (umask 077 && cat "$from" >"$to.tmp.$$") && mv -f "$to.tmp.$$" "$to"
    chmod 600 "$to"
}

# The pod's ordinal in its StatefulSet: the pod-index label, else the end of the pod name.
ordinal() {
    local i=${CHAINPS_POD_INDEX:-}
    if [[ -z $i ]]; then
        local name=${POD_NAME:-${HOSTNAME:-}}
        i=${name##*-}
    fi
    [[ $i =~ ^[0-9]+$ ]] || die "cannot tell this pod's ordinal (CHAINPS_POD_INDEX='${CHAINPS_POD_INDEX:-}', POD_NAME='${POD_NAME:-${HOSTNAME:-}}')"
    echo "$i"
}

# The server's stable DNS name: POD.SERVICE.NAMESPACE.svc (the headless Service).
server_dns() {
    : "${POD_NAME:?POD_NAME is not set (downward API metadata.name)}"
    : "${POD_NAMESPACE:?POD_NAMESPACE is not set (downward API metadata.namespace)}"
    : "${CHAINPS_SERVER_SERVICE:?CHAINPS_SERVER_SERVICE is not set (the headless Service)}"
    echo "$POD_NAME.$CHAINPS_SERVER_SERVICE.$POD_NAMESPACE.svc"
}

# Run "$@" as a child, pass TERM and INT on to it as signal ON_TERM, and return its exit
# status. usage: run_child ON_TERM COMMAND ARGS...
child=
forward() {
    if [[ -n $child ]]; then
        kill -s "$1" "$child" 2>/dev/null || true
    fi
}
run_child() {
    local on_term=$1
    shift
    # shellcheck disable=SC2064 # ON_TERM is fixed now, on purpose
    trap "forward $on_term" TERM INT
    "$@" &
    child=$!
    echo "$child" >"$pidfile" 2>/dev/null || true
    local rc=0
    # wait returns early (status > 128) when a trapped signal arrives: wait again.
    while :; do
        rc=0
        wait "$child" || rc=$?
        kill -0 "$child" 2>/dev/null || break
    done
    trap - TERM INT
    child=
    return "$rc"
}

# After a clean end: stay up, idle, until the pod is deleted.
idle_after_end() {
    date -u +%FT%TZ >"$mark" 2>/dev/null || true
    log "the job has ended; this pod stays up idle until it is deleted (kubectl delete -k ...)"
    trap 'exit 0' TERM INT
    while :; do
        sleep 3600 &
        wait $! || true
    done
}

# The scheduler's answer to `chainps status`, on stdout; exit status that of chainps status
# (0 answered, 1 no answer within 3 s, 2 bad configuration).
status() {
    local sched=${CHAINPS_SCHEDULER:-}
    # The scheduler is asked on its own address, not through its Service: a Service sends
    # nothing to a pod that is not ready, and this is what makes it ready.
    [[ ${CHAINPS_ROLE:-} == scheduler ]] && sched=${POD_IP:-127.0.0.1}:${CHAINPS_SCHEDULER##*:}
    "$CHAINPS" status --scheduler "$sched"
}

# Does the status text on stdin list a node of ROLE with RANK, and is it alive? Prints
# "yes" (some row of that rank is alive), "no" (listed, none alive) or nothing (not listed).
# Rows: id role rank address heard... alive.
node_alive() {
    awk -v role="$1" -v rank="$2" '
        /^nodes:/ { innodes = 1; next }
        /^$/ { innodes = 0 }
        innodes && $2 == role && $3 == rank { seen = 1; if ($NF == "yes") alive = 1 }
        END { if (alive) print "yes"; else if (seen) print "no" }'
}

probe() {
    local kind=${1:-} role=${CHAINPS_ROLE:-}
    [[ $kind == ready || $kind == live ]] || die "probe ready|live"
    # A job that has ended is neither to be restarted nor waited for.
    [[ -e $mark ]] && return 0
    local out rc=0
    case $role in
    scheduler)
        # Ready and alive when it answers on its own port. Liveness uses a high
        # failureThreshold: a scheduler busy saving a view is slow, not dead.
        out=$(status 2>&1) || rc=$?
        ((rc == 0)) || {
            echo "$out" | tail -n 2
            return 1
        }
        ;;
    server)
        local rank
        rank=$(ordinal)
        out=$(status 2>&1) || rc=$?
        if ((rc != 0)); then
            # No answer from the scheduler says nothing about this server: it is not ready
            # (not known to be in the job) but it is alive; restarting it would not bring the
            # scheduler back and would cost a state transfer.
            echo "$out" | tail -n 2
            [[ $kind == live ]] && return 0
            return 1
        fi
        local alive
        alive=$(echo "$out" | node_alive server "$rank")
        case $kind in
        ready) # the scheduler lists this rank alive
            [[ $alive == yes ]] || {
                echo "server rank $rank: ${alive:-not listed} in the scheduler's view"
                return 1
            }
            ;;
        live) # only a scheduler that answers and calls this rank dead counts against it
            [[ $alive == no ]] && {
                echo "server rank $rank: the scheduler declared it dead"
                return 1
            }
            ;;
        esac
        ;;
    *) die "probe: CHAINPS_ROLE='$role' (scheduler or server)" ;;
    esac
    return 0
}

role=${1:-}
shift || true
case $role in
scheduler)
    export CHAINPS_ROLE=scheduler
    rm -f "$mark"
    private_secret
    rc=0
    # Pod deleted, node drained, rollout: chainps's scheduler ends the whole job on SIGTERM,
    # while one that is killed leaves its view on the volume for the next pod to resume. So
    # the TERM Kubernetes sends becomes a KILL. (End a job on purpose with
    # `chainps status --end`.)
    run_child KILL "$CHAINPS" scheduler "$@" || rc=$?
    ((rc == 0)) || exit "$rc"
    idle_after_end
    ;;
server)
    export CHAINPS_ROLE=server
    rm -f "$mark"
    private_secret
    rank=$(ordinal)
    export CHAINPS_RANK=$rank
    dns=$(server_dns)
    log "server rank $rank, advertised as $dns"
    rc=0
    # A server stops cleanly on SIGTERM (flushes its store) and is failed over; the next pod
    # rejoins with its rank and volume.
    run_child TERM "$CHAINPS" server --rank "$rank" --advertise "$dns" "$@" || rc=$?
    ((rc == 0)) || exit "$rc"
    idle_after_end
    ;;
worker)
    [[ $# -gt 0 ]] || die "worker: no training program given"
    : "${JOB_COMPLETION_INDEX:?JOB_COMPLETION_INDEX is not set (an indexed Job sets it)}"
    [[ $JOB_COMPLETION_INDEX =~ ^[0-9]+$ ]] || die "bad JOB_COMPLETION_INDEX '$JOB_COMPLETION_INDEX'"
    export CHAINPS_ROLE=worker CHAINPS_RANK=$JOB_COMPLETION_INDEX
    private_secret
    exec "$@"
    ;;
probe)
    probe "$@"
    ;;
*)
    die "usage: chainps-k8s scheduler|server|worker ARGS... | probe ready|live"
    ;;
esac
