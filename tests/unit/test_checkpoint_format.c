/* Checkpoint files (src/checkpoint): round trips, sharding, and every kind of bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/json.h"
#include "core/log.h"

/* ---- helpers ---- */

static char last_log[1024];

static void capture(void *ctx, int level, const char *subsystem, const char *line)
{
    (void)ctx;
    (void)subsystem;
    if (level == CPS_LOG_ERROR)
        snprintf(last_log, sizeof last_log, "%s", line);
}

/* The last error line mentions every given fragment. */
static void assert_logged(const char *a, const char *b)
{
    if (!strstr(last_log, a) || (b && !strstr(last_log, b)))
        fail_msg("log line '%s' lacks '%s' / '%s'", last_log, a, b ? b : "");
}

static char tmpdir[4096];

static int setup(void **state)
{
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ckpt-test-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir))
        return -1;
    last_log[0] = '\0';
    cps__log_set_sink(capture, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void pathf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pathf(char *out, const char *fmt, ...)
{
    char rel[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    size_t n = strlen(tmpdir);
    memcpy(out, tmpdir, n);
    out[n] = '/';
    memcpy(out + n + 1, rel, strlen(rel) + 1);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

static int count_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".tmp") != NULL;
    closedir(d);
    return n;
}

static float val(int t, uint64_t i)
{
    return (float)t * 1000.0f + (float)i * 0.5f;
}

static int fill_fn(void *arg, uint64_t first, void *buf, size_t n)
{
    int t = (int)(intptr_t)arg;
    for (size_t i = 0; i < n; i++)
        ((float *)buf)[i] = val(t, first + i);
    return 0;
}

static int fail_fill(void *arg, uint64_t first, void *buf, size_t n)
{
    (void)arg;
    (void)first;
    (void)buf;
    (void)n;
    return CPS_ESTORE;
}

/* A checkpoint of 4 tensors: w [4, 8] (t=1), b [8] (t=2), optim/exp_avg/w [4, 8] (t=3,
 * streamed) and a U64 counter [3]; "step" = step_str. */
static float w1[32], b2[8];
static uint64_t cnt[3] = {1, UINT64_C(1) << 60, 42};

static int write_sample(const char *path, uint64_t max_shard, const char *step_str, char *out)
{
    for (int i = 0; i < 32; i++)
        w1[i] = val(1, (uint64_t)i);
    for (int i = 0; i < 8; i++)
        b2[i] = val(2, (uint64_t)i);
    cps__ckpt_writer *w;
    int rc = cps__ckpt_writer_open(path, max_shard, &w);
    if (rc)
        return rc;
    uint64_t s48[2] = {4, 8}, s8[1] = {8}, s3[1] = {3};
    char on[256];
    assert_int_equal(cps__ckpt_optim_tensor_name(on, sizeof on, CPS_W_OPT_ADAM, 0, "w"), 0);
    assert_string_equal(on, "optim/exp_avg/w");
    assert_int_equal(cps__ckpt_writer_add(w, "w", CPS_CKPT_F32, 2, s48, w1), 0);
    assert_int_equal(cps__ckpt_writer_add(w, "b", CPS_CKPT_F32, 1, s8, b2), 0);
    assert_int_equal(
        cps__ckpt_writer_add_stream(w, on, CPS_CKPT_F32, 2, s48, fill_fn, (void *)(intptr_t)3), 0);
    assert_int_equal(cps__ckpt_writer_add(w, "counts", CPS_CKPT_U64, 1, s3, cnt), 0);
    assert_int_equal(cps__ckpt_writer_set_meta(w, CPS_CKPT_META_STEP, "0"), 0);
    assert_int_equal(cps__ckpt_writer_set_meta(w, CPS_CKPT_META_STEP, step_str), 0);
    assert_int_equal(cps__ckpt_writer_set_meta(w, CPS_CKPT_META_OPTIM, "adam"), 0);
    return cps__ckpt_writer_commit(w, out, out ? 4096 : 0);
}

static void expect_sample(cps__ckpt_reader *r, const char *step_str)
{
    assert_int_equal(cps__ckpt_reader_count(r), 4);
    assert_string_equal(cps__ckpt_reader_meta(r, "step"), step_str);
    assert_string_equal(cps__ckpt_reader_meta(r, "optimizer"), "adam");
    assert_string_equal(cps__ckpt_reader_meta(r, "format"), "pt");
    assert_null(cps__ckpt_reader_meta(r, "checksum/w"));
    const cps__ckpt_tensor *t = cps__ckpt_reader_find(r, "w");
    assert_non_null(t);
    assert_string_equal(t->dtype, "F32");
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 4);
    assert_int_equal(t->shape[1], 8);
    assert_int_equal(t->nbytes, 128);
    assert_true(t->has_checksum);
    assert_int_equal(t->file_offset % 64, 0);
    float buf[32];
    assert_int_equal(cps__ckpt_reader_read(r, t, buf, sizeof buf), 0);
    assert_memory_equal(buf, w1, sizeof w1);
    assert_int_equal(cps__ckpt_reader_read(r, t, buf, 8), CPS_ESIZE);
    t = cps__ckpt_reader_find(r, "optim/exp_avg/w");
    assert_non_null(t);
    assert_int_equal(cps__ckpt_reader_read(r, t, buf, sizeof buf), 0);
    for (int i = 0; i < 32; i++)
        assert_true(buf[i] == val(3, (uint64_t)i));
    t = cps__ckpt_reader_find(r, "b");
    assert_int_equal(cps__ckpt_reader_read(r, t, buf, sizeof buf), 0);
    assert_memory_equal(buf, b2, sizeof b2);
    t = cps__ckpt_reader_find(r, "counts");
    assert_string_equal(t->dtype, "U64");
    uint64_t c[3];
    assert_int_equal(cps__ckpt_reader_read(r, t, c, sizeof c), 0);
    assert_memory_equal(c, cnt, sizeof cnt);
    for (size_t i = 0; i < cps__ckpt_reader_count(r); i++)
        assert_int_equal(cps__ckpt_reader_verify(r, cps__ckpt_reader_tensor(r, i)), 0);
    assert_null(cps__ckpt_reader_find(r, "nope"));
}

