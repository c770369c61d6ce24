/* Giving up, restores, gone workers, tools and status, the tensor registry, metrics. */
#include "fixture.h"

/* Not every node arrived in time: the job gives up, and the workers that came are told. */
void a_job_short_of_nodes_gives_up(void **state)
{
    (void)state;
    cps__coord *c = make(3, 2);
    hello(c, CPS_ROLE_WORKER, 8000, 0, 0);
    cps__coord_tick(c, 5000, NULL, 0);
    assert_int_equal(cps__coord_gave_up(c), 0);
    cps__coord_tick(c, 10001, NULL, 0);
    assert_int_equal(cps__coord_gave_up(c), CPS_ETIMEDOUT);
    assert_int_equal(count(c, CPS_CO_MSG, CPS_MSG_SHUTDOWN), 1);
    cps__coord_destroy(c);
}

/* --restore-from: the workers are WELCOMEd only at the restore tool's RELEASE, which the
 * coordinator acknowledges to the tool's temporary peer, a repeat too (the tool sends it until
 * it hears back: one sent just before its transport closed was lost). */
void a_restore_releases_the_held_workers_and_is_acknowledged(void **state)
{
    (void)state;
    hold = 1;
    cps__coord *c = make(4, 2);
    hold = 0;
    all_say_hello(c, 4, 2);
    assert_true(cps__coord_started(c));
    perform(c, 0, 0);
    assert_non_null(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 1));
    assert_null(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 5));
    assert_null(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 6));
    done(c);
    const uint32_t tool = 0x40000001u;
    for (int round = 0; round < 2; round++) {
        cps__msg_hdr h = {.type = CPS_MSG_RELEASE, .sender = UINT32_MAX, .req_seq = 7 + round};
        assert_int_equal(cps__coord_step(c, &h, NULL, 0, tool, 10), 0);
        perform(c, 0, 10);
        /* The workers are welcomed once, at the first RELEASE. */
        assert_int_equal(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 5) != NULL, round == 0);
        assert_int_equal(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 6) != NULL, round == 0);
        const cps__coord_action *a = find(c, CPS_CO_MSG, CPS_MSG_RELEASE, tool);
        assert_non_null(a);
        assert_true(a->hdr.flags & CPS_WF_REPLY);
        assert_int_equal(a->hdr.req_seq, 7 + round);
        done(c);
    }
    cps__coord_destroy(c);
}

/* A worker whose connection closed and now refuses: killed, it is declared dead at once (an
 * all-reduce's ring waits on it); finished (BYE), it closed on purpose and is left alone, tick
 * after tick. */
void a_gone_worker_is_dead_unless_it_finished(void **state)
{
    (void)state;
    cps__coord *c = running(3, 3); /* servers 1..3, workers 4..6 */
    msg(c, CPS_MSG_BYE, 4, 10);
    perform(c, 0, 10);
    done(c);
    uint64_t epoch = cps__coord_epoch(c);
    const uint32_t finished[] = {4};
    for (uint64_t t = 20; t <= 40; t += 10) {
        for (uint32_t id = 1; id <= 6; id++)
            if (id != 4)
                msg(c, CPS_MSG_HEARTBEAT, id, t);
        cps__coord_tick(c, t, finished, 1);
        assert_false(logged(c, "connection closed"));
        perform(c, 0, t);
        done(c);
    }
    assert_int_equal(cps__coord_epoch(c), epoch);
    const uint32_t killed[] = {5};
    cps__coord_tick(c, 50, killed, 1);
    assert_true(logged(c, "worker 5 (rank 1): connection closed"));
    perform(c, 0, 50);
    assert_true(cps__coord_epoch(c) > epoch);
    done(c);
    cps__coord_destroy(c);
}

/* Which requests are a tool's (answered at a peer the shell makes from their hello payload): the
 * queries from anyone, DRAIN and RELEASE only from a sender that is no member. */
void tools_are_told_from_members(void **state)
{
    (void)state;
    cps__msg_hdr h = {.type = CPS_MSG_STATUS, .sender = 3};
    assert_true(cps__coord_tool_request(&h));
    h.type = CPS_MSG_REGISTRY;
    assert_true(cps__coord_tool_request(&h));
    h.type = CPS_MSG_DRAIN;
    assert_false(cps__coord_tool_request(&h)); /* a server asking to leave */
    h.sender = UINT32_MAX;
    assert_true(cps__coord_tool_request(&h));
    h.type = CPS_MSG_RELEASE;
    assert_true(cps__coord_tool_request(&h));
    h.sender = 0x40000001u;
    assert_false(cps__coord_tool_request(&h));
    h.sender = UINT32_MAX;
    h.type = CPS_MSG_HEARTBEAT;
    assert_false(cps__coord_tool_request(&h));
    h.type = CPS_MSG_CKPT_DONE; /* answered by nobody: a note, not a question */
    assert_false(cps__coord_tool_request(&h));
}

