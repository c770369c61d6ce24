/* The scheduler's tensor registry (registry.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "recovery/registry.h"

/* 1: same name and definition registered; 0: new name; 2: registered before shapes were
 * recorded (ndim 0), same otherwise: its entry at *at takes the shape; CPS_EEXIST: same name,
 * other shape or optimizer. */
static int find(const cps__registry *r, const cps__tensor_desc *d, size_t *at)
{
    size_t off = 0, used;
    cps__tensor_desc e;
    while (off < r->len &&
           cps__wire_tensor_desc_decode(r->reg + off, r->len - off, &e, &used) == 0) {
        *at = off;
        off += used;
        if (strcmp(e.name, d->name) != 0)
            continue;
        /* Specs compare as their wire blocks: struct padding holds no meaning. */
        unsigned char a[CPS_WIRE_SPEC_SIZE], b[CPS_WIRE_SPEC_SIZE];
        cps__wire_spec_encode(a, &e.spec);
        cps__wire_spec_encode(b, &d->spec);
        if (!(e.kind == d->kind && e.length == d->length && e.rows == d->rows &&
              e.cols == d->cols && memcmp(a, b, sizeof a) == 0))
            return CPS_EEXIST;
        if (e.ndim == 0 && d->ndim != 0)
            return 2;
        return (d->ndim == 0 ||
                (e.ndim == d->ndim && memcmp(e.dims, d->dims, d->ndim * sizeof *d->dims) == 0))
                   ? 1
                   : CPS_EEXIST;
    }
    return 0;
}

/* Room for `extra` more bytes. Errors: CPS_ENOMEM. */
static int reserve(cps__registry *r, size_t extra)
{
    size_t need = r->len + extra;
    if (need <= r->cap)
        return 0;
    size_t cap = need * 2;
    unsigned char *grown = realloc(r->reg, cap);
    if (!grown)
        return CPS_ENOMEM;
    r->reg = grown;
    r->cap = cap;
    return 0;
}

int cps__registry_add(cps__registry *r, const void *payload, size_t len, char *text, size_t textlen,
                      char *name, size_t namelen)
{
    cps__tensor_desc d;
    size_t used, at = 0;
    int rc = cps__wire_tensor_desc_decode(payload, len, &d, &used);
    if (rc == 0 && used != len)
        rc = CPS_EPROTO;
    if (rc != 0) {
        snprintf(text, textlen, "malformed tensor description");
        return rc;
    }
    snprintf(name, namelen, "%s", d.name);
    rc = find(r, &d, &at);
    if (rc == CPS_EEXIST) {
        snprintf(text, textlen, "tensor %s is registered with another definition", d.name);
        return rc;
    }
    if (rc == 1)
        return 0;
    if (reserve(r, cps__wire_tensor_desc_size(&d)) != 0) {
        snprintf(text, textlen, "no memory for the tensor registry");
        return CPS_ENOMEM;
    }
    if (rc == 2) {
        /* The entry grows by its dims: move what follows it, then write it again in place. */
        cps__tensor_desc e;
        size_t old_size;
        cps__wire_tensor_desc_decode(r->reg + at, r->len - at, &e, &old_size);
        size_t new_size = cps__wire_tensor_desc_size(&d);
        memmove(r->reg + at + new_size, r->reg + at + old_size, r->len - at - old_size);
        cps__wire_tensor_desc_encode(r->reg + at, new_size, &d);
        r->len += new_size - old_size;
        snprintf(text, textlen, "tensor %s: its shape is now recorded", d.name);
    } else {
        r->len += cps__wire_tensor_desc_encode(r->reg + r->len, r->cap - r->len, &d);
        r->count++;
        snprintf(text, textlen, "tensor %s registered (%s, %llu values)", d.name,
                 d.kind == CPS_DESC_LOCAL ? "held by the workers"
                 : d.kind                 ? "table"
                                          : "dense",
                 (unsigned long long)d.length);
    }
    return 1;
}

int cps__registry_load(cps__registry *r, const void *blob, size_t len)
{
    if (len <= 4)
        return 0;
    unsigned char *b = malloc(len - 4);
    if (!b)
        return CPS_ENOMEM;
    memcpy(b, (const unsigned char *)blob + 4, len - 4);
    free(r->reg);
    r->reg = b;
    r->len = r->cap = len - 4;
    r->count = cps__le32_get(blob);
    return 0;
}

unsigned char *cps__registry_blob(const cps__registry *r, size_t *len)
{
    unsigned char *b = malloc(4 + r->len);
    if (!b)
        return NULL;
    cps__le32_put(b, r->count);
    if (r->len)
        memcpy(b + 4, r->reg, r->len);
    *len = 4 + r->len;
    return b;
}

void cps__registry_fini(cps__registry *r)
{
    free(r->reg);
    memset(r, 0, sizeof *r);
}
