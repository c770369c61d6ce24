# Workloads of the fault tests (issue 26), sourced by kill_test.sh, launch_resilience.sh,
# scale_test.sh and netns_job.sh (slurm_job.sh and transport_job.sh: the trajectory helpers). `WORKLOAD` chooses what the job trains:
#   lsq     tests/integration/lsq_worker: one tensor, paced steps (the default)
#   fmnist  examples/fmnist --model mlp: the Fashion-MNIST MLP users run, 6 tensors (fc1.weight
#           cut into chunks over every range, the others whole on ranges chosen by name), one
#           push_pull per tensor per step, started from backward as each gradient is ready
# A fault that passed with lsq_worker once deadlocked the fmnist job (issue 26): every fault
# claim of the README is checked on both. The scripts pass the training program's path; the
# workload's own flags are chosen here and in each script.
# POSIX sh (kill_test.sh and scale_test.sh are sh scripts).

WORKLOAD=${WORKLOAD:-lsq}
case $WORKLOAD in
lsq | fmnist) ;;
*)
    echo "WORKLOAD=$WORKLOAD: expected lsq or fmnist" >&2
    exit 2
    ;;
esac

# The Fashion-MNIST data comes with the test dependencies (scripts/deps.sh test installs
# Debian's dataset-fashion-mnist), so a job that cannot find it fails: a fault test that skipped
# would leave its claim unchecked on the real workload.
workload_need_data() {
    [ "$WORKLOAD" = fmnist ] || return 0
    wl_data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
    [ -r "$wl_data/train-images-idx3-ubyte.gz" ] && return 0
    echo "FAIL: WORKLOAD=fmnist needs the Fashion-MNIST data in $wl_data" \
        "(scripts/deps.sh test installs dataset-fashion-mnist; FMNIST_DATA names another place)"
    exit 1
}

# fmnist's flags for a job of STEPS sync steps, its outputs (rank 0's CSV, plot, model) in
# OUTDIR; a loss line every LOG_EVERY steps marks training under way in the job's output.
workload_fmnist_args() { # STEPS OUTDIR [LOG_EVERY]
    echo "--model mlp --steps $1 --log-every ${3:-0} --out $2" \
        "--data ${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}"
}

# A line of the job's output that says training is under way: fmnist's first loss line, or
# for lsq_worker (which prints nothing per step) the scheduler having admitted every node.
workload_training_re() {
    if [ "$WORKLOAD" = fmnist ]; then
        echo 'epoch: 1 step: [0-9]*, loss is'
    else
        echo 'connected [0-9]* workers'
    fi
}

# lsq_worker's trajectory hashes in FILE... (stdin without), one line each, sorted, deduplicated:
# "T" of each `final: ... trajectory T, checksum C` line ("-" where it is not comparable); fmnist
# prints none. In sync mode with the same worker processes a faulted run's must be its
# fault-free reference's (docs/testing.md).
workload_trajectories() {
    sed -n 's/.*final: .*trajectory \([-0-9a-f]*\), checksum .*$/\1/p' "$@" | sort -u
}

# The fault-free run's trajectory hash: the one 16-hex-digit T that every lsq_worker in FILE
# printed. Anything else ("-", no final line, workers that differ) prints a FAIL reason instead
# and returns 1: a reference of "-" or none would let a faulted run's "-" pass unchecked.
#   ref_traj=$(workload_ref_trajectory FILE) || fail "$ref_traj"
# The faulted runs then compare `workload_trajectories` of their logs with it as strings.
workload_ref_trajectory() { # FILE
    wl_rt=$(workload_trajectories "$1")
    case $wl_rt in
    "" | *[!0-9a-f]*) ;;
    ????????????????)
        echo "$wl_rt"
        return 0
        ;;
    esac
    echo "the fault-free run's trajectory hash(es) '$wl_rt' ($1) are not one 16-hex-digit hash"
    return 1
}

# The fault (the first line matching FAULT_RE in LOG) fell while the job trained: after the
# training line and before the first worker's final line. A fault outside that window checks
# nothing, so it fails the test (a job too short, or a machine too slow to start it in time).
workload_fault_mid_run() { # LOG FAULT_RE
    wl_t=$(grep -n -m1 "$(workload_training_re)" "$1" | cut -d: -f1)
    wl_f=$(grep -n -m1 "$2" "$1" | cut -d: -f1)
    wl_e=$(grep -n -m1 "final: " "$1" | cut -d: -f1)
    if [ -z "$wl_f" ]; then
        echo "FAIL: no fault ('$2') in $1"
        return 1
    fi
    if [ -z "$wl_t" ] || [ "$wl_f" -lt "$wl_t" ]; then
        echo "FAIL: the fault ('$2', line $wl_f) came before training started (line ${wl_t:-none}):" \
            "start it later"
        return 1
    fi
    if [ -n "$wl_e" ] && [ "$wl_f" -gt "$wl_e" ]; then
        echo "FAIL: the fault ('$2', line $wl_f) came after a worker finished (line $wl_e):" \
            "make the job longer"
        return 1
    fi
    return 0
}