/* STATUS: answered at the tool's peer with the view, each member's age since it was last heard
 * of, the copies under way and the last checkpoint aged by the wall clock; aux says the job
 * runs. A tool that named no inbox (reply_to 0) is not answered. */
void status_reports_the_view_ages_and_the_checkpoint(void **state)
{
    (void)state;
    cps__coord *c = make(4, 2);
    cps__msg_hdr q = {.type = CPS_MSG_STATUS, .sender = UINT32_MAX, .req_seq = 5};
    const uint32_t tool = 0x40000002u;
    const cps__coord_action *a = ask(c, &q, CPS_MSG_STATUS_REPLY, tool, 0);
    assert_int_equal(a->hdr.aux, 0); /* not started */
    done(c);
    all_say_hello(c, 4, 2);
    perform(c, 0, 0);
    done(c);
    msg(c, CPS_MSG_HEARTBEAT, 2, 300);
    done(c);
    cps__ckpt_note note = {.step = 40, .unix_ms = 1000000};
    snprintf(note.path, sizeof note.path, "/tmp/ck");
    unsigned char nb[CPS_CKPT_NOTE_FIXED + 16];
    size_t nl = cps__ckpt_note_encode(nb, sizeof nb, &note);
    cps__msg_hdr ck = {.type = CPS_MSG_CKPT_DONE, .sender = UINT32_MAX, .raw_len = (uint32_t)nl};
    cps__coord_step(c, &ck, nb, nl, UINT32_MAX, 350);
    perform(c, 0, 350);
    done(c);
    cps__coord_set_wall(c, 1000000 + 2500);
    assert_int_equal(cps__coord_step(c, &q, NULL, 0, 0, 400), 0);
    assert_int_equal(count(c, CPS_CO_REPLY, 0), 0); /* nobody to answer */
    a = ask(c, &q, CPS_MSG_STATUS_REPLY, tool, 400);
    assert_int_equal(a->hdr.aux, 1);
    assert_int_equal(a->hdr.req_seq, 5);
    assert_true(a->hdr.flags & CPS_WF_REPLY);
    assert_int_equal(a->hdr.epoch, cps__coord_epoch(c));
    const cps__coord_blob *b = &cps__coord_ready(c)->views[a->view];
    cps__view v;
    cps__view_init(&v);
    size_t vlen;
    assert_int_equal(cps__view_decode_prefix(b->data, b->len, &v, &vlen), 0);
    assert_int_equal(v.epoch, cps__coord_epoch(c));
    const unsigned char *p = (const unsigned char *)b->data + vlen;
    assert_int_equal(cps__le32_get(p), 6);
    p += 4;
    for (uint32_t i = 0; i < 6; i++, p += 8 + CPS_STATS_SIZE) {
        uint32_t id = cps__le32_get(p), age = cps__le32_get(p + 4);
        assert_int_equal(age, id == 2 ? 100 : 400); /* heard of at 300, the others at 0 */
    }
    assert_int_equal(cps__le32_get(p), v.nranges);
    p += 4 + 8 * (size_t)v.nranges;
    cps__ckpt_note got;
    size_t used;
    assert_int_equal(cps__ckpt_note_decode(p, b->len - (size_t)(p - (const unsigned char *)b->data),
                                           &got, &used),
                     0);
    assert_int_equal(got.id, 1);
    assert_int_equal(got.step, 40);
    assert_int_equal(got.age_ms, 2500);
    assert_int_equal((size_t)(p - (const unsigned char *)b->data) + used, b->len);
    cps__view_fini(&v);
    done(c);
    cps__coord_destroy(c);
}

static size_t desc(unsigned char *buf, size_t cap, const char *name, uint64_t length)
{
    cps__tensor_desc d = {.kind = 0, .length = length};
    d.spec.lr = 0.1f;
    snprintf(d.name, sizeof d.name, "%s", name);
    return cps__wire_tensor_desc_encode(buf, cap, &d);
}

static void reg(cps__coord *c, uint32_t from, const unsigned char *pl, size_t len)
{
    cps__msg_hdr h = {.type = CPS_MSG_REGISTER,
                      .sender = from,
                      .epoch = cps__coord_epoch(c),
                      .req_worker = from,
                      .req_seq = 11,
                      .raw_len = (uint32_t)len};
    assert_int_equal(cps__coord_step(c, &h, pl, len, from, 50), 0);
}

