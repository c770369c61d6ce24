#!/usr/bin/env bash
# Flake hunt: run a built suite's tests (ctest, `long` label excluded) N times in a row while
# busy loops keep every core loaded, as a shared CI machine would; stop at the first failure and
# print its output. Each busy loop is ended by its PID when the script exits.
# Usage: scripts/repeat.sh BUILD_DIR [N=20] [CTEST_REGEX]
#   e.g. ASAN_OPTIONS=detect_leaks=1 scripts/repeat.sh build/asan 20 'integration\.'
set -euo pipefail
dir=${1:?usage: scripts/repeat.sh BUILD_DIR [N] [CTEST_REGEX]}
n=${2:-20}
regex=${3:-.}
[ -f "$dir/CTestTestfile.cmake" ] || { echo "repeat: $dir is not a configured build" >&2; exit 2; }
burners=()
cleanup() { for p in "${burners[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  burners+=($!)
done
start=$(date +%s)
for i in $(seq "$n"); do
  log=$(mktemp)
  if (cd "$dir" && ctest -j1 -LE long -R "$regex" --output-on-failure >"$log" 2>&1); then
    echo "round $i/$n: $(grep -Eo '[0-9]+ tests passed[^,]*|100% tests passed.*' "$log" | head -1) ($(( $(date +%s) - start )) s so far)"
    rm -f "$log"
  else
    echo "round $i/$n FAILED:"
    grep -E "\*\*\*Failed|\*\*\*Timeout|Failed  |Timeout" "$log" || true
    echo "full output: $log"
    exit 1
  fi
done
echo "repeat: $n rounds of '$regex' in $dir passed with $(nproc) busy loops, $(( $(date +%s) - start )) s"
