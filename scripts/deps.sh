#!/usr/bin/env bash
# Install the Debian packages chainps needs, only those missing.
# Usage: scripts/deps.sh [demo|torch|test|all|pslite]   (pslite: what bench/run_pslite.sh builds ps-lite with)
set -euo pipefail
what=${1:-all}
# libunistring-dev: `pkg-config --static chainps` reaches it through libmicrohttpd and gnutls's
# Libs.private, but Debian's libgnutls28-dev does not bring it (install.prefix links statically).
pkgs=(build-essential cmake pkg-config liblmdb-dev libnanomsg-dev libopenblas-dev libsnappy-dev
      libcmocka-dev zlib1g-dev libssl-dev libxxhash-dev libmicrohttpd-dev libunistring-dev
      python3-dev)
case "$what" in
  demo) pkgs+=(dataset-fashion-mnist gnuplot-nox) ;;
  torch) pkgs+=(dataset-fashion-mnist python3-numpy python3-torch) ;;
  test) pkgs+=(clang clang-format libclang-rt-14-dev iperf3 dataset-fashion-mnist procps
              python3-numpy python3-torch python3-pytest python3-yaml iproute2 nftables
              python3-pip python3-setuptools python3-wheel python3-venv) ;;
  all)  pkgs+=(dataset-fashion-mnist gnuplot-nox clang clang-format libclang-rt-14-dev iperf3 procps
              python3-numpy python3-torch python3-pytest python3-yaml iproute2 nftables
              python3-pip python3-setuptools python3-wheel python3-venv) ;;
  pslite) pkgs=(g++ pkg-config protobuf-compiler libprotobuf-dev libzmq3-dev) ;;
  *) echo "usage: $0 [demo|torch|test|all|pslite]" >&2; exit 2 ;;
esac
# python3-pip, -setuptools, -wheel and -venv: install.prefix builds the Python package with pip
# (offline: --no-build-isolation) into a venv, as python/README.md tells users to.
# iproute2 and nftables: the netns tests (tests/integration/netns_job.sh) build their network
# with `ip netns`, veth pairs and a bridge, and drop packets with nftables.
# Wanted but not needed: integration.slurm runs a private one-node Slurm cluster with them and
# skips (naming why) without; integration.k8s lints the manifests with yamllint and the pods'
# entrypoint with shellcheck when they are there; long.k8s_image builds deploy/k8s/Dockerfile
# with buildah on a debootstrap'd base. A failed install of these is a warning.
optional=()
case "$what" in test|all) optional=(slurm-wlm munge yamllint shellcheck buildah debootstrap) ;; esac
absent() { # packages of "$@" not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(absent "${pkgs[@]}")
mapfile -t missing_opt < <(absent "${optional[@]}")
[ ${#missing[@]} -eq 0 ] && [ ${#missing_opt[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#missing_opt[@]} -gt 0 ]; then
  echo "deps: installing ${missing_opt[*]} (optional: for integration.slurm, integration.k8s, long.k8s_image)"
  $sudo apt-get install -y -qq --no-install-recommends "${missing_opt[@]}" >/dev/null ||
    echo "deps: warning: could not install ${missing_opt[*]}; integration.slurm and long.k8s_image will be skipped, integration.k8s will not lint"
fi
