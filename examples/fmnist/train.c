/* fmnist: train an MLP or a LeNet-5-style CNN on Fashion-MNIST through chainps, or alone with
 * --local as the baseline.
 *
 * Parameter-server mode: every worker declares the same tensors (the optimizer runs on the
 * servers), pulls the initial values, then per step computes gradients on its batch and
 * push-pulls each tensor. In sync mode (CHAINPS_MODE unset or "sync") the servers SUM the
 * gradients of all workers for a step, so each worker scales its gradient by 1/num_workers and
 * the update uses the average gradient over the global batch, as in single-process training with
 * batch * num_workers. In async/SSP mode every push is applied by itself, so gradients are sent
 * unscaled. (The worker API does not report the mode, so it is read from CHAINPS_MODE, the same
 * variable the library reads.) --schedule cosine also scales the gradient, by a cosine of the
 * step: the servers' learning rate is fixed at declaration, and with SGD/momentum scaling the
 * gradient is the same as scaling the rate (see README.md).
 *
 * --local runs the same model, data order (rank 0 of a 1-worker job), initial values
 * (cps_init_values) and update rules (fm_optim_apply, the formulas of the servers) in one
 * process, so a 1-worker job and --local should follow the same trajectory.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "chainps/chainps.h"
#include "data.h"
#include "model.h"
#include "options.h"

typedef struct run {
    fm_opts o;
    cps_client *cli;
    int rank, nworkers;
    fm_model *m;
    cps_tensor *tensors[FM_MAX_PARAMS];
    float *state[FM_MAX_PARAMS]; /* --local and --allreduce optimizer state */
    cps_freq *freq;              /* --allreduce: when the gradients travel */
    uint64_t updates;            /* --allreduce: optimizer steps applied (Adam's t) */
    cps_optim optim;
    float grad_scale;     /* 1/num_workers in sync mode, else 1 */
    uint64_t total_steps; /* planned steps, the length of the cosine schedule */
    FILE *csv;
    char csv_path[4096], plot_path[4096], model_path[4096];
    struct timespec t0;
    double t0_unix;  /* t0 on the wall clock: where launch's kill falls on the plot */
    double loss_sum; /* losses since the CSV's last loss point, and how many */
    long loss_n;
    double wait_s; /* training loop: time spent in cps_wait, i.e. not hidden behind compute */
    double cpu_s;  /* training loop: this process's CPU time, every thread */
    int plot_failed;
    int loss_rows, acc_rows; /* what the CSV holds, so the plot only draws series with points */
    double acc_min, acc_max;
} run;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fmnist: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* mkdir -p: the output directory may be several levels deep. */
static int mkdir_p(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static void check(int rc, const char *what, const char *name)
{
    if (rc != CPS_OK)
        die("%s(%s): %s (%s)", what, name, cps_strerror(rc), cps_err_name(rc));
}

/* Declare every tensor on the servers and pull its initial values (the first declaration
 * creates them; later workers find them, so everyone starts from the servers' copy). */
static void ps_setup(run *r)
{
    for (int i = 0; i < fm_model_num_params(r->m); i++) {
        fm_param *p = fm_model_param(r->m, i);
        check(cps_tensor_declare_shape(r->cli, p->name, p->ndim, p->dims, &p->init, &r->optim,
                                       &r->tensors[i]),
              "cps_tensor_declare_shape", p->name);
        check(cps_pull(r->cli, r->tensors[i], p->value, p->len), "cps_pull", p->name);
    }
}

static double now_s(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void local_setup(run *r);

/* --allreduce: the same initial values on every worker (cps_init_values depends on the seed
 * only), then the schedule over every gradient and, for the warm-up's average, every parameter
 * and optimizer state buffer. */
static void allreduce_setup(run *r)
{
    local_setup(r);
    int n = fm_model_num_params(r->m), ns = 0;
    size_t slots = fm_optim_state_slots(r->optim.kind);
    cps_freq_buf grads[FM_MAX_PARAMS], state[2 * FM_MAX_PARAMS];
    for (int i = 0; i < n; i++) {
        fm_param *p = fm_model_param(r->m, i);
        grads[i] = (cps_freq_buf){p->grad, p->len};
        state[ns++] = (cps_freq_buf){p->value, p->len};
    }
    for (int i = 0; slots && i < n; i++)
        state[ns++] = (cps_freq_buf){r->state[i], slots * fm_model_param(r->m, i)->len};
    cps_freq_config cfg = {.sync_every = r->o.sync_every, .warmup_steps = r->o.warmup};
    int rc = cps_freq_create(r->cli, &cfg, grads, (size_t)n, state, (size_t)ns, &r->freq);
    if (rc != CPS_OK)
        die("cps_freq_create: %s (%s)", cps_strerror(rc), cps_last_error_message());
}

/* Parameters on the servers with --sync-every: the schedule only counts and sums (a warm-up is
 * refused: the workers hold no parameters of their own to train). */
static void ps_freq_setup(run *r)
{
    int n = fm_model_num_params(r->m);
    cps_freq_buf grads[FM_MAX_PARAMS];
    for (int i = 0; i < n; i++)
        grads[i] = (cps_freq_buf){fm_model_param(r->m, i)->grad, fm_model_param(r->m, i)->len};
    cps_freq_config cfg = {
        .sync_every = r->o.sync_every, .warmup_steps = r->o.warmup, .target = CPS_FREQ_SERVERS};
    int rc = cps_freq_create(r->cli, &cfg, grads, (size_t)n, NULL, 0, &r->freq);
    if (rc != CPS_OK)
        die("cps_freq_create: %s (%s)", cps_strerror(rc), cps_last_error_message());
}

static void local_setup(run *r)
{
    size_t slots = fm_optim_state_slots(r->optim.kind);
    for (int i = 0; i < fm_model_num_params(r->m); i++) {
        fm_param *p = fm_model_param(r->m, i);
        cps_init_values(&p->init, 0, p->value, p->len);
        if (slots) {
            r->state[i] = calloc(slots * p->len, sizeof(float));
            if (!r->state[i])
                die("out of memory for optimizer state");
        }
    }
}

/* The step-size factor of step `step` (1-based): 1/num_workers in sync mode, times the cosine
 * schedule. */
static float step_scale(const run *r, uint64_t step)
{
    float scale = r->grad_scale;
    if (r->o.cosine)
        scale *= (float)(0.5 * (1.0 + cos(M_PI * (double)(step - 1) / (double)r->total_steps)));
    return scale;
}

/* One step's updates, made parameter by parameter as the backward pass finishes each gradient
 * (fm_model_forward_backward_cb): the last layers' push-pulls go out, are aggregated and applied
 * by the servers while this worker still differentiates the layers below. The next forward pass
 * reads every value, so the step ends by waiting for all of them (finish_step). */
typedef struct step_io {
    run *r;
    uint64_t step;
    float scale;
    int started;
    cps_handle *h[FM_MAX_PARAMS];
    int param[FM_MAX_PARAMS]; /* the parameter h[k] updates */
    int err, bad;             /* first failure to start an operation, and its parameter */
} step_io;

static void push_param(step_io *s, int i);

static void grad_ready(void *ctx, int i)
{
    step_io *s = ctx;
    run *r = s->r;
    fm_param *p = fm_model_param(r->m, i);
    /* Scaled the same way in both modes, so --local and a 1-worker job stay bit-identical. */
    if (s->scale != 1.0f)
        cblas_sscal((int)p->len, s->scale, p->grad, 1);
    if (r->o.local) {
        fm_optim_apply(&r->optim, p->value, r->state[i], p->grad, p->len, s->step);
        return;
    }
    if (r->freq)
        return; /* finish_step asks cps_freq, once every gradient is in */
    push_param(s, i);
}

static void push_param(step_io *s, int i)
{
    run *r = s->r;
    fm_param *p = fm_model_param(r->m, i);
    if (s->err != CPS_OK)
        return; /* nothing more after a failure; finish_step reports it */
    int rc =
        cps_push_pull_async(r->cli, r->tensors[i], p->grad, p->value, p->len, &s->h[s->started]);
    if (rc != CPS_OK) {
        s->err = rc;
        s->bad = i;
        return;
    }
    s->param[s->started++] = i;
}

/* Forward, backward and the step's updates. --no-overlap starts them after the whole backward
 * pass, in declaration order (as before the overlap: the comparison row of the benchmark). */
static double train_step(run *r, const float *x, const uint8_t *y, int b, uint64_t step,
                         step_io *io)
{
    *io = (step_io){.r = r, .step = step, .scale = step_scale(r, step)};
    if (!r->o.no_overlap && !r->freq)
        return fm_model_forward_backward_cb(r->m, x, y, b, NULL, grad_ready, io);
    double loss = fm_model_forward_backward(r->m, x, y, b, NULL);
    for (int i = 0; isfinite(loss) && i < fm_model_num_params(r->m); i++)
        grad_ready(io, i);
    return loss;
}

/* --allreduce: the gradients go to cps_freq, which says whether this step updates the
 * parameters (every k-th step with the mean of the k steps' gradients over the workers, or
 * every warm-up step with this worker's own), and averages parameters and optimizer state at the
 * warm-up's end. */
static void allreduce_step(run *r)
{
    double t0 = now_s(CLOCK_MONOTONIC);
    int rc = cps_freq_grad(r->freq);
    if (rc == CPS_FREQ_APPLY) {
        r->updates++;
        for (int i = 0; i < fm_model_num_params(r->m); i++) {
            fm_param *p = fm_model_param(r->m, i);
            fm_optim_apply(&r->optim, p->value, r->state[i], p->grad, p->len, r->updates);
        }
    }
    if (rc >= 0)
        rc = cps_freq_step_end(r->freq);
    r->wait_s += now_s(CLOCK_MONOTONIC) - t0;
    check(rc < 0 ? rc : 0, "cps_freq", "gradients");
}

/* Wait for every push-pull of the step, even after a failure: started operations still own
 * their buffers. */
static void finish_step(run *r, step_io *s)
{
    if (r->o.local)
        return;
    if (r->o.allreduce) {
        allreduce_step(r);
        return;
    }
    double t0 = now_s(CLOCK_MONOTONIC);
    /* --sync-every K on the servers: the window's mean gradient is pushed every K-th step. */
    int verdict = r->freq ? cps_freq_grad(r->freq) : CPS_FREQ_APPLY;
    check(verdict < 0 ? verdict : 0, "cps_freq_grad", "gradients");
    for (int i = 0; r->freq && verdict == CPS_FREQ_APPLY && i < fm_model_num_params(r->m); i++)
        push_param(s, i);
    for (int k = 0; k < s->started; k++) {
        int rc = cps_wait(s->h[k], -1);
        if (rc != CPS_OK && s->err == CPS_OK) {
            s->err = rc;
            s->bad = s->param[k];
        }
    }
    r->wait_s += now_s(CLOCK_MONOTONIC) - t0;
    if (s->err != CPS_OK)
        check(s->err, "cps_push_pull", fm_model_param(r->m, s->bad)->name);
    if (r->freq) {
        int rc = cps_freq_step_end(r->freq);
        check(rc < 0 ? rc : 0, "cps_freq_step_end", "gradients");
    }
}

static double evaluate(run *r, const fm_dataset *test)
{
    int mb = fm_model_max_batch(r->m);
    float *x = malloc((size_t)mb * FM_PIXELS * sizeof *x);
    if (!x)
        die("out of memory");
    size_t hits = 0;
    for (size_t i = 0; i < test->n; i += (size_t)mb) {
        int b = test->n - i < (size_t)mb ? (int)(test->n - i) : mb;
        int c = 0;
        fm_pixels_to_float(test->pixels + i * FM_PIXELS, (size_t)b * FM_PIXELS, x);
        fm_model_evaluate(r->m, x, test->labels + i, b, &c);
        hits += (size_t)c;
    }
    free(x);
    return 100.0 * (double)hits / (double)test->n;
}

static void shuffle(uint32_t *perm, size_t n, uint64_t seed, int epoch, int rank)
{
    uint64_t s = fm_mix64(fm_mix64(seed ^ 0x5348554646u) ^
                          fm_mix64(((uint64_t)epoch << 32) | (uint32_t)rank));
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        /* Rejection sampling: plain modulo would favour small indices. */
        uint64_t bound = (uint64_t)i + 1, lim = UINT64_MAX - UINT64_MAX % bound, x;
        do {
            s += 0x9e3779b97f4a7c15ull;
            x = fm_mix64(s);
        } while (x >= lim);
        size_t j = (size_t)(x % bound);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static uint64_t checksum(fm_model *m)
{
    uint64_t h = 0;
    for (int i = 0; i < fm_model_num_params(m); i++) {
        fm_param *p = fm_model_param(m, i);
        h = fm_hash64(h, p->value, p->len * sizeof(float));
    }
    return h;
}

/* Format: "FMNIST01", u32 tensor count, then per tensor u32 name length, name, u64 element
 * count, float32 values; all little-endian (the host order on every platform we build for). */
static int save_model(fm_model *m, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint32_t np = (uint32_t)fm_model_num_params(m);
    int ok = fwrite("FMNIST01", 1, 8, f) == 8 && fwrite(&np, sizeof np, 1, f) == 1;
    for (uint32_t i = 0; ok && i < np; i++) {
        fm_param *p = fm_model_param(m, (int)i);
        uint32_t nl = (uint32_t)strlen(p->name);
        uint64_t len = p->len;
        ok = fwrite(&nl, sizeof nl, 1, f) == 1 && fwrite(p->name, 1, nl, f) == nl &&
             fwrite(&len, sizeof len, 1, f) == 1 &&
             fwrite(p->value, sizeof(float), p->len, f) == p->len;
    }
    if (fclose(f) != 0)
        ok = 0;
    return ok ? 0 : -1;
}

static int have_gnuplot(void)
{
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/bin:/bin";
    char buf[4096];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && (size_t)snprintf(buf, sizeof buf, "%.*s/gnuplot", (int)n, p) < sizeof buf &&
            access(buf, X_OK) == 0)
            return 1;
        p += n;
        if (*p == ':')
            p++;
    }
    return 0;
}

static int plot(run *r)
{
    if (!have_gnuplot()) {
        printf("gnuplot not found in PATH: skipping the plot\n");
        return -1;
    }
    if (r->loss_rows == 0 && r->acc_rows == 0) {
        printf("nothing to plot\n");
        return -1;
    }
    if (strchr(r->csv_path, '\'') || strchr(r->plot_path, '\'')) {
        printf("a quote in %s or %s cannot be passed to gnuplot: skipping the plot\n", r->csv_path,
               r->plot_path);
        return -1;
    }
    FILE *g = popen("gnuplot", "w");
    if (!g)
        return -1;
    /* pngcairo draws anti-aliased lines; plain png is the fallback of builds without cairo. */
    fprintf(g,
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) "
            "{ set terminal pngcairo size 1000,600 } else { set terminal png size 1000,600 }\n"
            "set output '%s'\n"
            "set datafile separator ','\n"
            "set title 'Fashion-MNIST %s, %s, %s lr %g (%s), batch %d'\n"
            "set xlabel 'time (s)'\n"
            "set ylabel 'training loss (mean since the last point)'\n"
            "set y2label 'test accuracy (%%)'\n"
            "set ytics nomirror\n"
            "set y2tics\n"
            "set grid\n"
            "set key center right\n",
            r->plot_path, fm_model_kind_name(r->o.model), r->o.local ? "local" : "parameter server",
            fm_optim_name(r->o.optim), (double)r->o.lr, r->o.cosine ? "cosine" : "constant",
            r->o.batch);
    /* `chainps launch --kill-at` tells us when it killed a server: mark it on the plot, so the
     * curve visibly carries on through the failover. */
    /* launch counts from its own start, the plot from this worker's first step: the wall clock
     * of the kill places it; launch restarts the server 2 s after it. */
    const char *kill_at = getenv("CHAINPS_KILL_AT_S");
    const char *kill_unix_ms = getenv("CHAINPS_KILL_AT_UNIX_MS");
    double kill_x = kill_at ? atof(kill_at) : 0.0;
    if (kill_unix_ms && atof(kill_unix_ms) > 0)
        kill_x = atof(kill_unix_ms) / 1000.0 - r->t0_unix;
    if (kill_at && atof(kill_at) > 0 && kill_x > 0)
        fprintf(g,
                "set arrow from %g, graph 0 to %g, graph 1 nohead lc rgb 'red' dt 2 lw 2\n"
                "set label 'server killed' at %g, graph 0.95 left offset 0.5,0 tc rgb 'red'\n"
                "set arrow from %g, graph 0 to %g, graph 1 nohead lc rgb 'dark-green' dt 3 lw 2\n"
                "set label 'restarted: copies its ranges back' at %g, graph 0.88 left offset "
                "0.5,0 tc rgb 'dark-green'\n",
                kill_x, kill_x, kill_x, kill_x + 2.0, kill_x + 2.0, kill_x + 2.0);
    /* launch writes when the restarted server had every range back (CHAINPS_LAUNCH_EVENTS). */
    const char *events = getenv("CHAINPS_LAUNCH_EVENTS");
    FILE *ev = events ? fopen(events, "r") : NULL;
    unsigned long long caught_ms = 0;
    if (ev) {
        if (fscanf(ev, "caught_up_unix_ms=%llu", &caught_ms) != 1)
            caught_ms = 0;
        fclose(ev);
    }
    double caught_x = caught_ms ? (double)caught_ms / 1000.0 - r->t0_unix : 0.0;
    if (kill_at && atof(kill_at) > 0 && caught_x > 0)
        fprintf(g,
                "set arrow from %g, graph 0 to %g, graph 1 nohead lc rgb 'blue' dt 4 lw 2\n"
                "set label 'caught up: every range back to R replicas' at %g, graph 0.81 left "
                "offset 0.5,0 tc rgb 'blue'\n",
                caught_x, caught_x, caught_x);
    /* gnuplot refuses a series without points and warns about a zero-height axis. */
    if (r->acc_rows > 0 && r->acc_max - r->acc_min < 0.5)
        fprintf(g, "set y2range [%f:%f]\n", r->acc_min - 1.0, r->acc_max + 1.0);
    const char *sep = "plot ";
    if (r->loss_rows > 0) {
        fprintf(g, "%s'%s' every ::1 using 1:4 with lines lw 1.5 title 'loss'", sep, r->csv_path);
        sep = ", ";
    }
    if (r->acc_rows > 0)
        fprintf(g,
                "%s'%s' every ::1 using 1:5 axes x1y2 with linespoints lw 2 pt 7 "
                "title 'test accuracy'",
                sep, r->csv_path);
    fputc('\n', g);
    if (pclose(g) != 0) {
        r->plot_failed = 1;
        return -1;
    }
    return 0;
}

