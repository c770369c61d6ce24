/* Checkpoint threads of `chainps scheduler`: --restore-from (load a checkpoint, then let the
 * workers in) and --checkpoint-every (export into DIR/step-<step>/, keep the newest K). They run
 * beside the scheduler's event loop in the same process and talk to it over loopback like any
 * other tool, so the scheduler itself stays a pure event loop. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chainps/error.h"
#include "checkpoint/cluster.h"
#include "cli.h"
#include "core/log.h"
#include "node/msg.h"
#include "node/roles.h"

#define RETRY_MS 100 /* the job has not started, or no tensor is declared yet */

static atomic_int restore_failed;

int cps__cli_restore_failed(void)
{
    return atomic_load(&restore_failed);
}

typedef struct ckpt_thread_cfg {
    char sched[64];
    cps__config cfg;
} ckpt_thread_cfg;

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void *restore_thread(void *arg)
{
    ckpt_thread_cfg *t = arg;
    cps__param_spec spec;
    int have_spec =
        t->cfg.restore_optim[0] && cps__cli_parse_optim(t->cfg.restore_optim, NULL, &spec) == 0;
    cps__restore_opts o = {.scheduler = t->sched,
                           .key = cps__node_key(&t->cfg),
                           .release = 1,
                           .timeout_ms = 120000,
                           .default_spec = have_spec ? &spec : NULL};
    cps__restore_result res;
    /* The job starts once every server and worker has said HELLO: until then, ask again. */
    int rc;
    for (;;) {
        rc = cps__ckpt_restore(&o, t->cfg.restore_from, &res);
        if (rc != CPS_EUNAVAILABLE || res.started)
            break;
        sleep_ms(RETRY_MS);
    }
    if (rc == 0) {
        cps__log(CPS_LOG_INFO, "ckpt",
                 "restored %s: %u tensors, %.1f MB at step %" PRIu64
                 " in %.2f s (%u range(s) streamed again); workers admitted",
                 t->cfg.restore_from, res.tensors, res.bytes / 1e6, res.step, res.seconds,
                 res.resent);
    } else {
        /* Training from scratch is not what was asked for, and holding the workers back for
         * ever helps no one: the scheduler ends the job and exits CPS_CLI_EXIT_REFUSED, so
         * `chainps launch` (or whoever runs it) fails the job with this line as the reason. */
        cps__log(CPS_LOG_ERROR, "ckpt",
                 "--restore-from %s: restoring it failed: %s; the workers cannot be admitted, "
                 "so the scheduler ends the job",
                 t->cfg.restore_from, cps_strerror(rc));
        atomic_store(&restore_failed, 1);
        cps__role_request_stop();
    }
    free(t);
    return NULL;
}

/* ---- periodic export ---- */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[1200];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Keep the newest `keep` DIR/step-* checkpoints (names sort by step: fixed width). */
static void prune(const char *dir, uint32_t keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step-", 5) != 0 && strncmp(e->d_name, "time-", 5) != 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **g = realloc(names, cap * sizeof *g);
            if (!g)
                break;
            names = g;
        }
        names[n] = strdup(e->d_name);
        if (names[n])
            n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i + keep < n; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        remove_tree(path);
        cps__log(CPS_LOG_INFO, "ckpt", "removed old checkpoint %s (--keep %u)", path, keep);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Export into DIR/.tmp-<name>/ and rename it to DIR/<name>/ once complete. */
