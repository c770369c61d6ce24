#!/usr/bin/env bash
# The main job: a local cluster (3 servers, 2 workers, sync SGD) trains a model on Fashion-MNIST
# through the parameter server. Installs missing packages and builds first.
# Usage: scripts/demo.sh [--model mlp|cnn] [--epochs N] [other fmnist flags]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/deps.sh demo
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" --target chainps_cli fmnist >/dev/null
out="$root/out/demo"
mkdir -p "$out"
echo "demo: training on Fashion-MNIST with 3 servers and 2 workers (sync SGD); output in $out"
echo "demo: 6 s in, the head of a chain is killed (SIGKILL); training carries on without a"
echo "demo: restart, and the server comes back 2 s later and copies its ranges back"
echo "demo: every 500 steps the job is checkpointed while it trains (newest 2 kept in $out/checkpoints)"
build/release/chainps launch --servers 3 --workers 2 --mode sync --timeout 3600 --kill-at 6 \
  --checkpoint-every 500 --checkpoint-dir "$out/checkpoints" --keep 2 -- \
  build/release/examples/fmnist --model mlp --epochs 5 --out "$out" "$@"
echo "demo: plot $out/fmnist-mlp.png, CSV $out/fmnist-mlp.csv, final model $out/fmnist-mlp.bin"
echo "demo: checkpoints: build/release/chainps checkpoint inspect $out/checkpoints/<step-...>"
