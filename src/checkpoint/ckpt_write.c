/* Checkpoint writer: safetensors shards written to temporaries, synced, then renamed. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/bigbuf.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/json.h"
#include "core/log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; chainps copies it as is and needs a little-endian host"
#endif

#define BOUNCE_BYTES    ((size_t)1 << 20) /* fill calls of a tensor not aligned in the stream */
#define HEADER_ALIGN    64 /* data section starts 64-byte aligned (safetensors pads to 8) */
#define CRC_PLACEHOLDER "crc32:00000000"

typedef struct wtensor {
    char *name;
    cps__ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CPS_CKPT_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
    cps__ckpt_fill_fn fill;
    void *arg;
    uint32_t shard;
    uint64_t begin; /* offset in the shard's data section */
    size_t crc_pos; /* where its 8 hex digits sit in the shard's header */
    uint32_t crc;
} wtensor;

struct cps__ckpt_writer {
    char base[PATH_MAX - 64]; /* BASE: files are BASE.safetensors, BASE-i-of-k.safetensors, ... */
    char dir[PATH_MAX];       /* directory holding them (fsynced after the renames) */
    uint64_t max_shard;
    wtensor *t;
    size_t n, cap;
    char **mk, **mv;
    size_t nm, mcap;
    /* commit's figures, for its log line */
    uint64_t disk_wait_us, fsync_us;
    int direct;
};

static const char *dtype_str(cps__ckpt_dtype d)
{
    return d == CPS_CKPT_F32 ? "F32" : "U64";
}

static uint32_t dtype_size(cps__ckpt_dtype d)
{
    return d == CPS_CKPT_F32 ? 4 : 8;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* mkdir -p */
static int ensure_dir(const char *dir)
{
    struct stat st;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
            cps__log(CPS_LOG_ERROR, "ckpt", "%s: cannot create directory: %s", tmp,
                     strerror(errno));
            return CPS_EIO;
        }
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        cps__log(CPS_LOG_ERROR, "ckpt", "%s: cannot create directory: %s", dir, strerror(errno));
        return CPS_EIO;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cps__log(CPS_LOG_ERROR, "ckpt", "%s: not a directory", dir);
        return CPS_EIO;
    }
    return 0;
}

int cps__ckpt_writer_open(const char *path, uint64_t max_shard_bytes, cps__ckpt_writer **out)
{
    if (!path || !*path || !out)
        return CPS_EINVAL;
    cps__ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return CPS_ENOMEM;
    int rc = 0;
    size_t len = strlen(path);
    if (ends_with(path, ".safetensors")) {
        const char *slash = strrchr(path, '/');
        if (len - strlen(".safetensors") >= sizeof w->base || slash == path + len - 13) {
            rc = CPS_EINVAL;
        } else {
            memcpy(w->base, path, len - strlen(".safetensors"));
            if (slash)
                snprintf(w->dir, sizeof w->dir, "%.*s", (int)(slash - path + 1), path);
            else
                snprintf(w->dir, sizeof w->dir, ".");
            rc = ensure_dir(w->dir);
        }
    } else if (len + strlen("/model") < sizeof w->base) {
        snprintf(w->dir, sizeof w->dir, "%s", path);
        snprintf(w->base, sizeof w->base, "%s/model", path);
        rc = ensure_dir(w->dir);
    } else {
        rc = CPS_EINVAL;
    }
    if (rc) {
        free(w);
        return rc;
    }
    w->max_shard = max_shard_bytes ? max_shard_bytes : UINT64_MAX;
    *out = w;
    return 0;
}

void cps__ckpt_writer_abort(cps__ckpt_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    for (size_t i = 0; i < w->nm; i++) {
        free(w->mk[i]);
        free(w->mv[i]);
    }
    free(w->t);
    free(w->mk);
    free(w->mv);
    free(w);
}

