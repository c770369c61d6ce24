/* Raw nanomsg and raw TCP baselines for bench_ps: what the transport alone costs on this machine.
 *
 * Two processes, as a chainps worker and server are: a forked child echoes, wired the way chainps
 * wires nodes: each side binds one NN_PULL inbox on 127.0.0.1 and sends on an NN_PUSH socket
 * connected to the other's inbox, with 4 MiB NN_SNDBUF/NN_RCVBUF, NN_TCP_NODELAY and zero-copy
 * NN_MSG buffers. For each message size it measures:
 *   rtt   request of `size` bytes, 64-byte reply (a push and its ack): p50/p99 in microseconds
 *   push  the same, pipelined (window of `depth` requests): MB/s of request bytes
 *   echo  request and reply both `size` bytes, pipelined: MB/s counting both directions
 *   tcp   the rtt over a plain blocking TCP socket (TCP_NODELAY) to another forked child: the
 *         floor below nanomsg, whose I/O thread adds a thread hand-off at each end
 * The echo child replies by sending the received buffer itself (no copy), so these numbers are
 * the floor for any protocol on top of nanomsg. Both children are ended by their PID.
 *
 * usage: bench_nn [--out FILE] [--reps N] [--ms MS] [--sizes a,b,...] [--rtt-only] [--tag T]
 *        (results: key=value lines appended to FILE, a table on stdout; --rtt-only measures
 *        only the round trips, in about a second, so a caller can repeat it beside each of its
 *        own runs; --tag T is written into each result line as tag=T)
 *        bench_nn --free-port   (print a TCP port nobody listens on on 127.0.0.1, and exit)
 */
#include <arpa/inet.h>
#include <malloc.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <nanomsg/tcp.h>

#include "core/port.h"
#include "bench.h"
#include "flags.h"

#define SOCKBUF   (4 << 20)
#define ACK_BYTES 64
#define MAX_DEPTH 64

enum { OP_ACK = 1, OP_ECHO = 2, OP_QUIT = 3 };

static void die(const char *what)
{
    fprintf(stderr, "bench_nn: %s: %s\n", what, nn_strerror(nn_errno()));
    exit(1);
}

static int make_sock(int proto)
{
    int s = nn_socket(AF_SP, proto);
    if (s < 0)
        die("nn_socket");
    int v = -1, buf = SOCKBUF, one = 1;
    if (nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &v, sizeof v) < 0 ||
        nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDBUF, &buf, sizeof buf) < 0 ||
        nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVBUF, &buf, sizeof buf) < 0 ||
        nn_setsockopt(s, NN_TCP, NN_TCP_NODELAY, &one, sizeof one) < 0)
        die("nn_setsockopt");
    return s;
}

typedef struct echo_arg {
    int in, out;
} echo_arg;

static void echo_main(echo_arg *a)
{
    for (;;) {
        void *m = NULL;
        int n = nn_recv(a->in, &m, NN_MSG, 0);
        if (n < 0)
            die("echo nn_recv");
        unsigned char op = ((unsigned char *)m)[0];
        if (op == OP_QUIT) {
            nn_freemsg(m);
            return;
        }
        if (op == OP_ACK) {
            nn_freemsg(m);
            m = nn_allocmsg(ACK_BYTES, 0);
            if (!m)
                die("nn_allocmsg");
            memset(m, 0, ACK_BYTES);
        }
        if (nn_send(a->out, &m, NN_MSG, 0) < 0)
            die("echo nn_send");
    }
}

typedef struct client {
    int out, in;
    const unsigned char *data;
} client;

static void send_req(client *c, size_t size, unsigned char op)
{
    void *m = nn_allocmsg(size, 0);
    if (!m)
        die("nn_allocmsg");
    /* Fill the message as a sender would: one copy of the payload. */
    memcpy(m, c->data, size);
    ((unsigned char *)m)[0] = op;
    if (nn_send(c->out, &m, NN_MSG, 0) < 0)
        die("nn_send");
}

static size_t recv_rep(client *c)
{
    void *m = NULL;
    int n = nn_recv(c->in, &m, NN_MSG, 0);
    if (n < 0)
        die("nn_recv");
    nn_freemsg(m);
    return (size_t)n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Round trips: returns the number of samples written to lat_us. */
static int run_rtt(client *c, size_t size, int n, double *lat_us)
{
    for (int i = 0; i < n; i++) {
        double t0 = tc_now_s();
        send_req(c, size, OP_ACK);
        recv_rep(c);
        lat_us[i] = (tc_now_s() - t0) * 1e6;
    }
    return n;
}

/* Pipelined: `depth` requests in flight; returns MB/s of the bytes counted. */
static double run_pipe(client *c, size_t size, int n, int depth, unsigned char op)
{
    double t0 = tc_now_s();
    int sent = 0, done = 0;
    double bytes = 0;
    while (done < n) {
        while (sent < n && sent - done < depth) {
            send_req(c, size, op);
            sent++;
        }
        size_t got = recv_rep(c);
        bytes += (double)size + (op == OP_ECHO ? (double)got : 0.0);
        done++;
    }
    return bytes / (tc_now_s() - t0) / 1e6;
}

/* ---- raw TCP: [u32 length][payload] requests, 64-byte replies; length 0 ends the child ---- */

static int read_full(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0 || errno != EINTR)
            return -1;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    for (size_t put = 0; put < n;) {
        ssize_t r = write(fd, (const char *)buf + put, n - put);
        if (r > 0)
            put += (size_t)r;
        else if (r == 0 || errno != EINTR)
            return -1;
    }
    return 0;
}

