/* Shared-memory rings (see ring.h). */
#include "transport/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/wire.h"

#define RING_FILE_MAGIC 0x31474e4952535043ull /* "CPSRING1" */
#define RING_HDR        4096u                 /* the file's header; the data area follows */
#define RING_ALIGN      64u

/* The file's header. */
typedef struct ring_hdr {
    uint64_t magic;
    uint64_t gen;
    uint64_t cap; /* bytes of the data area */
    uint64_t pid;
    uint64_t retired; /* 1 once the sender gave this file up for a new generation */
} ring_hdr;

/* A slot's header, at its offset in the data area. */
typedef struct slot_hdr {
    uint64_t live; /* the slot's seq while lent out, 0 once released */
    uint64_t len;
    uint32_t peer;
} slot_hdr;

const char *cps__ring_why_str(int why)
{
    switch (why) {
    case CPS_RING_OK:
        return "ok";
    case CPS_RING_MALFORMED:
        return "malformed descriptor";
    case CPS_RING_NO_RING:
        return "no private ring file";
    case CPS_RING_STALE_GEN:
        return "stale generation";
    case CPS_RING_OUT_OF_RANGE:
        return "slot out of range";
    case CPS_RING_STALE_SLOT:
        return "stale slot";
    default:
        return "unknown";
    }
}

/* ---- descriptors ---- */

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int cps__ring_desc_is(const unsigned char *buf, size_t len)
{
    return buf && len >= 4 && get32(buf) == CPS_RING_MAGIC;
}

int cps__ring_desc_decode(const unsigned char *buf, size_t len, cps__ring_desc *out, int *why)
{
    if (why)
        *why = CPS_RING_MALFORMED;
    if (!buf || !out || len != CPS_RING_DESC || get32(buf) != CPS_RING_MAGIC ||
        buf[4] != CPS_WIRE_VERSION || buf[5] || buf[6] || buf[7])
        return CPS_EPROTO;
    cps__ring_desc d = {get64(buf + 8), get64(buf + 16), get64(buf + 24), get64(buf + 32),
                        get64(buf + 40)};
    const uint64_t max = (uint64_t)CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD;
    if (!d.gen || !d.seq || !d.len || d.len > max || d.offset % RING_ALIGN ||
        d.offset > (uint64_t)1 << 48)
        return CPS_EPROTO;
    *out = d;
    if (why)
        *why = CPS_RING_OK;
    return 0;
}

void cps__ring_desc_encode(unsigned char out[CPS_RING_DESC], const cps__ring_desc *d)
{
    memset(out, 0, CPS_RING_DESC);
    out[0] = 'C', out[1] = 'P', out[2] = 'S', out[3] = 'R';
    out[4] = CPS_WIRE_VERSION;
    put64(out + 8, d->ring);
    put64(out + 16, d->gen);
    put64(out + 24, d->offset);
    put64(out + 32, d->len);
    put64(out + 40, d->seq);
}

/* ---- the sender's ring ---- */

typedef struct ring_ent {
    uint64_t off, size, seq, tag;
    uint32_t peer;
    int unsent; /* reserved, being built by the sender: no receiver has its descriptor */
} ring_ent;

/* A retired file in which slots were reserved and not yet sent: the builders still write into
 * them, so it stays mapped until the last one is sent (as a copy) or abandoned. */
typedef struct ring_zombie {
    unsigned char *map;
    size_t map_len;
    uint64_t gen;
    uint64_t *unsent; /* the seqs of the slots still reserved in it */
    size_t nunsent;
} ring_zombie;

struct cps__ring {
    unsigned char *map; /* the whole file */
    size_t map_len;
    unsigned char *data; /* map + RING_HDR */
    uint64_t cap, id, gen, next_seq;
    uint64_t head;  /* where the next slot goes */
    ring_ent *fifo; /* live slots, oldest first: fcap entries from fhead */
    size_t fcap, fhead, flen;
    uint64_t retired; /* generations given up because a slot was taken back while lent */
    ring_zombie *zombies;
    size_t nzombies, zcap;
    dev_t dev; /* of the file we made: only that one is ours to unlink */
    ino_t ino;
    char path[512];
};

