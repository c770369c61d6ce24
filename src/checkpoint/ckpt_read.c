/* Checkpoint reader: opens a safetensors file or an index of shards and refuses anything that
 * does not add up, naming the file and the problem. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/json.h"
#include "core/log.h"

#define READ_CHUNK   ((size_t)64 << 20)
#define STREAM_ELEMS ((size_t)4 << 20)
#define INDEX_MAX    ((size_t)64 << 20)

typedef struct kv {
    const char *k, *v;
} kv;

typedef struct rshard {
    char *path;
    int fd;
    cps__json_doc *doc;
    kv *meta; /* non-checksum metadata, sorted by key */
    size_t nmeta;
} rshard;

struct cps__ckpt_reader {
    rshard *sh;
    size_t nsh;
    char *index_path;
    cps__json_doc *index_doc;
    cps__ckpt_tensor *t; /* sorted by name */
    size_t nt, tcap;
};

static int corrupt(const char *file, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int corrupt(const char *file, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    cps__log(CPS_LOG_ERROR, "ckpt", "%s: corrupt checkpoint: %s", file, what);
    return CPS_ECORRUPT;
}

static int io_err(const char *file, const char *op, int err)
{
    cps__log(CPS_LOG_ERROR, "ckpt", "%s: %s failed: %s", file, op, strerror(err));
    return CPS_EIO;
}

static const struct {
    const char *name;
    uint32_t size;
} dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
              {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
              {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};

static uint32_t dtype_size(const char *s)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, s))
            return dtypes[i].size;
    return 0;
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return io_err(path, "read", errno);
        if (k == 0)
            return corrupt(path, "file ends early (at byte %llu)", (unsigned long long)off);
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static int parse_crc(const char *s, uint32_t *out)
{
    if (strlen(s) != 14 || strncmp(s, "crc32:", 6) != 0)
        return -1;
    uint32_t v = 0;
    for (int i = 6; i < 14; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static int cmp_kv(const void *a, const void *b)
{
    return strcmp(((const kv *)a)->k, ((const kv *)b)->k);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const cps__ckpt_tensor *)a)->name, ((const cps__ckpt_tensor *)b)->name);
}