static void tcp_echo_main(int lfd, size_t maxsz)
{
    int fd = accept(lfd, NULL, NULL);
    int one = 1;
    char *buf = malloc(maxsz);
    if (fd < 0 || !buf || setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        _exit(1);
    char ack[ACK_BYTES] = {0};
    for (;;) {
        uint32_t len;
        if (read_full(fd, &len, sizeof len) < 0 || len == 0 || len > maxsz)
            _exit(0);
        if (read_full(fd, buf, len) < 0 || write_full(fd, ack, sizeof ack) < 0)
            _exit(1);
    }
}

static int tcp_rtt(int fd, const unsigned char *data, size_t size, int n, double *lat_us)
{
    char ack[ACK_BYTES];
    uint32_t len = (uint32_t)size;
    for (int i = 0; i < n; i++) {
        double t0 = tc_now_s();
        if (write_full(fd, &len, sizeof len) < 0 || write_full(fd, data, size) < 0 ||
            read_full(fd, ack, sizeof ack) < 0)
            return -1;
        lat_us[i] = (tc_now_s() - t0) * 1e6;
    }
    return n;
}

/* A child that dies with us (PR_SET_PDEATHSIG) and after `secs` at the latest, so an aborted run
 * leaves nothing behind. */
static pid_t fork_child(unsigned secs)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(secs);
    }
    return pid;
}

