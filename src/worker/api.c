/* The public worker API (include/chainps/chainps.h): argument checks, tensor bookkeeping and
 * the mapping of each call onto an operation of the request engine in client.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "core/log.h"
#include "node/msg.h"

static cps_tensor *find_tensor(cps_client *c, const char *name)
{
    for (cps_tensor *t = c->tensors; t; t = t->next)
        if (strcmp(t->name, name) == 0)
            return t;
    return NULL;
}

/* A tensor's identity: length, table shape and shape, each compared. */
static int same_shape(const cps_tensor *t, uint64_t rows, uint32_t ndim, const uint64_t *dims)
{
    return t->rows == rows && t->ndim == ndim && memcmp(t->dims, dims, ndim * sizeof *dims) == 0;
}

static void format_shape(char *buf, size_t len, uint32_t ndim, const uint64_t *dims)
{
    size_t off = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%llu", i ? "x" : "",
                                (unsigned long long)dims[i]);
}

static int declare(cps_client *c, const char *name, uint32_t ndim, const uint64_t *dims,
                   uint64_t rows, uint32_t cols, const cps_init *init, const cps_optim *optim,
                   cps_tensor **out)
{
    if (!c || !name || !out)
        return CPS_EINVAL;
    *out = NULL;
    size_t nlen = strlen(name);
    if (nlen == 0 || nlen > 255) {
        cps__log(CPS_LOG_ERROR, "worker", "a tensor name must be 1..255 bytes");
        return CPS_EINVAL;
    }
    uint64_t length = 1;
    if (!dims || ndim < 1 || ndim > CPS_MAX_NDIM) {
        cps__log(CPS_LOG_ERROR, "worker", "tensor %s: a shape needs 1..%d dimensions, not %u", name,
                 CPS_MAX_NDIM, ndim);
        return CPS_EINVAL;
    }
    for (uint32_t i = 0; i < ndim; i++) {
        if (dims[i] == 0 || length > (UINT64_C(1) << 62) / dims[i]) {
            cps__log(CPS_LOG_ERROR, "worker",
                     "tensor %s: dimension %u is %llu (each must be >= 1, the product < 2^62)",
                     name, i, (unsigned long long)dims[i]);
            return CPS_EINVAL;
        }
        length *= dims[i];
    }
    /* Before anything is laid out or sent: see cps__config's max_tensor_mb. */
    if (length > (uint64_t)c->cfg.max_tensor_mb * (UINT64_C(1) << 20) / sizeof(float)) {
        cps__log(CPS_LOG_ERROR, "worker",
                 "tensor %s: %llu values (%.1f GB of float32) is more than this job declares "
                 "(CHAINPS_MAX_TENSOR_MB=%u): check the shape, or raise the limit if the "
                 "servers' disks hold it",
                 name, (unsigned long long)length, (double)length * sizeof(float) / 1e9,
                 c->cfg.max_tensor_mb);
        return CPS_EINVAL;
    }
    cps__param_spec spec;
    int rc = cps__spec_make(name, init, optim, &spec);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->lock);
    cps_tensor *t = find_tensor(c, name);
    if (t) {
        rc = (same_shape(t, rows, ndim, dims) && memcmp(&t->spec, &spec, sizeof spec) == 0)
                 ? 0
                 : CPS_EEXIST;
        if (rc == 0) {
            *out = t;
        } else {
            char was[200], now[200];
            format_shape(was, sizeof was, t->ndim, t->dims);
            format_shape(now, sizeof now, ndim, dims);
            cps__log(CPS_LOG_ERROR, "worker",
                     "tensor %s declared again with another definition (shape %s, was %s)", name,
                     now, was);
        }
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    t = calloc(1, sizeof *t);
    if (!t) {
        pthread_mutex_unlock(&c->lock);
        return CPS_ENOMEM;
    }
    memcpy(t->name, name, nlen + 1);
    t->length = length;
    t->rows = rows;
    t->cols = cols;
    t->ndim = ndim;
    memcpy(t->dims, dims, ndim * sizeof *dims);
    t->hash = cps__hash64(name, nlen);
    t->spec = spec;
    t->codec = c->cfg.grad_codec; /* CHAINPS_COMPRESS's codec, if any; cps_tensor_compress */
    rc = cps__layout_tensor(t, c->view);
    if (rc == 0) {
        /* The scheduler keeps the names and shapes, so a checkpoint can name the keys. */
        cps__tensor_desc d = {.kind = rows ? 1 : 0,
                              .cols = rows ? cols : 0,
                              .length = length,
                              .rows = rows,
                              .spec = spec,
                              .ndim = ndim};
        memcpy(d.dims, dims, ndim * sizeof *dims);
        memcpy(d.name, name, nlen + 1);
        rc = cps__client_register(c, &d);
    }
    if (rc == 0) {
        cps__op op = {
            .so = {.kind = OP_DECLARE, .nparts = t->nparts}, .spec = &t->spec, .parts = t->parts};
        rc = cps__client_run(c, &op, NULL, 0, 1);
        /* op.so.step: 0 for a new job; the job's current step for a late joiner. The session
         * starts every tensor not pushed yet at the highest step any declaration found. */
        if (rc == 0)
            cps__sess_clock_add(c->sess, &t->clock, op.so.step);
        if (rc == 0 && op.so.step)
            cps__log(CPS_LOG_INFO, "worker", "tensor %s: joining at step %llu", name,
                     (unsigned long long)op.so.step);
    }
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "worker", "declaring tensor %s failed: %s", name, cps_strerror(rc));
        cps__parts_free(t->parts, t->nparts);
        free(t);
    } else {
        t->next = c->tensors;
        c->tensors = t;
        *out = t;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int cps_tensor_declare(cps_client *c, const char *name, uint64_t length, const cps_init *init,
                       const cps_optim *optim, cps_tensor **out)
{
    cps__why_clear();
    return declare(c, name, 1, &length, 0, 0, init, optim, out);
}

int cps_tensor_declare_shape(cps_client *c, const char *name, uint32_t ndim, const uint64_t *dims,
                             const cps_init *init, const cps_optim *optim, cps_tensor **out)
{
    cps__why_clear();
    return declare(c, name, ndim, dims, 0, 0, init, optim, out);
}

int cps_table_declare(cps_client *c, const char *name, uint64_t rows, uint32_t cols,
                      const cps_init *init, const cps_optim *optim, cps_tensor **out)
{
    cps__why_clear();
    if (rows == 0 || cols == 0 || rows > UINT64_MAX / cols)
        return CPS_EINVAL;
    uint64_t dims[2] = {rows, cols};
    return declare(c, name, 2, dims, rows, cols, init, optim, out);
}

uint64_t cps_tensor_step(const cps_tensor *t)
{
    return t ? t->clock.step : 0;
}

uint64_t cps_start_step(cps_client *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->lock);
    uint64_t step = cps__sess_start_step(c->sess);
    pthread_mutex_unlock(&c->lock);
    return step;
}