static int name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n > 0 && n < CPS_CKPT_NAME_MAX && cps__json_utf8_valid(s, n);
}

static int add(cps__ckpt_writer *w, const char *name, cps__ckpt_dtype dtype, uint32_t ndim,
               const uint64_t *shape, const void *data, cps__ckpt_fill_fn fill, void *arg)
{
    if (!w || !name_ok(name) || !strncmp(name, "__", 2) || ndim < 1 || ndim > CPS_CKPT_MAX_DIMS ||
        !shape || (dtype != CPS_CKPT_F32 && dtype != CPS_CKPT_U64))
        return CPS_EINVAL;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (shape[d] && numel > (UINT64_C(1) << 59) / shape[d])
            return CPS_EINVAL;
        numel *= shape[d];
    }
    if (numel > 0 && !data && !fill)
        return CPS_EINVAL;
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return CPS_ENOMEM;
        w->t = t;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return CPS_ENOMEM;
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, ndim * sizeof *shape);
    t->nbytes = numel * dtype_size(dtype);
    t->data = data;
    t->fill = fill;
    t->arg = arg;
    w->n++;
    return 0;
}

int cps__ckpt_writer_add(cps__ckpt_writer *w, const char *name, cps__ckpt_dtype dtype,
                         uint32_t ndim, const uint64_t *shape, const void *data)
{
    return add(w, name, dtype, ndim, shape, data, NULL, NULL);
}

int cps__ckpt_writer_add_stream(cps__ckpt_writer *w, const char *name, cps__ckpt_dtype dtype,
                                uint32_t ndim, const uint64_t *shape, cps__ckpt_fill_fn fill,
                                void *arg)
{
    if (!fill)
        return CPS_EINVAL;
    return add(w, name, dtype, ndim, shape, NULL, fill, arg);
}

int cps__ckpt_writer_set_meta(cps__ckpt_writer *w, const char *key, const char *value)
{
    if (!w || !name_ok(key) || !value || !cps__json_utf8_valid(value, strlen(value)) ||
        !strncmp(key, "checksum/", 9))
        return CPS_EINVAL;
    char *v = strdup(value);
    if (!v)
        return CPS_ENOMEM;
    for (size_t i = 0; i < w->nm; i++) {
        if (!strcmp(w->mk[i], key)) {
            free(w->mv[i]);
            w->mv[i] = v;
            return 0;
        }
    }
    if (w->nm == w->mcap) {
        size_t cap = w->mcap ? 2 * w->mcap : 8;
        char **k = realloc(w->mk, cap * sizeof *k);
        if (k)
            w->mk = k;
        char **vv = k ? realloc(w->mv, cap * sizeof *vv) : NULL;
        if (!vv) {
            free(v);
            return CPS_ENOMEM;
        }
        w->mv = vv;
        w->mcap = cap;
    }
    if (!(w->mk[w->nm] = strdup(key))) {
        free(v);
        return CPS_ENOMEM;
    }
    w->mv[w->nm++] = v;
    return 0;
}

/* ---- commit ---- */

static int cmp_namep(const void *a, const void *b)
{
    return strcmp((*(const wtensor *const *)a)->name, (*(const wtensor *const *)b)->name);
}

static int check_unique(cps__ckpt_writer *w)
{
    wtensor **v = malloc(w->n * sizeof *v);
    if (!v)
        return CPS_ENOMEM;
    for (size_t i = 0; i < w->n; i++)
        v[i] = &w->t[i];
    qsort(v, w->n, sizeof *v, cmp_namep);
    int rc = 0;
    for (size_t i = 1; i < w->n && !rc; i++) {
        if (!strcmp(v[i]->name, v[i - 1]->name)) {
            cps__log(CPS_LOG_ERROR, "ckpt", "%s: tensor '%s' added twice", w->base, v[i]->name);
            rc = CPS_EEXIST;
        }
    }
    free(v);
    return rc;
}

