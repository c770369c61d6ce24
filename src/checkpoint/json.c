#include "checkpoint/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"

#define JSON_MAX_DEPTH 64
#define JSON_MAX_NUM   64

/* ---- arena: blocks chained through their first word; freed all at once ---- */

typedef struct arena_blk {
    struct arena_blk *prev;
    size_t used, cap;
    max_align_t data[];
} arena_blk;

struct cps__json_doc {
    arena_blk *top;
};

static void *arena_alloc(cps__json_doc *d, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!d->top || d->top->cap - d->top->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        arena_blk *b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->prev = d->top;
        b->used = 0;
        b->cap = cap;
        d->top = b;
    }
    void *p = (char *)d->top->data + d->top->used;
    d->top->used += n;
    return p;
}

void cps__json_free(cps__json_doc *doc)
{
    if (!doc)
        return;
    arena_blk *b = doc->top;
    while (b) {
        arena_blk *prev = b->prev;
        free(b);
        b = prev;
    }
    free(doc);
}

/* ---- parser ---- */

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    cps__json_doc *doc;
    char *err;
    size_t errcap;
    int failed; /* CPS_ECORRUPT or CPS_ENOMEM once something went wrong */
} parser;

static int fail(parser *p, const char *what)
{
    if (!p->failed) {
        p->failed = CPS_ECORRUPT;
        if (p->err && p->errcap)
            snprintf(p->err, p->errcap, "JSON: %s at byte %zu", what, p->pos);
    }
    return p->failed;
}

static int oom(parser *p)
{
    if (!p->failed) {
        p->failed = CPS_ENOMEM;
        if (p->err && p->errcap)
            snprintf(p->err, p->errcap, "JSON: out of memory");
    }
    return p->failed;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

/* Length of the UTF-8 sequence at s[0..n), or 0 if malformed. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
        len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

int cps__json_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t k = utf8_seq(u + i, len - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

static int hex4(parser *p, uint32_t *out)
{
    if (p->len - p->pos < 4)
        return fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return fail(p, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int escape(parser *p, char *o, size_t *w)
{
    if (p->pos >= p->len)
        return fail(p, "truncated escape");
    unsigned char c = p->s[p->pos++];
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *f = c ? strchr(from, c) : NULL;
    if (f) {
        o[(*w)++] = to[f - from];
        return 0;
    }
    if (c != 'u')
        return fail(p, "unknown escape");
    uint32_t cp, lo;
    if (hex4(p, &cp))
        return p->failed;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return fail(p, "lone low surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
            return fail(p, "lone high surrogate");
        p->pos += 2;
        if (hex4(p, &lo))
            return p->failed;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return fail(p, "bad low surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (cp == 0)
        return fail(p, "\\u0000 in string");
    *w += put_utf8(o + *w, cp);
    return 0;
}

/* At the opening quote. Decoded output never exceeds the raw length (every escape is at least
 * as long as what it decodes to), so one allocation of raw length + 1 suffices. */
static int parse_string(parser *p, const char **out, size_t *out_len, size_t *raw_off,
                        size_t *raw_len)
{
    p->pos++;
    size_t start = p->pos, end = start;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    if (end >= p->len)
        return fail(p, "unterminated string");
    char *o = arena_alloc(p->doc, end - start + 1);
    if (!o)
        return oom(p);
    size_t w = 0;
    while (p->pos < end) {
        unsigned char c = p->s[p->pos];
        if (c < 0x20)
            return fail(p, "control character in string");
        if (c == '\\') {
            p->pos++;
            if (escape(p, o, &w))
                return p->failed;
            continue;
        }
        size_t k = utf8_seq(p->s + p->pos, end - p->pos);
        if (!k)
            return fail(p, "invalid UTF-8 in string");
        memcpy(o + w, p->s + p->pos, k);
        w += k;
        p->pos += k;
    }
    if (p->pos != end)
        return fail(p, "truncated escape");
    o[w] = '\0';
    p->pos = end + 1;
    *out = o;
    *out_len = w;
    if (raw_off)
        *raw_off = start;
    if (raw_len)
        *raw_len = end - start;
    return 0;
}

static int parse_number(parser *p, cps__json *v)
{
    size_t start = p->pos;
    const unsigned char *s = p->s;
    int plain = 1;
    if (p->pos < p->len && s[p->pos] == '-')
        p->pos++, plain = 0;
    if (p->pos >= p->len)
        return fail(p, "truncated number");
    if (s[p->pos] == '0') {
        p->pos++;
    } else if (s[p->pos] >= '1' && s[p->pos] <= '9') {
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
    } else {
        return fail(p, "bad number");
    }
    if (p->pos < p->len && s[p->pos] == '.') {
        p->pos++, plain = 0;
        size_t d = p->pos;
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
        if (p->pos == d)
            return fail(p, "bad fraction");
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        p->pos++, plain = 0;
        if (p->pos < p->len && (s[p->pos] == '+' || s[p->pos] == '-'))
            p->pos++;
        size_t d = p->pos;
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
        if (p->pos == d)
            return fail(p, "bad exponent");
    }
    size_t n = p->pos - start;
    if (n > JSON_MAX_NUM)
        return fail(p, "number too long");
    char tmp[JSON_MAX_NUM + 1];
    memcpy(tmp, s + start, n);
    tmp[n] = '\0';
    v->type = CPS_JSON_NUMBER;
    v->num = strtod(tmp, NULL);
    if (plain) {
        uint64_t u = 0;
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            unsigned d = (unsigned)(tmp[i] - '0');
            if (u > (UINT64_MAX - d) / 10) {
                ok = 0;
                break;
            }
            u = u * 10 + d;
        }
        v->is_uint = ok;
        v->u64 = ok ? u : 0;
    }
    return 0;
}