/* ---- round trips ---- */

static void round_trip_single_file(void **state)
{
    (void)state;
    char p[4096], out[4096];
    pathf(p, "a/step-7");
    assert_int_equal(write_sample(p, 0, "7", out), 0);
    pathf(p, "a/step-7/model.safetensors");
    assert_string_equal(out, p);
    assert_int_equal(count_tmp(p), 0);
    cps__ckpt_reader *r;
    pathf(p, "a/step-7");
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0); /* directory */
    expect_sample(r, "7");
    assert_int_equal(cps__ckpt_reader_shard_count(r), 1);
    assert_null(cps__ckpt_reader_index_path(r));
    /* names: a job that knows w, b, counts accepts it (optim/.../w maps to w). */
    const char *known[] = {"w", "b", "counts"};
    assert_int_equal(cps__ckpt_reader_check_names(r, known, 3), 0);
    const char *fewer[] = {"w", "b"};
    assert_int_equal(cps__ckpt_reader_check_names(r, fewer, 2), CPS_ENOTFOUND);
    assert_logged("counts", "not known to the job");
    const char *more[] = {"w", "b", "counts", "extra"};
    assert_int_equal(cps__ckpt_reader_check_names(r, more, 4), CPS_ENOTFOUND);
    assert_logged("extra", "model.safetensors");
    cps__ckpt_reader_close(r);

    /* An explicit .safetensors path; streamed reading. */
    pathf(p, "b.safetensors");
    assert_int_equal(write_sample(p, 0, "8", NULL), 0);
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    expect_sample(r, "8");
    cps__ckpt_reader_close(r);
}

static void round_trip_sharded_with_index(void **state)
{
    (void)state;
    char p[4096], out[4096];
    pathf(p, "s");
    /* 200 bytes per shard: w+b (160) | optim (128) + counts (24) -> 2 shards. */
    assert_int_equal(write_sample(p, 200, "9", out), 0);
    pathf(p, "s/model.safetensors.index.json");
    assert_string_equal(out, p);
    pathf(p, "s/model-00001-of-00002.safetensors");
    assert_int_equal(access(p, R_OK), 0);
    pathf(p, "s/model.safetensors");
    assert_int_not_equal(access(p, F_OK), 0);
    cps__ckpt_reader *r;
    pathf(p, "s");
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    expect_sample(r, "9");
    assert_int_equal(cps__ckpt_reader_shard_count(r), 2);
    assert_int_equal(cps__ckpt_reader_find(r, "w")->shard, 0);
    assert_int_equal(cps__ckpt_reader_find(r, "counts")->shard, 1);
    cps__ckpt_reader_close(r);
    pathf(p, "s/model.safetensors.index.json");
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    cps__ckpt_reader_close(r);
    /* A tensor larger than the shard limit gets a shard of its own. */
    pathf(p, "t");
    assert_int_equal(write_sample(p, 1, "9", NULL), 0);
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    assert_int_equal(cps__ckpt_reader_shard_count(r), 4);
    cps__ckpt_reader_close(r);
}

/* A convolution's weight keeps its 4 dims through a write and a read (torch's load_state_dict
 * needs them as declared). */
static void four_dim_shape_round_trips(void **state)
{
    (void)state;
    char p[4096];
    pathf(p, "conv.safetensors");
    cps__ckpt_writer *w;
    assert_int_equal(cps__ckpt_writer_open(p, 0, &w), 0);
    uint64_t s[4] = {3, 1, 2, 2};
    float d[12];
    for (int i = 0; i < 12; i++)
        d[i] = val(5, (uint64_t)i);
    assert_int_equal(cps__ckpt_writer_add(w, "conv1.weight", CPS_CKPT_F32, 4, s, d), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), 0);
    cps__ckpt_reader *r;
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    const cps__ckpt_tensor *t = cps__ckpt_reader_find(r, "conv1.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 4);
    assert_memory_equal(t->shape, s, sizeof s);
    assert_int_equal(t->numel, 12);
    float back[12];
    assert_int_equal(cps__ckpt_reader_read(r, t, back, sizeof back), 0);
    assert_memory_equal(back, d, sizeof d);
    cps__ckpt_reader_close(r);
}