static int cmp_tensor_off(const void *a, const void *b)
{
    const cps__ckpt_tensor *x = *(const cps__ckpt_tensor *const *)a;
    const cps__ckpt_tensor *y = *(const cps__ckpt_tensor *const *)b;
    if (x->data_begin != y->data_begin)
        return x->data_begin < y->data_begin ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static cps__ckpt_tensor *new_tensor(cps__ckpt_reader *r)
{
    if (r->nt == r->tcap) {
        size_t cap = r->tcap ? 2 * r->tcap : 64;
        cps__ckpt_tensor *t = realloc(r->t, cap * sizeof *t);
        if (!t)
            return NULL;
        r->t = t;
        r->tcap = cap;
    }
    cps__ckpt_tensor *t = &r->t[r->nt++];
    memset(t, 0, sizeof *t);
    return t;
}

/* One header entry -> tensor (offsets not yet checked against each other). */
static int parse_entry(const char *path, const cps__json *e, cps__ckpt_tensor *t)
{
    t->name = e->key;
    if (e->key_len == 0)
        return corrupt(path, "empty tensor name");
    if (e->type != CPS_JSON_OBJECT)
        return corrupt(path, "tensor '%s': entry is not an object", e->key);
    const cps__json *dt = cps__json_get(e, "dtype"), *sh = cps__json_get(e, "shape");
    const cps__json *off = cps__json_get(e, "data_offsets");
    if (!dt || !sh || !off || e->n != 3)
        return corrupt(path, "tensor '%s': needs exactly dtype, shape and data_offsets", e->key);
    if (dt->type != CPS_JSON_STRING || !(t->elem_size = dtype_size(dt->str)))
        return corrupt(path, "tensor '%s': unknown dtype", e->key);
    t->dtype = dt->str;
    if (sh->type != CPS_JSON_ARRAY || sh->n > CPS_CKPT_MAX_DIMS)
        return corrupt(path, "tensor '%s': shape is not an array of at most %d dims", e->key,
                       CPS_CKPT_MAX_DIMS);
    t->ndim = (uint32_t)sh->n;
    t->numel = 1;
    uint32_t d = 0;
    int overflow = 0;
    for (const cps__json *c = sh->child; c; c = c->next, d++) {
        if (c->type != CPS_JSON_NUMBER || !c->is_uint)
            return corrupt(path, "tensor '%s': shape holds a non-integer", e->key);
        t->shape[d] = c->u64;
        if (c->u64 && t->numel > UINT64_MAX / c->u64)
            overflow = 1;
        else
            t->numel *= c->u64;
    }
    if (overflow || t->numel > UINT64_MAX / t->elem_size)
        return corrupt(path, "tensor '%s': shape too large", e->key);
    t->nbytes = t->numel * t->elem_size;
    if (off->type != CPS_JSON_ARRAY || off->n != 2 || off->child->type != CPS_JSON_NUMBER ||
        !off->child->is_uint || off->child->next->type != CPS_JSON_NUMBER ||
        !off->child->next->is_uint)
        return corrupt(path, "tensor '%s': data_offsets is not [begin, end]", e->key);
    uint64_t b = off->child->u64, en = off->child->next->u64;
    if (en < b)
        return corrupt(path, "tensor '%s': data_offsets end %llu before begin %llu", e->key,
                       (unsigned long long)en, (unsigned long long)b);
    if (en - b != t->nbytes)
        return corrupt(path,
                       "tensor '%s': shape and dtype give %llu bytes but data_offsets span %llu",
                       e->key, (unsigned long long)t->nbytes, (unsigned long long)(en - b));
    t->data_begin = b;
    return 0;
}

/* Offsets, sorted, must tile the data section exactly. */
static int check_layout(const char *path, cps__ckpt_tensor *t, size_t n, uint64_t data_len)
{
    cps__ckpt_tensor **v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return CPS_ENOMEM;
    for (size_t i = 0; i < n; i++)
        v[i] = &t[i];
    qsort(v, n, sizeof *v, cmp_tensor_off);
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (v[i]->data_begin < at)
            rc = corrupt(path, "tensor '%s' overlaps the tensor before it (begins at %llu < %llu)",
                         v[i]->name, (unsigned long long)v[i]->data_begin, (unsigned long long)at);
        else if (v[i]->data_begin > at)
            rc = corrupt(path, "gap in the data section before tensor '%s' (%llu..%llu)",
                         v[i]->name, (unsigned long long)at, (unsigned long long)v[i]->data_begin);
        else if (v[i]->nbytes > data_len - at)
            rc = corrupt(path, "tensor '%s' ends at %llu, past the data section (%llu bytes)",
                         v[i]->name, (unsigned long long)(at + v[i]->nbytes),
                         (unsigned long long)data_len);
        at += v[i]->nbytes;
    }
    if (!rc && at != data_len)
        rc = corrupt(path, "data section has %llu bytes but the tensors cover %llu",
                     (unsigned long long)data_len, (unsigned long long)at);
    free(v);
    return rc;
}

/* CRC-32 of the header with the 8 digits of its own checksum read as '0'. */
static int check_header_crc(const char *path, const char *hdr, size_t n, const cps__json *v)
{
    uint32_t want;
    if (v->type != CPS_JSON_STRING || parse_crc(v->str, &want) || v->raw_len != 14)
        return corrupt(path, "checksum/__header__ is not \"crc32:<8 lowercase hex digits>\"");
    size_t at = v->raw_off + 6;
    uint32_t crc = cps__ckpt_crc32(0, hdr, at);
    crc = cps__ckpt_crc32(crc, "00000000", 8);
    crc = cps__ckpt_crc32(crc, hdr + at + 8, n - at - 8);
    if (crc != want)
        return corrupt(path, "header checksum mismatch (header says %08x, header bytes give %08x)",
                       want, crc);
    return 0;
}