/* Only a member worker declares tensors; a new one is persisted and acknowledged, the same one
 * again only acknowledged, another definition under its name refused; REGISTRY lists them, and
 * a restarted coordinator has them back. */
void workers_declare_tensors_and_tools_list_them(void **state)
{
    (void)state;
    cps__coord *c = running(4, 2); /* servers 1..4, workers 5, 6 */
    unsigned char pl[512];
    size_t len = desc(pl, sizeof pl, "w", 100);
    reg(c, 2, pl, len); /* a server */
    const cps__coord_action *a = find(c, CPS_CO_ERROR, 0, 2);
    assert_non_null(a);
    assert_int_equal(a->code, CPS_EPROTO);
    assert_false(cps__coord_ready(c)->persist & CPS_CO_P_REGISTRY);
    done(c);
    reg(c, 5, pl, len);
    assert_true(cps__coord_ready(c)->persist & CPS_CO_P_REGISTRY);
    a = find(c, CPS_CO_MSG, CPS_MSG_REGISTER, 5);
    assert_non_null(a);
    assert_true(a->hdr.flags & CPS_WF_REPLY);
    assert_int_equal(a->hdr.req_seq, 11);
    assert_int_equal(count(c, CPS_CO_ERROR, 0), 0);
    perform(c, 0, 50);
    done(c);
    reg(c, 6, pl, len); /* the other worker, the same tensor */
    assert_false(cps__coord_ready(c)->persist & CPS_CO_P_REGISTRY);
    assert_non_null(find(c, CPS_CO_MSG, CPS_MSG_REGISTER, 6));
    done(c);
    unsigned char other[512];
    size_t olen = desc(other, sizeof other, "w", 200);
    reg(c, 6, other, olen);
    a = find(c, CPS_CO_ERROR, 0, 6);
    assert_non_null(a);
    assert_int_equal(a->code, CPS_EEXIST);
    assert_null(find(c, CPS_CO_MSG, CPS_MSG_REGISTER, 6));
    done(c);
    reg(c, 5, pl, 7); /* truncated */
    a = find(c, CPS_CO_ERROR, 0, 5);
    assert_non_null(a);
    assert_true(a->code < 0);
    done(c);

    const uint32_t tool = 0x40000003u;
    cps__msg_hdr q = {.type = CPS_MSG_REGISTRY, .sender = UINT32_MAX, .req_seq = 3};
    a = ask(c, &q, CPS_MSG_REGISTRY, tool, 60);
    const cps__coord_blob *b = &cps__coord_ready(c)->views[a->view];
    size_t vlen = cps__view_encoded_size(cps__coord_view(c));
    assert_int_equal(b->len, vlen + 8 + len);
    assert_int_equal(cps__le32_get((const unsigned char *)b->data + vlen), 1);
    assert_memory_equal((const unsigned char *)b->data + vlen + 8, pl, len);
    done(c);

    size_t rlen;
    unsigned char *rb = cps__coord_registry_blob(c, &rlen);
    assert_non_null(rb);
    store s = {{"sched/registry"}, {{rb, rlen}}, {rb}, 1};
    cps__coord_destroy(c);
    c = make(4, 2);
    assert_int_equal(cps__coord_resume(c, get, &s, 0), 0); /* no job to resume; the registry */
    done(c);
    a = ask(c, &q, CPS_MSG_REGISTRY, tool, 60);
    b = &cps__coord_ready(c)->views[a->view];
    vlen = cps__view_encoded_size(cps__coord_view(c));
    assert_int_equal(b->len, vlen + 8 + len);
    assert_int_equal(cps__le32_get((const unsigned char *)b->data + vlen), 1);
    free(rb);
    done(c);
    cps__coord_destroy(c);
}

/* A join that could not be sent goes out again at the next repair, not after the join's
 * give-up time; other unsent messages change nothing. Probes fail quietly (their silence is
 * what a probe round looks for). */