static void writer_refuses_bad_input(void **state)
{
    (void)state;
    char p[4096];
    pathf(p, "bad");
    cps__ckpt_writer *w;
    assert_int_equal(cps__ckpt_writer_open(p, 0, &w), 0);
    uint64_t s[2] = {2, 2};
    float d[4] = {0};
    assert_int_equal(cps__ckpt_writer_add(w, "", CPS_CKPT_F32, 1, s, d), CPS_EINVAL);
    assert_int_equal(cps__ckpt_writer_add(w, "__metadata__", CPS_CKPT_F32, 1, s, d), CPS_EINVAL);
    assert_int_equal(cps__ckpt_writer_add(w, "bad\xff", CPS_CKPT_F32, 1, s, d), CPS_EINVAL);
    uint64_t nine[CPS_CKPT_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(cps__ckpt_writer_add(w, "x", CPS_CKPT_F32, CPS_CKPT_MAX_DIMS + 1, nine, d),
                     CPS_EINVAL);
    assert_int_equal(cps__ckpt_writer_add(w, "x", CPS_CKPT_F32, 0, s, d), CPS_EINVAL);
    assert_int_equal(cps__ckpt_writer_add(w, "x", (cps__ckpt_dtype)7, 1, s, d), CPS_EINVAL);
    assert_int_equal(cps__ckpt_writer_add(w, "x", CPS_CKPT_F32, 1, s, NULL), CPS_EINVAL);
    uint64_t huge[2] = {UINT64_C(1) << 40, UINT64_C(1) << 40};
    assert_int_equal(cps__ckpt_writer_add(w, "x", CPS_CKPT_F32, 2, huge, d), CPS_EINVAL);
    assert_int_equal(cps__ckpt_writer_set_meta(w, "checksum/x", "1"), CPS_EINVAL);
    assert_int_equal(cps__ckpt_writer_add(w, "x", CPS_CKPT_F32, 2, s, d), 0);
    assert_int_equal(cps__ckpt_writer_add(w, "x", CPS_CKPT_F32, 1, s, d), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), CPS_EEXIST);
    assert_logged("'x' added twice", NULL);
    assert_int_equal(count_tmp(p), 0);
    pathf(p, "bad/model.safetensors");
    assert_int_not_equal(access(p, F_OK), 0);
    /* empty checkpoint */
    pathf(p, "bad");
    assert_int_equal(cps__ckpt_writer_open(p, 0, &w), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), CPS_EINVAL);
    cps__ckpt_writer_abort(NULL);
}

static void fill_error_fails_the_commit_and_leaves_nothing(void **state)
{
    (void)state;
    char p[4096];
    pathf(p, "ff");
    assert_int_equal(write_sample(p, 0, "1", NULL), 0);
    cps__ckpt_writer *w;
    assert_int_equal(cps__ckpt_writer_open(p, 0, &w), 0);
    uint64_t s[1] = {10};
    assert_int_equal(cps__ckpt_writer_add_stream(w, "w", CPS_CKPT_F32, 1, s, fail_fill, NULL), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), CPS_ESTORE);
    assert_logged("'w'", "model.safetensors.tmp");
    assert_int_equal(count_tmp(p), 0);
    cps__ckpt_reader *r;
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    expect_sample(r, "1");
    cps__ckpt_reader_close(r);
}

/* A streamed tensor longer than the writer's buffers (8 MB, filled in place): full buffers are
 * written by a thread of its own while the next are produced, in order, the CRC over all of
 * them; the file's end is not a whole block (O_DIRECT pads it, then cuts the padding off). */
static int fail_third_fill(void *arg, uint64_t first, void *buf, size_t n)
{
    if (first + n > ((uint64_t)8 << 20))
        return CPS_ESTORE;
    return fill_fn(arg, first, buf, n);
}

/* U64 element i of a streamed tensor; the fill checks that it may store through its pointer. */
static int fill_u64(void *arg, uint64_t first, void *buf, size_t n)
{
    (void)arg;
    if ((uintptr_t)buf % sizeof(uint64_t))
        return CPS_EINVAL;
    for (size_t i = 0; i < n; i++)
        ((uint64_t *)buf)[i] = (first + i) * 0x9E3779B97F4A7C15ull;
    return 0;
}

/* An odd number of F32 before a U64 tensor puts the U64 data at 4 mod 8 in the file: its fills
 * still get a pointer aligned for uint64_t, across a write buffer's end (8 MB). In `dir` (the
 * test's directory, or tmpfs, where O_DIRECT is refused and the page cache is used). */
