/* The coordinator's test fixture (fixture.h). */
#include "fixture.h"

cps__config cfg;
int hold;              /* the next make() holds the workers back until a RELEASE (--restore-from) */
uint32_t replicas = 3; /* the chains' length of the next make() */
int allow_rollback;    /* the next make() runs with --allow-rollback */
int await_replacements; /* the next make() runs with --await-replacements */

cps__coord *make(uint32_t servers, uint32_t workers)
{
    cps__config_defaults(&cfg);
    cfg.num_servers = servers;
    cfg.num_workers = workers;
    cfg.replicas = replicas;
    cfg.num_ranges = 4;
    cfg.mode = CPS_MODE_SYNC;
    cfg.dead_after_ms = DEAD_MS;
    cfg.worker_dead_after_ms = 2 * DEAD_MS;
    cfg.join_timeout_ms = 10000;
    cfg.hold_workers = hold;
    cfg.allow_rollback = allow_rollback;
    cfg.await_replacements = await_replacements;
    cps__coord_config cc = {&cfg, 500, 100, 5000, 200, 0x40000000u, 0, 0};
    cps__coord *c = NULL;
    assert_int_equal(cps__coord_create(&cc, &c), 0);
    return c;
}

size_t count(cps__coord *c, int kind, uint8_t type)
{
    const cps__coord_out *o = cps__coord_ready(c);
    size_t n = 0;
    for (size_t i = 0; i < o->n; i++)
        n += o->a[i].kind == kind && (!type || o->a[i].hdr.type == type);
    return n;
}

const cps__coord_action *find(cps__coord *c, int kind, uint8_t type, uint32_t peer)
{
    const cps__coord_out *o = cps__coord_ready(c);
    for (size_t i = 0; i < o->n; i++)
        if (o->a[i].kind == kind && (!type || o->a[i].hdr.type == type) &&
            (peer == UINT32_MAX || o->a[i].peer == peer))
            return &o->a[i];
    return NULL;
}

const cps__coord_action *ask(cps__coord *c, const cps__msg_hdr *q, uint8_t reply, uint32_t tool,
                             uint64_t now)
{
    assert_int_equal(cps__coord_step(c, q, NULL, 0, tool, now), 0);
    const cps__coord_action *a = find(c, CPS_CO_REPLY, reply, tool);
    assert_non_null(a);
    return a;
}

int logged_at(cps__coord *c, int level, const char *what)
{
    const cps__coord_out *o = cps__coord_ready(c);
    int n = 0;
    for (size_t i = 0; i < o->n; i++)
        n += o->a[i].kind == CPS_CO_LOG && (level < 0 || o->a[i].level == level) &&
             strstr(o->a[i].text, what) != NULL;
    return n;
}

int logged(cps__coord *c, const char *what)
{
    return logged_at(c, -1, what) > 0;
}

void perform(cps__coord *c, int rc, uint64_t now)
{
    if (cps__coord_ready(c)->persist)
        cps__coord_persisted(c, rc, now);
}

void done(cps__coord *c)
{
    cps__coord_done(c);
}

void hello_flags(cps__coord *c, uint32_t role, uint32_t port, uint64_t boot, uint32_t flags,
                 uint64_t now)
{
    char addr[64], pl[128];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", port);
    size_t len = cps__hello_encode(pl, sizeof pl, role, UINT32_MAX, 0, addr);
    len = cps__hello_add_flags(pl, sizeof pl, len, flags);
    cps__msg_hdr h = {
        .type = CPS_MSG_HELLO, .sender = UINT32_MAX, .aux = boot, .raw_len = (uint32_t)len};
    assert_int_equal(cps__coord_step(c, &h, pl, len, UINT32_MAX, now), 0);
}

void hello(cps__coord *c, uint32_t role, uint32_t port, uint64_t boot, uint64_t now)
{
    hello_flags(c, role, port, boot, 0, now);
}

void msg(cps__coord *c, uint8_t type, uint32_t from, uint64_t now)
{
    cps__msg_hdr h = {.type = type, .sender = from, .epoch = cps__coord_epoch(c), .req_seq = 9};
    cps__coord_step(c, &h, NULL, 0, from, now);
}

uint64_t silence_server_1(cps__coord *c)
{
    uint64_t t;
    for (t = 100; t <= 1000 && cps__coord_epoch(c) == 1; t += 100) {
        for (uint32_t id = 2; id <= 6; id++)
            msg(c, CPS_MSG_HEARTBEAT, id, t);
        cps__coord_tick(c, t, NULL, 0);
    }
    return t - 100;
}