static int export_one(const ckpt_thread_cfg *t, uint64_t at_step, cps__export_result *res)
{
    const char *dir = t->cfg.ckpt_dir;
    char tmp[700], final[700];
    snprintf(tmp, sizeof tmp, "%s/.tmp-export", dir);
    remove_tree(tmp); /* an export that crashed half-way */
    cps__export_opts o = {.scheduler = t->sched,
                          .key = cps__node_key(&t->cfg),
                          .at_step = at_step,
                          .timeout_ms = at_step ? 600000 : 120000,
                          .quiet_until_ready = 1,
                          .no_announce = 1};
    int rc = cps__ckpt_export(&o, tmp, res);
    if (rc != 0) {
        remove_tree(tmp);
        return rc;
    }
    if (t->cfg.ckpt_every_seconds && !at_step && res->step == 0)
        snprintf(final, sizeof final, "%s/time-%010llu", dir, (unsigned long long)time(NULL));
    else
        snprintf(final, sizeof final, "%s/step-%010" PRIu64, dir, res->step);
    remove_tree(final); /* the same step again (a restarted scheduler) */
    if (rename(tmp, final) != 0) {
        cps__log(CPS_LOG_ERROR, "ckpt", "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        remove_tree(tmp);
        return CPS_EIO;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    /* The scheduler learns of it under its final name: the file, as an export names it. */
    char announced[sizeof res->path + sizeof final];
    size_t tl = strlen(tmp);
    snprintf(announced, sizeof announced, "%s%s", final,
             strncmp(res->path, tmp, tl) == 0 ? res->path + tl : "");
    cps__ckpt_announce(&o, announced, res->step);
    snprintf(res->path, sizeof res->path, "%s", final);
    return 0;
}

static void *periodic_thread(void *arg)
{
    ckpt_thread_cfg *t = arg;
    const cps__config *c = &t->cfg;
    uint64_t next = c->ckpt_every;
    for (;;) {
        uint64_t want = 0;
        if (c->ckpt_every_seconds)
            sleep_ms(c->ckpt_every * 1000);
        else
            want = next;
        cps__export_result res;
        int rc = export_one(t, want, &res);
        if (rc == 0) {
            cps__log(CPS_LOG_INFO, "ckpt",
                     "checkpoint at step %" PRIu64 ": %s (%u tensors, "
                     "%.1f MB in %.2f s)",
                     res.step, res.path, res.tensors, res.bytes / 1e6, res.seconds);
            if (c->ckpt_keep)
                prune(c->ckpt_dir, c->ckpt_keep);
            next = (res.step / c->ckpt_every + 1) * c->ckpt_every;
        } else if (rc == CPS_EPAST) {
            /* Behind the job (it was restored at a later step, or an export took longer than
             * the steps it spans): aim at the next multiple. */
            next = (res.step / c->ckpt_every + 1) * c->ckpt_every;
        } else {
            int early = rc == CPS_EUNAVAILABLE || rc == CPS_ENOTFOUND;
            if (!early)
                cps__log(CPS_LOG_WARN, "ckpt", "periodic checkpoint failed: %s; trying again",
                         cps_strerror(rc));
            sleep_ms(early ? RETRY_MS : 10 * RETRY_MS);
        }
    }
    return NULL;
}

static int start(void *(*fn)(void *), const cps__config *cfg)
{
    ckpt_thread_cfg *t = calloc(1, sizeof *t);
    if (!t)
        return CPS_ENOMEM;
    snprintf(t->sched, sizeof t->sched, "127.0.0.1:%u", cfg->sched_port);
    t->cfg = *cfg;
    pthread_t th;
    if (pthread_create(&th, NULL, fn, t) != 0) {
        free(t);
        return CPS_ENOMEM;
    }
    pthread_detach(th);
    return 0;
}

int cps__cli_ckpt_threads_start(const cps__config *cfg)
{
    int rc = 0;
    if (cfg->restore_from[0])
        rc = start(restore_thread, cfg);
    if (rc == 0 && cfg->ckpt_every) {
        cps__config c = *cfg;
        if (!c.ckpt_dir[0])
            snprintf(c.ckpt_dir, sizeof c.ckpt_dir, "%.490s/checkpoints", cfg->data_dir);
        if (mkdir(c.ckpt_dir, 0755) != 0 && errno != EEXIST) {
            cps__log(CPS_LOG_ERROR, "ckpt", "cannot create %s: %s", c.ckpt_dir, strerror(errno));
            return CPS_EIO;
        }
        cps__log(CPS_LOG_INFO, "ckpt", "a checkpoint every %llu %s into %s%s",
                 (unsigned long long)c.ckpt_every, c.ckpt_every_seconds ? "s" : "steps", c.ckpt_dir,
                 c.ckpt_keep ? " (keeping the newest)" : "");
        rc = start(periodic_thread, &c);
    }
    if (rc != 0)
        cps__log(CPS_LOG_ERROR, "ckpt", "cannot start the checkpoint thread: %s", cps_strerror(rc));
    return rc;
}
