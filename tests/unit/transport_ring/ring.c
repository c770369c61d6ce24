/* The ring alone (transport/ring.h): descriptors, slots around the ring, refusals of stale and
 * out-of-range descriptors, a sender's restart, reserved slots. */
#include "fixture.h"

void desc_round_trip_and_refusals(void **state)
{
    (void)state;
    cps__ring_desc d = {RING_ID, 77, 4096, 1000, 5}, back;
    unsigned char b[CPS_RING_DESC];
    cps__ring_desc_encode(b, &d);
    assert_true(cps__ring_desc_is(b, sizeof b));
    int why = -1;
    assert_int_equal(cps__ring_desc_decode(b, sizeof b, &back, &why), 0);
    assert_int_equal(why, CPS_RING_OK);
    assert_memory_equal(&d, &back, sizeof d);
    /* A wire header is never a descriptor. */
    unsigned char w[CPS_WIRE_HDR_SIZE] = {0x43, 0x50, 0x53, 0x31};
    assert_false(cps__ring_desc_is(w, sizeof w));
    /* Each field that must not be 0, a misaligned offset, a bad version, a non-zero pad byte,
     * a wrong length. */
    cps__ring_desc bad[] = {
        {RING_ID, 0, 0, 1, 1}, {RING_ID, 1, 0, 0, 1}, {RING_ID, 1, 0, 1, 0}, {RING_ID, 1, 8, 1, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cps__ring_desc_encode(b, &bad[i]);
        assert_int_equal(cps__ring_desc_decode(b, sizeof b, &back, &why), CPS_EPROTO);
        assert_int_equal(why, CPS_RING_MALFORMED);
    }
    cps__ring_desc_encode(b, &d);
    b[4]++;
    assert_int_equal(cps__ring_desc_decode(b, sizeof b, &back, &why), CPS_EPROTO);
    b[4]--;
    b[6] = 1;
    assert_int_equal(cps__ring_desc_decode(b, sizeof b, &back, &why), CPS_EPROTO);
    b[6] = 0;
    assert_int_equal(cps__ring_desc_decode(b, sizeof b - 1, &back, &why), CPS_EPROTO);
    assert_string_equal(cps__ring_why_str(CPS_RING_STALE_GEN), "stale generation");
}

/* The file is private: mode 0600, ours. */
void ring_file_private(void **state)
{
    fixture *f = *state;
    cps__ring *r;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &r), 0);
    char path[256];
    assert_int_equal(cps__ring_path(f->dir, RING_ID, path, sizeof path), 0);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    cps__ring_destroy(r, 1);
    assert_int_not_equal(lstat(path, &st), 0);
}

/* Slots go around the ring: released ones come back oldest first, a slot that does not fit at
 * the end starts again at 0, and the bytes a receiver sees are the sender's. */
void wrap_around(void **state)
{
    fixture *f = *state;
    cps__ring *r;
    cps__ring_peers *t;
    const size_t cap = 64 * 1024, len = 20000;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, cap, &r), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    int wrapped = 0;
    uint64_t last_off = 0;
    void *prev = NULL;
    cps__ring_desc prev_d = {0};
    for (int i = 0; i < 40; i++) {
        cps__ring_desc d;
        unsigned char *slot;
        assert_int_equal(cps__ring_alloc(r, 7, 0, len, &d, &slot), 0);
        memset(slot, i, len);
        if (i && d.offset < last_off)
            wrapped++;
        last_off = d.offset;
        void *buf, *again;
        int why;
        assert_int_equal(cps__ring_resolve(t, &d, &buf, &why), 0);
        assert_true(cps__ring_owns(buf));
        assert_int_equal(((unsigned char *)buf)[0], i);
        assert_int_equal(((unsigned char *)buf)[len - 1], i);
        /* A replayed descriptor while its slot is out is refused. */
        assert_int_equal(cps__ring_resolve(t, &d, &again, &why), CPS_EPROTO);
        assert_int_equal(why, CPS_RING_STALE_SLOT);
        /* One slot stays out while the next is taken, so the ring moves on. */
        if (prev) {
            assert_int_equal(((unsigned char *)prev)[len / 2], i - 1);
            assert_int_equal(cps__ring_release(prev), 1);
            /* Released: its descriptor no longer matches the slot. */
            assert_int_equal(cps__ring_resolve(t, &prev_d, &again, &why), CPS_EPROTO);
            assert_int_equal(why, CPS_RING_STALE_SLOT);
        }
        prev = buf;
        prev_d = d;
    }
    cps__ring_release(prev);
    assert_true(wrapped >= 5);
    int dummy;
    assert_int_equal(cps__ring_release(&dummy), 0);
    cps__ring_peers_destroy(t);
    cps__ring_destroy(r, 1);
}