static void csv_row(run *r, int epoch, uint64_t step, double loss, double acc)
{
    if (!r->csv)
        return;
    if (!isnan(loss))
        r->loss_rows++;
    if (!isnan(acc)) {
        r->acc_min = r->acc_rows == 0 || acc < r->acc_min ? acc : r->acc_min;
        r->acc_max = r->acc_rows == 0 || acc > r->acc_max ? acc : r->acc_max;
        r->acc_rows++;
    }
    fprintf(r->csv, "%.3f,%d,%llu,", since(&r->t0), epoch, (unsigned long long)step);
    if (!isnan(loss))
        fprintf(r->csv, "%.6f", loss);
    fputc(',', r->csv);
    if (!isnan(acc))
        fprintf(r->csv, "%.2f", acc);
    fputc('\n', r->csv);
    fflush(r->csv);
}

static void open_outputs(run *r)
{
    const char *mk = fm_model_kind_name(r->o.model);
    snprintf(r->csv_path, sizeof r->csv_path, "%s/fmnist-%s.csv", r->o.out, mk);
    snprintf(r->plot_path, sizeof r->plot_path, "%s/fmnist-%s.png", r->o.out, mk);
    snprintf(r->model_path, sizeof r->model_path, "%s/fmnist-%s.bin", r->o.out, mk);
    if (r->o.csv)
        snprintf(r->csv_path, sizeof r->csv_path, "%s", r->o.csv);
    if (r->o.plot)
        snprintf(r->plot_path, sizeof r->plot_path, "%s", r->o.plot);
    if (r->rank != 0)
        return; /* workers share the output directory; one writer is enough */
    if (mkdir_p(r->o.out) != 0)
        die("cannot create output directory %s: %s", r->o.out, strerror(errno));
    r->csv = fopen(r->csv_path, "w");
    if (!r->csv)
        die("cannot write %s: %s", r->csv_path, strerror(errno));
    fprintf(r->csv, "time_s,epoch,step,loss,accuracy\n");
}

