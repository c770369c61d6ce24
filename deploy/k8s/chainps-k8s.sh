#!/bin/bash
# The entrypoint of every chainps pod (installed in the image as /usr/local/bin/chainps-k8s).
# It turns the pod's view of itself (its Job completion index, its stable DNS name) into chainps flags, makes a private copy of the job secret, and runs the
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
#   servers: JOB_COMPLETION_INDEX (the rank; Kubernetes sets it in an Indexed Job's pods),
#            JOB_NAME (the Job's name: the pod's host name is JOB_NAME-INDEX), POD_NAMESPACE,
#            CHAINPS_SERVER_SERVICE (the headless Service, the pods' subdomain),
#   scheduler: POD_IP (its own address, for the probes; default 127.0.0.1),
#   workers: JOB_COMPLETION_INDEX (set by Kubernetes for an indexed Job),
#   CHAINPS_FINISHED_MARK (file written when the job has ended, just before the exit 0;
#            default /run/chainps/finished; chainps.pid beside it holds the scheduler's or
#            server's PID).
#
# Why a copy of the secret: chainps refuses a secret file that group or others may read, and
# Kubernetes mounts a Secret with the pod's fsGroup added and group read (0440) whatever
# defaultMode says. The copy lives on a memory-backed emptyDir owned by the pod's user.
#
# Why the scheduler is killed, not terminated, when its pod is deleted: see `scheduler)` below.
#
# The end of the job: the scheduler and the servers run as Jobs (restartPolicy OnFailure), so
# when `chainps scheduler`/`chainps server` exits 0 this script writes the finished mark and
# exits 0 too, and the pod is done: nothing restarts it. A non-zero exit is passed on, and
# Kubernetes restarts the container in its pod, on the same volumes: a restarted scheduler
# resumes the job from its view, a restarted server rejoins and copies its ranges back.
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

# The server's rank: its completion index in the servers' Indexed Job.
ordinal() {
    local i=${JOB_COMPLETION_INDEX:-}
    [[ $i =~ ^[0-9]+$ ]] || die "cannot tell this pod's index (JOB_COMPLETION_INDEX='$i'; an Indexed Job sets it)"
    echo "$i"
}

# The server's stable DNS name: HOST.SERVICE.NAMESPACE.svc, where HOST is JOB_NAME-INDEX, the
# host name Kubernetes gives an Indexed Job's pod, published under the headless Service named
# by the pod's subdomain.
server_dns() {
    : "${JOB_NAME:?JOB_NAME is not set (downward API label batch.kubernetes.io/job-name)}"
    : "${POD_NAMESPACE:?POD_NAMESPACE is not set (downward API metadata.namespace)}"
    : "${CHAINPS_SERVER_SERVICE:?CHAINPS_SERVER_SERVICE is not set (the headless Service)}"
    echo "$JOB_NAME-$(ordinal).$CHAINPS_SERVER_SERVICE.$POD_NAMESPACE.svc"
}

# Run "$@" as a child, pass TERM and INT on to it as signal ON_TERM, and return its exit
# status. usage: run_child ON_TERM COMMAND ARGS...
child=
stopped= # set when Kubernetes stopped the pod (TERM or INT arrived)
forward() {
    stopped=1
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

# After a clean end: record it and exit 0; the pod is then done (its Job is not restarted).
ended() {
    date -u +%FT%TZ >"$mark" 2>/dev/null || true
    log "the job has ended; exiting 0 (the pod is done)"
    exit 0
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
# "yes" (some row of that rank is alive and copies no range), "copying" (alive, but still
# copying a range from its tail: state transfer), "no" (listed, none alive) or nothing (not
# listed). Node rows: id role rank address heard (3 words) alive [clock]; range rows end with
# "(node ID copying it from node ID)" while a copy is under way.
node_alive() {
    awk -v role="$1" -v rank="$2" '
        /^nodes:/ { innodes = 1; next }
        /^ranges:/ { inranges = 1; next }
        /^$/ { innodes = 0; inranges = 0 }
        innodes && $2 == role && $3 == rank {
            seen = 1
            if ($8 == "yes") { alive = 1; ids[$1] = 1 }
        }
        inranges && match($0, /\(node [0-9]+ copying it/) {
            split(substr($0, RSTART, RLENGTH), w, " ")
            copying[w[2]] = 1
        }
        END {
            for (id in ids) if (id in copying) busy = 1
            if (alive && busy) print "copying"; else if (alive) print "yes"; else if (seen) print "no"
        }'
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
        ready) # the scheduler lists this rank alive and it copies no range: a server is not
            # ready while its state transfer runs, so the PodDisruptionBudget (servers-pdb.yaml)
            # lets no other server be evicted before the chains are whole again.
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
    ended
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
    # A pod deleted or evicted mid-job must end Failed, not Succeeded: a Job counts a pod
    # whose containers all exited 0 as its index done and would not replace the server.
    if [[ -n $stopped ]] && ((rc == 0)); then
        log "stopped by Kubernetes (TERM) before the job ended: exit 143, so that the Job replaces this pod"
        exit 143
    fi
    ((rc == 0)) || exit "$rc"
    ended
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
