# Input: `perf script -F tid,ip,sym` of one process (DWARF call graphs). Output: its samples
# grouped by (nearest data-path function on the stack | kind of cost at the leaf), with % of
# the process's samples and CPU milliseconds (hz = the perf -F rate). Used by profile.sh.
function flush(   i, fn, kind, s) {
    if (!n)
        return
    fn = ""
    kind = ""
    for (i = 1; i <= n; i++) {
        s = fr[i]
        if (kind == "") {
            if (s ~ /^__(memmove|memcpy)/) kind = "memcpy"
            else if (s ~ /clear_page|exc_page_fault|do_anonymous_page/) kind = "page fault"
            else if (s ~ /__brk|munmap|__mmap/) kind = "brk/munmap (heap trim)"
            else if (s ~ /__libc_sendmsg/) kind = "sendmsg (kernel TCP)"
            else if (s ~ /__libc_recvmsg/) kind = "recvmsg (kernel TCP)"
            else if (s ~ /__GI___writev|pwrite/) kind = "writev to LMDB file"
            else if (s ~ /^(__poll|poll|__GI___poll|epoll_wait)$/) kind = "poll"
            else if (s ~ /^(__read|__write|__GI___libc_write|__GI___libc_read|eventfd)/) kind = "eventfd read/write"
            else if (s ~ /snappy/) kind = "snappy"
            else if (s ~ /^(_int_free|malloc|_int_malloc|sysmalloc|cfree|__libc_free)/) kind = "malloc/free"
            else if (s ~ /pthread_mutex|futex/) kind = "locks"
        }
        if (fn == "" && s ~ FNS)
            fn = s
    }
    if (fn == "")
        fn = "(other)"
    if (kind == "")
        kind = "compute"
    c[fn " | " kind]++
    total++
    n = 0
}
BEGIN {
    FNS = "^(req_send|on_reply|cps__store_param_apply|cps__optim_apply|mdb_txn_commit|" \
          "mdb_txn_begin|mdb_put|mdb_get|read_values|cps__rx_free|cps__rx_parse|cps__msg_alloc|" \
          "cps__codec_compress|cps__codec_decompress|wait_once|slot_try_complete|push_sync|" \
          "push_async|cps__store_write|cps__store_read|nn_usock_send|nn_usock_recv|" \
          "cps__tp_send|drain_inbox|nn_recv|nn_send|cps__tp_poll|progress|op_start|" \
          "cps__server_run|start_thread)$"
}
/^ *[0-9]+ *$/ { flush(); next }
/^[ \t]*$/ { flush(); next }
{ fr[++n] = $2 }
END {
    flush()
    for (k in c)
        printf "%6.1f%% %8.1f ms  %s\n", 100 * c[k] / total, c[k] * 1000 / hz, k | "sort -rn"
    close("sort -rn")
    printf "(%d samples = %.2f CPU s)\n", total, total / hz
}
