#!/bin/sh
# Build the libFuzzer target with clang and fuzz the wire decoders for a while.
#   usage: tests/fuzz/run_fuzz.sh BUILD_DIR SECONDS
# The corpus lives in BUILD_DIR/corpus/wire and grows across runs; crashes land in
# BUILD_DIR/artifacts/. Seeds come from fuzz_wire_replay, so they follow the current format.
set -eu
dir=${1:?usage: run_fuzz.sh BUILD_DIR SECONDS}
secs=${2:?usage: run_fuzz.sh BUILD_DIR SECONDS}
src=$(cd "$(dirname "$0")/../.." && pwd)
cc=${CC:-clang}

cmake -S "$src" -B "$dir" -DCMAKE_C_COMPILER="$cc" -DCHAINPS_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$dir" --target fuzz_wire fuzz_wire_replay -j"$(nproc)"

corpus=$dir/corpus/wire
mkdir -p "$corpus" "$dir/artifacts"
"$dir/tests/fuzz/fuzz_wire_replay" --write-corpus "$corpus"
exec "$dir/tests/fuzz/fuzz_wire" -max_total_time="$secs" -max_len=65536 \
    -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "$corpus"