static int has_meta(const cps__ckpt_writer *w, const char *key)
{
    for (size_t i = 0; i < w->nm; i++)
        if (!strcmp(w->mk[i], key))
            return 1;
    return 0;
}

/* Header of shard s with placeholder checksums; records where each tensor's digits and the
 * header's own digits go. Padded with spaces to HEADER_ALIGN (with the 8-byte length prefix). */
static int build_header(cps__ckpt_writer *w, uint32_t s, cps__json_buf *b, size_t *hdr_crc_pos)
{
    cps__json_puts(b, "{\"__metadata__\":{");
    for (size_t i = 0; i < w->nm; i++) {
        cps__json_put_str(b, w->mk[i]);
        cps__json_puts(b, ":");
        cps__json_put_str(b, w->mv[i]);
        cps__json_puts(b, ",");
    }
    if (!has_meta(w, "format"))
        cps__json_puts(b, "\"format\":\"pt\",");
    for (size_t i = 0; i < w->n; i++) {
        wtensor *t = &w->t[i];
        if (t->shard != s)
            continue;
        char key[CPS_CKPT_NAME_MAX + 16];
        snprintf(key, sizeof key, "checksum/%s", t->name);
        cps__json_put_str(b, key);
        cps__json_puts(b, ":\"crc32:");
        t->crc_pos = b->len;
        cps__json_puts(b, "00000000\",");
    }
    cps__json_puts(b, "\"checksum/__header__\":\"crc32:");
    *hdr_crc_pos = b->len;
    cps__json_puts(b, "00000000\"}");
    for (size_t i = 0; i < w->n; i++) {
        wtensor *t = &w->t[i];
        if (t->shard != s)
            continue;
        cps__json_puts(b, ",");
        cps__json_put_str(b, t->name);
        cps__json_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", dtype_str(t->dtype));
        for (uint32_t d = 0; d < t->ndim; d++)
            cps__json_printf(b, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        cps__json_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin,
                         (unsigned long long)(t->begin + t->nbytes));
    }
    cps__json_puts(b, "}");
    while ((8 + b->len) % HEADER_ALIGN)
        cps__json_puts(b, " ");
    return b->failed ? CPS_ENOMEM : 0;
}

static void put_hex(char *p, uint32_t v)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 7; i >= 0; i--, v >>= 4)
        p[i] = hex[v & 15];
}

static int io_fail(const char *path, const char *op, int err)
{
    cps__log(CPS_LOG_ERROR, "ckpt", "%s: %s failed: %s", path, op, strerror(err));
    return CPS_EIO;
}

static int write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return io_fail(path, "write", errno);
        if (k == 0)
            return io_fail(path, "write", ENOSPC);
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t n, off_t off, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return io_fail(path, "write", k < 0 ? errno : ENOSPC);
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

/* A shard is written as one stream of bytes through a ring of WBUF_N aligned buffers: the
 * committing thread fills them (the fill callbacks write straight into them, so a tensor that
 * arrives over the network is copied once), and a thread of its own writes each full one at its
 * file offset while the next ones fill. With O_DIRECT the disk reads the buffers by DMA: no copy
 * into the page cache (that copy and the page faults under it were 2/3 of the export's CPU,
 * measured with perf), no dirty pages for the kernel to throttle us on while a training job
 * dirties its store (16 MB writes stalled for up to 1.2 s), and the fsync at the end has only
 * the metadata left. Filesystems without O_DIRECT (tmpfs) get the same writes through the page
 * cache. */
#define WBUF_BYTES ((size_t)8 << 20) /* per write(): as fast as larger ones with O_DIRECT */
#define WBUF_N     4                 /* 32 MB in the ring: slack for a disk that hiccups */
#define DIO_ALIGN  4096              /* buffer, offset and length alignment for O_DIRECT */

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