int cps__ring_path(const char *dir, uint64_t id, char *out, size_t cap)
{
    if (!dir || !out)
        return CPS_EINVAL;
    int n = snprintf(out, cap, "%s/r%016llx.ring", dir, (unsigned long long)id);
    return n > 0 && (size_t)n < cap ? 0 : CPS_EINVAL;
}

static slot_hdr *slot_at(unsigned char *data, uint64_t off)
{
    return (slot_hdr *)(void *)(data + off);
}

static ring_ent *fifo_at(const cps__ring *r, size_t i)
{
    return &r->fifo[(r->fhead + i) % r->fcap];
}

/* Make a fresh file of a fresh generation for r (any old file of that name goes: a crashed
 * predecessor's, or our own retired one) and map it. On failure r->map is NULL. */
static int ring_open_file(cps__ring *r)
{
    r->map = NULL;
    r->data = NULL;
    uint64_t gen = 0;
    while (!gen || gen == r->gen)
        if (getrandom(&gen, sizeof gen, 0) != (ssize_t)sizeof gen)
            return CPS_EIO;
    r->gen = gen;
    /* Receivers that map the old file keep their pages, and its descriptors no longer match
     * the new file's generation. */
    if (unlink(r->path) != 0 && errno != ENOENT)
        return CPS_EIO;
    int fd = open(r->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return CPS_EIO;
    r->map_len = RING_HDR + r->cap;
    struct stat st;
    /* The blocks are reserved now: a store into a hole of a full file system would be a
     * SIGBUS, a failed reservation only sends inline. */
    if (fchmod(fd, 0600) != 0 || fstat(fd, &st) != 0 || ftruncate(fd, (off_t)r->map_len) != 0 ||
        (errno = posix_fallocate(fd, 0, (off_t)r->map_len)) != 0) {
        int e = errno;
        close(fd);
        unlink(r->path);
        errno = e;
        return CPS_EIO;
    }
    void *m = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        unlink(r->path);
        return CPS_EIO;
    }
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    r->map = m;
    r->data = r->map + RING_HDR;
    r->head = 0;
    r->fhead = r->flen = 0;
    ring_hdr *h = (ring_hdr *)(void *)r->map;
    h->gen = r->gen;
    h->cap = r->cap;
    h->pid = (uint64_t)getpid();
    __atomic_store_n(&h->magic, RING_FILE_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

int cps__ring_create(const char *dir, uint64_t id, size_t cap, cps__ring **out)
{
    if (!dir || !out || cap < RING_ALIGN * 2 || cap > (size_t)1 << 40)
        return CPS_EINVAL;
    cps__ring *r = calloc(1, sizeof *r);
    if (!r)
        return CPS_ENOMEM;
    r->cap = (cap + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    r->id = id;
    r->next_seq = 1;
    if (cps__ring_path(dir, id, r->path, sizeof r->path) != 0) {
        free(r);
        return CPS_EINVAL;
    }
    int rc = ring_open_file(r);
    if (rc) {
        int e = errno;
        free(r);
        errno = e;
        return rc;
    }
    *out = r;
    return 0;
}

/* Unlink our file, but only if the name still is our file: a successor on the same address
 * has replaced it with its own, which its receivers map. */
static void unlink_ours(const cps__ring *r)
{
    struct stat st;
    if (lstat(r->path, &st) == 0 && st.st_dev == r->dev && st.st_ino == r->ino)
        unlink(r->path);
}

/* Give up the current file: a receiver may still read a slot we took back, so no byte of it is
 * written again. Receivers keep their mappings; the header tells them to drop theirs once their
 * last buffer from it is released. A new generation replaces it; if that cannot be made, r sends
 * nothing more (cps__ring_alloc: CPS_EIO). */
static void ring_retire(cps__ring *r)
{
    if (!r->map)
        return;
    ring_hdr *h = (ring_hdr *)(void *)r->map;
    __atomic_store_n(&h->retired, 1, __ATOMIC_RELEASE);
    struct stat st;
    /* Another process on our address (a successor) made the file under our name: it is not
     * ours to replace, so this ring stops (inline from now on). */
    int theirs = lstat(r->path, &st) == 0 && (st.st_dev != r->dev || st.st_ino != r->ino);
    unlink_ours(r);
    size_t unsent = 0;
    for (size_t i = 0; i < r->flen; i++)
        unsent += fifo_at(r, i)->unsent && fifo_at(r, i)->seq;
    uint64_t *seqs = unsent ? malloc(unsent * sizeof *seqs) : NULL;
    void *nz = r->zombies;
    int grown = seqs ? cps__array_reserve(&nz, &r->zcap, r->nzombies + 1, sizeof *r->zombies, 4)
                     : CPS_ENOMEM;
    r->zombies = nz;
    if (grown == 0) {
        size_t k = 0;
        for (size_t i = 0; i < r->flen; i++)
            if (fifo_at(r, i)->unsent && fifo_at(r, i)->seq)
                seqs[k++] = fifo_at(r, i)->seq;
        r->zombies[r->nzombies++] = (ring_zombie){r->map, r->map_len, r->gen, seqs, unsent};
    } else if (!unsent) {
        munmap(r->map, r->map_len);
    } else {
        /* No memory to remember the builders' slots: the mapping is leaked rather than
         * unmapped under them. */
        free(seqs);
    }
    r->map = NULL;
    r->data = NULL;
    r->head = 0;
    r->fhead = r->flen = 0;
    r->retired++;
    if (!theirs)
        ring_open_file(r);
}

void cps__ring_destroy(cps__ring *r, int unlink_file)
{
    if (!r)
        return;
    if (unlink_file && r->map)
        unlink_ours(r);
    if (r->map)
        munmap(r->map, r->map_len);
    for (size_t i = 0; i < r->nzombies; i++) {
        munmap(r->zombies[i].map, r->zombies[i].map_len);
        free(r->zombies[i].unsent);
    }
    free(r->zombies);
    free(r->fifo);
    free(r);
}

uint64_t cps__ring_retired(const cps__ring *r)
{
    return r ? r->retired : 0;
}

int cps__ring_dir_in_memory(const char *dir)
{
    struct statfs sf;
    if (!dir || statfs(dir, &sf) != 0)
        return 0;
    /* tmpfs (TMPFS_MAGIC) and ramfs (RAMFS_MAGIC): a shared mapping of a file elsewhere is
     * written back to its disk, the whole hot ring over and over. */
    return (unsigned long)sf.f_type == 0x01021994ul || (unsigned long)sf.f_type == 0x858458f6ul;
}

uint64_t cps__ring_gen(const cps__ring *r)
{
    return r ? r->gen : 0;
}

size_t cps__ring_retired_held(const cps__ring *r)
{
    return r ? r->nzombies : 0;
}

size_t cps__ring_live(const cps__ring *r)
{
    size_t n = 0;
    for (size_t i = 0; r && r->map && i < r->flen; i++) {
        const ring_ent *e = fifo_at(r, i);
        n += e->seq && __atomic_load_n(&slot_at(r->data, e->off)->live, __ATOMIC_ACQUIRE) == e->seq;
    }
    return n;
}

/* Take back, oldest first, the slots whose receivers released them (or that were taken back). */
static void reap(cps__ring *r)
{
    while (r->flen) {
        ring_ent *e = fifo_at(r, 0);
        if (e->seq && __atomic_load_n(&slot_at(r->data, e->off)->live, __ATOMIC_ACQUIRE) == e->seq)
            break;
        r->fhead = (r->fhead + 1) % r->fcap;
        r->flen--;
    }
    if (!r->flen) {
        r->fhead = 0;
        r->head = 0;
    }
}

/* Where a slot of `size` bytes fits now, or UINT64_MAX. The live slots lie in [front, head)
 * when that does not wrap, else in [front, cap) and [0, head). */
static uint64_t fit(const cps__ring *r, uint64_t size)
{
    if (!r->flen)
        return size <= r->cap ? 0 : UINT64_MAX;
    uint64_t front = fifo_at(r, 0)->off;
    if (r->head > front) {
        if (r->cap - r->head >= size)
            return r->head;
        return front >= size ? 0 : UINT64_MAX;
    }
    return front - r->head >= size ? r->head : UINT64_MAX;
}

static int ring_take_slot(cps__ring *r, uint32_t peer, uint64_t tag, size_t len, int unsent,
                          cps__ring_desc *d, unsigned char **data)
{
    if (!r || !d || !data || !len)
        return CPS_EINVAL;
    uint64_t size = (CPS_RING_SLOT_HDR + (uint64_t)len + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    if (size > r->cap)
        return CPS_EINVAL;
    if (!r->map)
        return CPS_EIO;
    reap(r);
    uint64_t off = fit(r, size);
    if (off == UINT64_MAX)
        return CPS_EAGAIN;
    if (r->flen == r->fcap) {
        size_t ncap = r->fcap ? r->fcap * 2 : 64;
        ring_ent *nf = malloc(ncap * sizeof *nf);
        if (!nf)
            return CPS_ENOMEM;
        for (size_t i = 0; i < r->flen; i++)
            nf[i] = *fifo_at(r, i);
        free(r->fifo);
        r->fifo = nf;
        r->fcap = ncap;
        r->fhead = 0;
    }
    uint64_t seq = r->next_seq++;
    *fifo_at(r, r->flen++) = (ring_ent){off, size, seq, tag, peer, unsent};
    r->head = off + size;
    slot_hdr *s = slot_at(r->data, off);
    s->len = len;
    s->peer = peer;
    __atomic_store_n(&s->live, seq, __ATOMIC_RELEASE);
    *d = (cps__ring_desc){r->id, r->gen, off, len, seq};
    *data = r->data + off + CPS_RING_SLOT_HDR;
    return 0;
}

int cps__ring_alloc(cps__ring *r, uint32_t peer, uint64_t tag, size_t len, cps__ring_desc *d,
                    unsigned char **data)
{
    return ring_take_slot(r, peer, tag, len, 0, d, data);
}

int cps__ring_reserve(cps__ring *r, uint32_t peer, size_t len, cps__ring_desc *d,
                      unsigned char **data)
{
    return ring_take_slot(r, peer, 0, len, 1, d, data);
}

/* The current generation's FIFO entry of descriptor d, or NULL. */
static ring_ent *ent_of(cps__ring *r, const cps__ring_desc *d)
{
    if (!r->map || d->gen != r->gen || d->ring != r->id)
        return NULL;
    for (size_t i = 0; i < r->flen; i++) {
        ring_ent *e = fifo_at(r, i);
        if (e->seq == d->seq)
            return e;
    }
    return NULL;
}

int cps__ring_commit(cps__ring *r, cps__ring_desc *d, uint32_t peer, uint64_t tag, size_t len)
{
    if (!r || !d)
        return CPS_EINVAL;
    ring_ent *e = ent_of(r, d);
    if (!e || !e->unsent)
        return CPS_ENOTFOUND;
    if (!len || len > d->len)
        return CPS_EINVAL;
    slot_hdr *s = slot_at(r->data, e->off);
    s->len = len;
    s->peer = peer;
    e->peer = peer;
    e->tag = tag;
    e->unsent = 0;
    d->len = len;
    return 0;
}

void cps__ring_uncommit(cps__ring *r, const cps__ring_desc *d)
{
    ring_ent *e = r && d ? ent_of(r, d) : NULL;
    if (e)
        e->unsent = 1;
}

/* Take one slot back. 1 if it was still live (its receiver may be reading it: the caller must
 * retire the ring), 0 if its receiver had released it. */
static int take_back(cps__ring *r, ring_ent *e)
{
    uint64_t seq = e->seq;
    int live = __atomic_compare_exchange_n(&slot_at(r->data, e->off)->live, &seq, 0, 0,
                                           __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    e->seq = 0;
    return live;
}

void cps__ring_abandon(cps__ring *r, const cps__ring_desc *d)
{
    if (!r || !d)
        return;
    for (size_t i = 0; i < r->nzombies; i++) {
        ring_zombie *z = &r->zombies[i];
        if (z->gen != d->gen)
            continue;
        /* A reservation in a retired file: the file is no one's any more once the last
         * builder lets go. */
        for (size_t k = 0; k < z->nunsent; k++)
            if (z->unsent[k] == d->seq) {
                z->unsent[k] = z->unsent[--z->nunsent];
                break;
            }
        if (!z->nunsent) {
            munmap(z->map, z->map_len);
            free(z->unsent);
            r->zombies[i] = r->zombies[--r->nzombies];
        }
        return;
    }
    if (!r->map || d->gen != r->gen)
        return;
    /* Never sent: no receiver saw it, so its bytes may be reused at once. */
    for (size_t i = 0; i < r->flen; i++) {
        ring_ent *e = fifo_at(r, i);
        if (e->seq == d->seq) {
            take_back(r, e);
            break;
        }
    }
    reap(r);
}

size_t cps__ring_reclaim_peer(cps__ring *r, uint32_t peer)
{
    return cps__ring_reclaim_before(r, peer, UINT64_MAX);
}

size_t cps__ring_reclaim_before(cps__ring *r, uint32_t peer, uint64_t tag)
{
    size_t n = 0;
    if (!r || !r->map)
        return 0;
    for (size_t i = 0; i < r->flen; i++) {
        ring_ent *e = fifo_at(r, i);
        /* A reserved slot not yet sent has no receiver: it stays with its builder. */
        if (e->seq && !e->unsent && e->peer == peer && (tag == UINT64_MAX || e->tag < tag))
            n += (size_t)take_back(r, e);
    }
    /* A receiver counted dead may be alive (a worker dropped by mistake, a connection that only
     * reconnected) and still read a slot taken back while lent: reusing it would change bytes
     * under it, so the whole ring goes instead. */
    if (n)
        ring_retire(r);
    else
        reap(r);
    return n;
}

int cps__ring_oldest_peer(cps__ring *r, uint32_t *peer, uint64_t *tag)
{
    if (!r)
        return CPS_EINVAL;
    if (!r->map)
        return CPS_ENOTFOUND;
    reap(r);
    if (!r->flen)
        return CPS_ENOTFOUND;
    if (peer)
        *peer = fifo_at(r, 0)->peer;
    if (tag)
        *tag = fifo_at(r, 0)->tag;
    return 0;
}

/* ---- the receiver's side ----
 * Every mapping of a sender's ring is in one process-wide registry, so that cps__tp_free, which
 * knows no transport, can tell a ring buffer from a nanomsg one and release it. */

typedef struct lent {
    const unsigned char *payload;
    uint64_t off, seq;
} lent;

typedef struct ring_map {
    unsigned char *map;
    size_t map_len;
    uint64_t id, gen, cap;
    const cps__ring_peers *owner; /* the table that looks descriptors up in it; NULL: none */
    lent *lent;                   /* buffers out */
    size_t nlent, lent_cap;
} ring_map;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static ring_map **reg;
static size_t nreg, reg_cap;
/* [reg_lo, reg_hi) covers every mapping in the registry (empty: lo >= hi). Written under
 * reg_lock, read without it: cps__tp_free of a nanomsg buffer, the common case, neither locks
 * nor scans. A buffer lent from a mapping is covered for as long as it is lent, since the bound
 * is widened before the mapping is registered and recomputed only when one goes. */
static uintptr_t reg_lo = UINTPTR_MAX, reg_hi;

struct cps__ring_peers {
    char dir[512];
    uint64_t returned; /* slots of refused descriptors given back to their sender */
};

/* With reg_lock held: recompute [reg_lo, reg_hi) from the registry. */
static void bounds_update(void)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (size_t i = 0; i < nreg; i++) {
        uintptr_t a = (uintptr_t)reg[i]->map, b = a + reg[i]->map_len;
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    __atomic_store_n(&reg_lo, lo, __ATOMIC_RELEASE);
    __atomic_store_n(&reg_hi, hi, __ATOMIC_RELEASE);
}

/* 1 if p may lie in a registered mapping (then look under the lock), 0 if it cannot. */
static int in_bounds(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    return a >= __atomic_load_n(&reg_lo, __ATOMIC_ACQUIRE) &&
           a < __atomic_load_n(&reg_hi, __ATOMIC_ACQUIRE);
}

int cps__ring_bounds(uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t l = __atomic_load_n(&reg_lo, __ATOMIC_ACQUIRE),
              h = __atomic_load_n(&reg_hi, __ATOMIC_ACQUIRE);
    if (lo)
        *lo = l;
    if (hi)
        *hi = h;
    return l < h;
}

uint64_t cps__ring_peers_returned(const cps__ring_peers *t)
{
    return t ? t->returned : 0;
}

int cps__ring_peers_create(const char *dir, cps__ring_peers **out)
{
    if (!dir || !out || strlen(dir) >= sizeof((cps__ring_peers *)0)->dir)
        return CPS_EINVAL;
    cps__ring_peers *t = calloc(1, sizeof *t);
    if (!t)
        return CPS_ENOMEM;
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    *out = t;
    return 0;
}

/* With reg_lock held: unmap and forget registry entry i if nothing needs it. */
static void map_maybe_free(size_t i)
{
    ring_map *m = reg[i];
    if (m->owner || m->nlent)
        return;
    munmap(m->map, m->map_len);
    free(m->lent);
    free(m);
    reg[i] = reg[--nreg];
    bounds_update();
}

void cps__ring_peers_destroy(cps__ring_peers *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&reg_lock);
    for (size_t i = nreg; i-- > 0;)
        if (reg[i]->owner == t) {
            reg[i]->owner = NULL;
            map_maybe_free(i);
        }
    pthread_mutex_unlock(&reg_lock);
    free(t);
}

/* With reg_lock held: table t's current mapping of ring `id`, or NULL. */
static ring_map *map_find(const cps__ring_peers *t, uint64_t id)
{
    for (size_t i = 0; i < nreg; i++)
        if (reg[i]->owner == t && reg[i]->id == id)
            return reg[i];
    return NULL;
}

/* With reg_lock held: map ring d->ring's file for table t. Its generation must be d->gen. */
static int map_open(cps__ring_peers *t, const cps__ring_desc *d, ring_map **out)
{
    char path[600];
    if (cps__ring_path(t->dir, d->ring, path, sizeof path) != 0)
        return CPS_RING_NO_RING;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return CPS_RING_NO_RING;
    struct stat st;
    /* The directory vouches for the file only if it is a plain file of ours that nobody else
     * can open. */
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) || st.st_size < (off_t)(RING_HDR + 2 * RING_ALIGN)) {
        close(fd);
        return CPS_RING_NO_RING;
    }
    size_t len = (size_t)st.st_size;
    void *mp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mp == MAP_FAILED)
        return CPS_RING_NO_RING;
    const ring_hdr *h = mp;
    int why = CPS_RING_OK;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != RING_FILE_MAGIC || h->cap != len - RING_HDR)
        why = CPS_RING_NO_RING;
    else if (h->gen != d->gen)
        why = CPS_RING_STALE_GEN;
    ring_map *m = why ? NULL : calloc(1, sizeof *m);
    if (!why && !m)
        why = CPS_RING_NO_RING;
    if (!why && nreg == reg_cap) {
        size_t ncap = reg_cap ? reg_cap * 2 : 8;
        ring_map **nr = realloc(reg, ncap * sizeof *nr);
        if (nr) {
            reg = nr;
            reg_cap = ncap;
        } else {
            why = CPS_RING_NO_RING;
        }
    }
    if (why) {
        free(m);
        munmap(mp, len);
        return why;
    }
    *m = (ring_map){
        .map = mp, .map_len = len, .id = d->ring, .gen = d->gen, .cap = h->cap, .owner = t};
    uintptr_t a = (uintptr_t)mp, b = a + len;
    if (a < __atomic_load_n(&reg_lo, __ATOMIC_RELAXED))
        __atomic_store_n(&reg_lo, a, __ATOMIC_RELEASE);
    if (b > __atomic_load_n(&reg_hi, __ATOMIC_RELAXED))
        __atomic_store_n(&reg_hi, b, __ATOMIC_RELEASE);
    reg[nreg++] = m;
    *out = m;
    return CPS_RING_OK;
}

