/* `chainps checkpoint inspect|export|restore`: checkpoint files (src/checkpoint/ckpt.h). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "cli.h"

static const char checkpoint_usage[] =
    "usage: chainps checkpoint <inspect|export|restore> [options]\n"
    "\n"
    "Checkpoints are safetensors files (model.safetensors, or model-0000i-of-0000k.safetensors\n"
    "shards plus model.safetensors.index.json): parameters under their tensor names, optimizer\n"
    "state under optim/<slot>/<tensor>, the step, optimizer and a CRC-32 per tensor in\n"
    "__metadata__.\n"
    "\n"
    "  inspect PATH   list tensors, shapes, dtypes, step and metadata, and verify every\n"
    "                 checksum. PATH: a .safetensors file, an index .json, or a directory.\n"
    "                 Exit status 0 if the checkpoint is whole, 1 if it is corrupt or\n"
    "                 unreadable, 2 on a usage error.\n"
    "      --no-verify  check the structure only (do not read the tensor data)\n"
    "  export         not built yet (issue 6): a consistent cut of a running job\n"
    "  restore        not built yet (issue 6)\n"
    "\n"
    "  -h, --help     this text\n";

static int inspect(const char *path, int verify)
{
    cps_ckpt_reader *r;
    int rc = cps__ckpt_reader_open(path, &r);
    if (rc) {
        fprintf(stderr, "chainps checkpoint inspect: %s: %s (%s)\n", path, cps_strerror(rc),
                rc == CPS_ECORRUPT ? "not a whole checkpoint; see the line above" : "unreadable");
        return 1;
    }
    size_t n = cps__ckpt_reader_count(r), nsh = cps__ckpt_reader_shard_count(r);
    printf("checkpoint: %s\n", path);
    if (cps__ckpt_reader_index_path(r))
        printf("index:      %s\n", cps__ckpt_reader_index_path(r));
    for (size_t i = 0; i < nsh; i++)
        printf("%s %s\n", i ? "           " : "files:     ", cps__ckpt_reader_shard_path(r, i));
    const char *step = cps__ckpt_reader_meta(r, CPS_CKPT_META_STEP);
    printf("step:       %s\n", step ? step : "(none)");
    size_t nm = cps__ckpt_reader_meta_count(r);
    if (nm)
        printf("metadata:\n");
    for (size_t i = 0; i < nm; i++) {
        const char *k, *v;
        cps__ckpt_reader_meta_at(r, i, &k, &v);
        printf("  %s: %s\n", k, v);
    }
    uint64_t total = 0;
    size_t width = 4;
    for (size_t i = 0; i < n; i++) {
        const cps_ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        total += t->nbytes;
        width = strlen(t->name) > width ? strlen(t->name) : width;
    }
    width = width > 60 ? 60 : width;
    printf("tensors:    %zu, %.1f MB\n", n, (double)total / 1e6);
    printf("  %-*s  %-5s  %-20s  %12s%s\n", (int)width, "name", "dtype", "shape", "bytes",
           nsh > 1 ? "  shard" : "");
    for (size_t i = 0; i < n; i++) {
        const cps_ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        printf("  %-*s  %-5s  ", (int)width, t->name, t->dtype);
        char shape[64] = "";
        size_t at = 0;
        for (uint32_t d = 0; d < t->ndim && at < sizeof shape; d++)
            at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%" PRIu64, d ? ", " : "",
                                   t->shape[d]);
        char br[80];
        snprintf(br, sizeof br, "[%s]", shape);
        printf("%-20s  %12" PRIu64, br, t->nbytes);
        if (nsh > 1)
            printf("  %u", t->shard + 1);
        printf("\n");
    }
    if (!verify) {
        printf("checksums:  not verified (--no-verify)\n");
        cps__ckpt_reader_close(r);
        return 0;
    }
    size_t bad = 0, unchecked = 0, io = 0;
    for (size_t i = 0; i < n; i++) {
        const cps_ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        if (!t->has_checksum) {
            unchecked++;
            continue;
        }
        int vrc = cps__ckpt_reader_verify(r, t);
        if (vrc == CPS_ECORRUPT) {
            printf("checksum:   BAD %s (in %s)\n", t->name, t->file);
            bad++;
        } else if (vrc) {
            printf("checksum:   cannot read %s (in %s): %s\n", t->name, t->file, cps_strerror(vrc));
            io++;
        }
    }
    if (!bad && !io && !unchecked)
        printf("checksums:  all %zu verify\n", n);
    else if (!bad && !io)
        printf("checksums:  %zu verify, %zu tensors carry no checksum\n", n - unchecked, unchecked);
    else
        printf("checksums:  %zu of %zu do not verify%s\n", bad + io, n - unchecked,
               io ? " (some could not be read)" : "");
    cps__ckpt_reader_close(r);
    return bad || io ? 1 : 0;
}

static const struct option checkpoint_opts[] = {
    {"no-verify", no_argument, 0, 'n'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};

int cps__cli_checkpoint(int argc, char **argv)
{
    if (argc < 2) {
        fputs(checkpoint_usage, stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
        fputs(checkpoint_usage, stdout);
        return 0;
    }
    if (!strcmp(sub, "export") || !strcmp(sub, "restore")) {
        fprintf(stderr, "chainps checkpoint %s: not built yet: see issue 6\n", sub);
        return 2;
    }
    if (strcmp(sub, "inspect"))
        return cps__cli_usage_error("checkpoint", "unknown subcommand '%s'", sub);
    int opt, verify = 1;
    optind = 1;
    while ((opt = getopt_long(argc - 1, argv + 1, "h", checkpoint_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(checkpoint_usage, stdout);
            return 0;
        }
        if (opt == 'n') {
            verify = 0;
            continue;
        }
        return cps__cli_usage_error("checkpoint", "unknown option");
    }
    if (optind != argc - 2)
        return cps__cli_usage_error("checkpoint", "inspect takes exactly one PATH");
    return inspect(argv[1 + optind], verify);
}
