# median(a, n): the median of a[1..n] (sorts a in place; the mean of the middle two when n is
# even). Shared by bench drivers: awk -f bench/lib_median.awk -f PROGRAM.
function median(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
