#!/usr/bin/env bash
# The main job: a local cluster (3 servers, 2 workers, sync SGD) trains a model on Fashion-MNIST
# through the parameter server. Installs missing packages and builds first.
# Usage: scripts/demo.sh [--model mlp|cnn] [--epochs N] [other fmnist flags]
#        scripts/demo.sh torch [train.py flags]   (the PyTorch example, LeNet-5, the same way)
# BUILD (default build/release) is the build directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD:-build/release}
case $build in /*) ;; *) build=$root/$build ;; esac
out="$root/out/demo"
mkdir -p "$out"
# One preparation for both demos: packages, configure, the targets the demo runs.
prepare() { # deps.sh set, build targets...
    scripts/deps.sh "$1"
    shift
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j"$(nproc)" --target chainps_cli "$@" >/dev/null
}
if [ "${1:-}" = torch ]; then
    shift
    # The Python package is the extension and the modules beside it (python/CMakeLists.txt).
    prepare torch chainps_python
    echo "demo: PyTorch LeNet-5 on Fashion-MNIST with 3 servers and 2 workers (sync SGD)"
    echo "demo: 6 s in, the head of a chain is killed (SIGKILL); training carries on, and the"
    echo "demo: server comes back 2 s later and copies its ranges back"
    PYTHONPATH="$build/python" "$build/chainps" launch --servers 3 --workers 2 --mode sync \
        --timeout 3600 --kill-at 6 -- /usr/bin/python3 examples/torch/train.py --epochs 2 "$@"
    echo "demo: both workers printed the same final checksum: the model is bitwise the same on each"
    exit 0
fi
prepare demo fmnist
echo "demo: training on Fashion-MNIST with 3 servers and 2 workers (sync SGD); output in $out"
echo "demo: 6 s in, the head of a chain is killed (SIGKILL); training carries on without a"
echo "demo: restart, and the server comes back 2 s later and copies its ranges back"
echo "demo: every 500 steps the job is checkpointed while it trains (newest 2 kept in $out/checkpoints)"
"$build/chainps" launch --servers 3 --workers 2 --mode sync --timeout 3600 --kill-at 6 \
  --checkpoint-every 500 --checkpoint-dir "$out/checkpoints" --keep 2 -- \
  "$build/examples/fmnist" --model mlp --epochs 5 --out "$out" "$@"
echo "demo: plot $out/fmnist-mlp.png, CSV $out/fmnist-mlp.csv, final model $out/fmnist-mlp.bin"
echo "demo: checkpoints: $build/chainps checkpoint inspect $out/checkpoints/<step-...>"