static void load(const char *dir, const char *prefix, fm_dataset *ds)
{
    char err[8192];
    if (fm_dataset_load_split(ds, dir, prefix, err, sizeof err) != FM_DATA_OK)
        die("cannot load Fashion-MNIST: %s", err);
}

/* End of training: final model, its accuracy and checksum, the files, the summary line. */
static void finish(run *r, const fm_dataset *test, double acc, int acc_fresh, double train_s,
                   uint64_t samples, int epoch, uint64_t step)
{
    if (r->o.allreduce) {
        /* Every worker holds the same parameters after the last sync; the barrier keeps a peer
         * from leaving while another still waits for the last all-reduce's chunks. */
        check(cps_barrier(r->cli), "cps_barrier", "final");
        acc_fresh = acc_fresh && r->rank == 0;
    } else if (!r->o.local) {
        /* After the barrier every push of every worker is applied: pulling then gives all
         * workers the same final model (in async mode too), so their checksums agree. */
        check(cps_barrier(r->cli), "cps_barrier", "final");
        for (int i = 0; i < fm_model_num_params(r->m); i++) {
            fm_param *p = fm_model_param(r->m, i);
            check(cps_pull(r->cli, r->tensors[i], p->value, p->len), "cps_pull", p->name);
        }
        acc_fresh = 0;
    }
    if (!acc_fresh) {
        acc = evaluate(r, test);
        if (r->rank == 0)
            csv_row(r, epoch, step, NAN, acc);
    }
    cps_client_stats st = {0};
    if (r->cli)
        cps_client_stats_get(r->cli, &st);
    uint64_t sum = checksum(r->m);
    if (r->freq) {
        cps_freq_stats fs = {0};
        cps_freq_stats_get(r->freq, &fs);
        printf("sync every %ld, warm-up %ld: %llu windows, %llu steps held\n", r->o.sync_every,
               r->o.warmup, (unsigned long long)fs.syncs, (unsigned long long)fs.held);
    }
    if (r->o.allreduce) {
        cps_allreduce_stats as = {0};
        cps_allreduce_stats_get(r->cli, &as);
        cps_freq_stats fs = {0};
        cps_freq_stats_get(r->freq, &fs);
        st.push_raw_bytes = st.push_wire_bytes = as.bytes_sent;
        printf("allreduce: sync every %ld, warm-up %ld, %llu all-reduces of gradients, "
               "%llu steps held, sent %llu bytes\n",
               r->o.sync_every, r->o.warmup, (unsigned long long)fs.syncs,
               (unsigned long long)fs.held, (unsigned long long)as.bytes_sent);
    }
    if (r->rank == 0) {
        if (r->csv && fclose(r->csv) != 0)
            fprintf(stderr, "fmnist: error writing %s\n", r->csv_path);
        r->csv = NULL;
        printf("wrote CSV to %s\n", r->csv_path);
        if (save_model(r->m, r->model_path) == 0)
            printf("wrote model to %s\n", r->model_path);
        else
            fprintf(stderr, "fmnist: cannot write model %s: %s\n", r->model_path, strerror(errno));
        if (plot(r) == 0)
            printf("wrote plot to %s\n", r->plot_path);
        else if (r->plot_failed)
            fprintf(stderr, "fmnist: gnuplot failed to write %s\n", r->plot_path);
    }
    /* The training loop alone (no start-up, evaluation or final pull), for
     * bench/run_fmnist_scale.sh: a job's rate is its workers' samples over rank 0's loop time
     * (rank 0 does not count its evaluations; the other ranks wait for them inside their loop).
     * cpu: this process's CPU time in the loop, every thread (nanomsg's and BLAS's included);
     * process cpu: since it started (data loading and evaluations too). */
    printf("train: %llu samples, %llu steps, loop %.3f s, waiting %.3f s, cpu %.3f s, %.1f "
           "samples/s, process cpu %.3f s\n",
           (unsigned long long)samples, (unsigned long long)step, train_s, r->wait_s, r->cpu_s,
           train_s > 0 ? (double)samples / train_s : 0.0, now_s(CLOCK_PROCESS_CPUTIME_ID));
    double ratio =
        st.push_wire_bytes ? (double)st.push_raw_bytes / (double)st.push_wire_bytes : 1.0;
    printf("final: test accuracy %.2f%%, %.1f samples/s, pushed %.1f MB (wire %.1f MB, ratio "
           "%.2f), pulled %.1f MB, checksum %016llx\n",
           acc, train_s > 0 ? (double)samples / train_s : 0.0, (double)st.push_raw_bytes / 1e6,
           (double)st.push_wire_bytes / 1e6, ratio, (double)st.pull_bytes / 1e6,
           (unsigned long long)sum);
    fflush(stdout);
}

