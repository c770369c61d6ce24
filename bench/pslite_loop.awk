# The results of bench_ps --loop pslite runs, for the tables of bench/run_pslite.sh and
# bench/run_ab.sh (awk -f bench/pslite_loop.awk -f THEIR_END_RULE): lines "pslite_loop key=value
# ... round=R side=S", as the drivers tag them, gathered per cell ("1w1s 4 KB") into cells[] (in
# order of appearance), runs[cell, side, round] and sum[cell, side, round, metric] (pp_gbps summed
# over the workers, latencies *_us the slower worker's, cpu[] and bytes[] per run when the lines
# carry cpu_s); stat() then gives "median (min-max)" of
# what the END rule put into val[key, 1..cnt[key]].

# Insertion sort of a[1..n], ascending (a handful of rounds).
function sortn(a, n,    i, j, t) {
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
}
# "median (min-max)" of val[key, 1..cnt[key]] printed with fmt, the median alone for one value,
# or "-" for none.
function stat(key, fmt,    a, i, m, med) {
    m = cnt[key] + 0
    if (m == 0) return "-"
    for (i = 1; i <= m; i++) a[i] = val[key, i]
    sortn(a, m)
    med = m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    if (m == 1) return sprintf(fmt, med)
    return sprintf(fmt " (" fmt "-" fmt ")", med, a[1], a[m])
}

function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) {
        p = index($i, "=")
        f[substr($i, 1, p - 1)] = substr($i, p + 1)
    }
}
function human(n) {
    return n >= 1048576 ? sprintf("%d MB", n / 1048576) : sprintf("%d KB", n / 1024)
}
$1 == "pslite_loop" {
    kv()
    c = f["workers"] "w" f["servers"] "s " human(f["size"] + 0)
    if (!(c in seen)) { seen[c] = 1; cells[++ncells] = c }
    k = c SUBSEP f["side"] SUBSEP f["round"]
    runs[k] = 1
    sum[k, "pp_gbps"] += f["pp_gbps"]
    for (x in f)
        if (x ~ /_us$/ && f[x] + 0 > sum[k, x] + 0) sum[k, x] = f[x] + 0
    # cpu_s (run_ab.sh CPU=1): the CPU time of the whole job that ran this one size, on every
    # worker's line; bytes counts what all its workers pushed and pulled.
    if ("cpu_s" in f) {
        cpu[k] = f["cpu_s"]
        bytes[k] += 2 * f["iters"] * f["size"]
    }
}