void all_say_hello(cps__coord *c, uint32_t servers, uint32_t workers)
{
    for (uint32_t i = 0; i < servers; i++)
        hello(c, CPS_ROLE_SERVER, 7000 + i, 100 + i, 0);
    for (uint32_t i = 0; i < workers; i++)
        hello(c, CPS_ROLE_WORKER, 8000 + i, 0, 0);
}

cps__coord *running(uint32_t servers, uint32_t workers)
{
    cps__coord *c = make(servers, workers);
    all_say_hello(c, servers, workers);
    assert_true(cps__coord_started(c));
    perform(c, 0, 0);
    done(c);
    return c;
}

cps__coord *running_in_pairs(uint32_t servers, uint32_t workers)
{
    replicas = 2;
    cps__coord *c = running(servers, workers);
    replicas = 3;
    return c;
}

cps__coord *server_1_silenced(uint64_t *t)
{
    cps__coord *c = running(4, 2);
    *t = silence_server_1(c);
    perform(c, 0, *t);
    return c;
}

uint32_t joiners_become_tails(cps__coord *c, uint64_t t, cps__msg_hdr joins[8], uint32_t peers[8])
{
    perform(c, 0, t);
    const cps__coord_out *o = cps__coord_ready(c);
    uint32_t nj = 0;
    for (size_t i = 0; i < o->n && nj < 8; i++)
        if (o->a[i].kind == CPS_CO_MSG && o->a[i].hdr.type == CPS_MSG_JOIN_RANGE) {
            joins[nj] = o->a[i].hdr;
            peers[nj++] = o->a[i].peer;
        }
    assert_true(nj >= 2);
    done(c);
    uint64_t epoch = cps__coord_epoch(c);
    for (uint32_t k = 0; k < nj; k++) {
        cps__msg_hdr h = {.type = CPS_MSG_CAUGHT_UP,
                          .sender = peers[k],
                          .epoch = epoch,
                          .range = joins[k].range,
                          .step = joins[k].step};
        assert_int_equal(cps__coord_step(c, &h, NULL, 0, peers[k], t + 10 * k), 0);
        assert_int_equal(cps__coord_epoch(c), epoch); /* held for the batch */
    }
    cps__coord_tick(c, t + 50, NULL, 0);
    assert_int_equal(cps__coord_epoch(c), epoch);
    cps__coord_tick(c, t + 120, NULL, 0);
    assert_int_equal(cps__coord_epoch(c), epoch + 1);
    const cps__view *v = cps__coord_view(c);
    for (uint32_t k = 0; k < nj; k++) {
        const cps__range *rg = &v->ranges[joins[k].range];
        assert_int_equal(rg->chain[rg->chain_len - 1], peers[k]);
    }
    assert_true(logged(c, "joiner(s) became tails"));
    return nj;
}

void confirm(cps__coord *c, const cps__msg_hdr *joins, const uint32_t *peers, uint32_t k,
             uint64_t now)
{
    cps__msg_hdr h = {.type = CPS_MSG_CAUGHT_UP,
                      .sender = peers[k],
                      .epoch = cps__coord_epoch(c),
                      .range = joins[k].range,
                      .step = joins[k].step,
                      .aux = 1};
    assert_int_equal(cps__coord_step(c, &h, NULL, 0, peers[k], now), 0);
}

cps__coord *first_joiner_confirmed(joined *jt)
{
    cps__coord *c = running(4, 2);
    jt->t = silence_server_1(c);
    jt->nj = joiners_become_tails(c, jt->t, jt->joins, jt->peers);
    done(c);
    confirm(c, jt->joins, jt->peers, 0, jt->t + 200);
    return c;
}

cps__coord *two_servers_one_dead(void)
{
    cps__coord *c = running_in_pairs(2, 1);
    uint64_t t;
    for (t = 100; t <= 2000 && cps__coord_epoch(c) == 1; t += 50) {
        msg(c, CPS_MSG_HEARTBEAT, 2, t);
        msg(c, CPS_MSG_HEARTBEAT, 3, t);
        cps__coord_tick(c, t, NULL, 0);
    }
    const cps__view *v = cps__coord_view(c);
    assert_false(cps__view_node(v, 1)->alive);
    for (uint32_t r = 0; r < v->nranges; r++) {
        assert_int_equal(v->ranges[r].chain_len, 1);
        assert_int_equal(v->ranges[r].chain[0], 2);
    }
    done(c);
    return c;
}

int get(void *ctx, const char *name, const void **data, size_t *len)
{
    store *s = ctx;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            *data = s->copy[i];
            *len = s->b[i].len;
            return 0;
        }
    return CPS_ENOTFOUND;
}
