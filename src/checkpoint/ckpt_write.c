/* Checkpoint writer: safetensors shards written to temporaries, synced, then renamed. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/json.h"
#include "core/log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; chainps copies it as is and needs a little-endian host"
#endif

#define STREAM_ELEMS    ((size_t)4 << 20)  /* elements per fill call */
#define WRITE_CHUNK     ((size_t)64 << 20) /* bytes per write() of in-memory data */
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

/* The CRC and the write of one filled buffer run on a thread of their own while the next buffer
 * is filled: a fill of a running job's tensor waits on the network, the write on the disk, and
 * one after the other the export ran at the speed of neither. One buffer is handed over at a
 * time; the filler owns the other. */
typedef struct sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd;
    const char *path;
    const void *buf; /* handed over, not yet written (NULL: none) */
    size_t len;
    int stop;
    uint32_t crc;
    int rc; /* the first write error; later buffers are dropped */
} sink;

static void *sink_main(void *arg)
{
    sink *k = arg;
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (!k->buf && !k->stop)
            pthread_cond_wait(&k->cv, &k->mu);
        if (!k->buf)
            break;
        const void *b = k->buf;
        size_t n = k->len;
        int failed = k->rc;
        pthread_mutex_unlock(&k->mu);
        uint32_t crc = k->crc;
        int rc = 0;
        if (!failed) {
            crc = cps__ckpt_crc32(crc, b, n);
            rc = write_all(k->fd, b, n, k->path);
        }
        pthread_mutex_lock(&k->mu);
        k->crc = crc;
        if (rc && !k->rc)
            k->rc = rc;
        k->buf = NULL;
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* Wait until the sink holds no buffer; returns its error so far. */
static int sink_idle(sink *k)
{
    pthread_mutex_lock(&k->mu);
    while (k->buf)
        pthread_cond_wait(&k->cv, &k->mu);
    int rc = k->rc;
    pthread_mutex_unlock(&k->mu);
    return rc;
}

/* Hand `buf` over once the previous buffer is written: the caller may refill that one then. */
static int sink_put(sink *k, const void *buf, size_t len)
{
    pthread_mutex_lock(&k->mu);
    while (k->buf)
        pthread_cond_wait(&k->cv, &k->mu);
    int rc = k->rc;
    if (!rc) {
        k->buf = buf;
        k->len = len;
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    return rc;
}

static int write_tensor(wtensor *t, int fd, const char *path, void **stream_buf)
{
    uint32_t crc = 0;
    int rc = 0;
    if (!t->fill) {
        const char *p = t->data;
        for (uint64_t done = 0; done < t->nbytes && !rc;) {
            size_t k = t->nbytes - done < WRITE_CHUNK ? (size_t)(t->nbytes - done) : WRITE_CHUNK;
            crc = cps__ckpt_crc32(crc, p + done, k);
            rc = write_all(fd, p + done, k, path);
            done += k;
        }
        t->crc = crc;
        return rc;
    }
    uint32_t es = dtype_size(t->dtype);
    for (int i = 0; i < 2; i++)
        if (!stream_buf[i] && !(stream_buf[i] = aligned_alloc(64, STREAM_ELEMS * 8)))
            return CPS_ENOMEM;
    uint64_t numel = t->nbytes / es;
    sink k = {.fd = fd, .path = path};
    pthread_t th;
    /* A tensor of one fill has nothing to overlap: no thread. */
    int threaded = numel > STREAM_ELEMS;
    if (threaded) {
        pthread_mutex_init(&k.mu, NULL);
        pthread_cond_init(&k.cv, NULL);
        if (pthread_create(&th, NULL, sink_main, &k) != 0) {
            pthread_cond_destroy(&k.cv);
            pthread_mutex_destroy(&k.mu);
            threaded = 0;
        }
    }
    int cur = 0;
    for (uint64_t first = 0; first < numel && !rc;) {
        size_t n = numel - first < STREAM_ELEMS ? (size_t)(numel - first) : STREAM_ELEMS;
        rc = t->fill(t->arg, first, stream_buf[cur], n);
        if (rc) {
            cps__log(CPS_LOG_ERROR, "ckpt", "%s: producing tensor '%s' failed: %s", path, t->name,
                     cps_strerror(rc));
            break;
        }
        if (threaded) {
            rc = sink_put(&k, stream_buf[cur], n * es);
            cur ^= 1;
        } else {
            crc = cps__ckpt_crc32(crc, stream_buf[cur], n * es);
            rc = write_all(fd, stream_buf[cur], n * es, path);
        }
        first += n;
    }
    if (threaded) {
        int wrc = sink_idle(&k);
        pthread_mutex_lock(&k.mu);
        k.stop = 1;
        pthread_cond_broadcast(&k.cv);
        pthread_mutex_unlock(&k.mu);
        pthread_join(th, NULL);
        pthread_cond_destroy(&k.cv);
        pthread_mutex_destroy(&k.mu);
        crc = k.crc;
        if (!rc)
            rc = wrc;
    }
    t->crc = crc;
    return rc;
}

static int write_shard(cps__ckpt_writer *w, uint32_t s, const char *tmp, void **stream_buf)
{
    cps__json_buf b = {0};
    size_t hpos;
    int rc = build_header(w, s, &b, &hpos);
    if (rc) {
        cps__json_buf_fini(&b);
        return rc;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        cps__json_buf_fini(&b);
        return io_fail(tmp, "open", errno);
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    rc = write_all(fd, len8, 8, tmp);
    if (!rc)
        rc = write_all(fd, b.p, b.len, tmp);
    for (size_t i = 0; i < w->n && !rc; i++)
        if (w->t[i].shard == s)
            rc = write_tensor(&w->t[i], fd, tmp, stream_buf);
    if (!rc) {
        /* Same length as the placeholder header, so it overwrites it exactly. */
        for (size_t i = 0; i < w->n; i++)
            if (w->t[i].shard == s)
                put_hex(b.p + w->t[i].crc_pos, w->t[i].crc);
        put_hex(b.p + hpos, cps__ckpt_crc32(0, b.p, b.len));
        rc = pwrite_all(fd, b.p, b.len, 8, tmp);
    }
    if (!rc && fsync(fd) != 0)
        rc = io_fail(tmp, "fsync", errno);
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
    void *stream_buf[2] = {NULL, NULL};
    for (uint32_t s = 0; !rc && s < k; s++) {
        created = s + 1;
        rc = write_shard(w, s, tmps[s], stream_buf);
    }
    free(stream_buf[0]);
    free(stream_buf[1]);
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
        cps__log(CPS_LOG_INFO, "ckpt", "wrote %s (%zu tensors, %u shard%s)", names[nfiles - 1],
                 w->n, k, k > 1 ? "s" : "");
    free(names);
    cps__ckpt_writer_abort(w);
    return rc;
}