uint64_t cps_tensor_length(const cps_tensor *t)
{
    return t ? t->length : 0;
}

const char *cps_tensor_name(const cps_tensor *t)
{
    return t ? t->name : NULL;
}

uint32_t cps_tensor_ndim(const cps_tensor *t)
{
    return t ? t->ndim : 0;
}

uint64_t cps_tensor_dim(const cps_tensor *t, uint32_t i)
{
    return t && i < t->ndim ? t->dims[i] : 0;
}

int cps_tensor_compress(cps_client *c, cps_tensor *t, const char *spec)
{
    cps__why_clear();
    if (!c || !t || !spec)
        return CPS_EINVAL;
    cps__gradcodec gc;
    if (cps__gradcodec_parse(spec, &gc) != 0) {
        cps__log(CPS_LOG_ERROR, "worker",
                 "tensor %s: '%s' is not a gradient codec (fp16, bf16, topk:R with 0 < R <= 1, "
                 "or none)",
                 t->name, spec);
        return CPS_EINVAL;
    }
    pthread_mutex_lock(&c->lock);
    /* Between lossy codecs the residuals stay: they are gradient not sent yet, whatever sends
     * it. Turned off, there is no later encoding to carry them: they are dropped. */
    if (gc.kind == CPS_GC_NONE) {
        for (uint32_t i = 0; i < t->nparts; i++) {
            free(t->parts[i].resid);
            t->parts[i].resid = NULL;
        }
    }
    t->codec = gc;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/* A failed operation's reason for cps_last_error_message(), unless this thread's own lines
 * already hold it: an asynchronous one may have failed inside another thread's call. */
static void why_from_op(const cps__op *op)
{
    if (op->why[0] && !strstr(cps_last_error_message(), op->why))
        cps__why_set(op->why);
}

/* Start (and with `wait` finish) a whole-tensor operation. */
static int tensor_op(cps_client *c, cps_tensor *t, int kind, const float *grad, float *out,
                     uint64_t len, cps_handle **h)
{
    if (!c || !t || ((kind == OP_PUSH || kind == OP_PUSH_PULL) && !grad) ||
        ((kind == OP_PULL || kind == OP_PUSH_PULL) && !out))
        return CPS_EINVAL;
    if (len != t->length) {
        cps__log(CPS_LOG_ERROR, "worker", "tensor %s has %llu values, the call passed %llu",
                 t->name, (unsigned long long)t->length, (unsigned long long)len);
        return CPS_ESIZE;
    }
    cps_handle *hd = NULL;
    cps__op local;
    cps__op *op = &local;
    if (h) {
        hd = calloc(1, sizeof *hd);
        if (!hd)
            return CPS_ENOMEM;
        op = &hd->op;
    }
    memset(op, 0, sizeof *op);
    op->so.kind = kind;
    op->so.nparts = t->nparts;
    op->grad = grad;
    op->out = out;
    op->parts = t->parts;
    pthread_mutex_lock(&c->lock);
    if (kind != OP_PULL && t->codec.kind != CPS_GC_NONE) {
        /* Encoded once, here: the request's every send carries these bytes. */
        int erc = cps__op_encode(c, t, op);
        if (erc != 0) {
            pthread_mutex_unlock(&c->lock);
            cps__log(CPS_LOG_ERROR, "worker", "tensor %s: cannot encode its gradient: %s", t->name,
                     cps_strerror(erc));
            free(hd);
            return erc;
        }
    }
    /* The session moves a push on to the tensor's next step and flags its first. */
    int rc = cps__client_run(c, op, &t->clock, 1, h == NULL);
    if (rc != 0)
        why_from_op(op);
    if (kind == OP_PUSH || kind == OP_PUSH_PULL) {
        c->stats.pushes++;
        cps__client_publish_step(c, op->so.step);
    }
    if (kind == OP_PULL || kind == OP_PUSH_PULL)
        c->stats.pulls++;
    pthread_mutex_unlock(&c->lock);
    if (h) {
        if (rc != 0 && op->so.pending == 0) {
            cps__op_enc_free(op);
            free(hd);
            return rc;
        }
        hd->op.in_use = 1;
        *h = hd;
        return 0;
    }
    cps__op_enc_free(op);
    return rc;
}

int cps_push(cps_client *c, cps_tensor *t, const float *grad, uint64_t len)
{
    cps__why_clear();
    return tensor_op(c, t, OP_PUSH, grad, NULL, len, NULL);
}

int cps_pull(cps_client *c, cps_tensor *t, float *out, uint64_t len)
{
    cps__why_clear();
    return tensor_op(c, t, OP_PULL, NULL, out, len, NULL);
}

int cps_push_pull(cps_client *c, cps_tensor *t, const float *grad, float *out, uint64_t len)
{
    cps__why_clear();
    return tensor_op(c, t, OP_PUSH_PULL, grad, out, len, NULL);
}

int cps_push_async(cps_client *c, cps_tensor *t, const float *grad, uint64_t len, cps_handle **h)
{
    cps__why_clear();
    if (!h)
        return CPS_EINVAL;
    return tensor_op(c, t, OP_PUSH, grad, NULL, len, h);
}

int cps_pull_async(cps_client *c, cps_tensor *t, float *out, uint64_t len, cps_handle **h)
{
    cps__why_clear();
    if (!h)
        return CPS_EINVAL;
    return tensor_op(c, t, OP_PULL, NULL, out, len, h);
}

int cps_push_pull_async(cps_client *c, cps_tensor *t, const float *grad, float *out, uint64_t len,
                        cps_handle **h)
{
    cps__why_clear();
    if (!h)
        return CPS_EINVAL;
    return tensor_op(c, t, OP_PUSH_PULL, grad, out, len, h);
}

int cps_wait_result(cps_handle *h, int timeout_ms, int *result)
{
    cps__why_clear();
    if (!h || !h->op.in_use || !result)
        return CPS_EINVAL;
    cps_client *c = h->op.client;
    pthread_mutex_lock(&c->lock);
    int rc = h->op.so.pending ? cps__client_wait(c, &h->op, timeout_ms) : h->op.so.result;
    int pending = h->op.so.pending != 0;
    pthread_mutex_unlock(&c->lock);
    if (pending)
        return 0;
    if (rc != 0)
        why_from_op(&h->op);
    free(h->op.scratch);
    cps__op_enc_free(&h->op);
    if (h->op.own_parts)
        cps__parts_free(h->op.parts, h->op.so.nparts);
    free(h);
    *result = rc;
    return 1;
}

int cps_wait(cps_handle *h, int timeout_ms)
{
    int result;
    int rc = cps_wait_result(h, timeout_ms, &result);
    if (rc < 0)
        return rc;
    return rc ? result : CPS_ETIMEDOUT;
}

int cps_barrier(cps_client *c)
{
    cps__why_clear();
    if (!c)
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    int rc = cps__client_barrier(c);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* ---- raw (ps-lite shaped) ---- */

static int raw_op(cps_client *c, int kind, const uint64_t *keys, size_t nkeys, const float *vals,
                  float *out, const uint32_t *lens, const cps__param_spec *spec, int noagg)
{
    if (!c || !keys || !lens || nkeys == 0)
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    cps__op op;
    memset(&op, 0, sizeof op);
    cps__part *parts = NULL;
    uint32_t nparts = 0;
    int rc = cps__layout_raw(c->view, keys, nkeys, lens, &parts, &nparts);
    if (rc == 0) {
        op.so.kind = kind;
        op.so.nparts = nparts;
        op.so.noagg = noagg;
        op.grad = vals;
        op.out = out;
        op.spec = spec;
        op.parts = parts;
        /* Raw keys have no per-tensor step; sync mode needs one, so use a per-client counter
         * the caller advances by pushing the same key set once per step. */
        cps_tensor *t = NULL;
        if (kind == OP_PUSH || kind == OP_PUSH_PULL) {
            uint64_t sig = cps__hash64(keys, nkeys * 8);
            char name[32];
            snprintf(name, sizeof name, "\x01raw%016llx", (unsigned long long)sig);
            for (t = c->tensors; t && strcmp(t->name, name) != 0; t = t->next)
                ;
            if (!t && (t = calloc(1, sizeof *t)) != NULL) {
                memcpy(t->name, name, sizeof name);
                t->next = c->tensors;
                c->tensors = t;
                cps__sess_clock_add(c->sess, &t->clock, 0);
            }
            c->stats.pushes++;
        } else if (kind == OP_PULL) {
            c->stats.pulls++;
        }
        rc = cps__client_run(c, &op, t ? &t->clock : NULL, 0, 1);
    } else {
        cps__log(CPS_LOG_ERROR, "worker", "raw keys must be strictly increasing with lens > 0");
    }
    pthread_mutex_unlock(&c->lock);
    cps__parts_free(parts, nparts);
    return rc;
}

int cps_raw_declare(cps_client *c, const uint64_t *keys, size_t nkeys, const uint32_t *lens,
                    const cps_init *init, const cps_optim *optim)
{
    cps__why_clear();
    cps__param_spec spec;
    int rc = cps__spec_make("(raw keys)", init, optim, &spec);
    if (rc != 0)
        return rc;
    return raw_op(c, OP_DECLARE, keys, nkeys, NULL, NULL, lens, &spec, 0);
}

int cps_raw_push(cps_client *c, const uint64_t *keys, size_t nkeys, const float *vals,
                 const uint32_t *lens)
{
    cps__why_clear();
    if (!vals)
        return CPS_EINVAL;
    return raw_op(c, OP_PUSH, keys, nkeys, vals, NULL, lens, NULL, 0);
}

int cps_raw_pull(cps_client *c, const uint64_t *keys, size_t nkeys, float *vals,
                 const uint32_t *lens)
{
    cps__why_clear();
    if (!vals)
        return CPS_EINVAL;
    return raw_op(c, OP_PULL, keys, nkeys, NULL, vals, lens, NULL, 0);
}

/* ---- sparse rows ---- */

typedef struct row_ref {
    uint64_t key;
    uint64_t row;
    size_t pos; /* index in the caller's list */
} row_ref;

static int cmp_row_ref(const void *a, const void *b)
{
    const row_ref *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Sort the requested rows by key and merge duplicates: returns the unique keys, and for each
 * caller position the index of its unique key. */
static int rows_prepare(cps_client *c, cps_tensor *t, const uint64_t *rows, size_t nrows,
                        uint64_t **ukeys, uint32_t **ulens, size_t **slot_of, size_t *nunique)
{
    row_ref *refs = malloc(nrows * sizeof *refs);
    *ukeys = malloc(nrows * sizeof **ukeys);
    *ulens = malloc(nrows * sizeof **ulens);
    *slot_of = malloc(nrows * sizeof **slot_of);
    if (!refs || !*ukeys || !*ulens || !*slot_of) {
        free(refs);
        return CPS_ENOMEM;
    }
    for (size_t i = 0; i < nrows; i++) {
        if (rows[i] >= t->rows) {
            cps__log(CPS_LOG_ERROR, "worker", "table %s: row %llu out of %llu rows", t->name,
                     (unsigned long long)rows[i], (unsigned long long)t->rows);
            free(refs);
            return CPS_ENOTFOUND;
        }
        refs[i] = (row_ref){cps__layout_row_key(t, c->view, rows[i]), rows[i], i};
    }
    qsort(refs, nrows, sizeof *refs, cmp_row_ref);
    size_t n = 0;
    for (size_t i = 0; i < nrows; i++) {
        if (n == 0 || (*ukeys)[n - 1] != refs[i].key) {
            (*ukeys)[n] = refs[i].key;
            (*ulens)[n] = t->cols;
            n++;
        }
        (*slot_of)[refs[i].pos] = n - 1;
    }
    free(refs);
    *nunique = n;
    return 0;
}

static int rows_op(cps_client *c, cps_tensor *t, const uint64_t *rows, size_t nrows,
                   const float *grads, float *out)
{
    if (!c || !t || !rows || nrows == 0 || (!grads && !out))
        return CPS_EINVAL;
    if (t->rows == 0) {
        cps__log(CPS_LOG_ERROR, "worker", "%s is a dense tensor, not a table", t->name);
        return CPS_EINVAL;
    }
    uint64_t *ukeys = NULL;
    uint32_t *ulens = NULL;
    size_t *slot_of = NULL, n = 0;
    float *buf = NULL;
    pthread_mutex_lock(&c->lock);
    int rc = rows_prepare(c, t, rows, nrows, &ukeys, &ulens, &slot_of, &n);
    pthread_mutex_unlock(&c->lock);
    size_t cols = t->cols;
    if (rc == 0 && !(buf = calloc(n * cols, sizeof *buf)))
        rc = CPS_ENOMEM;
    if (rc == 0 && grads) {
        /* Duplicated rows: their gradients add up, in the caller's order. */
        for (size_t i = 0; i < nrows; i++)
            for (size_t j = 0; j < cols; j++)
                buf[slot_of[i] * cols + j] += grads[i * cols + j];
        /* Rows differ between workers, so there is no per-step aggregate: applied on arrival. */
        rc = raw_op(c, OP_PUSH, ukeys, n, buf, NULL, ulens, NULL, 1);
    } else if (rc == 0) {
        rc = cps_raw_pull(c, ukeys, n, buf, ulens);
        if (rc == 0)
            for (size_t i = 0; i < nrows; i++)
                memcpy(out + i * cols, buf + slot_of[i] * cols, cols * sizeof *out);
    }
    free(ukeys);
    free(ulens);
    free(slot_of);
    free(buf);
    return rc;
}

int cps_rows_push(cps_client *c, cps_tensor *t, const uint64_t *rows, size_t nrows,
                  const float *grads)
{
    cps__why_clear();
    if (!grads)
        return CPS_EINVAL;
    return rows_op(c, t, rows, nrows, grads, NULL);
}

int cps_rows_pull(cps_client *c, cps_tensor *t, const uint64_t *rows, size_t nrows, float *out)
{
    cps__why_clear();
    if (!out)
        return CPS_EINVAL;
    return rows_op(c, t, rows, nrows, NULL, out);
}
