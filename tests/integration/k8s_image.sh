#!/usr/bin/env bash
# ctest long.k8s_image: build deploy/k8s/Dockerfile with Debian's buildah and run the image.
#
# No registry is reachable here, so the Dockerfile's bases (debian:12, debian:12-slim) are
# made locally: debootstrap --variant=minbase bookworm from Debian's archive, imported and
# tagged under both names (kept as a tarball in WORK_DIR/k8s-image for the next run). Then
# `buildah bud` builds the image (the RUN steps install packages from Debian's archive), and
# the image is run as its non-root user: chainps and fmnist start, the data set is there,
# every library resolves, the entrypoint answers, and a 2-server 2-worker fmnist job runs
# to its end inside it (chainps launch). Then the torch variant (--build-arg WITH_TORCH=1, what
# deploy/k8s-torch runs): chainps, chainps.torch, torch and numpy import as uid 10001 and a
# 2-server 2-worker job of the PyTorch example (the image's train.py) runs to its end.
#
# env: K8S_IMAGE_TORCH=0 skips the torch variant (it downloads python3-torch and its
#   libraries, some hundreds of MB, and compiles chainps a second time).
# usage: k8s_image.sh REPO_ROOT WORK_DIR
# Exits 77 (skipped), saying why, without root, buildah or debootstrap, or when Debian's
# archive cannot be reached. All of buildah's state is in WORK_DIR/k8s-image/storage
# (--root/--runroot, vfs driver), removed at the end; nothing else on the machine is touched.
set -euo pipefail

root=$(cd "${1:?usage: k8s_image.sh REPO_ROOT WORK_DIR}" && pwd)
mkdir -p "${2:?WORK_DIR}/k8s-image"
cache=$(cd "$2/k8s-image" && pwd)
say() { echo "$(date +%T) k8s_image: $*"; }
skip() {
    say "SKIP: $*"
    exit 77
}
[[ $(id -u) == 0 ]] || skip "buildah and debootstrap need root here"
for b in buildah debootstrap; do
    command -v "$b" >/dev/null || skip "$b not installed (apt-get install buildah debootstrap)"
done

store=$cache/storage
bha=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
bh() { "${bha[@]}" "$@"; }
export BUILDAH_ISOLATION=chroot
ctrs=()
cleanup() {
    local c
    for c in "${ctrs[@]}"; do bh rm "$c" >/dev/null 2>&1 || true; done
    rm -rf "$store" "$cache/rootfs"
}
trap cleanup EXIT

# The base image, once: a minimal Debian 12 from Debian's archive.
base=$cache/debian-12-minbase.tar
if [[ ! -s $base ]]; then
    say "debootstrap --variant=minbase bookworm (first run only)"
    rm -rf "$cache/rootfs"
    if ! timeout 900 debootstrap --variant=minbase bookworm "$cache/rootfs" \
        http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1; then
        tail -n 5 "$cache/debootstrap.log"
        skip "debootstrap could not make a Debian 12 base (is Debian's archive reachable?)"
    fi
    tar -C "$cache/rootfs" -cf "$base.tmp" . && mv "$base.tmp" "$base"
    rm -rf "$cache/rootfs"
fi
c=$(bh from scratch)
ctrs+=("$c")
mnt=$(bh mount "$c")
tar -C "$mnt" -xf "$base"
bh umount "$c" >/dev/null
bh config --cmd /bin/bash "$c"
bh commit -q "$c" docker.io/library/debian:12 >/dev/null
bh tag docker.io/library/debian:12 docker.io/library/debian:12-slim
say "base images debian:12 and debian:12-slim made from debootstrap"

say "buildah bud -f deploy/k8s/Dockerfile (builds chainps in the image: a few minutes)"
if ! timeout 1500 nice "${bha[@]}" bud --pull=never --layers=false -f "$root/deploy/k8s/Dockerfile" \
    -t localhost/chainps:test "$root" >"$cache/build.log" 2>&1; then
    tail -n 30 "$cache/build.log"
    if grep -qE 'Temporary failure resolving|Could not resolve|Failed to fetch' "$cache/build.log"; then
        skip "the image's apt-get could not reach Debian's archive"
    fi
    say "FAIL: the image did not build (log above, all of it in $cache/build.log)"
    exit 1