static void end_child(pid_t pid)
{
    if (pid <= 0)
        return;
    int st;
    for (int i = 0; i < 200; i++) { /* 2 s to leave on its own, then SIGKILL */
        if (waitpid(pid, &st, WNOHANG) == pid)
            return;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

/* Number of operations for about `ms` milliseconds, from a short timed warm-up. */
static int calibrate(client *c, size_t size, int depth, unsigned char op, double ms, int lo, int hi)
{
    int w = 8;
    double t0 = tc_now_s();
    if (depth <= 1) {
        double tmp[8];
        run_rtt(c, size, w, tmp);
    } else {
        run_pipe(c, size, w, depth, op);
    }
    double per = (tc_now_s() - t0) / w;
    int n = (int)(ms * 1e-3 / (per > 1e-9 ? per : 1e-9));
    return n < lo ? lo : n > hi ? hi : n;
}

int main(int argc, char **argv)
{
    const char *out_path = NULL, *sizes_arg = "4096,65536,1048576,16777216", *tag = NULL;
    int reps = 5, rtt_only = 0;
    double ms = 60;
    int want_port = 0;
    const tc_flag flags[] = {{"--free-port", TC_SWITCH, &want_port},
                             {"--out", TC_STR, &out_path},
                             {"--reps", TC_INT, &reps},
                             {"--ms", TC_DOUBLE, &ms},
                             {"--sizes", TC_STR, &sizes_arg},
                             {"--tag", TC_STR, &tag},
                             {"--rtt-only", TC_SWITCH, &rtt_only},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0) {
        fprintf(stderr, "usage: bench_nn [--out FILE] [--reps N] [--ms MS] [--sizes a,b]"
                        " [--rtt-only] [--tag T] | --free-port\n");
        return 2;
    }
    if (want_port) { /* for bench/run_bench.sh: the same picker as the tests' */
        int p = cps__free_port();
        if (p <= 0)
            return 1;
        printf("%d\n", p);
        return 0;
    }
    if (reps < 1 || reps > 50 || ms <= 0) {
        fprintf(stderr, "bench_nn: bad --reps or --ms\n");
        return 2;
    }
    size_t sizes[16];
    int nsizes = 0;
    for (const char *p = sizes_arg; *p && nsizes < 16;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v < ACK_BYTES || v > (1ull << 28)) {
            fprintf(stderr, "bench_nn: bad --sizes\n");
            return 2;
        }
        sizes[nsizes++] = (size_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    size_t maxsz = 0;
    for (int i = 0; i < nsizes; i++)
        maxsz = sizes[i] > maxsz ? sizes[i] : maxsz;
    /* As chainps's processes do (src/node/roles.c): keep large message buffers in the heap
     * instead of an mmap and munmap for each one, so the floor is measured the same way. */
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    mallopt(M_MMAP_THRESHOLD, 128 << 20);

    /* The TCP echo child: listening before the fork, so the connect below cannot race it. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in la = {.sin_family = AF_INET, .sin_port = 0};
    la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t lalen = sizeof la;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&la, sizeof la) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&la, &lalen) < 0) {
        perror("bench_nn: tcp listen");
        return 1;
    }
    int sp = cps__free_port(), cp = cps__free_port();
    if (sp <= 0 || cp <= 0 || sp == cp) {
        fprintf(stderr, "bench_nn: no free ports on 127.0.0.1\n");
        return 1;
    }
    char surl[64], curl[64];
    snprintf(surl, sizeof surl, "tcp://127.0.0.1:%d", sp);
    snprintf(curl, sizeof curl, "tcp://127.0.0.1:%d", cp);

    /* Children fork before this process opens any nanomsg socket: nanomsg's threads do not
     * survive a fork. */
    pid_t tcp_child = fork_child(900);
    if (tcp_child == 0)
        tcp_echo_main(lfd, maxsz);
    close(lfd);
    pid_t nn_child = fork_child(900);
    if (nn_child == 0) {
        echo_arg ea = {make_sock(NN_PULL), make_sock(NN_PUSH)};
        if (nn_bind(ea.in, surl) < 0 || nn_connect(ea.out, curl) < 0)
            die("echo bind/connect");
        echo_main(&ea);
        nn_close(ea.in);
        nn_close(ea.out);
        _exit(0);
    }
    if (tcp_child < 0 || nn_child < 0) {
        perror("bench_nn: fork");
        end_child(tcp_child);
        end_child(nn_child);
        return 1;
    }
    int tfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (tfd < 0 || connect(tfd, (struct sockaddr *)&la, sizeof la) < 0 ||
        setsockopt(tfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) {
        perror("bench_nn: tcp connect");
        return 1;
    }
    client c = {make_sock(NN_PUSH), make_sock(NN_PULL), NULL};
    if (nn_bind(c.in, curl) < 0)
        die("nn_bind");
    if (nn_connect(c.out, surl) < 0)
        die("nn_connect");
    int to = 10000; /* never hang: a lost message fails the run after 10 s */
    if (nn_setsockopt(c.in, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to) < 0)
        die("nn_setsockopt");

    unsigned char *data = malloc(maxsz);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < maxsz; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        data[i] = (unsigned char)x;
    }
    c.data = data;

    FILE *out = out_path ? fopen(out_path, "a") : NULL;
    if (out_path && !out) {
        perror(out_path);
        return 1;
    }
    printf("%10s %10s %10s %12s %12s %10s %10s\n", "size", "rtt p50us", "rtt p99us", "push MB/s",
           "echo MB/s", "tcp p50us", "tcp p99us");
    for (int s = 0; s < nsizes; s++) {
        size_t size = sizes[s];
        int depth = (int)((32u << 20) / size);
        depth = depth < 2 ? 2 : depth > 16 ? 16 : depth;
        int n_rtt = calibrate(&c, size, 1, OP_ACK, ms, 20, 20000);
        int n_push = rtt_only ? 0 : calibrate(&c, size, depth, OP_ACK, ms, 8, 100000);
        int n_echo = rtt_only ? 0 : calibrate(&c, size, depth, OP_ECHO, ms, 8, 100000);
        double *lat = malloc(sizeof *lat * (size_t)n_rtt);
        double p50[50], p99[50], push[50], echo[50], t50[50], t99[50];
        for (int r = 0; r < reps; r++) {
            run_rtt(&c, size, n_rtt, lat);
            p50[r] = pct(lat, n_rtt, 0.50);
            p99[r] = pct(lat, n_rtt, 0.99);
            if (tcp_rtt(tfd, data, size, n_rtt, lat) < 0) {
                perror("bench_nn: tcp round trip");
                return 1;
            }
            t50[r] = pct(lat, n_rtt, 0.50);
            t99[r] = pct(lat, n_rtt, 0.99);
            push[r] = rtt_only ? 0 : run_pipe(&c, size, n_push, depth, OP_ACK);
            echo[r] = rtt_only ? 0 : run_pipe(&c, size, n_echo, depth, OP_ECHO);
        }
        free(lat);
        double m50 = median(p50, reps), m99 = median(p99, reps);
        double mp = median(push, reps), me = median(echo, reps);
        double tm50 = median(t50, reps), tm99 = median(t99, reps);
        printf("%10zu %10.1f %10.1f %12.0f %12.0f %10.1f %10.1f\n", size, m50, m99, mp, me, tm50,
               tm99);
        if (out)
            fprintf(out,
                    "%s size=%zu rtt_p50=%.2f rtt_p99=%.2f push_mbps=%.1f echo_mbps=%.1f "
                    "depth=%d tcp_p50=%.2f tcp_p99=%.2f tag=%s\n",
                    rtt_only ? "nnrtt" : "nn", size, m50, m99, mp, me, depth, tm50, tm99,
                    tag ? tag : "-");
    }
    if (out)
        fclose(out);
    send_req(&c, ACK_BYTES, OP_QUIT);
    uint32_t zero = 0;
    if (write_full(tfd, &zero, sizeof zero) < 0)
        perror("bench_nn: tcp quit");
    close(tfd);
    end_child(nn_child);
    end_child(tcp_child);
    nn_close(c.out);
    nn_close(c.in);
    free(data);
    return 0;
}
