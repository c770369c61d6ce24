#!/usr/bin/env bash
# Where `chainps launch` puts the job's runtime directory (issue 30): in memory when it can, since
# the shared-memory rings are made only on a memory file system. With TMPDIR on a disk and
# /dev/shm a writable tmpfs, the directory must be under /dev/shm, mode 0700, and gone after the
# job; a CHAINPS_RUNTIME_DIR given is used as it is.
# usage: launch_rundir.sh CHAINPS_CLI
set -euo pipefail
cli=$1
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" != tmpfs ] || [ ! -w /dev/shm ]; then
  echo "skip: /dev/shm is not a writable tmpfs on this machine"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
disk=$work/disk
mkdir "$disk"
[ "$(stat -f -c %T "$disk")" != tmpfs ] || { echo "skip: $work is on tmpfs, no disk to compare"; exit 77; }
# shellcheck disable=SC2016 # expanded by the job's sh, not here
show='echo "RUNDIR=$CHAINPS_RUNTIME_DIR FS=$(stat -f -c %T "$CHAINPS_RUNTIME_DIR") MODE=$(stat -c %a "$CHAINPS_RUNTIME_DIR")"'
out=$(env -u CHAINPS_RUNTIME_DIR -u XDG_RUNTIME_DIR TMPDIR="$disk" timeout 60 "$cli" launch \
  --servers 1 --workers 1 -- sh -c "$show" 2>&1)
line=$(grep -o 'RUNDIR=.*' <<<"$out" | head -1)
echo "$line"
dir=${line#RUNDIR=}
dir=${dir%% *}
case "$dir" in
  /dev/shm/chainps-run-*) ;;
  *) echo "FAIL: the runtime directory is $dir, not under /dev/shm"; echo "$out" | tail -20; exit 1 ;;
esac
grep -q 'FS=tmpfs MODE=700' <<<"$line" || { echo "FAIL: not a 0700 directory on tmpfs: $line"; exit 1; }
[ ! -e "$dir" ] || { echo "FAIL: $dir is left after the job"; exit 1; }
# A directory named by the caller is kept as it is, even on a disk.
mkdir -m 700 "$disk/mine"
out=$(env CHAINPS_RUNTIME_DIR="$disk/mine" timeout 60 "$cli" launch --servers 1 --workers 1 -- \
  sh -c "$show" 2>&1)
grep -q "RUNDIR=$disk/mine " <<<"$out" || { echo "FAIL: CHAINPS_RUNTIME_DIR not kept"; echo "$out" | tail -20; exit 1; }
echo "ok: launch's runtime directory is in memory (/dev/shm), 0700, removed after; a given one is kept"
