/* Same-host ipc:// channels (transport/local.h): which directory is accepted, which peers go over
 * ipc, and that only the ipc inbox takes messages without a MAC. Transports on 127.0.0.1 in one
 * thread; every wait has a deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/auth.h"
#include "transport/local.h"
#include "transport/transport.h"
#include "transport_test.h"

static const unsigned char KEY[32] = "chainps ipc unit test key ......";
static const unsigned char OTHER[32] = "another job's key ..............";

#define HOST    "127.0.0.1"
#define WAIT_MS 5000

typedef struct got {
    size_t n;
    size_t len;
    unsigned char first;
} got;

static void count_fn(void *ctx, void *buf, size_t len)
{
    got *g = ctx;
    g->n++;
    g->len = len;
    g->first = len ? *(unsigned char *)buf : 0;
    cps__tp_free(buf);
}

static int wait_for(cps__tp *snd, cps__tp *rcv, got *g, size_t want, int wait_ms)
{
    int64_t deadline = now_ms() + wait_ms;
    while (g->n < want && now_ms() < deadline) {
        if (snd)
            assert_true(cps__tp_poll(snd, 0, NULL, NULL, 0) >= 0);
        assert_true(cps__tp_poll(rcv, 10, count_fn, g, 0) >= 0);
    }
    return g->n >= want;
}

typedef struct fixture {
    char dir[64];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/cps-ipc-test-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}

static cps__tp *bound_in(const unsigned char *key, const char *dir, uint16_t *port)
{
    cps__tp *tp = NULL;
    assert_int_equal(cps__tp_create(key, &tp), 0);
    assert_int_equal(cps__tp_set_runtime_dir(tp, dir), 0);
    assert_int_equal(cps__tp_bind(tp, HOST, 0, port), 0);
    return tp;
}

static void url_of(char *buf, size_t cap, uint16_t port)
{
    snprintf(buf, cap, "tcp://" HOST ":%u", (unsigned)port);
}

static void *msg(size_t len, unsigned char first)
{
    unsigned char *b = cps__tp_alloc(len);
    assert_non_null(b);
    memset(b, 0x5a, len);
    b[0] = first;
    return b;
}

static void dir_check_refuses_wider(void **state)
{
    fixture *f = *state;
    char err[512];
    assert_int_equal(cps__tp_local_dir_check(f->dir, err, sizeof err), 0);
    assert_int_equal(chmod(f->dir, 0750), 0);
    assert_int_equal(cps__tp_local_dir_check(f->dir, err, sizeof err), CPS_ECONFIG);
    assert_non_null(strstr(err, "0750"));
    assert_int_equal(chmod(f->dir, 0701), 0);
    assert_int_equal(cps__tp_local_dir_check(f->dir, err, sizeof err), CPS_ECONFIG);
    assert_int_equal(chmod(f->dir, 0700), 0);
    /* A link to a private directory is refused: whoever owns the link's directory could
     * re-point it. */
    char link[96];
    snprintf(link, sizeof link, "%s.link", f->dir);
    assert_int_equal(symlink(f->dir, link), 0);
    assert_int_equal(cps__tp_local_dir_check(link, err, sizeof err), CPS_ECONFIG);
    unlink(link);
    if (geteuid() == 0) {
        assert_int_equal(chown(f->dir, 65534, 65534), 0);
        assert_int_equal(cps__tp_local_dir_check(f->dir, err, sizeof err), CPS_ECONFIG);
        assert_non_null(strstr(err, "owned by uid 65534"));
        assert_int_equal(chown(f->dir, 0, 0), 0);
    }
    assert_int_equal(cps__tp_local_dir_check("/nonexistent/cps", err, sizeof err), CPS_ECONFIG);
}

static void bind_refuses_open_dir(void **state)
{
    fixture *f = *state;
    assert_int_equal(chmod(f->dir, 0755), 0);
    cps__tp *tp = NULL;
    assert_int_equal(cps__tp_create(KEY, &tp), 0);
    assert_int_equal(cps__tp_set_runtime_dir(tp, f->dir), 0);
    assert_int_equal(cps__tp_bind(tp, HOST, 0, NULL), CPS_ECONFIG);
    assert_int_equal(cps__tp_inbox_fd(tp), -1);
    cps__tp_destroy(tp);
    assert_int_equal(chmod(f->dir, 0700), 0);
}

/* Peers sharing the directory talk over ipc, both ways; a peer without it over tcp. */
static void same_dir_goes_ipc(void **state)
{
    fixture *f = *state;
    uint16_t pa, pb, pc;
    cps__tp *a = bound_in(KEY, f->dir, &pa);
    cps__tp *b = bound_in(KEY, f->dir, &pb);
    cps__tp *c = bound_in(KEY, NULL, &pc);
    assert_true(cps__tp_inbox_local_fd(a) >= 0);
    assert_int_equal(cps__tp_inbox_local_fd(c), -1);
    char ua[64], ub[64];
    url_of(ua, sizeof ua, pa);
    url_of(ub, sizeof ub, pb);
    assert_int_equal(cps__tp_peer_set(b, 1, ua), 0);
    assert_int_equal(cps__tp_peer_set(a, 2, ub), 0);
    assert_int_equal(cps__tp_peer_set(c, 1, ua), 0);
    assert_int_equal(cps__tp_peer_local(b, 1), 1);
    assert_int_equal(cps__tp_peer_local(a, 2), 1);
    assert_int_equal(cps__tp_peer_local(c, 1), 0);

    got g = {0};
    const size_t big = 3u << 20;
    assert_int_equal(cps__tp_send(b, 1, msg(big, 7), big), 0);
    assert_int_equal(cps__tp_send(c, 1, msg(100, 8), 100), 0);
    assert_true(wait_for(b, a, &g, 1, WAIT_MS));
    int64_t deadline = now_ms() + WAIT_MS;
    while (g.n < 2 && now_ms() < deadline) {
        assert_true(cps__tp_poll(c, 0, NULL, NULL, 0) >= 0);
        assert_true(cps__tp_poll(a, 10, count_fn, &g, 0) >= 0);
    }
    assert_int_equal(g.n, 2);
    assert_int_equal(cps__tp_auth_dropped(a), 0);

    got back = {0};
    assert_int_equal(cps__tp_send(a, 2, msg(64, 9), 64), 0);
    assert_true(wait_for(a, b, &back, 1, WAIT_MS));
    assert_int_equal(back.len, 64);
    assert_int_equal(back.first, 9);
    cps__tp_destroy(c);
    cps__tp_destroy(b);
    cps__tp_destroy(a);
}

