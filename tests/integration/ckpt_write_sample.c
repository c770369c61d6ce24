/* Writes two sample checkpoints through src/checkpoint and prints, as JSON on stdout, what a
 * reader must find in them (tests/integration/ckpt_reader.py checks it with json + numpy):
 *   OUTDIR/single.safetensors  one file
 *   OUTDIR/sharded/            model-0000i-of-00003.safetensors + model.safetensors.index.json
 * Values are chosen so float32 prints exactly with %.9g. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"

typedef struct sample {
    const char *name;
    cps__ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t shape[2];
    int streamed;
} sample;

static const sample samples[] = {
    {"layer1.weight", CPS_CKPT_F32, 2, {3, 4}, 0},
    {"layer1.bias", CPS_CKPT_F32, 1, {4, 0}, 0},
    {"optim/exp_avg/layer1.weight", CPS_CKPT_F32, 2, {3, 4}, 0},
    {"optim/exp_avg_sq/layer1.weight", CPS_CKPT_F32, 2, {3, 4}, 0},
    {"embedding", CPS_CKPT_F32, 2, {5, 3}, 1},
    {"counts", CPS_CKPT_U64, 1, {5, 0}, 0},
    {"empty", CPS_CKPT_F32, 1, {0, 0}, 0},
};
#define NSAMPLES (sizeof samples / sizeof samples[0])

static float fval(size_t t, uint64_t i)
{
    return (float)((double)t * 100.0 + (double)i * 0.25 - 1.5);
}

static uint64_t uval(uint64_t i)
{
    return UINT64_C(1) << 40 | i * 7;
}

static int fill(void *arg, uint64_t first, void *buf, size_t n)
{
    size_t t = (size_t)(uintptr_t)arg;
    for (size_t i = 0; i < n; i++)
        ((float *)buf)[i] = fval(t, first + i);
    return 0;
}

static uint64_t numel(const sample *s)
{
    return s->ndim == 1 ? s->shape[0] : s->shape[0] * s->shape[1];
}

static int write_one(const char *path, uint64_t max_shard, void **bufs)
{
    cps__ckpt_writer *w;
    if (cps__ckpt_writer_open(path, max_shard, &w))
        return 1;
    for (size_t t = 0; t < NSAMPLES; t++) {
        const sample *s = &samples[t];
        int rc = s->streamed
                     ? cps__ckpt_writer_add_stream(w, s->name, s->dtype, s->ndim, s->shape, fill,
                                                   (void *)(uintptr_t)t)
                     : cps__ckpt_writer_add(w, s->name, s->dtype, s->ndim, s->shape, bufs[t]);
        if (rc) {
            cps__ckpt_writer_abort(w);
            return 1;
        }
    }
    cps__param_spec spec = {.opt_kind = CPS_W_OPT_ADAM,
                            .lr = 1e-3f,
                            .beta1 = 0.9f,
                            .beta2 = 0.999f,
                            .eps = 1e-8f,
                            .init_kind = CPS_W_INIT_NORMAL,
                            .init_b = 0.05f,
                            .init_seed = 42};
    char js[512];
    if (cps__ckpt_spec_to_json(&spec, js, sizeof js) < 0 ||
        cps__ckpt_writer_set_meta(w, CPS_CKPT_META_STEP, "120") ||
        cps__ckpt_writer_set_meta(w, CPS_CKPT_META_OPTIM, "adam") ||
        cps__ckpt_writer_set_meta(w, "hparams/layer1.weight", js) ||
        cps__ckpt_writer_set_meta(w, "note", "quote \" backslash \\ tab \t unicode \xc3\xa9")) {
        cps__ckpt_writer_abort(w);
        return 1;
    }
    return cps__ckpt_writer_commit(w, NULL, 0) ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: ckpt_write_sample OUTDIR\n");
        return 2;
    }
    void *bufs[NSAMPLES] = {0};
    for (size_t t = 0; t < NSAMPLES; t++) {
        const sample *s = &samples[t];
        if (s->streamed)
            continue;
        uint64_t n = numel(s);
        bufs[t] = malloc(n * 8 + 8);
        for (uint64_t i = 0; i < n; i++) {
            if (s->dtype == CPS_CKPT_F32)
                ((float *)bufs[t])[i] = fval(t, i);
            else
                ((uint64_t *)bufs[t])[i] = uval(i);
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/single.safetensors", argv[1]);
    int rc = write_one(path, 0, bufs);
    snprintf(path, sizeof path, "%s/sharded", argv[1]);
    /* 100 bytes per shard: layer1.weight+bias (64 B) | 2 x 48 B | embedding 60 B + ... -> the
     * greedy packing makes several shards. */
    rc |= write_one(path, 100, bufs);
    if (rc) {
        fprintf(stderr, "ckpt_write_sample: writing failed\n");
        return 1;
    }
    printf("{\"step\": \"120\", \"optimizer\": \"adam\", \"tensors\": {");
    for (size_t t = 0; t < NSAMPLES; t++) {
        const sample *s = &samples[t];
        printf("%s\n  \"%s\": {\"dtype\": \"%s\", \"shape\": [", t ? "," : "", s->name,
               s->dtype == CPS_CKPT_F32 ? "F32" : "U64");
        for (uint32_t d = 0; d < s->ndim; d++)
            printf("%s%" PRIu64, d ? ", " : "", s->shape[d]);
        printf("], \"values\": [");
        for (uint64_t i = 0; i < numel(s); i++) {
            if (s->dtype == CPS_CKPT_F32)
                printf("%s%.9g", i ? ", " : "", (double)fval(t, i));
            else
                printf("%s%" PRIu64, i ? ", " : "", uval(i));
        }
        printf("]}");
    }
    printf("\n}}\n");
    for (size_t t = 0; t < NSAMPLES; t++)
        free(bufs[t]);
    return 0;
}