typedef struct wstream {
    int fd;
    const char *path;
    int direct; /* O_DIRECT is on: whole aligned blocks only */
    unsigned char *buf[WBUF_N];
    uint64_t seq; /* the buffer being filled (slot seq % WBUF_N) */
    size_t used;  /* bytes in it */
    uint64_t off; /* file offset of its first byte */
    size_t len[WBUF_N];
    uint64_t at[WBUF_N];
    /* shared with the writer thread, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t queued;  /* buffers handed over: seq < queued */
    uint64_t written; /* buffers written: seq < written */
    int stop;
    int rc;             /* the first write error: later buffers are dropped */
    uint64_t waited_us; /* the filler waited this long for a free buffer (the disk is behind) */
    int threaded;
    pthread_t th;
} wstream;

/* Write a buffer; with O_DIRECT a length that is not a whole number of blocks (the file's last
 * buffer) is padded with zeros, which the caller truncates away. A filesystem that refuses
 * O_DIRECT writes (EINVAL) gets this one and the rest through the page cache. */
static int ws_write(wstream *s, unsigned char *b, size_t n, uint64_t off)
{
    if (s->direct && n % DIO_ALIGN) {
        size_t m = (n + DIO_ALIGN - 1) & ~(size_t)(DIO_ALIGN - 1);
        memset(b + n, 0, m - n);
        n = m;
    }
    for (size_t done = 0; done < n;) {
        ssize_t k = pwrite(s->fd, b + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EINVAL && s->direct) {
            int fl = fcntl(s->fd, F_GETFL);
            if (fl < 0 || fcntl(s->fd, F_SETFL, fl & ~O_DIRECT) != 0)
                return io_fail(s->path, "fcntl", errno);
            s->direct = 0;
            continue;
        }
        if (k <= 0)
            return io_fail(s->path, "write", k < 0 ? errno : ENOSPC);
        done += (size_t)k;
    }
    return 0;
}

static void *ws_main(void *arg)
{
    wstream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->written == s->queued && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->written == s->queued)
            break;
        unsigned slot = (unsigned)(s->written % WBUF_N);
        int failed = s->rc;
        pthread_mutex_unlock(&s->mu);
        int rc = failed ? 0 : ws_write(s, s->buf[slot], s->len[slot], s->at[slot]);
        pthread_mutex_lock(&s->mu);
        if (rc && !s->rc)
            s->rc = rc;
        s->written++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int ws_open(wstream *s, int fd, const char *path, int direct)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->path = path;
    s->direct = direct;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int i = 0; i < WBUF_N; i++)
        if (!(s->buf[i] = cps__bigbuf_alloc(WBUF_BYTES))) /* 2 MB aligned: O_DIRECT-fit */
            return CPS_ENOMEM;
    /* Without a thread the buffers are written in turn by the filler: slower, still correct. */
    s->threaded = pthread_create(&s->th, NULL, ws_main, s) == 0;
    return 0;
}

