/* libFuzzer target for the checkpoint JSON reader (src/checkpoint/json.c), the first code to
 * read a checkpoint's header or index from a file we do not trust. Every input either parses
 * into a tree whose invariants hold (valid UTF-8 without NUL in strings and keys, unique keys,
 * child counts that match, depth within the limit) or is refused with CPS_ECORRUPT and a reason;
 * anything else (a crash, a sanitizer report, a broken invariant) aborts. */
#include "fuzz_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "checkpoint/json.h"

fuzz_json_counts fuzz_json_n;

static void need(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_json: invariant broken: %s\n", what);
        abort();
    }
}

static void walk(const cps__json *v, int depth)
{
    need(depth <= 65, "nesting deeper than the parser allows");
    if (v->type == CPS_JSON_STRING) {
        need(v->str != NULL && strlen(v->str) == v->str_len, "string length");
        need(cps__json_utf8_valid(v->str, v->str_len), "string is UTF-8");
    }
    if (v->type != CPS_JSON_ARRAY && v->type != CPS_JSON_OBJECT)
        return;
    size_t n = 0;
    for (const cps__json *c = v->child; c; c = c->next, n++) {
        if (v->type == CPS_JSON_OBJECT) {
            need(c->key && strlen(c->key) == c->key_len, "key length");
            need(cps__json_utf8_valid(c->key, c->key_len), "key is UTF-8");
            need(cps__json_get(v, c->key) == c, "keys are unique");
        }
        walk(c, depth + 1);
    }
    need(n == v->n, "child count");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_json_n.inputs++;
    cps__json_doc *doc = NULL;
    const cps__json *root = NULL;
    char err[256] = "";
    int rc = cps__json_parse((const char *)data, size, &doc, &root, err, sizeof err);
    if (rc != 0) {
        need(rc == CPS_ECORRUPT || rc == CPS_ENOMEM, "error code");
        need(doc == NULL, "nothing allocated on error");
        need(strstr(err, "JSON") != NULL, "the reason is given");
        return 0;
    }
    fuzz_json_n.ok++;
    walk(root, 0);
    if (root->type == CPS_JSON_OBJECT && cps__json_get(root, "__metadata__"))
        fuzz_json_n.headers++;
    cps__json_free(doc);
    return 0;
}