static void misaligned_u64_after_odd_f32_in(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/mis", dir);
    cps__ckpt_writer *w;
    assert_int_equal(cps__ckpt_writer_open(p, 0, &w), 0);
    uint64_t nf = ((uint64_t)1 << 21) - 3, nu = ((uint64_t)1 << 18) + 7; /* 8 MB - 12, 2 MB */
    assert_int_equal(
        cps__ckpt_writer_add_stream(w, "a", CPS_CKPT_F32, 1, &nf, fill_fn, (void *)(intptr_t)2), 0);
    assert_int_equal(cps__ckpt_writer_add_stream(w, "b", CPS_CKPT_U64, 1, &nu, fill_u64, NULL), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), 0);
    cps__ckpt_reader *r;
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    const cps__ckpt_tensor *t = cps__ckpt_reader_find(r, "b");
    assert_non_null(t);
    assert_int_equal(t->file_offset % 8, 4);
    uint64_t *u = malloc(nu * sizeof *u);
    assert_non_null(u);
    assert_int_equal(cps__ckpt_reader_read(r, t, u, nu * sizeof *u), 0);
    for (uint64_t i = 0; i < nu; i++)
        assert_true(u[i] == i * 0x9E3779B97F4A7C15ull);
    free(u);
    float *f = malloc(nf * sizeof *f);
    assert_non_null(f);
    t = cps__ckpt_reader_find(r, "a");
    assert_int_equal(cps__ckpt_reader_read(r, t, f, nf * sizeof *f), 0);
    assert_true(f[0] == val(2, 0) && f[nf - 1] == val(2, nf - 1));
    free(f);
    cps__ckpt_reader_close(r);
}

static void misaligned_u64_after_odd_f32(void **state)
{
    (void)state;
    misaligned_u64_after_odd_f32_in(tmpdir);
    char shm[] = "/dev/shm/cps-ckpt-XXXXXX";
    if (!mkdtemp(shm))
        return; /* no tmpfs here */
    misaligned_u64_after_odd_f32_in(shm);
    char f[64];
    snprintf(f, sizeof f, "%s/mis/model.safetensors", shm);
    unlink(f);
    snprintf(f, sizeof f, "%s/mis", shm);
    rmdir(f);
    rmdir(shm);
}

static void long_streamed_tensor_written_in_order(void **state)
{
    (void)state;
    char p[4096];
    pathf(p, "long");
    uint64_t numel = ((uint64_t)9 << 20) + 5; /* five buffers, the last short */
    cps__ckpt_writer *w;
    assert_int_equal(cps__ckpt_writer_open(p, 0, &w), 0);
    uint64_t s[1] = {numel};
    assert_int_equal(
        cps__ckpt_writer_add_stream(w, "big", CPS_CKPT_F32, 1, s, fill_fn, (void *)(intptr_t)5), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), 0);
    cps__ckpt_reader *r;
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    const cps__ckpt_tensor *t = cps__ckpt_reader_find(r, "big");
    assert_non_null(t);
    assert_true(t->has_checksum);
    float *buf = malloc(numel * sizeof *buf);
    assert_non_null(buf);
    /* The reader checks the CRC the writer's thread computed. */
    assert_int_equal(cps__ckpt_reader_read(r, t, buf, numel * sizeof *buf), 0);
    for (uint64_t i = 0; i < numel; i += 4099)
        assert_true(buf[i] == val(5, i));
    assert_true(buf[numel - 1] == val(5, numel - 1));
    free(buf);
    cps__ckpt_reader_close(r);

    /* A fill failing after buffers were handed over: nothing published, no temporary left. */
    pathf(p, "longfail");
    assert_int_equal(cps__ckpt_writer_open(p, 0, &w), 0);
    assert_int_equal(cps__ckpt_writer_add_stream(w, "big", CPS_CKPT_F32, 1, s, fail_third_fill,
                                                 (void *)(intptr_t)5),
                     0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), CPS_ESTORE);
    assert_int_equal(count_tmp(p), 0);
    char f[4200];
    snprintf(f, sizeof f, "%s/model.safetensors", p);
    assert_int_equal(access(f, F_OK), -1);
}

/* ---- corruption ---- */

static void open_fails(const char *path, int want, const char *problem)
{
    cps__ckpt_reader *r = NULL;
    last_log[0] = '\0';
    int rc = cps__ckpt_reader_open(path, &r);
    if (rc != want)
        fail_msg("%s: got %s, wanted %s (log: %s)", problem, cps_err_name(rc), cps_err_name(want),
                 last_log);
    assert_logged(strrchr(path, '/') + 1, problem);
}

static void truncated_file_is_refused_at_every_length(void **state)
{
    (void)state;
    char p[4096], q[4096];
    pathf(p, "good.safetensors");
    assert_int_equal(write_sample(p, 0, "3", NULL), 0);
    size_t len;
    unsigned char *b = slurp(p, &len);
    pathf(q, "cut.safetensors");
    for (size_t n = 0; n < len; n++) {
        spit(q, b, n);
        cps__ckpt_reader *r = NULL;
        last_log[0] = '\0';
        int rc = cps__ckpt_reader_open(q, &r);
        if (rc != CPS_ECORRUPT)
            fail_msg("file cut to %zu of %zu bytes: %s", n, len, cps_err_name(rc));
        assert_logged("cut.safetensors", "corrupt checkpoint");
    }
    spit(q, b, 3);
    open_fails(q, CPS_ECORRUPT, "shorter than the 8-byte header length");
    spit(q, b, len - 1);
    open_fails(q, CPS_ECORRUPT, "past the data section");
    free(b);
}

