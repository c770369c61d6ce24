/* cps_freq: communication frequency (gradient accumulation over k steps) and warm-up (n steps
 * without talking, then one average of the state) for all-reduced training; include/chainps/freq.h.
 * python/chainps/torch.py's sync_every and warmup_steps are this schedule (the binding's
 * client.freq), so its rules live here only. The accumulation windows are counted from the job's
 * step rather than from this process's start, so a replacement of a dead worker syncs at the
 * same steps as the survivors. */
#include <stdlib.h>
#include <string.h>

#include "chainps/chainps.h"
#include "chainps/freq.h"
#include "core/log.h"

struct cps_freq {
    cps_client *c;
    int64_t k, warmup;
    cps_freq_target target;
    uint64_t step; /* the job's step the next cps_freq_grad belongs to */
    cps_freq_buf *grads, *state;
    size_t ngrads, nstate;
    uint64_t glen;
    float *acc;   /* the window's sum, then its mean: the one buffer the ring sees */
    int64_t held; /* steps of the window already summed into acc */
    int in_step;  /* cps_freq_grad called, cps_freq_step_end not yet */
    int poison;   /* the error that poisoned the schedule, or 0 */
    cps_freq_stats st;
};

static int bad(const char *why)
{
    cps__log(CPS_LOG_ERROR, "freq", "cps_freq_create: %s", why);
    return CPS_EINVAL;
}

static int check_bufs(const cps_freq_buf *b, size_t n, uint64_t *total)
{
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!b[i].data || b[i].len == 0)
            return bad("a buffer is NULL or has no values");
        if (b[i].len >= (UINT64_C(1) << 32) - *total)
            return bad("the buffers hold 2^32 values or more");
        *total += b[i].len;
    }
    return 0;
}

static int check_config(const cps_freq_config *cfg, const cps_freq_buf *grads, size_t ngrads,
                        const cps_freq_buf *state, size_t nstate, uint64_t *glen)
{
    if (cfg->sync_every < 1 || cfg->sync_every > CPS_FREQ_MAX_SYNC_EVERY) {
        cps__log(CPS_LOG_ERROR, "freq", "cps_freq_create: sync_every %lld is outside 1..%d",
                 (long long)cfg->sync_every, CPS_FREQ_MAX_SYNC_EVERY);
        return CPS_EINVAL;
    }
    if (cfg->warmup_steps < 0 || cfg->warmup_steps > CPS_FREQ_MAX_WARMUP) {
        cps__log(CPS_LOG_ERROR, "freq", "cps_freq_create: warmup_steps %lld is outside 0..%lld",
                 (long long)cfg->warmup_steps, (long long)CPS_FREQ_MAX_WARMUP);
        return CPS_EINVAL;
    }
    if (!grads || ngrads == 0)
        return bad("no gradient buffer");
    if (cfg->target != CPS_FREQ_RING && cfg->target != CPS_FREQ_SERVERS)
        return bad("unknown target");
    if (cfg->target == CPS_FREQ_SERVERS && cfg->warmup_steps > 0)
        return bad("a warm-up needs the parameters on the workers, not on the servers");
    if ((nstate && !state) || (cfg->warmup_steps > 0 && nstate == 0))
        return bad("a warm-up needs the state buffers it averages at its end");
    uint64_t slen;
    int rc = check_bufs(grads, ngrads, glen);
    return rc ? rc : check_bufs(state, nstate, &slen);
}

static cps_freq_buf *copy_bufs(const cps_freq_buf *b, size_t n)
{
    cps_freq_buf *out = malloc((n ? n : 1) * sizeof *out);
    if (out && n)
        memcpy(out, b, n * sizeof *out);
    return out;
}