static int cmp_keyp(const void *a, const void *b)
{
    const cps__json *x = *(const cps__json *const *)a, *y = *(const cps__json *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    if (c)
        return c;
    return x->key_len < y->key_len ? -1 : x->key_len > y->key_len;
}

/* Duplicate keys: serde_json keeps the last, Python's json the last too; two readers could
 * then disagree with a third about which tensor a name means, so refuse them. */
static int check_dup_keys(parser *p, cps__json *obj)
{
    if (obj->n < 2)
        return 0;
    cps__json **v = malloc(obj->n * sizeof *v);
    if (!v)
        return oom(p);
    size_t i = 0;
    for (cps__json *c = obj->child; c; c = c->next)
        v[i++] = c;
    qsort(v, obj->n, sizeof *v, cmp_keyp);
    int rc = 0;
    for (i = 1; i < obj->n && !rc; i++) {
        if (cmp_keyp(&v[i - 1], &v[i]) == 0) {
            char what[160];
            snprintf(what, sizeof what, "duplicate key \"%.100s\" in object", v[i]->key);
            rc = fail(p, what);
        }
    }
    free(v);
    return rc;
}

static int parse_value(parser *p, cps__json *v, int depth);

static int parse_container(parser *p, cps__json *v, int depth, int is_obj)
{
    if (depth >= JSON_MAX_DEPTH)
        return fail(p, "nesting too deep");
    v->type = is_obj ? CPS_JSON_OBJECT : CPS_JSON_ARRAY;
    char close = is_obj ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    cps__json **tail = &v->child;
    for (;;) {
        cps__json *c = arena_alloc(p->doc, sizeof *c);
        if (!c)
            return oom(p);
        memset(c, 0, sizeof *c);
        skip_ws(p);
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return fail(p, "expected a member name");
            if (parse_string(p, &c->key, &c->key_len, NULL, NULL))
                return p->failed;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':')
                return fail(p, "expected ':'");
            p->pos++;
        }
        if (parse_value(p, c, depth + 1))
            return p->failed;
        *tail = c;
        tail = &c->next;
        v->n++;
        skip_ws(p);
        if (p->pos >= p->len)
            return fail(p, is_obj ? "unterminated object" : "unterminated array");
        if (p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->s[p->pos] == close) {
            p->pos++;
            break;
        }
        return fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    return is_obj ? check_dup_keys(p, v) : 0;
}