/* With slots held the ring fills (CPS_EAGAIN: the transport then sends inline); a held slot
 * released in the middle comes back only once those before it are. */
void full_ring(void **state)
{
    fixture *f = *state;
    cps__ring *r;
    cps__ring_peers *t;
    const size_t cap = 64 * 1024, len = 15000;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, cap, &r), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    void *held[8];
    cps__ring_desc d;
    unsigned char *slot;
    int n = 0, why;
    while (cps__ring_alloc(r, 3, 0, len, &d, &slot) == 0) {
        assert_true(n < 8);
        assert_int_equal(cps__ring_resolve(t, &d, &held[n++], &why), 0);
    }
    assert_int_equal(n, 4);
    assert_int_equal(cps__ring_alloc(r, 3, 0, len, &d, &slot), CPS_EAGAIN);
    assert_int_equal(cps__ring_alloc(r, 3, 0, cap * 2, &d, &slot), CPS_EINVAL);
    cps__ring_release(held[2]);
    assert_int_equal(cps__ring_alloc(r, 3, 0, len, &d, &slot), CPS_EAGAIN);
    cps__ring_release(held[0]);
    cps__ring_release(held[1]);
    assert_int_equal(cps__ring_alloc(r, 3, 0, len, &d, &slot), 0);
    assert_int_equal(cps__ring_live(r), 2);
    cps__ring_release(held[3]);
    /* A peer that never releases: its slots are taken back, and its late release does not free
     * a slot that went to someone else since. It may be alive and still reading (counted dead
     * by mistake): the bytes it reads stay the sender's, because the ring is retired rather
     * than its slot reused. */
    memset(slot, 0x3c, len);
    void *late;
    assert_int_equal(cps__ring_resolve(t, &d, &late, &why), 0);
    uint64_t gen0 = cps__ring_gen(r);
    assert_int_equal(cps__ring_retired(r), 0);
    assert_int_equal(cps__ring_reclaim_peer(r, 3), 1);
    assert_int_equal(cps__ring_retired(r), 1);
    assert_int_not_equal(cps__ring_gen(r), gen0);
    assert_int_equal(cps__ring_live(r), 0);
    cps__ring_desc d2;
    assert_int_equal(cps__ring_alloc(r, 4, 0, len, &d2, &slot), 0);
    assert_int_equal(d2.offset, 0);
    assert_int_equal(d2.offset, d.offset);
    memset(slot, 0xe1, len);
    for (size_t i = 0; i < len; i++)
        assert_int_equal(((unsigned char *)late)[i], 0x3c);
    /* Another receiver (its own table) gets the slot now. */
    cps__ring_peers *t2;
    assert_int_equal(cps__ring_peers_create(f->dir, &t2), 0);
    void *b2;
    assert_int_equal(cps__ring_resolve(t2, &d2, &b2, &why), 0);
    assert_int_equal(((unsigned char *)b2)[len - 1], 0xe1);
    assert_int_equal(((unsigned char *)late)[len - 1], 0x3c);
    /* A descriptor of the old generation is refused now (the file is the new one). */
    assert_int_equal(cps__ring_resolve(t2, &d, &held[0], &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_STALE_GEN);
    assert_int_equal(cps__ring_release(late), 1);
    /* The retired file's last buffer went: its mapping goes with it. */
    assert_int_equal(cps__ring_release(late), 0);
    assert_int_equal(cps__ring_live(r), 1);
    uint32_t oldest = 0;
    assert_int_equal(cps__ring_oldest_peer(r, &oldest, NULL), 0);
    assert_int_equal(oldest, 4);
    cps__ring_release(b2);
    assert_int_equal(cps__ring_oldest_peer(r, &oldest, NULL), CPS_ENOTFOUND);
    cps__ring_peers_destroy(t2);
    cps__ring_peers_destroy(t);
    cps__ring_destroy(r, 1);
}