static void flipped_data_bit_names_the_tensor(void **state)
{
    (void)state;
    char p[4096];
    pathf(p, "flip.safetensors");
    assert_int_equal(write_sample(p, 0, "3", NULL), 0);
    cps__ckpt_reader *r;
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    uint64_t off = cps__ckpt_reader_find(r, "optim/exp_avg/w")->file_offset;
    cps__ckpt_reader_close(r);
    size_t len;
    unsigned char *b = slurp(p, &len);
    b[off + 77] ^= 0x04;
    spit(p, b, len);
    free(b);
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0); /* structure is fine */
    for (size_t i = 0; i < cps__ckpt_reader_count(r); i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        int want = strcmp(t->name, "optim/exp_avg/w") ? 0 : CPS_ECORRUPT;
        assert_int_equal(cps__ckpt_reader_verify(r, t), want);
    }
    assert_logged("'optim/exp_avg/w': checksum mismatch", "flip.safetensors");
    float buf[32];
    assert_int_equal(
        cps__ckpt_reader_read(r, cps__ckpt_reader_find(r, "optim/exp_avg/w"), buf, sizeof buf),
        CPS_ECORRUPT);
    cps__ckpt_reader_close(r);
}

static void every_flipped_header_bit_is_refused(void **state)
{
    (void)state;
    char p[4096], q[4096];
    pathf(p, "h.safetensors");
    assert_int_equal(write_sample(p, 0, "12345", NULL), 0);
    size_t len;
    unsigned char *b = slurp(p, &len);
    uint64_t hlen = 0;
    memcpy(&hlen, b, 8);
    pathf(q, "hflip.safetensors");
    /* Every bit of the length prefix and of the header, one at a time: the metadata values
     * (e.g. the step) are only protected by checksum/__header__. */
    for (size_t i = 0; i < 8 + hlen; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (unsigned char)(1u << bit);
            spit(q, b, len);
            b[i] ^= (unsigned char)(1u << bit);
            cps__ckpt_reader *r = NULL;
            int rc = cps__ckpt_reader_open(q, &r);
            if (rc != CPS_ECORRUPT) {
                cps__ckpt_reader_close(r);
                fail_msg("bit %d of byte %zu flipped: %s", bit, i, cps_err_name(rc));
            }
        }
    }
    /* a sample of the messages */
    b[8 + 20] ^= 1;
    spit(q, b, len);
    b[8 + 20] ^= 1;
    cps__ckpt_reader *r;
    assert_int_equal(cps__ckpt_reader_open(q, &r), CPS_ECORRUPT);
    assert_logged("hflip.safetensors", "corrupt checkpoint");
    free(b);
}

static void header_length_larger_than_the_file(void **state)
{
    (void)state;
    char p[4096];
    pathf(p, "len.safetensors");
    assert_int_equal(write_sample(p, 0, "3", NULL), 0);
    size_t len;
    unsigned char *b = slurp(p, &len);
    uint64_t big = len;
    memcpy(b, &big, 8);
    spit(p, b, len);
    open_fails(p, CPS_ECORRUPT, "exceeds the file size");
    big = UINT64_MAX;
    memcpy(b, &big, 8);
    spit(p, b, len);
    open_fails(p, CPS_ECORRUPT, "exceeds the 104857600 byte limit");
    free(b);
}

/* A safetensors file with a hand-written header and `data` zero bytes of data. */
static void craft(const char *name, const char *header, size_t data, char *path)
{
    pathf(path, "%s", name);
    size_t h = strlen(header);
    unsigned char *b = calloc(1, 8 + h + data);
    uint64_t hl = h;
    memcpy(b, &hl, 8);
    memcpy(b + 8, header, h);
    spit(path, b, 8 + h + data);
    free(b);
}