static int parse_meta(const char *path, rshard *sh, const cps__json *m, const char *hdr,
                      size_t hlen, const cps__json **checks, int *hdr_crc)
{
    if (m->type != CPS_JSON_OBJECT)
        return corrupt(path, "__metadata__ is not an object");
    sh->meta = malloc((m->n ? m->n : 1) * sizeof *sh->meta);
    if (!sh->meta)
        return CPS_ENOMEM;
    for (const cps__json *c = m->child; c; c = c->next) {
        if (c->type != CPS_JSON_STRING)
            return corrupt(path, "__metadata__ value of '%s' is not a string", c->key);
        if (!strcmp(c->key, "checksum/__header__")) {
            int rc = check_header_crc(path, hdr, hlen, c);
            if (rc)
                return rc;
            *hdr_crc = 1;
        } else if (!strncmp(c->key, "checksum/", 9)) {
            *checks = m; /* resolved once the shard's tensors are known */
        } else {
            sh->meta[sh->nmeta++] = (kv){c->key, c->str};
        }
    }
    if (sh->nmeta)
        qsort(sh->meta, sh->nmeta, sizeof *sh->meta, cmp_kv);
    return 0;
}

static int apply_checksums(const char *path, const cps__json *m, cps__ckpt_tensor *t, size_t n)
{
    for (const cps__json *c = m->child; c; c = c->next) {
        if (strncmp(c->key, "checksum/", 9) || !strcmp(c->key, "checksum/__header__"))
            continue;
        cps__ckpt_tensor key = {.name = c->key + 9};
        cps__ckpt_tensor *hit = n ? bsearch(&key, t, n, sizeof *t, cmp_tensor_name) : NULL;
        if (!hit)
            return corrupt(path, "%s names no tensor of this file", c->key);
        if (parse_crc(c->str, &hit->checksum))
            return corrupt(path, "%s is not \"crc32:<8 lowercase hex digits>\"", c->key);
        hit->has_checksum = 1;
    }
    return 0;
}

static int open_shard(cps__ckpt_reader *r, const char *path, int missing_is_corrupt)
{
    rshard *sh = &r->sh[r->nsh];
    memset(sh, 0, sizeof *sh);
    sh->fd = -1;
    if (!(sh->path = strdup(path)))
        return CPS_ENOMEM;
    r->nsh++;
    sh->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (sh->fd < 0) {
        if (errno == ENOENT && missing_is_corrupt)
            return corrupt(r->index_path, "shard %s is missing", path);
        return io_err(path, "open", errno);
    }
    struct stat st;
    if (fstat(sh->fd, &st) != 0)
        return io_err(path, "stat", errno);
    if (!S_ISREG(st.st_mode))
        return corrupt(path, "not a regular file");
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8)
        return corrupt(path, "file is %llu bytes, shorter than the 8-byte header length",
                       (unsigned long long)size);
    unsigned char len8[8];
    int rc = pread_all(sh->fd, len8, 8, 0, path);
    if (rc)
        return rc;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    if (hlen > CPS_CKPT_HEADER_MAX)
        return corrupt(path, "header length %llu exceeds the %u byte limit",
                       (unsigned long long)hlen, CPS_CKPT_HEADER_MAX);
    if (hlen > size - 8)
        return corrupt(path, "header length %llu exceeds the file size %llu (truncated?)",
                       (unsigned long long)hlen, (unsigned long long)size);
    char *hdr = malloc(hlen ? hlen : 1);
    if (!hdr)
        return CPS_ENOMEM;
    rc = pread_all(sh->fd, hdr, hlen, 8, path);
    const cps__json *root = NULL;
    char err[200];
    if (!rc && (hlen == 0 || hdr[0] != '{'))
        rc = corrupt(path, "header does not start with '{'");
    if (!rc && (rc = cps__json_parse(hdr, hlen, &sh->doc, &root, err, sizeof err)) != 0)
        rc = rc == CPS_ECORRUPT ? corrupt(path, "header: %s", err) : rc;
    if (!rc && root->type != CPS_JSON_OBJECT)
        rc = corrupt(path, "header is not a JSON object");
    const cps__json *checks = NULL;
    int hdr_crc = 0;
    size_t first = r->nt;
    for (const cps__json *e = root && !rc ? root->child : NULL; e && !rc; e = e->next) {
        if (!strcmp(e->key, "__metadata__")) {
            rc = parse_meta(path, sh, e, hdr, hlen, &checks, &hdr_crc);
            continue;
        }
        cps__ckpt_tensor *t = new_tensor(r);
        if (!t) {
            rc = CPS_ENOMEM;
            break;
        }
        rc = parse_entry(path, e, t);
        t->file = sh->path;
        t->shard = (uint32_t)(r->nsh - 1);
        t->file_offset = 8 + hlen + t->data_begin;
    }
    free(hdr);
    cps__ckpt_tensor *mine = r->nt > first ? r->t + first : NULL;
    if (!rc)
        rc = check_layout(path, mine, r->nt - first, size - 8 - hlen);
    if (!rc && mine)
        qsort(mine, r->nt - first, sizeof *r->t, cmp_tensor_name);
    if (!rc && checks)
        rc = apply_checksums(path, checks, mine, r->nt - first);
    /* A file with checksums (chainps writes them all) must have them all: otherwise one
     * flipped bit in a "checksum/..." key would silently turn a check off. */
    if (!rc && (checks || hdr_crc)) {
        if (!hdr_crc)
            rc = corrupt(path, "tensor checksums but no checksum/__header__");
        for (size_t i = first; i < r->nt && !rc; i++)
            if (!r->t[i].has_checksum)
                rc = corrupt(path, "tensor '%s' has no checksum (the others do)", r->t[i].name);
    }
    return rc;
}

