#!/usr/bin/env bash
# Lossy gradient compression (issue 16): what each codec saves on the wire and costs in time.
#
#   bench/run_compress.sh [BUILD_DIR]     (default: build-bench beside this folder's parent)
#
# For each codec (none, fp16, bf16, topk:0.01, topk:0.1), one `chainps launch --servers 1
# --workers 1 --mode async --compress CODEC` runs bench_ps on dense gradients (normal, scale
# 1e-3: incompressible to snappy, which stays on) of 1 MB and 16 MB:
#   - push bytes: the push payload as sent, per step (bench_ps's wire ratio: raw / sent);
#   - B/step: every byte the job moved over 127.0.0.1 for one push+pull (the loopback
#     interface's counter, TCP/IP headers and the pull's float32 values included);
#   - pp MB/s: cps_push_pull_async throughput (tensor bytes of both directions), median of REPS
#     runs of OPS operations, and its ratio to none;
# then bench_gradcodec: encode (with error feedback) and decode GB/s of each codec, median of
# REPS runs, in one process. Environment knobs: REPS (5), OPS (40), SIZES (1048576,16777216),
# CODECS, KEEP=1 keeps the raw results. On a machine shared with other work the figures move
# from run to run; the load average is printed before and after.
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_prepare run_compress "${1:-}" chainps bench/bench_ps bench/bench_gradcodec
bench_report "" "$@"
CHAINPS=$build/chainps
BENCH_PS=$build/bench/bench_ps
BENCH_GC=$build/bench/bench_gradcodec
REPS=${REPS:-5}
OPS=${OPS:-40}
SIZES=${SIZES:-1048576,16777216}
CODECS=${CODECS:-none fp16 bf16 topk:0.01 topk:0.1}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps lossy compression benchmark on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')," \
    "load average $load0"
for codec in $CODECS; do
    flag=()
    [ "$codec" != none ] && flag=(--compress "$codec")
    rm -f "$res.run"
    if ! "$CHAINPS" launch --servers 1 --workers 1 --mode async --timeout 600 "${flag[@]}" -- \
        "$BENCH_PS" --out "$res.run" --reps "$REPS" --ops "$OPS" --sizes "$SIZES" --data dense \
        --only pp,push --lo-bytes >"$log.run" 2>&1; then
        echo "run_compress: codec $codec failed:" >&2
        tail -20 "$log.run" >&2
    fi
    [ -f "$res.run" ] && sed "s/^ps /ps codec=$codec /" "$res.run" >>"$res"
    cat "$log.run" >>"$log"
    rm -f "$log.run" "$res.run"
done
"$BENCH_GC" --reps "$REPS" --sizes "$SIZES" --out "$res" >>"$log" 2>&1 ||
    echo "run_compress: bench_gradcodec failed" >&2

awk -v reps="$REPS" -v ops="$OPS" -v load0="$load0" -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" '
function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) {
        p = index($i, "=")
        f[substr($i, 1, p - 1)] = substr($i, p + 1)
    }
}
function human(n) { return n >= 1048576 ? sprintf("%d MB", n / 1048576) : sprintf("%d KB", n / 1024) }
$1 == "ps" {
    kv(); k = f["codec"] SUBSEP f["size"]
    if (!(f["codec"] in seen)) { seen[f["codec"]] = 1; order[++nc] = f["codec"] }
    sizes[f["size"]] = 1
    pp[k] = f["pp_mbps"]; wr[k] = f["wire_ratio"]; lo[k] = f["pp_lo_bytes"]
}
$1 == "codec" { kv(); enc[f["name"] SUBSEP f["size"]] = f["enc_gbps"]; dec[f["name"] SUBSEP f["size"]] = f["dec_gbps"] }
END {
    ns = 0
    for (s in sizes) sl[++ns] = s + 0
    for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (sl[j] < sl[i]) { t = sl[i]; sl[i] = sl[j]; sl[j] = t }
    printf "\nLossy gradient compression, 1 server, 1 worker (async), dense float32 gradients, snappy on;\n"
    printf "median of %d runs (%d push+pulls each); codec speed: median of %d runs in one process\n\n", reps, ops, reps
    hdr = sprintf("%-10s %-6s | %12s %8s | %12s %6s | %8s %5s | %8s %8s", "codec", "size",
                  "push bytes", "x none", "B/step lo", "x none", "pp MB/s", "x none", "enc GB/s", "dec GB/s")
    print hdr; gsub(/./, "-", hdr); print hdr
    for (b = 1; b <= ns; b++) for (a = 1; a <= nc; a++) {
        c = order[a]; s = sl[b]; k = c SUBSEP s; k0 = "none" SUBSEP s
        if (!(k in pp)) continue
        push = wr[k] > 0 ? s / wr[k] : 0
        push0 = ((k0 in wr) && wr[k0] > 0) ? s / wr[k0] : 0
        e = (k in enc) ? sprintf("%8.2f", enc[k]) : sprintf("%8s", "-")
        d = (k in dec) ? sprintf("%8.2f", dec[k]) : sprintf("%8s", "-")
        # (a ">" in printf arguments would be a redirection: the ratios are worked out first)
        rpush = push0 > 0 ? sprintf("%.3f", push / push0) : "-"
        rlo = ((k0 in lo) && lo[k0] > 0) ? sprintf("%.3f", lo[k] / lo[k0]) : "-"
        rpp = ((k0 in pp) && pp[k0] > 0) ? sprintf("%.2f", pp[k] / pp[k0]) : "-"
        printf "%-10s %-6s | %12.0f %8s | %12.0f %6s | %8.0f %5s | %s %s\n", c, human(s), push,
               rpush, lo[k], rlo, pp[k], rpp, e, d
    }
    printf "\n(push bytes: payload as sent per step; B/step lo: all loopback bytes per push+pull,\n"
    printf " the pull of float32 values included; load average %s before, %s after)\n", load0, load1
}' "$res"
