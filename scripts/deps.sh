#!/usr/bin/env bash
# Install the Debian packages chainps needs, only those missing. Usage: scripts/deps.sh [demo|test|all]
set -euo pipefail
what=${1:-all}
pkgs=(build-essential cmake pkg-config liblmdb-dev libnanomsg-dev libopenblas-dev libsnappy-dev
      libcmocka-dev zlib1g-dev libssl-dev python3-dev)
case "$what" in
  demo) pkgs+=(dataset-fashion-mnist gnuplot-nox) ;;
  test) pkgs+=(clang clang-format libclang-rt-14-dev iperf3 dataset-fashion-mnist procps
              python3-numpy python3-torch python3-pytest slurm-wlm munge) ;;
  all)  pkgs+=(dataset-fashion-mnist gnuplot-nox clang clang-format libclang-rt-14-dev iperf3 procps
              python3-numpy python3-torch python3-pytest slurm-wlm munge) ;;
  *) echo "usage: $0 [demo|test|all]" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
