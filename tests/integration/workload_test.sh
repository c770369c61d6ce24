#!/bin/sh
# unit.workload_sh: workload.sh's trajectory helpers on made-up lsq_worker logs. The fault tests
# (kill_test.sh, launch_resilience.sh, netns_job.sh, scale_test.sh, slurm_job.sh,
# transport_job.sh) take the reference with workload_ref_trajectory and compare each faulted
# run's workload_trajectories with it; a faulted run printing "trajectory -" must fail that
# comparison, and a reference of "-", none or two hashes must be refused.
set -eu
. "$(dirname "$0")/workload.sh"
dir=$(mktemp -d "${TMPDIR:-/tmp}/workload_sh.XXXXXX")
trap 'rm -rf "$dir"' EXIT
bad=0
no() {
    echo "FAIL: $*"
    bad=1
}
final() { # RANK TRAJECTORY CHECKSUM
    echo "final: rank $1 max |w - w*| = 1.2e-07, trajectory $2, checksum $3"
}
h=0123456789abcdef
c=00000000deadbeef

{
    echo "launch: connected 2 workers"
    final 0 $h $c
    final 1 $h $c
} >"$dir/ref.log"
ref=$(workload_ref_trajectory "$dir/ref.log") || no "a good reference refused: $ref"
[ "$ref" = $h ] || no "reference '$ref', expected $h"

# A faulted run whose workers print "-": same checksum, so only the trajectory tells it apart.
{
    final 0 - $c
    final 1 - $c
} >"$dir/dash.log"
got=$(workload_trajectories "$dir/dash.log")
[ "$got" = - ] || no "trajectories of the '-' run: '$got'"
[ "$got" != "$ref" ] || no "a run with trajectory - compared equal to reference $ref"
# One worker "-", the other the reference's: two lines, not the reference either.
{
    final 0 $h $c
    final 1 - $c
} >"$dir/half.log"
[ "$(workload_trajectories "$dir/half.log")" != "$ref" ] || no "half '-' run compared equal"
# The same hash from a faulted run compares equal (the comparison can pass).
[ "$(workload_trajectories "$dir/ref.log")" = "$ref" ] || no "the reference differs from itself"

# References that must be refused, each with a reason on stdout and status 1.
for case in dash none two short; do
    case $case in
    dash) { final 0 - $c; final 1 - $c; } >"$dir/r.log" ;;
    none) echo "launch: connected 2 workers" >"$dir/r.log" ;;
    two) { final 0 $h $c; final 1 fedcba9876543210 $c; } >"$dir/r.log" ;;
    short) final 0 0123abcd $c >"$dir/r.log" ;;
    esac
    if msg=$(workload_ref_trajectory "$dir/r.log"); then
        no "reference '$case' accepted: '$msg'"
    else
        case $msg in *"not one 16-hex-digit hash"*) ;; *) no "reference '$case': message '$msg'" ;; esac
    fi
done
if msg=$(workload_ref_trajectory "$dir/missing.log" 2>/dev/null); then
    no "a missing reference log accepted: '$msg'"
fi

[ $bad = 0 ] || exit 1
echo "PASS: workload_ref_trajectory takes one 16-hex hash and refuses -, none, two, short, no file;" \
    "a run printing trajectory - differs from the reference"