/* Hand the current buffer to the writer and wait until the next slot is free. */
static int ws_flush(wstream *s)
{
    unsigned slot = (unsigned)(s->seq % WBUF_N);
    s->len[slot] = s->used;
    s->at[slot] = s->off;
    int rc;
    if (!s->threaded) {
        rc = ws_write(s, s->buf[slot], s->used, s->off);
        s->rc = s->rc ? s->rc : rc;
        s->queued = s->written = s->seq + 1;
    } else {
        pthread_mutex_lock(&s->mu);
        s->queued = s->seq + 1;
        pthread_cond_broadcast(&s->cv);
        if (s->queued - s->written >= WBUF_N && !s->rc) {
            uint64_t t0 = mono_us();
            while (s->queued - s->written >= WBUF_N && !s->rc)
                pthread_cond_wait(&s->cv, &s->mu);
            s->waited_us += mono_us() - t0;
        }
        pthread_mutex_unlock(&s->mu);
    }
    s->off += s->used;
    s->used = 0;
    s->seq++;
    pthread_mutex_lock(&s->mu);
    rc = s->rc;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Room in the current buffer: a pointer to it and its size (> 0), flushing a full buffer. */
static int ws_room(wstream *s, unsigned char **at, size_t *n)
{
    if (s->used == WBUF_BYTES) {
        int rc = ws_flush(s);
        if (rc)
            return rc;
    }
    *at = s->buf[s->seq % WBUF_N] + s->used;
    *n = WBUF_BYTES - s->used;
    return 0;
}

static int ws_put(wstream *s, const void *p, size_t n)
{
    const unsigned char *src = p;
    while (n > 0) {
        unsigned char *at;
        size_t room;
        int rc = ws_room(s, &at, &room);
        if (rc)
            return rc;
        size_t k = n < room ? n : room;
        memcpy(at, src, k);
        s->used += k;
        src += k;
        n -= k;
    }
    return 0;
}

/* Write what is left, wait for the writer and free the buffers. With O_DIRECT the padding of
 * the last block is cut off, and the descriptor goes back to the page cache for the header's
 * rewrite. Returns the first error (also after a failure elsewhere: `rc` is the caller's). */
static int ws_close(wstream *s, int rc)
{
    if (!rc && s->used)
        rc = ws_flush(s);
    if (s->threaded) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    if (!rc)
        rc = s->rc;
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    for (int i = 0; i < WBUF_N; i++)
        cps__bigbuf_free(s->buf[i], WBUF_BYTES);
    if (!rc && s->direct) {
        int fl = fcntl(s->fd, F_GETFL);
        if (ftruncate(s->fd, (off_t)s->off) != 0)
            rc = io_fail(s->path, "ftruncate", errno);
        else if (fl < 0 || fcntl(s->fd, F_SETFL, fl & ~O_DIRECT) != 0)
            rc = io_fail(s->path, "fcntl", errno);
    }
    return rc;
}

static int write_tensor(wtensor *t, wstream *s)
{
    uint32_t crc = 0;
    int rc = 0;
    if (!t->fill) {
        /* Piece by piece, the CRC right after each copy, while the bytes are in the cache (one
         * pass over the whole tensor, then another, read a large one from memory twice). */
        const unsigned char *p = t->data;
        for (uint64_t done = 0; done < t->nbytes && !rc;) {
            size_t k = t->nbytes - done < BOUNCE_BYTES ? (size_t)(t->nbytes - done) : BOUNCE_BYTES;
            rc = ws_put(s, p + done, k);
            crc = cps__ckpt_crc32(crc, p + done, k);
            done += k;
        }
        t->crc = crc;
        return rc;
    }
    uint32_t es = dtype_size(t->dtype);
    uint64_t numel = t->nbytes / es;
    void *bounce = NULL;
    for (uint64_t first = 0; first < numel && !rc;) {
        unsigned char *at;
        size_t room;
        if ((rc = ws_room(s, &at, &room)) != 0)
            break;
        /* Fill in place; a tensor that starts at an offset its element type cannot be aligned
         * to (a U64 after an odd number of F32) goes through a small aligned buffer. */
        int aligned = ((uintptr_t)at % es) == 0;
        size_t n = (aligned ? room : (room < BOUNCE_BYTES ? room : BOUNCE_BYTES)) / es;
        if (n == 0) { /* less than one element of room: finish the buffer byte-wise */
            aligned = 0;
            n = 1;
        }
        n = numel - first < n ? (size_t)(numel - first) : n;
        if (!aligned && !bounce && !(bounce = aligned_alloc(64, BOUNCE_BYTES))) {
            rc = CPS_ENOMEM;
            break;
        }
        void *dst = aligned ? (void *)at : bounce;
        rc = t->fill(t->arg, first, dst, n);
        if (rc) {
            cps__log(CPS_LOG_ERROR, "ckpt", "%s: producing tensor '%s' failed: %s", s->path,
                     t->name, cps_strerror(rc));
            break;
        }
        /* The CRC while the bytes are still in the cache they were just written to. */
        crc = cps__ckpt_crc32(crc, dst, n * es);
        if (aligned)
            s->used += n * es;
        else
            rc = ws_put(s, bounce, n * es);
        first += n;
    }
    free(bounce);
    t->crc = crc;
    return rc;
}

static int write_shard(cps__ckpt_writer *w, uint32_t s, const char *tmp)
{
    cps__json_buf b = {0};
    size_t hpos;
    int rc = build_header(w, s, &b, &hpos);
    if (rc) {
        cps__json_buf_fini(&b);
        return rc;
    }
    int direct = 1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (fd < 0 && errno == EINVAL) { /* no O_DIRECT here (tmpfs) */
        direct = 0;
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        cps__json_buf_fini(&b);
        return io_fail(tmp, "open", errno);
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    wstream ws;
    rc = ws_open(&ws, fd, tmp, direct);
    if (!rc)
        rc = ws_put(&ws, len8, 8);
    if (!rc)
        rc = ws_put(&ws, b.p, b.len);
    for (size_t i = 0; i < w->n && !rc; i++)
        if (w->t[i].shard == s)
            rc = write_tensor(&w->t[i], &ws);
    rc = ws_close(&ws, rc);
    w->disk_wait_us += ws.waited_us;
    w->direct &= ws.direct;
    if (!rc) {
        /* Same length as the placeholder header, so it overwrites it exactly. */
        for (size_t i = 0; i < w->n; i++)
            if (w->t[i].shard == s)
                put_hex(b.p + w->t[i].crc_pos, w->t[i].crc);
        put_hex(b.p + hpos, cps__ckpt_crc32(0, b.p, b.len));
        rc = pwrite_all(fd, b.p, b.len, 8, tmp);
    }
    uint64_t t0 = mono_us();
    if (!rc && fsync(fd) != 0)
        rc = io_fail(tmp, "fsync", errno);
    w->fsync_us += mono_us() - t0;
    if (close(fd) != 0 && !rc)
        rc = io_fail(tmp, "close", errno);
    cps__json_buf_fini(&b);
    return rc;
}

static int write_index(cps__ckpt_writer *w, char (*names)[PATH_MAX], const char *tmp)
{
    cps__json_buf b = {0};
    uint64_t total = 0;
    for (size_t i = 0; i < w->n; i++)
        total += w->t[i].nbytes;
    cps__json_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu",
                     (unsigned long long)total);
    for (size_t i = 0; i < w->nm; i++) {
        cps__json_puts(&b, ",\n    ");
        cps__json_put_str(&b, w->mk[i]);
        cps__json_puts(&b, ": ");
        cps__json_put_str(&b, w->mv[i]);
    }
    if (!has_meta(w, "format"))
        cps__json_puts(&b, ",\n    \"format\": \"pt\"");
    cps__json_puts(&b, "\n  },\n  \"weight_map\": {");
    for (size_t i = 0; i < w->n; i++) {
        const char *file = strrchr(names[w->t[i].shard], '/');
        cps__json_puts(&b, i ? ",\n    " : "\n    ");
        cps__json_put_str(&b, w->t[i].name);
        cps__json_puts(&b, ": ");
        cps__json_put_str(&b, file ? file + 1 : names[w->t[i].shard]);
    }
    cps__json_puts(&b, "\n  }\n}\n");
    if (b.failed) {
        cps__json_buf_fini(&b);
        return CPS_ENOMEM;
    }
    int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        rc = io_fail(tmp, "open", errno);
    if (!rc)
        rc = write_all(fd, b.p, b.len, tmp);
    if (!rc && fsync(fd) != 0)
        rc = io_fail(tmp, "fsync", errno);
    if (fd >= 0 && close(fd) != 0 && !rc)
        rc = io_fail(tmp, "close", errno);
    cps__json_buf_fini(&b);
    return rc;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return io_fail(dir, "open", errno);
    int rc = fsync(fd) != 0 ? io_fail(dir, "fsync", errno) : 0;
    close(fd);
    return rc;
}

/* Packs tensors, in the order added, into shards of at most max_shard data bytes. */
static uint32_t assign_shards(cps__ckpt_writer *w)
{
    uint32_t s = 0;
    uint64_t used = 0;
    for (size_t i = 0; i < w->n; i++) {
        wtensor *t = &w->t[i];
        if (used > 0 && (used > w->max_shard || t->nbytes > w->max_shard - used)) {
            s++;
            used = 0;
        }
        t->shard = s;
        t->begin = used;
        used += t->nbytes;
    }
    return s + 1;
}

int cps__ckpt_writer_commit(cps__ckpt_writer *w, char *path_out, size_t cap)
{
    if (!w)
        return CPS_EINVAL;
    if (w->n == 0) {
        cps__log(CPS_LOG_ERROR, "ckpt", "%s: no tensors to write", w->base);
        cps__ckpt_writer_abort(w);
        return CPS_EINVAL;
    }
    int rc = check_unique(w);
    uint32_t k = rc ? 0 : assign_shards(w);
    if (k > 99999) {
        cps__log(CPS_LOG_ERROR, "ckpt", "%s: %u shards is too many", w->base, k);
        rc = CPS_EINVAL;
    }
    /* k shard names + the index name, then the same with ".tmp". */
    char(*names)[PATH_MAX] = rc ? NULL : calloc(2 * ((size_t)k + 1), PATH_MAX);
    if (!rc && !names)
        rc = CPS_ENOMEM;
    char(*tmps)[PATH_MAX] = names ? names + k + 1 : NULL;
    size_t nfiles = k > 1 ? (size_t)k + 1 : 1, created = 0;
    for (size_t i = 0; !rc && i < nfiles; i++) {
        if (k == 1)
            snprintf(names[i], PATH_MAX, "%s.safetensors", w->base);
        else if (i < k)
            snprintf(names[i], PATH_MAX, "%s-%05zu-of-%05u.safetensors", w->base, i + 1, k);
        else
            snprintf(names[i], PATH_MAX, "%s.safetensors.index.json", w->base);
        snprintf(tmps[i], PATH_MAX, "%s.tmp", names[i]);
    }
    w->direct = 1;
    for (uint32_t s = 0; !rc && s < k; s++) {
        created = s + 1;
        rc = write_shard(w, s, tmps[s]);
    }
    if (!rc && k > 1) {
        created = nfiles;
        rc = write_index(w, names, tmps[k]);
    }
    /* Publish: every temporary is complete and synced; the index goes last so a reader that
     * follows it never finds a shard missing. */
    size_t renamed = 0;
    while (!rc && renamed < nfiles) {
        if (rename(tmps[renamed], names[renamed]) != 0)
            rc = io_fail(names[renamed], "rename", errno);
        else
            renamed++;
    }
    if (!rc)
        rc = fsync_dir(w->dir);
    else if (names)
        for (size_t i = renamed; i < created; i++)
            unlink(tmps[i]);
    if (!rc && path_out && cap)
        snprintf(path_out, cap, "%s", names[nfiles - 1]);
    if (!rc)
        cps__log(CPS_LOG_INFO, "ckpt",
                 "wrote %s (%zu tensors, %u shard%s; %s; waited %.2f s for the disk, fsync "
                 "%.2f s)",
                 names[nfiles - 1], w->n, k, k > 1 ? "s" : "",
                 w->direct ? "O_DIRECT" : "through the page cache", w->disk_wait_us / 1e6,
                 w->fsync_us / 1e6);
    free(names);
    cps__ckpt_writer_abort(w);
    return rc;
}