#define T(name, dtype, shape, b, e)                                                                \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void crafted_headers(void **state)
{
    (void)state;
    char p[4096];
    cps__ckpt_reader *r;
    /* A third-party file (no checksums, other dtypes, scalar, padding) opens. */
    craft("ok.safetensors",
          "{" T("a", "F32", "[2,2]", 0, 16) "," T("s", "F16", "[]", 16, 18) "," T(
              "z", "BF16", "[0,5]", 18, 18) ",\"__metadata__\":{\"k\":\"v\"}}    ",
          18, p);
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    assert_int_equal(cps__ckpt_reader_count(r), 3);
    assert_false(cps__ckpt_reader_find(r, "a")->has_checksum);
    assert_int_equal(cps__ckpt_reader_find(r, "s")->ndim, 0);
    assert_int_equal(cps__ckpt_reader_find(r, "s")->numel, 1);
    assert_int_equal(cps__ckpt_reader_verify(r, cps__ckpt_reader_find(r, "a")), 0);
    cps__ckpt_reader_close(r);

    craft("overlap.safetensors",
          "{" T("a", "F32", "[4]", 0, 16) "," T("b", "F32", "[4]", 8, 24) "}", 24, p);
    open_fails(p, CPS_ECORRUPT, "'b' overlaps");
    craft("range.safetensors", "{" T("a", "F32", "[4]", 0, 16) "}", 8, p);
    open_fails(p, CPS_ECORRUPT, "past the data section");
    craft("gap.safetensors", "{" T("a", "F32", "[2]", 8, 16) "}", 16, p);
    open_fails(p, CPS_ECORRUPT, "gap in the data section");
    craft("extra.safetensors", "{" T("a", "F32", "[2]", 0, 8) "}", 16, p);
    open_fails(p, CPS_ECORRUPT, "data section has 16 bytes but the tensors cover 8");
    craft("backwards.safetensors", "{" T("a", "F32", "[0]", 8, 0) "}", 8, p);
    open_fails(p, CPS_ECORRUPT, "before begin");
    craft("shape.safetensors", "{" T("a", "F32", "[3]", 0, 16) "}", 16, p);
    open_fails(p, CPS_ECORRUPT, "shape and dtype give 12 bytes but data_offsets span 16");
    craft("bigshape.safetensors", "{" T("a", "F32", "[4294967296,4294967296]", 0, 16) "}", 16, p);
    open_fails(p, CPS_ECORRUPT, "shape too large");
    craft("dtype.safetensors", "{" T("a", "F31", "[4]", 0, 16) "}", 16, p);
    open_fails(p, CPS_ECORRUPT, "'a': unknown dtype");
    craft("dup.safetensors", "{" T("a", "F32", "[4]", 0, 16) "," T("a", "F32", "[4]", 16, 32) "}",
          32, p);
    open_fails(p, CPS_ECORRUPT, "duplicate key \"a\"");
    craft("negshape.safetensors", "{" T("a", "F32", "[-4]", 0, 16) "}", 16, p);
    open_fails(p, CPS_ECORRUPT, "non-integer");
    craft("extrakey.safetensors",
          "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, p);
    open_fails(p, CPS_ECORRUPT, "exactly dtype, shape and data_offsets");
    craft("meta.safetensors", "{" T("a", "F32", "[1]", 0, 4) ",\"__metadata__\":{\"step\":5}}", 4,
          p);
    open_fails(p, CPS_ECORRUPT, "'step' is not a string");
    craft("ck.safetensors",
          "{" T("a", "F32", "[1]", 0, 4) ",\"__metadata__\":{\"checksum/b\":\"crc32:00000000\"}}",
          4, p);
    open_fails(p, CPS_ECORRUPT, "checksum/b names no tensor");
    craft("ckfmt.safetensors",
          "{" T("a", "F32", "[1]", 0, 4) ",\"__metadata__\":{\"checksum/a\":\"md5:0\"}}", 4, p);
    open_fails(p, CPS_ECORRUPT, "checksum/a is not");
    craft("trail.safetensors", "{" T("a", "F32", "[1]", 0, 4) "}x", 4, p);
    open_fails(p, CPS_ECORRUPT, "trailing characters");
    craft("start.safetensors", " {" T("a", "F32", "[1]", 0, 4) "}", 4, p);
    open_fails(p, CPS_ECORRUPT, "does not start with '{'");
    craft("array.safetensors", "{\"a\":[]}", 0, p);
    open_fails(p, CPS_ECORRUPT, "not an object");
}

static void index_problems(void **state)
{
    (void)state;
    char p[4096], q[4096];
    pathf(p, "ix");
    assert_int_equal(write_sample(p, 200, "5", NULL), 0);
    pathf(q, "ix/model.safetensors.index.json");
    size_t len;
    char *orig = (char *)slurp(q, &len);
    orig[len] = '\0';
    char *text = malloc(len + 64);

    /* weight_map sends a tensor to the wrong shard */
    strcpy(text, orig);
    char *at = strstr(text, "\"counts\": \"model-00002");
    assert_non_null(at);
    at[strlen("\"counts\": \"model-0000")] = '1';
    spit(q, text, strlen(text));
    open_fails(q, CPS_ECORRUPT, "weight_map puts 'counts' in model-00001-of-00002.safetensors");
    /* weight_map names a tensor no shard holds */
    strcpy(text, orig);
    at = strstr(text, "\"weight_map\": {");
    at += strlen("\"weight_map\": {");
    const char *ghost = "\"ghost\": \"model-00001-of-00002.safetensors\",";
    memmove(at + strlen(ghost), at, strlen(at) + 1);
    memcpy(at, ghost, strlen(ghost));
    spit(q, text, strlen(text));
    open_fails(q, CPS_ECORRUPT, "weight_map names 'ghost'");
    /* wrong total_size, mismatched metadata, path in a file name, bad JSON */
    strcpy(text, orig);
    at = strstr(text, "\"total_size\": 312");
    assert_non_null(at);
    at[15] = '3';
    spit(q, text, strlen(text));
    open_fails(q, CPS_ECORRUPT, "total_size");
    strcpy(text, orig);
    at = strstr(text, "\"step\": \"5\"");
    at[9] = '6';
    spit(q, text, strlen(text));
    open_fails(q, CPS_ECORRUPT, "metadata 'step' differs");
    strcpy(text, orig);
    at = strstr(text, "\"w\": \"model-");
    memcpy(at + 6, "../", 3);
    spit(q, text, strlen(text));
    open_fails(q, CPS_ECORRUPT, "not a plain file name");
    spit(q, orig, len - 3);
    open_fails(q, CPS_ECORRUPT, "JSON");
    spit(q, orig, len);

    /* a missing shard */
    pathf(p, "ix/model-00002-of-00002.safetensors");
    pathf(q, "ix/moved");
    assert_int_equal(rename(p, q), 0);
    pathf(q, "ix");
    open_fails(q, CPS_ECORRUPT, "shard");
    assert_logged("model-00002-of-00002.safetensors is missing", "index.json");
    pathf(q, "ix/moved");
    assert_int_equal(rename(q, p), 0);

    /* shards of two checkpoints mixed: same layout, another step */
    pathf(q, "iy");
    assert_int_equal(write_sample(q, 200, "6", NULL), 0);
    pathf(q, "iy/model-00002-of-00002.safetensors");
    assert_int_equal(rename(q, p), 0);
    pathf(q, "ix");
    open_fails(q, CPS_ECORRUPT, "metadata 'step' differs from shard");

    /* a directory with both a single file and an index is ambiguous */
    pathf(p, "ix/model.safetensors");
    spit(p, "x", 1);
    pathf(q, "ix");
    open_fails(q, CPS_ECORRUPT, "holds both");
    free(text);
    free(orig);
}

/* ---- disk full ---- */

/* In a child limited to `limit` bytes per file (EFBIG, like ENOSPC, from write()): write a
 * checkpoint of tensors t0..t3 of n, n, n and 2n floats to path. Returns the commit's result. */
static int commit_in_limited_child(const char *path, uint64_t max_shard, rlim_t limit, size_t n)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(100);
        float *d = calloc(5 * n, sizeof *d);
        cps__ckpt_writer *w;
        if (!d || cps__ckpt_writer_open(path, max_shard, &w))
            _exit(101);
        for (size_t t = 0; t < 4; t++) {
            char name[16];
            uint64_t s[1] = {t == 3 ? 2 * n : n};
            snprintf(name, sizeof name, "t%zu", t);
            if (cps__ckpt_writer_add(w, name, CPS_CKPT_F32, 1, s, d + t * n))
                _exit(102);
        }
        cps__ckpt_writer_set_meta(w, "step", "999");
        int rc = cps__ckpt_writer_commit(w, NULL, 0);
        free(d);
        char lp[4096];
        pathf(lp, "child.log"); /* the parent checks what the child logged */
        signal(SIGXFSZ, SIG_DFL);
        setrlimit(RLIMIT_FSIZE, &(struct rlimit){RLIM_INFINITY, RLIM_INFINITY});
        FILE *f = fopen(lp, "w");
        if (f) {
            fputs(last_log, f);
            fclose(f);
        }
        _exit(-rc);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    char lp[4096];
    pathf(lp, "child.log");
    FILE *f = fopen(lp, "r");
    last_log[0] = '\0';
    if (f) {
        if (!fgets(last_log, sizeof last_log, f))
            last_log[0] = '\0';
        fclose(f);
        unlink(lp);
    }
    return -WEXITSTATUS(st);
}

