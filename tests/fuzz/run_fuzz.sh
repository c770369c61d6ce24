#!/bin/sh
# Build the libFuzzer targets with clang and fuzz the wire decoders for a while, then the
# checkpoint JSON reader for half as long (its corpus starts from real export headers).
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
cmake --build "$dir" --target fuzz_wire fuzz_wire_replay fuzz_json -j"$(nproc)"

corpus=$dir/corpus/wire
mkdir -p "$corpus" "$dir/artifacts"
"$dir/tests/fuzz/fuzz_wire_replay" --write-corpus "$corpus"
"$dir/tests/fuzz/fuzz_wire" -max_total_time="$secs" -max_len=65536 \
    -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "$corpus"
jcorpus=$dir/corpus/json
mkdir -p "$jcorpus"
cp "$src"/tests/fuzz/corpus/json/* "$jcorpus"/
exec "$dir/tests/fuzz/fuzz_json" -max_total_time="$(( (secs + 1) / 2 ))" -max_len=131072 \
    -artifact_prefix="$dir/artifacts/json-" -print_final_stats=1 "$jcorpus"