static void train(run *r, const fm_dataset *trainset, const fm_dataset *test)
{
    const fm_opts *o = &r->o;
    size_t shard = trainset->n / (size_t)r->nworkers; /* equal shards: sync steps line up */
    size_t off = (size_t)r->rank * shard;
    if (shard == 0)
        die("%d workers but only %zu training images", r->nworkers, trainset->n);
    uint32_t *perm = malloc(shard * sizeof *perm);
    float *x = malloc((size_t)o->batch * FM_PIXELS * sizeof *x);
    uint8_t *y = malloc((size_t)o->batch);
    if (!perm || !x || !y)
        die("out of memory");
    long steps_per_epoch = (long)((shard + (size_t)o->batch - 1) / (size_t)o->batch);
    r->total_steps = (uint64_t)steps_per_epoch * (uint64_t)o->epochs;
    if (o->steps && (uint64_t)o->steps < r->total_steps)
        r->total_steps = (uint64_t)o->steps;
    /* A worker that takes a dead one's place (launch --restart-workers), or a job restored from
     * a checkpoint, continues at the step the job is on: its shard's batches of the earlier
     * steps are skipped, so it ends with the others instead of pushing steps nobody else will. */
    uint64_t step = r->cli ? cps_start_step(r->cli) : 0, samples = 0;
    if (step > r->total_steps)
        step = r->total_steps;
    if (step) {
        printf("resuming at step %llu of %llu\n", (unsigned long long)step,
               (unsigned long long)r->total_steps);
        fflush(stdout);
    }
    double train_s = 0.0, acc = 0.0;
    int acc_fresh = 0, last_epoch = 1;
    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    r->t0_unix = now_s(CLOCK_REALTIME);
    for (int epoch = 1 + (int)(step / (uint64_t)steps_per_epoch);
         epoch <= o->epochs && (!o->steps || (long)step < o->steps); epoch++) {
        last_epoch = epoch;
        struct timespec te;
        clock_gettime(CLOCK_MONOTONIC, &te);
        double cpu0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        shuffle(perm, shard, o->seed, epoch, r->rank);
        long s = (long)(step % (uint64_t)steps_per_epoch); /* > 0 only when resuming */
        for (; s < steps_per_epoch && (!o->steps || (long)step < o->steps); s++) {
            size_t first = (size_t)s * (size_t)o->batch;
            int b = shard - first < (size_t)o->batch ? (int)(shard - first) : o->batch;
            for (int i = 0; i < b; i++) {
                size_t idx = off + perm[first + (size_t)i];
                fm_pixels_to_float(trainset->pixels + idx * FM_PIXELS, FM_PIXELS,
                                   x + (size_t)i * FM_PIXELS);
                y[i] = trainset->labels[idx];
            }
            step_io io;
            double loss = train_step(r, x, y, b, ++step, &io);
            /* A non-finite loss skips the backward pass: nothing was sent. */
            if (!isfinite(loss))
                die("loss diverged at epoch %d step %ld (%f): lower --lr", epoch, s + 1, loss);
            finish_step(r, &io);
            samples += (uint64_t)b;
            acc_fresh = 0;
            if (o->log_every && (s + 1) % o->log_every == 0) {
                printf("epoch: %d step: %ld, loss is %f\n", epoch, s + 1, loss);
                fflush(stdout);
            }
            /* The CSV keeps its loss curve when printing is off. A point is the mean over the
             * steps since the last one: one batch's loss swings by a factor of 4 from batch to
             * batch and hid the curve's shape (and what a kill cost). */
            r->loss_sum += loss;
            r->loss_n++;
            if ((s + 1) % (o->log_every ? o->log_every : 100) == 0) {
                csv_row(r, epoch, step, r->loss_sum / (double)r->loss_n, NAN);
                r->loss_sum = 0.0;
                r->loss_n = 0;
            }
        }
        train_s += since(&te);
        r->cpu_s += now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
        if (s == steps_per_epoch && r->rank == 0) {
            acc = evaluate(r, test);
            acc_fresh = 1;
            printf("epoch: %d test accuracy %.2f%% after %.3f s of training\n", epoch, acc,
                   train_s);
            fflush(stdout);
            csv_row(r, epoch, step, NAN, acc);
        }
    }
    free(perm);
    free(x);
    free(y);
    finish(r, test, acc, acc_fresh, train_s, samples, last_epoch, step);
}

