/* A small strict JSON reader and writer for checkpoint headers and indexes (RFC 8259).
 *
 * Why our own: a safetensors header is a few KB of JSON read from a file we do not trust; a
 * 600-line parser whose every bound we can see is easier to trust than a dependency. It refuses
 * what serde_json (the parser of the safetensors reference) refuses and a little more: invalid
 * UTF-8, control characters and \u0000 in strings, duplicate object keys, trailing garbage,
 * nesting deeper than 64, numbers longer than 64 characters.
 *
 * The parsed tree lives in one arena owned by the cps__json_doc; every pointer into it (nodes,
 * decoded strings) is valid until cps__json_free().
 */
#ifndef CPS_CHECKPOINT_JSON_H
#define CPS_CHECKPOINT_JSON_H

#include <stddef.h>
#include <stdint.h>

enum cps__json_type {
    CPS_JSON_NULL,
    CPS_JSON_FALSE,
    CPS_JSON_TRUE,
    CPS_JSON_NUMBER,
    CPS_JSON_STRING,
    CPS_JSON_ARRAY,
    CPS_JSON_OBJECT
};

typedef struct cps__json cps__json;
struct cps__json {
    int type;        /* enum cps__json_type */
    const char *key; /* member name when inside an object (NUL-terminated), else NULL */
    size_t key_len;
    const char *str; /* STRING: decoded UTF-8, NUL-terminated (no interior NUL) */
    size_t str_len;
    size_t raw_off;   /* STRING: offset of the first byte after the opening quote in the input;
                         lets a caller locate a value's bytes (header checksum) */
    size_t raw_len;   /* STRING: bytes between the quotes in the input */
    double num;       /* NUMBER: value as a double */
    int is_uint;      /* NUMBER: 1 if a plain non-negative integer that fits in uint64 */
    uint64_t u64;     /* NUMBER: the value when is_uint */
    size_t n;         /* ARRAY/OBJECT: number of children */
    cps__json *child; /* ARRAY/OBJECT: first child; siblings through next, in input order */
    cps__json *next;
};

typedef struct cps__json_doc cps__json_doc;

/* Parse `len` bytes (need not be NUL-terminated). On success *root is the top-level value and
 * *doc owns it. On error returns CPS_ECORRUPT (or CPS_ENOMEM) and writes a one-line reason with
 * the byte offset into err (if non-NULL); nothing is allocated. */
int cps__json_parse(const char *text, size_t len, cps__json_doc **doc, const cps__json **root,
                    char *err, size_t errcap);
void cps__json_free(cps__json_doc *doc);

/* Member `key` of an object, or NULL (also when obj is not an object). */
const cps__json *cps__json_get(const cps__json *obj, const char *key);

/* 1 if s[0..len) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int cps__json_utf8_valid(const char *s, size_t len);

/* Growable output buffer. Errors are sticky: after a failed allocation every append is a no-op
 * and `failed` is set, so a caller checks once at the end. */
typedef struct cps__json_buf {
    char *p;
    size_t len, cap;
    int failed;
} cps__json_buf;

void cps__json_buf_fini(cps__json_buf *b);
void cps__json_put(cps__json_buf *b, const char *s, size_t n);
void cps__json_puts(cps__json_buf *b, const char *s);
void cps__json_printf(cps__json_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s as a JSON string literal with quotes ("\"", "\\" and control characters escaped;
 * other UTF-8 passed through: the caller validates it). */
void cps__json_put_str(cps__json_buf *b, const char *s);

#endif