static void disk_full_leaves_no_temporary_and_keeps_the_earlier_checkpoint(void **state)
{
    (void)state;
    char p[4096];
    cps__ckpt_reader *r;
    /* Same name as the earlier checkpoint: the strongest case (it must survive). */
    pathf(p, "full");
    assert_int_equal(write_sample(p, 0, "41", NULL), 0);
    last_log[0] = '\0';
    assert_int_equal(commit_in_limited_child(p, 0, 64 << 10, 1 << 18), CPS_EIO);
    assert_logged("full/model.safetensors.tmp: write failed", "File too large");
    assert_int_equal(count_tmp(p), 0);
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    expect_sample(r, "41");
    cps__ckpt_reader_close(r);

    /* Sharded: shards 1-3 (1 MiB) fit, shard 4 (2 MiB) does not; nothing new appears. */
    pathf(p, "full2");
    assert_int_equal(write_sample(p, 200, "42", NULL), 0);
    assert_int_equal(commit_in_limited_child(p, 1 << 20, (1 << 20) + 4096, 1 << 18), CPS_EIO);
    assert_logged("model-00004-of-00004.safetensors.tmp: write failed", NULL);
    assert_int_equal(count_tmp(p), 0);
    pathf(p, "full2/model-00001-of-00004.safetensors");
    assert_int_not_equal(access(p, F_OK), 0);
    pathf(p, "full2");
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    expect_sample(r, "42");
    cps__ckpt_reader_close(r);

    /* And the unconstrained write of the same checkpoint works. */
    pathf(p, "full3");
    assert_int_equal(commit_in_limited_child(p, 1 << 20, RLIM_INFINITY, 1 << 18), 0);
    assert_int_equal(cps__ckpt_reader_open(p, &r), 0);
    assert_int_equal(cps__ckpt_reader_shard_count(r), 4);
    assert_string_equal(cps__ckpt_reader_meta(r, "step"), "999");
    cps__ckpt_reader_close(r);
}

/* ---- JSON, names, optimizer description ---- */