int cps_freq_create(cps_client *c, const cps_freq_config *cfg, const cps_freq_buf *grads,
                    size_t ngrads, const cps_freq_buf *state, size_t nstate, cps_freq **out)
{
    cps__why_clear();
    if (!out)
        return CPS_EINVAL;
    *out = NULL;
    if (!c || !cfg)
        return bad("NULL client or configuration");
    uint64_t glen;
    int rc = check_config(cfg, grads, ngrads, state, nstate, &glen);
    if (rc)
        return rc;
    cps_freq *f = calloc(1, sizeof *f);
    if (!f)
        return CPS_ENOMEM;
    *f = (cps_freq){.c = c,
                    .k = cfg->sync_every,
                    .warmup = cfg->warmup_steps,
                    .target = cfg->target,
                    .step = cfg->start_step,
                    .ngrads = ngrads,
                    .nstate = nstate,
                    .glen = glen,
                    .grads = copy_bufs(grads, ngrads),
                    .state = copy_bufs(state, nstate),
                    .acc = malloc(glen * sizeof(float))};
    if (!f->grads || !f->state || !f->acc) {
        cps_freq_destroy(f);
        return CPS_ENOMEM;
    }
    *out = f;
    return 0;
}

/* acc = grads (first step of a window) or acc += grads: one fixed order of additions, so every
 * run with the same k sums the same bits. */
static void accumulate(cps_freq *f)
{
    float *a = f->acc;
    for (size_t i = 0; i < f->ngrads; i++) {
        const float *g = f->grads[i].data;
        uint64_t n = f->grads[i].len;
        if (f->held == 0)
            memcpy(a, g, n * sizeof *a);
        else
            for (uint64_t j = 0; j < n; j++)
                a[j] += g[j];
        a += n;
    }
}

static void scatter(cps_freq *f)
{
    const float *a = f->acc;
    for (size_t i = 0; i < f->ngrads; i++) {
        memcpy(f->grads[i].data, a, f->grads[i].len * sizeof *a);
        a += f->grads[i].len;
    }
}

static int poison(cps_freq *f, int rc, const char *what)
{
    cps__log(CPS_LOG_ERROR, "freq", "%s at step %llu failed: %s; the schedule is poisoned", what,
             (unsigned long long)f->step, cps_err_name(rc));
    f->poison = rc;
    return rc;
}

int cps_freq_grad(cps_freq *f)
{
    cps__why_clear();
    if (!f || f->in_step)
        return CPS_EINVAL;
    if (f->poison)
        return CPS_EPOISONED;
    f->in_step = 1;
    if (f->step < (uint64_t)f->warmup)
        return CPS_FREQ_APPLY;
    accumulate(f);
    /* The window ends on the job's step, not on this process's count: a replacement that joins
     * mid-window syncs with the others (its sum lacks the steps before it joined). */
    if ((f->step - (uint64_t)f->warmup + 1) % (uint64_t)f->k != 0) {
        f->held++;
        f->st.held++;
        return CPS_FREQ_HOLD;
    }
    if (f->k > 1) {
        /* Divided by k, not by the steps summed (fewer for a replacement that joined inside the
         * window): the same divisor on every worker. */
        float kf = (float)f->k;
        for (uint64_t j = 0; j < f->glen; j++)
            f->acc[j] /= kf;
    }
    f->held = 0;
    if (f->target == CPS_FREQ_RING) {
        int rc = cps_allreduce(f->c, f->acc, f->glen, CPS_REDUCE_MEAN);
        if (rc != 0)
            return poison(f, rc, "the gradients' all-reduce");
    }
    f->st.syncs++;
    scatter(f);
    return CPS_FREQ_APPLY;
}

int cps_freq_step_end(cps_freq *f)
{
    cps__why_clear();
    if (!f || !f->in_step)
        return CPS_EINVAL;
    if (f->poison)
        return CPS_EPOISONED;
    f->in_step = 0;
    int averaged = 0;
    if (f->warmup > 0 && f->step + 1 == (uint64_t)f->warmup) {
        for (size_t i = 0; i < f->nstate; i++) {
            int rc = cps_allreduce(f->c, f->state[i].data, f->state[i].len, CPS_REDUCE_MEAN);
            if (rc != 0)
                return poison(f, rc, "the warm-up's average");
        }
        f->st.averaged = 1;
        averaged = 1;
    }
    f->step++;
    f->st.steps++;
    return averaged;
}

void cps_freq_stats_get(const cps_freq *f, cps_freq_stats *out)
{
    if (!out)
        return;
    *out = f ? f->st : (cps_freq_stats){0};
}

uint64_t cps_freq_step(const cps_freq *f)
{
    return f ? f->step : 0;
}

void cps_freq_destroy(cps_freq *f)
{
    if (!f)
        return;
    free(f->grads);
    free(f->state);
    free(f->acc);
    free(f);
}