static int resolve_locked(cps__ring_peers *t, const cps__ring_desc *d, void **buf)
{
    ring_map *m = map_find(t, d->ring);
    if (m && m->gen != d->gen) {
        /* The sender restarted (a new file) or this is a descriptor of its old self: only the
         * file can tell which. An old descriptor is refused either way. */
        ring_map *fresh;
        int why = map_open(t, d, &fresh);
        if (why)
            return why;
        for (size_t i = 0; i < nreg; i++)
            if (reg[i] == m) {
                m->owner = NULL;
                map_maybe_free(i);
                break;
            }
        m = fresh;
    } else if (!m) {
        int why = map_open(t, d, &m);
        if (why)
            return why;
    }
    if (d->offset >= m->cap || m->cap - d->offset < CPS_RING_SLOT_HDR ||
        m->cap - d->offset - CPS_RING_SLOT_HDR < d->len)
        return CPS_RING_OUT_OF_RANGE;
    unsigned char *data = m->map + RING_HDR;
    slot_hdr *s = slot_at(data, d->offset);
    /* A descriptor replayed while its slot is out would lend the slot twice (and must not give
     * back a slot we are reading). The same offset with another seq is the slot reused after
     * its release: a new message. */
    for (size_t i = 0; i < m->nlent; i++)
        if (m->lent[i].off == d->offset && m->lent[i].seq == d->seq)
            return CPS_RING_STALE_SLOT;
    int why = CPS_RING_OK;
    if (__atomic_load_n(&s->live, __ATOMIC_ACQUIRE) != d->seq)
        return CPS_RING_STALE_SLOT;
    if (s->len != d->len)
        why = CPS_RING_STALE_SLOT;
    if (!why && m->nlent == m->lent_cap) {
        size_t ncap = m->lent_cap ? m->lent_cap * 2 : 16;
        lent *nl = realloc(m->lent, ncap * sizeof *nl);
        if (nl) {
            m->lent = nl;
            m->lent_cap = ncap;
        } else {
            why = CPS_RING_NO_RING;
        }
    }
    if (why) {
        /* The slot holds this descriptor's seq and nobody here reads it: refused, it would stay
         * live for good and stop the sender's ring (first in, first out) behind it. */
        uint64_t seq = d->seq;
        if (__atomic_compare_exchange_n(&s->live, &seq, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            t->returned++;
        return why;
    }
    unsigned char *payload = data + d->offset + CPS_RING_SLOT_HDR;
    m->lent[m->nlent++] = (lent){payload, d->offset, d->seq};
    *buf = payload;
    return CPS_RING_OK;
}

int cps__ring_resolve(cps__ring_peers *t, const cps__ring_desc *d, void **buf, int *why)
{
    int w = CPS_RING_MALFORMED;
    if (t && d && buf) {
        pthread_mutex_lock(&reg_lock);
        w = resolve_locked(t, d, buf);
        pthread_mutex_unlock(&reg_lock);
    }
    if (why)
        *why = w;
    return w ? CPS_EPROTO : 0;
}

/* With reg_lock held: the registry entry whose mapping holds p, or nreg. */
static size_t map_of(const void *p)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < nreg; i++)
        if (b >= reg[i]->map && b < reg[i]->map + reg[i]->map_len)
            return i;
    return nreg;
}