void an_unsent_join_is_retried_at_the_next_repair(void **state)
{
    (void)state;
    uint64_t t;
    cps__coord *c = server_1_silenced(&t);
    const cps__coord_action *j = find(c, CPS_CO_MSG, CPS_MSG_JOIN_RANGE, UINT32_MAX);
    assert_non_null(j);
    cps__msg_hdr join = j->hdr;
    uint32_t joiner = j->peer;
    size_t joins = count(c, CPS_CO_MSG, CPS_MSG_JOIN_RANGE);
    assert_int_equal(cps__coord_unsent(c, &join), CPS_LOG_WARN);
    cps__msg_hdr probe = {.type = CPS_MSG_PROBE, .req_seq = 1};
    assert_int_equal(cps__coord_unsent(c, &probe), CPS_LOG_DEBUG);
    done(c);
    for (uint64_t at = t + 100; at <= t + 700; at += 100) {
        for (uint32_t id = 2; id <= 6; id++)
            msg(c, CPS_MSG_HEARTBEAT, id, at);
        cps__coord_tick(c, at, NULL, 0);
        perform(c, 0, at);
        const cps__coord_out *o = cps__coord_ready(c);
        for (size_t i = 0; i < o->n; i++)
            if (o->a[i].kind == CPS_CO_MSG && o->a[i].hdr.type == CPS_MSG_JOIN_RANGE) {
                /* Only the unsent one, to the same joiner, for the same range. */
                assert_int_equal(o->a[i].hdr.range, join.range);
                assert_int_equal(o->a[i].peer, joiner);
                joins = 0;
            }
        done(c);
    }
    assert_int_equal(joins, 0); /* it went out again */
    cps__coord_destroy(c);
}

/* The figures of /metrics: live servers and workers, the servers' counters summed, the job's
 * step the highest any server applied; a finished worker still shows its clock. */
void metrics_count_what_the_view_holds(void **state)
{
    (void)state;
    cps__coord *c = running(4, 2); /* servers 1..4, workers 5, 6 */
    cps__coord_summary m = cps__coord_summarize(c);
    assert_true(m.running);
    assert_int_equal(m.live_servers, 4);
    assert_int_equal(m.live_workers, 2);
    uint64_t t = silence_server_1(c) + 10;
    perform(c, 0, t);
    done(c);
    m = cps__coord_summarize(c);
    assert_int_equal(m.live_servers, 3);
    for (uint32_t id = 2; id <= 3; id++) {
        unsigned char st[CPS_STATS_SIZE];
        cps__node_stats ns = {.push_raw_bytes = 100 * id, .updates_applied = id, .step = 10 * id};
        cps__stats_encode(st, &ns);
        cps__msg_hdr h = {.type = CPS_MSG_HEARTBEAT,
                          .sender = id,
                          .epoch = cps__coord_epoch(c),
                          .raw_len = CPS_STATS_SIZE};
        cps__coord_step(c, &h, st, sizeof st, id, t);
    }
    msg(c, CPS_MSG_BYE, 5, t);
    perform(c, 0, t);
    done(c);
    m = cps__coord_summarize(c);
    assert_int_equal(m.push_raw_bytes, 500);
    assert_int_equal(m.updates_applied, 5);
    assert_int_equal(m.step, 30);
    assert_int_equal(m.live_workers, 1);
    uint32_t nn;
    const cps__coord_node *nodes = cps__coord_nodes(c, &nn);
    for (uint32_t i = 0; i < nn; i++)
        assert_int_equal(cps__coord_shows_clock(c, i), nodes[i].info.role == CPS_ROLE_WORKER);
    assert_false(cps__coord_shows_clock(c, nn));
    cps__coord_destroy(c);
}

/* While a range is copied to a joiner, STATUS names the joiner and its source: the range's tail,
 * which serves snapshots (src/server/transfer.c refuses a snapshot request elsewhere). */
void status_names_each_copy_and_its_source(void **state)
{
    (void)state;
    uint64_t t;
    cps__coord *c = server_1_silenced(&t);
    done(c);
    const uint32_t tool = 0x40000004u;
    cps__msg_hdr q = {.type = CPS_MSG_STATUS, .sender = UINT32_MAX, .req_seq = 8};
    const cps__coord_action *a = ask(c, &q, CPS_MSG_STATUS_REPLY, tool, t);
    const cps__coord_blob *b = &cps__coord_ready(c)->views[a->view];
    cps__view v;
    cps__view_init(&v);
    size_t vlen;
    assert_int_equal(cps__view_decode_prefix(b->data, b->len, &v, &vlen), 0);
    const unsigned char *p = (const unsigned char *)b->data + vlen;
    p += 4 + (size_t)cps__le32_get(p) * (8 + CPS_STATS_SIZE);
    assert_int_equal(cps__le32_get(p), v.nranges);
    p += 4;
    uint32_t copies = 0;
    for (uint32_t r = 0; r < v.nranges; r++, p += 8) {
        uint32_t joiner = cps__le32_get(p), source = cps__le32_get(p + 4);
        const cps__range *rg = &v.ranges[r];
        if (!joiner) {
            assert_int_equal(source, 0);
            continue;
        }
        copies++;
        assert_int_not_equal(joiner, 1);
        assert_int_equal(source, rg->chain[rg->chain_len - 1]);
    }
    assert_true(copies >= 1);
    cps__view_fini(&v);
    done(c);
    cps__coord_destroy(c);
}