int main(int argc, char **argv)
{
    run r = {0};
    int prc = fm_parse_opts(argc, argv, &r.o);
    if (prc)
        return prc < 0 ? 0 : prc;
    /* Workers and servers share few cores; OpenBLAS's own threads would only oversubscribe them.
     * OPENBLAS_NUM_THREADS, when set, is the user's choice (e.g. a --local baseline given both
     * cores); servers take 1 whatever it says (src/server/server.c). */
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    r.rank = 0;
    r.nworkers = 1;
    r.grad_scale = 1.0f;
    if (!r.o.local) {
        /* Servers and the scheduler run their role inside cps_open and never return, so they
         * never load the data. */
        check(cps_open(&r.cli), "cps_open", "job");
        r.rank = cps_rank(r.cli);
        r.nworkers = cps_num_workers(r.cli);
        const char *mode = getenv("CHAINPS_MODE");
        /* --allreduce's mean already divides by the workers. */
        if ((!mode || !strcmp(mode, "sync")) && r.nworkers > 1 && !r.o.allreduce)
            r.grad_scale = 1.0f / (float)r.nworkers;
    }
    r.optim = (cps_optim){.kind = r.o.optim, .lr = r.o.lr, .weight_decay = r.o.wd};
    if (r.o.optim == CPS_OPTIM_MOMENTUM)
        r.optim.momentum = 0.9f;

    fm_dataset trainset, test;
    load(r.o.data, "train", &trainset);
    load(r.o.data, "t10k", &test);
    int max_batch = r.o.batch > 256 ? r.o.batch : 256; /* evaluation uses larger batches */
    if (fm_model_create(r.o.model, max_batch, r.o.seed, &r.m) != 0)
        die("out of memory building the model");
    if (r.o.local)
        local_setup(&r);
    else if (r.o.allreduce)
        allreduce_setup(&r);
    else
        ps_setup(&r);
    if (!r.o.local && !r.o.allreduce && (r.o.sync_every != 1 || r.o.warmup != 0))
        ps_freq_setup(&r);
    open_outputs(&r);
    printf("fmnist: %s (%zu parameters in %d tensors), %s lr %g, batch %d, epochs %d, "
           "worker %d of %d%s, train %zu images (shard %zu), test %zu\n",
           fm_model_kind_name(r.o.model), fm_model_size(r.m), fm_model_num_params(r.m),
           fm_optim_name(r.o.optim), (double)r.o.lr, r.o.batch, r.o.epochs, r.rank, r.nworkers,
           r.o.local ? " (local)" : "", trainset.n, trainset.n / (size_t)r.nworkers, test.n);
    fflush(stdout);
    train(&r, &trainset, &test);

    int rc = 0;
    cps_freq_destroy(r.freq); /* before the client it borrows */
    if (r.cli) {
        int crc = cps_close(r.cli);
        if (crc != CPS_OK) {
            fprintf(stderr, "fmnist: cps_close: %s\n", cps_strerror(crc));
            rc = 1;
        }
    }
    for (int i = 0; i < FM_MAX_PARAMS; i++)
        free(r.state[i]);
    fm_model_destroy(r.m);
    fm_dataset_fini(&trainset);
    fm_dataset_fini(&test);
    return rc;
}