static int literal(parser *p, const char *word, int type, cps__json *v)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail(p, "unexpected character");
    p->pos += n;
    v->type = type;
    return 0;
}

static int parse_value(parser *p, cps__json *v, int depth)
{
    skip_ws(p);
    if (p->pos >= p->len)
        return fail(p, "unexpected end of input");
    switch (p->s[p->pos]) {
    case '{':
        return parse_container(p, v, depth, 1);
    case '[':
        return parse_container(p, v, depth, 0);
    case '"':
        v->type = CPS_JSON_STRING;
        return parse_string(p, &v->str, &v->str_len, &v->raw_off, &v->raw_len);
    case 't':
        return literal(p, "true", CPS_JSON_TRUE, v);
    case 'f':
        return literal(p, "false", CPS_JSON_FALSE, v);
    case 'n':
        return literal(p, "null", CPS_JSON_NULL, v);
    default:
        return parse_number(p, v);
    }
}

int cps__json_parse(const char *text, size_t len, cps__json_doc **doc, const cps__json **root,
                    char *err, size_t errcap)
{
    if (err && errcap)
        err[0] = '\0';
    if (!text || !doc || !root)
        return CPS_EINVAL;
    parser p = {(const unsigned char *)text, len, 0, NULL, err, errcap, 0};
    p.doc = calloc(1, sizeof *p.doc);
    if (!p.doc)
        return oom(&p);
    cps__json *r = arena_alloc(p.doc, sizeof *r);
    if (!r) {
        oom(&p);
    } else {
        memset(r, 0, sizeof *r);
        if (parse_value(&p, r, 0) == 0) {
            skip_ws(&p);
            if (p.pos != p.len)
                fail(&p, "trailing characters after the JSON value");
        }
    }
    if (p.failed) {
        cps__json_free(p.doc);
        return p.failed;
    }
    *doc = p.doc;
    *root = r;
    return 0;
}

const cps__json *cps__json_get(const cps__json *obj, const char *key)
{
    if (!obj || obj->type != CPS_JSON_OBJECT)
        return NULL;
    size_t n = strlen(key);
    for (const cps__json *c = obj->child; c; c = c->next)
        if (c->key_len == n && memcmp(c->key, key, n) == 0)
            return c;
    return NULL;
}

/* ---- writer ---- */

void cps__json_buf_fini(cps__json_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static int reserve(cps__json_buf *b, size_t n)
{
    if (b->failed)
        return -1;
    if (b->cap - b->len > n)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap - b->len <= n)
        cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
        b->failed = 1;
        return -1;
    }
    b->p = q;
    b->cap = cap;
    return 0;
}

void cps__json_put(cps__json_buf *b, const char *s, size_t n)
{
    if (reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void cps__json_puts(cps__json_buf *b, const char *s)
{
    cps__json_put(b, s, strlen(s));
}

void cps__json_printf(cps__json_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->failed = 1;
        return;
    }
    cps__json_put(b, tmp, (size_t)n);
}

void cps__json_put_str(cps__json_buf *b, const char *s)
{
    cps__json_put(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        cps__json_put(b, run, (size_t)(s - run));
        if (c == '"')
            cps__json_put(b, "\\\"", 2);
        else if (c == '\\')
            cps__json_put(b, "\\\\", 2);
        else
            cps__json_printf(b, "\\u%04x", c);
        run = s + 1;
    }
    cps__json_put(b, run, (size_t)(s - run));
    cps__json_put(b, "\"", 1);
}