fi
say "built: $(bh images --format '{{.Name}}:{{.Tag}} {{.Size}}' localhost/chainps:test)"

r=$(bh from --pull=never localhost/chainps:test)
ctrs+=("$r")
user=$(bh inspect --format '{{.OCIv1.Config.User}}' "$r")
entry=$(bh inspect --format '{{.OCIv1.Config.Entrypoint}}' "$r")
[[ $user == 10001:10001 ]] || {
    say "FAIL: the image's user is '$user', not 10001:10001 (the manifests' runAsUser)"
    exit 1
}
[[ $entry == *"/usr/local/bin/chainps-k8s"* ]] || {
    say "FAIL: the image's entrypoint is $entry"
    exit 1
}
# The image as the pods run it: its own user, with /tmp as their writable directory.
# shellcheck disable=SC2016 # expanded in the image's shell
if ! timeout 300 "${bha[@]}" run --user 10001:10001 "$r" -- sh -ec '
    id -u | grep -qx 10001
    for b in chainps fmnist; do
        if ldd /usr/local/bin/$b | grep "not found"; then echo "$b: a library is missing"; exit 1; fi
    done
    chainps --help | head -1
    fmnist --help | head -1
    test -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
    chainps-k8s 2>&1 | grep -q usage
    cd /tmp
    chainps launch --servers 2 --workers 2 --timeout 120 -- \
        fmnist --steps 200 --log-every 0 --out /tmp/out >/tmp/launch.log 2>&1 ||
        { tail -n 20 /tmp/launch.log; exit 1; }
    grep "^\[worker 0\] final:" /tmp/launch.log
    test -s /tmp/out/fmnist-mlp.bin' >"$cache/run.log" 2>&1; then
    cat "$cache/run.log"
    say "FAIL: the image does not run"
    exit 1
fi
cat "$cache/run.log"
say "ok: the image builds from deploy/k8s/Dockerfile and runs a job as uid 10001"
bh rm "$r" >/dev/null 2>&1 || true
bh rmi localhost/chainps:test >/dev/null 2>&1 || true # vfs: each image is a full copy

[[ ${K8S_IMAGE_TORCH:-1} == 0 ]] && exit 0
say "buildah bud --build-arg WITH_TORCH=1 (the torch variant: python3-torch, the Python package)"
if ! timeout 1800 nice "${bha[@]}" bud --pull=never --layers=false --build-arg WITH_TORCH=1 \
    -f "$root/deploy/k8s/Dockerfile" -t localhost/chainps-torch:test "$root" >"$cache/build-torch.log" 2>&1; then
    tail -n 30 "$cache/build-torch.log"
    if grep -qE 'Temporary failure resolving|Could not resolve|Failed to fetch' "$cache/build-torch.log"; then
        skip "the torch image's apt-get could not reach Debian's archive"
    fi
    say "FAIL: the torch image did not build (all of its log in $cache/build-torch.log)"
    exit 1
fi
say "built: $(bh images --format '{{.Name}}:{{.Tag}} {{.Size}}' localhost/chainps-torch:test)"
r=$(bh from --pull=never localhost/chainps-torch:test)
ctrs+=("$r")
# shellcheck disable=SC2016 # expanded in the image's shell
if ! timeout 600 "${bha[@]}" run --user 10001:10001 "$r" -- sh -ec '
    python3 -c "import chainps, chainps.torch, torch, numpy; print(\"torch\", torch.__version__)"
    test -f /usr/local/share/chainps/examples/torch/train.py
    cd /tmp
    chainps launch --servers 2 --workers 2 --timeout 300 -- \
        python3 /usr/local/share/chainps/examples/torch/train.py --steps 200 --log-every 0 \
        >/tmp/launch.log 2>&1 || { tail -n 20 /tmp/launch.log; exit 1; }
    grep "^\[worker 0\] final:" /tmp/launch.log' >"$cache/run-torch.log" 2>&1; then
    cat "$cache/run-torch.log"
    say "FAIL: the torch image does not run the PyTorch example"
    exit 1
fi
cat "$cache/run-torch.log"
say "ok: the torch variant builds (WITH_TORCH=1) and runs the PyTorch example as uid 10001"