int cps__ring_owns(const void *buf)
{
    if (!buf || !in_bounds(buf))
        return 0;
    pthread_mutex_lock(&reg_lock);
    int owns = map_of(buf) < nreg;
    pthread_mutex_unlock(&reg_lock);
    return owns;
}

int cps__ring_release(void *buf)
{
    if (!buf || !in_bounds(buf))
        return 0;
    pthread_mutex_lock(&reg_lock);
    size_t i = map_of(buf);
    if (i == nreg) {
        pthread_mutex_unlock(&reg_lock);
        return 0;
    }
    ring_map *m = reg[i];
    for (size_t k = 0; k < m->nlent; k++) {
        if (m->lent[k].payload != buf)
            continue;
        uint64_t seq = m->lent[k].seq;
        slot_hdr *s = slot_at(m->map + RING_HDR, m->lent[k].off);
        /* A slot the sender took back (and maybe reused) holds another seq: left alone. */
        __atomic_compare_exchange_n(&s->live, &seq, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        m->lent[k] = m->lent[--m->nlent];
        break;
    }
    /* Its sender gave this file up for a new generation: nothing more comes from it. */
    const ring_hdr *h = (const ring_hdr *)(const void *)m->map;
    if (!m->nlent && __atomic_load_n(&h->retired, __ATOMIC_ACQUIRE))
        m->owner = NULL;
    map_maybe_free(i);
    pthread_mutex_unlock(&reg_lock);
    return 1;
}
