#!/usr/bin/env bash
# The cross-host cells of issue 30 in one command: a 1 MB and a 16 MB push+pull between two
# network namespaces (veth pairs to a bridge stand in for two hosts), chainps authenticated as
# by default (one MAC per message), chainps --insecure and ps-lite across the same namespaces,
# in interleaved rounds; per cell pp GB/s, push and pull p50 and CPU ms per GB moved (all the
# job's processes), and the median of the per-round ratios to ps-lite.
#
#   bench/run_xhost.sh BUILD_DIR PSLITE_BENCH     (root; iproute2 and nftables)
#
# PSLITE_BENCH: the pslite_bench that bench/run_pslite.sh built (e.g.
# ~/.cache/chainps-pslite/15b8adf/pslite_bench). This is bench/run_frames.sh with the sides
# `auth insecure pslite` (FRAMES=auth) writing bench/results/run_xhost.md; its knobs hold
# (ROUNDS, default 5 here; SIZES; ITERS; KEEP=1; PERF=DIR to profile every process with perf).
# Namespaces cpsf<PID>-*; every process ended by its PID, every namespace deleted on exit.
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || { echo "usage: run_xhost.sh BUILD_DIR PSLITE_BENCH" >&2; exit 2; }
export FRAMES=auth REPORT_NAME=${REPORT_NAME:-run_xhost} ROUNDS=${ROUNDS:-5}
exec "$here/run_frames.sh" "$@"