static int read_small_file(const char *path, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return io_err(path, "open", errno);
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = io_err(path, "stat", errno);
    else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > INDEX_MAX)
        rc = corrupt(path, "index is not a regular file of at most %zu bytes", INDEX_MAX);
    char *buf = rc ? NULL : malloc((size_t)st.st_size + 1);
    if (!rc && !buf)
        rc = CPS_ENOMEM;
    if (!rc)
        rc = pread_all(fd, buf, (size_t)st.st_size, 0, path);
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = (size_t)st.st_size;
    return 0;
}

static int kv_equal(const kv *a, size_t na, const kv *b, size_t nb, const char **diff)
{
    size_t i = 0, j = 0;
    while (i < na && j < nb) {
        int c = strcmp(a[i].k, b[j].k);
        if (c || strcmp(a[i].v, b[j].v)) {
            *diff = c > 0 ? b[j].k : a[i].k;
            return 0;
        }
        i++, j++;
    }
    if (i < na || j < nb) {
        *diff = i < na ? a[i].k : b[j].k;
        return 0;
    }
    return 1;
}

/* Distinct shard file names of the weight_map, in order of first appearance. */
static int index_files(const char *ipath, const cps__json *wm, const char ***files, size_t *nf)
{
    const char **f = malloc((wm->n ? wm->n : 1) * sizeof *f);
    if (!f)
        return CPS_ENOMEM;
    size_t n = 0;
    for (const cps__json *c = wm->child; c; c = c->next) {
        if (c->type != CPS_JSON_STRING || c->str_len == 0 || strchr(c->str, '/') ||
            !strcmp(c->str, ".") || !strcmp(c->str, "..")) {
            free(f);
            return corrupt(ipath, "weight_map entry '%s' is not a plain file name", c->key);
        }
        size_t i = 0;
        while (i < n && strcmp(f[i], c->str))
            i++;
        if (i == n)
            f[n++] = c->str;
    }
    *files = f;
    *nf = n;
    return 0;
}