/* A refused descriptor whose slot holds its seq gives the slot back, so the FIFO ring is not
 * stopped behind it; a replayed one (a slot we hold) does not; a slot reused after it was given
 * back at the same offset is a new message, not a replay. */
void refused_slot_given_back(void **state)
{
    fixture *f = *state;
    cps__ring *r;
    cps__ring_peers *t;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &r), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    cps__ring_desc d, bad;
    unsigned char *slot;
    void *a, *b;
    int why;
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d, &slot), 0);
    bad = d;
    bad.len = 99;
    assert_int_equal(cps__ring_resolve(t, &bad, &a, &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_STALE_SLOT);
    assert_int_equal(cps__ring_live(r), 0);
    assert_int_equal(cps__ring_peers_returned(t), 1);
    /* A replay of a slot we hold: refused, and the slot stays ours. */
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d, &slot), 0);
    assert_int_equal(cps__ring_resolve(t, &d, &a, &why), 0);
    assert_int_equal(cps__ring_resolve(t, &d, &b, &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_STALE_SLOT);
    assert_int_equal(cps__ring_live(r), 1);
    assert_int_equal(cps__ring_peers_returned(t), 1);
    /* The sender gives the slot up (abandon does not retire) and reuses its offset: the new seq
     * is another message. */
    cps__ring_abandon(r, &d);
    cps__ring_desc d2;
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d2, &slot), 0);
    assert_int_equal(d2.offset, d.offset);
    assert_int_equal(cps__ring_resolve(t, &d2, &b, &why), 0);
    assert_int_equal(cps__ring_release(a), 1);
    assert_int_equal(cps__ring_live(r), 1);
    assert_int_equal(cps__ring_release(b), 1);
    assert_int_equal(cps__ring_live(r), 0);
    cps__ring_peers_destroy(t);
    cps__ring_destroy(r, 1);
}

/* An old process that ends after its successor on the same address made its ring must not
 * unlink the successor's file. */
void destroy_spares_successor(void **state)
{
    fixture *f = *state;
    cps__ring *old, *succ;
    cps__ring_peers *t;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &old), 0);
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &succ), 0);
    /* The old one retires its ring (it took back a slot still lent): it leaves the successor's
     * file alone and makes none of its own. */
    cps__ring_desc od;
    unsigned char *oslot;
    assert_int_equal(cps__ring_alloc(old, 1, 0, 100, &od, &oslot), 0);
    assert_int_equal(cps__ring_reclaim_peer(old, 1), 1);
    assert_int_equal(cps__ring_alloc(old, 1, 0, 100, &od, &oslot), CPS_EIO);
    cps__ring_destroy(old, 1);
    char path[256];
    struct stat st;
    assert_int_equal(cps__ring_path(f->dir, RING_ID, path, sizeof path), 0);
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    cps__ring_desc d;
    unsigned char *slot;
    void *buf;
    int why;
    assert_int_equal(cps__ring_alloc(succ, 1, 0, 100, &d, &slot), 0);
    assert_int_equal(cps__ring_resolve(t, &d, &buf, &why), 0);
    cps__ring_release(buf);
    cps__ring_peers_destroy(t);
    cps__ring_destroy(succ, 1);
    assert_int_not_equal(lstat(path, &st), 0);
}