/* The ipc inbox takes what the directory lets in, MAC or not (a process of the same user under
 * another key gets through: the directory is the boundary); the tcp inbox of the same transport
 * still refuses a message without a valid MAC, so a remote sender gains nothing. */
static void only_ipc_skips_mac(void **state)
{
    fixture *f = *state;
    uint16_t pa, pb, pc;
    cps__tp *a = bound_in(KEY, f->dir, &pa);
    cps__tp *b = bound_in(OTHER, f->dir, &pb);
    cps__tp *c = bound_in(OTHER, NULL, &pc);
    char ua[64];
    url_of(ua, sizeof ua, pa);
    assert_int_equal(cps__tp_peer_set(b, 1, ua), 0);
    assert_int_equal(cps__tp_peer_set(c, 1, ua), 0);
    assert_int_equal(cps__tp_peer_local(b, 1), 1);
    assert_int_equal(cps__tp_peer_local(c, 1), 0);
    got g = {0};
    assert_int_equal(cps__tp_send(b, 1, msg(200, 1), 200), 0);
    assert_true(wait_for(b, a, &g, 1, WAIT_MS));
    assert_int_equal(cps__tp_send(c, 1, msg(200, 2), 200), 0);
    /* A zeroed trailer, as the ipc channel sends, straight into the tcp inbox. */
    int raw = nn_socket(AF_SP, NN_PUSH);
    assert_true(raw >= 0);
    assert_true(nn_connect(raw, ua) >= 0);
    size_t n = 100 + CPS_AUTH_TRAILER;
    unsigned char *m = calloc(1, n);
    memset(m, 0x11, 100);
    assert_true(nn_send(raw, m, n, 0) == (int)n);
    free(m);
    int64_t deadline = now_ms() + WAIT_MS;
    while (cps__tp_auth_dropped(a) < 2 && now_ms() < deadline) {
        assert_true(cps__tp_poll(c, 0, NULL, NULL, 0) >= 0);
        assert_true(cps__tp_poll(a, 10, count_fn, &g, 0) >= 0);
    }
    assert_int_equal(cps__tp_auth_dropped(a), 2);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.first, 1);
    nn_close(raw);
    cps__tp_destroy(c);
    cps__tp_destroy(b);
    cps__tp_destroy(a);
}

/* The socket file goes with the transport, and a stale one (a crashed process's) is replaced. */
static void socket_file_life(void **state)
{
    fixture *f = *state;
    uint16_t pa;
    cps__tp *a = bound_in(KEY, f->dir, &pa);
    char ua[64], host[128], path[256];
    url_of(ua, sizeof ua, pa);
    assert_int_equal(cps__tp_local_host_id(host, sizeof host), 0);
    assert_int_equal(cps__tp_local_path(f->dir, host, ua, path, sizeof path), 0);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    cps__tp_destroy(a);
    assert_int_not_equal(lstat(path, &st), 0);
    /* Another host identity (namespace) names another file: no match across namespaces. */
    char other[256];
    assert_int_equal(cps__tp_local_path(f->dir, "other-boot/1:2", ua, other, sizeof other), 0);
    assert_string_not_equal(path, other);
    /* A path too long for a Unix socket is refused, not cut. */
    char longdir[200];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[sizeof longdir - 1] = 0;
    assert_int_equal(cps__tp_local_path(longdir, host, ua, path, 108), CPS_EINVAL);
}

/* A directory whose path leaves no room for a socket name costs the speed, not the job: the
 * inbox binds over tcp:// only. */
static void long_dir_stays_tcp(void **state)
{
    fixture *f = *state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%0100d", f->dir, 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    uint16_t port;
    cps__tp *tp = bound_in(KEY, dir, &port);
    assert_true(cps__tp_inbox_fd(tp) >= 0);
    assert_int_equal(cps__tp_inbox_local_fd(tp), -1);
    cps__tp_destroy(tp);
}

int main(void)
{
    cps__log_set_sink(quiet_sink, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(dir_check_refuses_wider, setup, teardown),
        cmocka_unit_test_setup_teardown(bind_refuses_open_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(same_dir_goes_ipc, setup, teardown),
        cmocka_unit_test_setup_teardown(only_ipc_skips_mac, setup, teardown),
        cmocka_unit_test_setup_teardown(socket_file_life, setup, teardown),
        cmocka_unit_test_setup_teardown(long_dir_stays_tcp, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
