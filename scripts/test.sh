#!/usr/bin/env bash
# Build chainps and run every test: unit, simulator, integration and fuzz-replay tests in a
# normal build, the same again under AddressSanitizer + UndefinedBehaviorSanitizer, and a
# bounded libFuzzer run of the wire decoders. Installs missing packages first.
# Usage: scripts/test.sh            (everything; see docs/testing.md for how long)
#        QUICK=1 scripts/test.sh    (normal build only)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/deps.sh test
jobs=$(nproc)
fail=0
passed=0
failed=0

run_suite() { # dir label
  local dir=$1 name=$2 log
  log=$(mktemp)
  echo "== $name: configure and build in $dir"
  cmake -S . -B "$dir" "${@:3}" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  echo "== $name: ctest"
  # The `long` label (10,000 more simulator seeds) is for `ctest -L long`, not for every run;
  # EXCLUDE (the sanitizer suite's) leaves out more. The simulator's seeds are pure computation
  # (no socket, no clock), so they run on every core first; then the rest, two at a time: jobs
  # of several processes and the unit tests of heartbeats and sockets each take one of two
  # lanes (tests/lanes.json), so no more than two of them share the cores.
  local exclude=${EXCLUDE:-long}
  if (cd "$dir" && ctest --output-on-failure -j"$jobs" -L '^sim$' -LE "$exclude" 2>&1 | tee "$log"); then :; else fail=1; fi
  if (cd "$dir" && ctest --output-on-failure -j"$jobs" -LE "^sim$|$exclude" 2>&1 | tee -a "$log"); then :; else fail=1; fi
  # ctest's summary of each run: "NN% tests passed, F tests failed out of T"
  local f t
  while read -r f t; do
    failed=$((failed + f)); passed=$((passed + t - f))
  done < <(sed -nE 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\1 \2/p' "$log")
  rm -f "$log"
}

# Release (-O3), as the README and scripts/demo.sh build it: gcc warns differently at -O3.
run_suite build/test "release build" -DCMAKE_BUILD_TYPE=Release
if [ -z "${QUICK:-}" ]; then
  # LSan needs ptrace-free operation; halt on the first UBSan report.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # Not the `accuracy` test (fmnist trained to a margin: 2 minutes under ASan, and its codecs
  # run under ASan in their unit tests and chaos.lossy), nor `release_only` tests (fault variants
  # of a test whose plain run is in this pass), nor the `netns` ones (multi-host jobs in network
  # namespaces: their code runs under ASan in the other suites), nor the `deploy` ones (Slurm and
  # Kubernetes harnesses around the same code: 4 minutes under ASan), nor `docs` (docs.snippets:
  # the README's and docs/' commands, Python among them, which Debian's python3 cannot run
  # under ASan).
  EXCLUDE='long|accuracy|release_only|netns|deploy|docs' run_suite build/asan "ASan+UBSan build" -DCMAKE_BUILD_TYPE=Debug -DCHAINPS_SANITIZE=ON
  unset ASAN_OPTIONS UBSAN_OPTIONS
  echo "== libFuzzer: wire decoders for ${FUZZ_SECONDS:-40} s, the checkpoint JSON reader for half that"
  if tests/fuzz/run_fuzz.sh build/fuzz "${FUZZ_SECONDS:-40}"; then passed=$((passed + 1)); else failed=$((failed + 1)); fail=1; fi
fi
echo
echo "tests: $passed passed, $failed failed"
exit $fail