/* The bound of all mappings covers a lent buffer and is empty once none is mapped, so freeing a
 * nanomsg buffer takes neither the lock nor a scan. */
void bounds_of_mappings(void **state)
{
    fixture *f = *state;
    uintptr_t lo, hi;
    /* Mappings an earlier failed test left behind would keep the bound; none otherwise. */
    int before = cps__ring_bounds(&lo, &hi);
    if (!before)
        assert_true(lo >= hi);
    cps__ring *r;
    cps__ring_peers *t;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &r), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    cps__ring_desc d;
    unsigned char *slot;
    void *buf;
    int why;
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d, &slot), 0);
    assert_int_equal(cps__ring_resolve(t, &d, &buf, &why), 0);
    assert_int_equal(cps__ring_bounds(&lo, &hi), 1);
    assert_true((uintptr_t)buf >= lo && (uintptr_t)buf + 100 <= hi);
    void *heap = malloc(64);
    assert_int_equal(cps__ring_owns(heap), 0);
    assert_int_equal(cps__ring_release(heap), 0);
    free(heap);
    assert_true(cps__ring_owns(buf));
    cps__ring_peers_destroy(t);
    assert_int_equal(cps__ring_bounds(NULL, NULL), 1); /* still lent */
    assert_int_equal(cps__ring_release(buf), 1);
    /* Its mapping went (the retired-or-unowned mapping of its last buffer): the bound shrinks
     * off it (only a mapping an earlier failed test left could still span it). */
    cps__ring_bounds(&lo, &hi);
    assert_false((uintptr_t)buf >= lo && (uintptr_t)buf < hi);
    if (!before)
        assert_int_equal(cps__ring_bounds(NULL, NULL), 0);
    cps__ring_destroy(r, 1);
}

/* Slots sent to a peer before its connection broke (tag below the current count) come back; the
 * ones sent since, and other peers', stay. Released ones come back plainly; one still lent
 * retires the ring (every slot starts afresh in a new generation). */
void reclaim_before_a_break(void **state)
{
    fixture *f = *state;
    cps__ring *r;
    cps__ring_peers *t;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &r), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    cps__ring_desc d[4];
    unsigned char *slot;
    void *buf;
    int why;
    assert_int_equal(cps__ring_alloc(r, 5, 0, 100, &d[0], &slot), 0);
    assert_int_equal(cps__ring_alloc(r, 6, 0, 100, &d[1], &slot), 0);
    assert_int_equal(cps__ring_alloc(r, 5, 1, 100, &d[2], &slot), 0);
    assert_int_equal(cps__ring_alloc(r, 5, 2, 100, &d[3], &slot), 0);
    uint32_t peer;
    uint64_t tag = 9;
    assert_int_equal(cps__ring_oldest_peer(r, &peer, &tag), 0);
    assert_int_equal(peer, 5);
    assert_int_equal(tag, 0);
    /* Peer 5 released what it got before the break: nothing live to take back. */
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(cps__ring_resolve(t, &d[i], &buf, &why), 0);
        assert_int_equal(cps__ring_release(buf), 1);
    }
    uint64_t gen0 = cps__ring_gen(r);
    assert_int_equal(cps__ring_reclaim_before(r, 5, 2), 0);
    assert_int_equal(cps__ring_retired(r), 0);
    assert_int_equal(cps__ring_live(r), 2);
    assert_int_equal(cps__ring_oldest_peer(r, &peer, &tag), 0);
    assert_int_equal(peer, 6);
    /* The one sent after the break is still lent: taking it back retires the ring. */
    assert_int_equal(cps__ring_reclaim_before(r, 5, 2), 0);
    assert_int_equal(cps__ring_reclaim_before(r, 5, 3), 1);
    assert_int_equal(cps__ring_retired(r), 1);
    assert_int_not_equal(cps__ring_gen(r), gen0);
    assert_int_equal(cps__ring_live(r), 0);
    assert_int_equal(cps__ring_oldest_peer(r, &peer, &tag), CPS_ENOTFOUND);
    assert_int_equal(cps__ring_alloc(r, 6, 4, 100, &d[0], &slot), 0);
    assert_int_equal(d[0].offset, 0);
    assert_int_equal(cps__ring_reclaim_peer(r, 6), 1);
    assert_int_equal(cps__ring_retired(r), 2);
    cps__ring_peers_destroy(t);
    cps__ring_destroy(r, 1);
}