static void json_is_strict(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",
        "{",
        "{\"a\":1,}",
        "[1,]",
        "01",
        "1.",
        "-",
        "1e",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\u0000\"",
        "\"a\nb\"",
        "\"\xc0\xaf\"",
        "\"\xed\xa0\x80\"",
        "nul",
        "{\"a\" 1}",
        "{1:2}",
        "[1 2]",
        "{\"a\":1,\"a\":2}",
        "1 2",
        "\"abc",
        "tru",
        "{\"a\":1}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cps__json_doc *d = NULL;
        const cps__json *root;
        char err[128];
        if (cps__json_parse(bad[i], strlen(bad[i]), &d, &root, err, sizeof err) != CPS_ECORRUPT)
            fail_msg("accepted bad JSON #%zu '%s'", i, bad[i]);
        assert_non_null(strstr(err, "JSON:"));
    }
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    cps__json_doc *d;
    const cps__json *root;
    assert_int_equal(cps__json_parse(deep, 200, &d, &root, NULL, 0), CPS_ECORRUPT);
    const char *good = " {\"a\\u00e9\\ud83d\\ude00\":[1, -2.5e3, 18446744073709551615, "
                       "18446744073709551616, true, false, null, \"x\\\"y\"]} ";
    assert_int_equal(cps__json_parse(good, strlen(good), &d, &root, NULL, 0), 0);
    const cps__json *a = cps__json_get(root, "a\xc3\xa9\xf0\x9f\x98\x80");
    assert_non_null(a);
    assert_int_equal(a->n, 8);
    assert_true(a->child->is_uint && a->child->u64 == 1);
    assert_false(a->child->next->is_uint);
    assert_true(a->child->next->num == -2500.0);
    assert_true(a->child->next->next->is_uint && a->child->next->next->u64 == UINT64_MAX);
    assert_false(a->child->next->next->next->is_uint);
    cps__json_free(d);
}

static void names_and_optimizer_description(void **state)
{
    (void)state;
    assert_string_equal(cps__ckpt_slot_name(CPS_W_OPT_ADAM, 0), "exp_avg");
    assert_string_equal(cps__ckpt_slot_name(CPS_W_OPT_ADAM, 1), "exp_avg_sq");
    assert_null(cps__ckpt_slot_name(CPS_W_OPT_ADAM, 2));
    assert_string_equal(cps__ckpt_slot_name(CPS_W_OPT_MOMENTUM, 0), "momentum_buffer");
    assert_string_equal(cps__ckpt_slot_name(CPS_W_OPT_ADAGRAD, 0), "sum");
    assert_string_equal(cps__ckpt_slot_name(CPS_W_OPT_RMSPROP, 0), "square_avg");
    assert_null(cps__ckpt_slot_name(CPS_W_OPT_SGD, 0));
    char b[16];
    assert_int_equal(cps__ckpt_optim_tensor_name(b, sizeof b, CPS_W_OPT_ADAM, 1, "long-name"),
                     CPS_EINVAL);
    cps__param_spec s = {.init_kind = CPS_W_INIT_UNIFORM,
                         .init_a = -0.1f,
                         .init_b = 0.1f,
                         .init_seed = UINT64_MAX,
                         .opt_kind = CPS_W_OPT_MOMENTUM,
                         .nesterov = 1,
                         .lr = 0.01f,
                         .weight_decay = 1e-4f,
                         .momentum = 0.9f};
    char js[512];
    assert_true(cps__ckpt_spec_to_json(&s, js, sizeof js) > 0);
    assert_non_null(strstr(js, "\"lr\":0.01,"));
    cps__param_spec back;
    assert_int_equal(cps__ckpt_spec_from_json(js, &back), 0);
    assert_memory_equal(&back, &s, sizeof s);
    assert_int_equal(cps__ckpt_spec_to_json(&s, js, 20), CPS_ESIZE);
    assert_int_equal(cps__ckpt_spec_from_json("{\"optimizer\":\"adam\"}", &back), CPS_ECORRUPT);
    /* CRC-32 check value */
    assert_int_equal(cps__ckpt_crc32(0, "123456789", 9), 0xCBF43926u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(round_trip_single_file, setup, teardown),
        cmocka_unit_test_setup_teardown(round_trip_sharded_with_index, setup, teardown),
        cmocka_unit_test_setup_teardown(writer_refuses_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(four_dim_shape_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(long_streamed_tensor_written_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(misaligned_u64_after_odd_f32, setup, teardown),
        cmocka_unit_test_setup_teardown(fill_error_fails_the_commit_and_leaves_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(truncated_file_is_refused_at_every_length, setup, teardown),
        cmocka_unit_test_setup_teardown(flipped_data_bit_names_the_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(every_flipped_header_bit_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(header_length_larger_than_the_file, setup, teardown),
        cmocka_unit_test_setup_teardown(crafted_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(index_problems, setup, teardown),
        cmocka_unit_test_setup_teardown(
            disk_full_leaves_no_temporary_and_keeps_the_earlier_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(json_is_strict, setup, teardown),
        cmocka_unit_test_setup_teardown(names_and_optimizer_description, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