static int open_index(cps__ckpt_reader *r, const char *ipath)
{
    char *text;
    size_t len;
    if (!(r->index_path = strdup(ipath)))
        return CPS_ENOMEM;
    int rc = read_small_file(ipath, &text, &len);
    if (rc)
        return rc;
    const cps__json *root = NULL, *wm = NULL, *md = NULL;
    char err[200];
    rc = cps__json_parse(text, len, &r->index_doc, &root, err, sizeof err);
    free(text);
    if (rc)
        return rc == CPS_ECORRUPT ? corrupt(ipath, "%s", err) : rc;
    wm = cps__json_get(root, "weight_map");
    md = cps__json_get(root, "metadata");
    if (!wm || wm->type != CPS_JSON_OBJECT || wm->n == 0)
        return corrupt(ipath, "no weight_map object with at least one tensor");
    if (md && md->type != CPS_JSON_OBJECT)
        return corrupt(ipath, "metadata is not an object");
    const char **files = NULL;
    size_t nf = 0;
    if ((rc = index_files(ipath, wm, &files, &nf)) != 0)
        return rc;
    if (!(r->sh = calloc(nf, sizeof *r->sh))) {
        free(files);
        return CPS_ENOMEM;
    }
    const char *slash = strrchr(ipath, '/');
    int dlen = slash ? (int)(slash - ipath + 1) : 0;
    for (size_t i = 0; i < nf && !rc; i++) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%.*s%s", dlen, ipath, files[i]) >= (int)sizeof p)
            rc = corrupt(ipath, "shard path too long");
        else
            rc = open_shard(r, p, 1);
    }
    /* Every tensor of shard i must be mapped to shard i; with the counts equal and the names
     * unique (checked by the caller), the weight_map is then exactly the shards' contents. */
    for (size_t i = 0; i < r->nt && !rc; i++) {
        const cps__json *m = cps__json_get(wm, r->t[i].name);
        if (!m)
            rc = corrupt(ipath, "tensor '%s' of %s is not in the weight_map", r->t[i].name,
                         r->t[i].file);
        else if (strcmp(m->str, files[r->t[i].shard]))
            rc = corrupt(ipath, "weight_map puts '%s' in %s but it is in %s", r->t[i].name, m->str,
                         r->t[i].file);
    }
    free(files);
    if (!rc)
        qsort(r->t, r->nt, sizeof *r->t, cmp_tensor_name); /* for cps__ckpt_reader_find */
    if (!rc && wm->n != r->nt) {
        for (const cps__json *c = wm->child; c && !rc; c = c->next)
            if (!cps__ckpt_reader_find(r, c->key))
                rc = corrupt(ipath, "weight_map names '%s' but %s holds no such tensor", c->key,
                             c->str);
        if (!rc)
            rc = corrupt(ipath, "weight_map has %zu entries for %zu tensors", wm->n, r->nt);
    }
    for (const cps__json *c = md ? md->child : NULL; c && !rc; c = c->next) {
        if (!strcmp(c->key, "total_size")) {
            uint64_t total = 0;
            for (size_t i = 0; i < r->nt; i++)
                total += r->t[i].nbytes;
            if (c->type != CPS_JSON_NUMBER || !c->is_uint || c->u64 != total)
                rc = corrupt(ipath, "total_size is not %llu, the sum of the tensor sizes",
                             (unsigned long long)total);
        } else if (c->type != CPS_JSON_STRING) {
            rc = corrupt(ipath, "metadata '%s' is not a string", c->key);
        } else {
            const char *v = cps__ckpt_reader_meta(r, c->key);
            if (!v || strcmp(v, c->str))
                rc = corrupt(ipath, "metadata '%s' differs from shard %s", c->key, r->sh[0].path);
        }
    }
    return rc;
}

