/* Deterministic stand-in for libFuzzer on the JSON reader, built with any compiler and run by
 * CTest: the corpus of real checkpoint headers and indexes (tests/fuzz/corpus/json), the inputs
 * that must be refused by name (truncated, too deeply nested, huge, duplicate keys), then seeded
 * mutations of the corpus (bit flips, JSON punctuation stored at random, truncations, spliced
 * copies of a segment, which make duplicate keys and deep nests). The seed is printed first, so
 * a failure can be replayed.
 *
 * usage: fuzz_json_replay CORPUS_DIR [ITERATIONS [SEED]] */
#include "fuzz_json.h"
#include "fuzz_rng.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "checkpoint/json.h"

#define MAX_SEEDS 32
static unsigned char *seeds[MAX_SEEDS];
static size_t seed_len[MAX_SEEDS];
static int nseeds;

static void load_corpus(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_json_replay: cannot open %s\n", dir);
        exit(2);
    }
    struct dirent *e;
    while ((e = readdir(d)) && nseeds < MAX_SEEDS) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        seeds[nseeds] = malloc((size_t)n + 1);
        if (fread(seeds[nseeds], 1, (size_t)n, f) == (size_t)n)
            seed_len[nseeds++] = (size_t)n;
        fclose(f);
    }
    closedir(d);
    if (nseeds == 0) {
        fprintf(stderr, "fuzz_json_replay: no seeds in %s\n", dir);
        exit(2);
    }
}

/* Inputs a reader must refuse, each with the reason it must name. */
static void refused_by_name(void)
{
    static char buf[1 << 16];
    /* Nested 100 deep (the reader stops at 64). */
    memset(buf, '[', 100);
    memset(buf + 100, ']', 100);
    cps__json_doc *doc = NULL;
    const cps__json *root;
    char err[256] = "";
    int rc = cps__json_parse(buf, 200, &doc, &root, err, sizeof err);
    if (rc != CPS_ECORRUPT || !strstr(err, "nest")) {
        fprintf(stderr, "fuzz_json_replay: a 100-deep nest: rc %d, reason '%s'\n", rc, err);
        abort();
    }
    /* A real header, truncated at every length, and with one key doubled. */
    size_t end = seed_len[0]; /* safetensors pads a header with spaces: those may go */
    while (end > 0 && seeds[0][end - 1] == ' ')
        end--;
    for (size_t k = 0; k < end; k++) {
        if (cps__json_parse((const char *)seeds[0], k, &doc, &root, err, sizeof err) == 0) {
            cps__json_free(doc);
            fprintf(stderr, "fuzz_json_replay: a truncated header (%zu of %zu bytes) parsed\n", k,
                    seed_len[0]);
            abort();
        }
    }
    const char dup[] = "{\"__metadata__\":{\"step\":\"1\"},\"w\":{\"dtype\":\"F32\"},"
                       "\"w\":{\"dtype\":\"F32\"}}";
    if (cps__json_parse(dup, sizeof dup - 1, &doc, &root, err, sizeof err) != CPS_ECORRUPT ||
        !strstr(err, "duplicate key \"w\"")) {
        fprintf(stderr, "fuzz_json_replay: duplicate key not refused by name: '%s'\n", err);
        abort();
    }
    /* A number longer than the reader takes. */
    memset(buf, '1', 1000);
    if (cps__json_parse(buf, 1000, &doc, &root, err, sizeof err) != CPS_ECORRUPT) {
        fprintf(stderr, "fuzz_json_replay: a 1000-digit number was accepted\n");
        abort();
    }
}

static size_t mutate(unsigned char *out, size_t cap, int s)
{
    size_t n = seed_len[s] < cap ? seed_len[s] : cap;
    memcpy(out, seeds[s], n);
    static const char punct[] = "{}[]\",:\\0-eE.tfn u";
    int edits = 1 + (int)(rnd() % 4);
    for (int e = 0; e < edits && n > 0; e++) {
        size_t at = rnd() % n;
        switch (rnd() % 5) {
        case 0:
            out[at] ^= (unsigned char)(1u << (rnd() % 8));
            break;
        case 1:
            out[at] = (unsigned char)punct[rnd() % (sizeof punct - 1)];
            break;
        case 2:
            n = at;
            break;
        case 3: { /* splice a copy of a segment after it (duplicate keys, deeper nests) */
            size_t len = 1 + rnd() % 64;
            if (at + len > n)
                len = n - at;
            if (n + len <= cap) {
                memmove(out + at + len, out + at, n - at);
                n += len;
            }
            break;
        }
        default:
            out[at] = (unsigned char)rnd();
            break;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fuzz_json_replay CORPUS_DIR [ITERATIONS [SEED]]\n");
        return 2;
    }
    long iters = argc > 2 ? atol(argv[2]) : 100000;
    rng = argc > 3 ? strtoull(argv[3], NULL, 10) : 0x9e3779b97f4a7c15ull;
    printf("fuzz_json_replay: seed %llu, %ld iterations\n", (unsigned long long)rng, iters);
    fflush(stdout);
    load_corpus(argv[1]);
    for (int s = 0; s < nseeds; s++)
        if (LLVMFuzzerTestOneInput(seeds[s], seed_len[s]) != 0 ||
            fuzz_json_n.ok != (uint64_t)s + 1) {
            fprintf(stderr, "fuzz_json_replay: corpus file %d does not parse\n", s);
            return 1;
        }
    refused_by_name();
    static unsigned char buf[1 << 17];
    for (long i = 0; i < iters; i++) {
        size_t n = mutate(buf, sizeof buf, (int)(rnd() % (uint64_t)nseeds));
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("fuzz_json_replay: %llu inputs, %llu parsed, %llu headers; no invariant broken\n",
           (unsigned long long)fuzz_json_n.inputs, (unsigned long long)fuzz_json_n.ok,
           (unsigned long long)fuzz_json_n.headers);
    return fuzz_json_n.ok > (uint64_t)nseeds ? 0 : 1;
}