/* A sender restarts: its new file has a new generation; descriptors of the old one are refused,
 * the new ones accepted, and a buffer lent from the old mapping stays readable until released. */
void stale_generation_and_restart(void **state)
{
    fixture *f = *state;
    cps__ring *r;
    cps__ring_peers *t;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &r), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    cps__ring_desc d_old, d_old2, d_new;
    unsigned char *slot;
    void *old_buf, *buf;
    int why;
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d_old, &slot), 0);
    memset(slot, 0xab, 100);
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d_old2, &slot), 0);
    assert_int_equal(cps__ring_resolve(t, &d_old, &old_buf, &why), 0);
    /* The sender dies without a word (its file stays) and starts again. */
    cps__ring_destroy(r, 0);
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &r), 0);
    assert_int_not_equal(cps__ring_gen(r), d_old.gen);
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d_new, &slot), 0);
    memset(slot, 0xcd, 100);
    assert_int_equal(cps__ring_resolve(t, &d_new, &buf, &why), 0);
    assert_int_equal(((unsigned char *)buf)[99], 0xcd);
    /* The old incarnation's descriptor still in flight. */
    assert_int_equal(cps__ring_resolve(t, &d_old2, &buf, &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_STALE_GEN);
    assert_int_equal(((unsigned char *)old_buf)[99], 0xab);
    assert_int_equal(cps__ring_release(old_buf), 1);
    assert_int_equal(cps__ring_release(old_buf), 0); /* its mapping is gone now */
    /* Out of the data area, and a ring that does not exist. */
    cps__ring_desc far = d_new;
    far.offset = (uint64_t)1 << 20;
    assert_int_equal(cps__ring_resolve(t, &far, &old_buf, &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_OUT_OF_RANGE);
    far = d_new;
    far.len = 1 << 16;
    assert_int_equal(cps__ring_resolve(t, &far, &old_buf, &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_OUT_OF_RANGE);
    far = d_new;
    far.ring++;
    assert_int_equal(cps__ring_resolve(t, &far, &old_buf, &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_NO_RING);
    cps__ring_release(buf);
    /* A ring file open to others is not taken. */
    char path[256];
    assert_int_equal(cps__ring_path(f->dir, RING_ID, path, sizeof path), 0);
    cps__ring_peers_destroy(t);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(cps__ring_alloc(r, 1, 0, 100, &d_new, &slot), 0);
    assert_int_equal(cps__ring_resolve(t, &d_new, &buf, &why), CPS_EPROTO);
    assert_int_equal(why, CPS_RING_NO_RING);
    cps__ring_peers_destroy(t);
    cps__ring_destroy(r, 1);
}

/* A reserved slot is built in place and sent by commit; while unsent it is not taken back with
 * its peer's slots; abandoned, it is reused at once; a ring retired under a reservation stays
 * mapped for it (its bytes still writable and readable), the commit is refused, and the last
 * abandon lets it go. */
void reserve_commit_abandon(void **state)
{
    fixture *f = *state;
    cps__ring *r;
    cps__ring_peers *t;
    assert_int_equal(cps__ring_create(f->dir, RING_ID, 1 << 16, &r), 0);
    assert_int_equal(cps__ring_peers_create(f->dir, &t), 0);
    cps__ring_desc d, d2, lent;
    unsigned char *slot, *slot2;
    void *buf;
    int why;
    assert_int_equal(cps__ring_reserve(r, 5, 1000, &d, &slot), 0);
    assert_int_equal(d.offset, 0);
    memset(slot, 0x5a, 1000);
    /* Peer 5 dropped while the slot is being built: nothing of it is taken back. */
    assert_int_equal(cps__ring_reclaim_peer(r, 5), 0);
    assert_int_equal(cps__ring_retired(r), 0);
    /* Sent shorter than reserved, to another peer. */
    assert_int_equal(cps__ring_commit(r, &d, 7, 0, 0), CPS_EINVAL);
    assert_int_equal(cps__ring_commit(r, &d, 7, 0, 1001), CPS_EINVAL);
    assert_int_equal(cps__ring_commit(r, &d, 7, 0, 600), 0);
    assert_int_equal(d.len, 600);
    assert_int_equal(cps__ring_commit(r, &d, 7, 0, 600), CPS_ENOTFOUND);
    assert_int_equal(cps__ring_resolve(t, &d, &buf, &why), 0);
    assert_int_equal(((unsigned char *)buf)[599], 0x5a);
    assert_int_equal(cps__ring_release(buf), 1);

    /* Abandoned: the next slot takes its place. */
    assert_int_equal(cps__ring_reserve(r, 5, 1000, &d, &slot), 0);
    uint64_t off = d.offset;
    cps__ring_abandon(r, &d);
    assert_int_equal(cps__ring_live(r), 0);
    assert_int_equal(cps__ring_alloc(r, 5, 0, 1000, &d, &slot), 0);
    assert_int_equal(d.offset, off);

    /* A slot of peer 6 lent out, one reserved for peer 5: taking peer 6's back retires the
     * ring; the reservation keeps its old mapping. */
    assert_int_equal(cps__ring_alloc(r, 6, 0, 100, &lent, &slot), 0);
    assert_int_equal(cps__ring_resolve(t, &lent, &buf, &why), 0);
    assert_int_equal(cps__ring_reserve(r, 5, 4000, &d2, &slot2), 0);
    uint64_t gen0 = cps__ring_gen(r);
    assert_int_equal(cps__ring_reclaim_peer(r, 6), 1);
    assert_int_equal(cps__ring_retired(r), 1);
    assert_int_not_equal(cps__ring_gen(r), gen0);
    memset(slot2, 0x77, 4000); /* still mapped: a fault here would be the bug */
    assert_int_equal(cps__ring_commit(r, &d2, 5, 0, 4000), CPS_ENOTFOUND);
    assert_int_equal(slot2[3999], 0x77);
    cps__ring_abandon(r, &d2);
    cps__ring_release(buf);
    /* The new generation works as before. */
    assert_int_equal(cps__ring_reserve(r, 5, 100, &d, &slot), 0);
    assert_int_equal(d.offset, 0);
    assert_int_equal(cps__ring_commit(r, &d, 5, 0, 100), 0);
    assert_int_equal(cps__ring_resolve(t, &d, &buf, &why), 0);
    /* A commit whose descriptor could not be sent is undone: the slot is the builder's again
     * (not taken back with its peer). */
    assert_int_equal(cps__ring_reserve(r, 5, 100, &d2, &slot2), 0);
    assert_int_equal(cps__ring_commit(r, &d2, 5, 0, 100), 0);
    cps__ring_uncommit(r, &d2);
    cps__ring_release(buf);
    assert_int_equal(cps__ring_reclaim_peer(r, 5), 0);
    assert_int_equal(cps__ring_retired(r), 1);
    cps__ring_abandon(r, &d2);
    assert_int_equal(cps__ring_live(r), 0);
    cps__ring_peers_destroy(t);
    cps__ring_destroy(r, 1);
}