static int finish(cps__ckpt_reader *r)
{
    if (r->nt)
        qsort(r->t, r->nt, sizeof *r->t, cmp_tensor_name);
    for (size_t i = 1; i < r->nt; i++)
        if (!strcmp(r->t[i].name, r->t[i - 1].name))
            return corrupt(r->t[i].file, "tensor '%s' also appears in %s", r->t[i].name,
                           r->t[i - 1].file);
    for (size_t i = 1; i < r->nsh; i++) {
        const char *diff;
        if (!kv_equal(r->sh[0].meta, r->sh[0].nmeta, r->sh[i].meta, r->sh[i].nmeta, &diff))
            return corrupt(r->sh[i].path,
                           "metadata '%s' differs from shard %s (mixed checkpoints?)", diff,
                           r->sh[0].path);
    }
    return 0;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

int cps__ckpt_reader_open(const char *path, cps__ckpt_reader **out)
{
    if (!path || !out)
        return CPS_EINVAL;
    cps__ckpt_reader *r = calloc(1, sizeof *r);
    if (!r)
        return CPS_ENOMEM;
    char p[PATH_MAX];
    int rc = 0;
    if (is_dir(path)) {
        char single[PATH_MAX], index[PATH_MAX];
        if (snprintf(single, sizeof single, "%s/model.safetensors", path) >= PATH_MAX ||
            snprintf(index, sizeof index, "%s/model.safetensors.index.json", path) >= PATH_MAX) {
            rc = CPS_EINVAL;
        } else if (exists(single) && exists(index)) {
            rc = corrupt(path, "holds both model.safetensors and an index: which is current?");
        } else if (!exists(single) && !exists(index)) {
            cps__log(CPS_LOG_ERROR, "ckpt", "%s: no model.safetensors or index in directory", path);
            rc = CPS_EIO;
        } else {
            snprintf(p, sizeof p, "%s", exists(index) ? index : single);
        }
    } else if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        rc = CPS_EINVAL;
    }
    size_t n = strlen(p);
    if (!rc && n > 5 && !strcmp(p + n - 5, ".json")) {
        rc = open_index(r, p);
    } else if (!rc) {
        if (!(r->sh = calloc(1, sizeof *r->sh)))
            rc = CPS_ENOMEM;
        else
            rc = open_shard(r, p, 0);
    }
    if (!rc)
        rc = finish(r);
    if (rc) {
        cps__ckpt_reader_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

void cps__ckpt_reader_close(cps__ckpt_reader *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nsh; i++) {
        if (r->sh[i].fd >= 0)
            close(r->sh[i].fd);
        free(r->sh[i].path);
        free(r->sh[i].meta);
        cps__json_free(r->sh[i].doc);
    }
    free(r->sh);
    free(r->t);
    free(r->index_path);
    cps__json_free(r->index_doc);
    free(r);
}

size_t cps__ckpt_reader_count(const cps__ckpt_reader *r)
{
    return r ? r->nt : 0;
}

const cps__ckpt_tensor *cps__ckpt_reader_tensor(const cps__ckpt_reader *r, size_t i)
{
    return r && i < r->nt ? &r->t[i] : NULL;
}

const cps__ckpt_tensor *cps__ckpt_reader_find(const cps__ckpt_reader *r, const char *name)
{
    if (!r || !name || !r->nt)
        return NULL;
    cps__ckpt_tensor key = {.name = name};
    return bsearch(&key, r->t, r->nt, sizeof *r->t, cmp_tensor_name);
}

const char *cps__ckpt_reader_meta(const cps__ckpt_reader *r, const char *key)
{
    if (!r || !key || r->nsh == 0 || r->sh[0].nmeta == 0)
        return NULL;
    kv k = {key, NULL};
    kv *hit = bsearch(&k, r->sh[0].meta, r->sh[0].nmeta, sizeof k, cmp_kv);
    return hit ? hit->v : NULL;
}

size_t cps__ckpt_reader_meta_count(const cps__ckpt_reader *r)
{
    return r && r->nsh ? r->sh[0].nmeta : 0;
}

int cps__ckpt_reader_meta_at(const cps__ckpt_reader *r, size_t i, const char **key,
                             const char **value)
{
    if (!r || i >= cps__ckpt_reader_meta_count(r) || !key || !value)
        return CPS_EINVAL;
    *key = r->sh[0].meta[i].k;
    *value = r->sh[0].meta[i].v;
    return 0;
}

size_t cps__ckpt_reader_shard_count(const cps__ckpt_reader *r)
{
    return r ? r->nsh : 0;
}

const char *cps__ckpt_reader_shard_path(const cps__ckpt_reader *r, size_t i)
{
    return r && i < r->nsh ? r->sh[i].path : NULL;
}

const char *cps__ckpt_reader_index_path(const cps__ckpt_reader *r)
{
    return r ? r->index_path : NULL;
}

static int crc_result(const cps__ckpt_tensor *t, uint32_t crc)
{
    if (t->has_checksum && crc != t->checksum)
        return corrupt(t->file,
                       "tensor '%s': checksum mismatch (header says %08x, data gives %08x)",
                       t->name, t->checksum, crc);
    return 0;
}

int cps__ckpt_reader_read(cps__ckpt_reader *r, const cps__ckpt_tensor *t, void *buf, size_t cap)
{
    if (!r || !t || (!buf && t->nbytes))
        return CPS_EINVAL;
    if (cap < t->nbytes)
        return CPS_ESIZE;
    int fd = r->sh[t->shard].fd;
    uint32_t crc = 0;
    for (uint64_t done = 0; done < t->nbytes;) {
        size_t k = t->nbytes - done < READ_CHUNK ? (size_t)(t->nbytes - done) : READ_CHUNK;
        int rc = pread_all(fd, (char *)buf + done, k, t->file_offset + done, t->file);
        if (rc)
            return rc;
        crc = cps__ckpt_crc32(crc, (char *)buf + done, k);
        done += k;
    }
    return crc_result(t, crc);
}

int cps__ckpt_reader_stream(cps__ckpt_reader *r, const cps__ckpt_tensor *t, cps__ckpt_sink_fn sink,
                            void *arg)
{
    if (!r || !t)
        return CPS_EINVAL;
    size_t chunk = STREAM_ELEMS * t->elem_size;
    void *buf = aligned_alloc(64, chunk);
    if (!buf)
        return CPS_ENOMEM;
    int fd = r->sh[t->shard].fd;
    posix_fadvise(fd, (off_t)t->file_offset, (off_t)t->nbytes, POSIX_FADV_SEQUENTIAL);
    uint32_t crc = 0;
    int rc = 0;
    for (uint64_t done = 0; done < t->nbytes && !rc;) {
        size_t k = t->nbytes - done < chunk ? (size_t)(t->nbytes - done) : chunk;
        rc = pread_all(fd, buf, k, t->file_offset + done, t->file);
        if (!rc) {
            crc = cps__ckpt_crc32(crc, buf, k);
            if (sink)
                rc = sink(arg, done / t->elem_size, buf, k / t->elem_size);
        }
        done += k;
    }
    free(buf);
    return rc ? rc : crc_result(t, crc);
}

int cps__ckpt_reader_verify(cps__ckpt_reader *r, const cps__ckpt_tensor *t)
{
    if (t && !t->has_checksum)
        return 0;
    return cps__ckpt_reader_stream(r, t, NULL, NULL);
}

int cps__ckpt_reader_check_names(const cps__ckpt_reader *r, const char *const *names, size_t n)
{
    if (!r || (n && !names))
        return CPS_EINVAL;
    const char *where = r->index_path ? r->index_path : r->nsh ? r->sh[0].path : "?";
    for (size_t i = 0; i < r->nt; i++) {
        const char *base = r->t[i].name;
        size_t plen = strlen(CPS_CKPT_OPTIM_PREFIX);
        if (!strncmp(base, CPS_CKPT_OPTIM_PREFIX, plen)) {
            const char *slash = strchr(base + plen, '/');
            if (slash)
                base = slash + 1;
        }
        size_t j = 0;
        /* A worker's local tensor may itself be named optim/... (cps_local_add): its full name. */
        while (j < n && strcmp(names[j], base) && strcmp(names[j], r->t[i].name))
            j++;
        if (j == n) {
            cps__log(CPS_LOG_ERROR, "ckpt", "%s: tensor '%s' is not known to the job", where,
                     r->t[i].name);
            return CPS_ENOTFOUND;
        }
    }
    for (size_t j = 0; j < n; j++) {
        if (!cps__ckpt_reader_find(r, names[j])) {
            cps__log(CPS_LOG_ERROR, "ckpt", "%s: holds no tensor '%s' (the job declares it)", where,
                     names[j]);
            return CPS_ENOTFOUND;
        }
    }
    return 0;
}
