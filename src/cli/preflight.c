/* What a job is given, checked before any process starts (issue 26): a checkpoint to restore,
 * the job's secret, the training program. Each problem is one line naming the flag, printed at
 * once, instead of a job whose scheduler holds the workers back for ever or whose workers fail
 * one by one. The checks reuse the code that would use each input later (the checkpoint reader,
 * the secret loader, execvp's PATH rule), so they cannot disagree with it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "cli.h"
#include "core/log.h"
#include "transport/auth.h"

/* The reader logs why it refuses a file (subsystem "ckpt"): keep its first error line for our
 * one-line message instead of printing it apart. */
typedef struct first_error {
    char line[400];
} first_error;

static void keep_first_error(void *ctx, int level, const char *subsystem, const char *line)
{
    (void)subsystem;
    first_error *f = ctx;
    if (level == CPS_LOG_ERROR && !f->line[0])
        snprintf(f->line, sizeof f->line, "%s", line);
}

int cps__cli_check_restore(const char *path, char *err, size_t len)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, len, "%s", strerror(errno));
        return -1;
    }
    if (access(path, R_OK) != 0) {
        snprintf(err, len, "cannot read it: %s", strerror(errno));
        return -1;
    }
    /* The structure only (headers, offsets, index): what a restore opens first. The tensor
     * data's checksums are verified by the restore itself, before it writes anything. */
    first_error f = {""};
    cps__log_set_sink(keep_first_error, &f);
    cps__ckpt_reader *r = NULL;
    int rc = cps__ckpt_reader_open(path, &r);
    cps__log_set_sink(NULL, NULL);
    cps__ckpt_reader_close(r);
    if (rc == 0)
        return 0;
    snprintf(err, len, "not a checkpoint the reader accepts (%s%s%s)", cps_strerror(rc),
             f.line[0] ? ": " : "", f.line);
    return -1;
}

/* Find `prog` as execvp would: a name with a '/' as it is, else the first executable regular
 * file of that name in PATH (glibc's default when PATH is unset). */
static int check_program(const char *prog, char *err, size_t len)
{
    struct stat st;
    if (!*prog) {
        snprintf(err, len, "the program after -- is an empty name");
        return -1;
    }
    if (strchr(prog, '/')) {
        if (stat(prog, &st) != 0) {
            snprintf(err, len, "the program %s after --: %s", prog, strerror(errno));
            return -1;
        }
        if (!S_ISREG(st.st_mode) || access(prog, X_OK) != 0) {
            snprintf(err, len, "the program %s after -- is not an executable file", prog);
            return -1;
        }
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin";
    char cand[4096];
    for (const char *p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        /* An empty PATH entry means the current directory, as for execvp. */
        int k = snprintf(cand, sizeof cand, "%.*s%s%s", (int)n, n ? p : ".", "/", prog);
        if (k > 0 && (size_t)k < sizeof cand && stat(cand, &st) == 0 && S_ISREG(st.st_mode) &&
            access(cand, X_OK) == 0)
            return 0;
        if (!end)
            break;
        p = end;
    }
    snprintf(err, len, "the program %s after --: no executable of that name on PATH", prog);
    return -1;
}

int cps__cli_job_check(const char *cmd, const cps__config *cfg, char *const *prog)
{
    char err[1024];
    if (cfg->restore_from[0] && cps__cli_check_restore(cfg->restore_from, err, sizeof err) != 0) {
        fprintf(stderr, "chainps %s: --restore-from %s: %s\n", cmd, cfg->restore_from, err);
        return 2;
    }
    /* The rule every node applies when it loads the file (transport/auth.c): a regular file,
     * readable, 16 to 4096 bytes, open to no one but its owner. */
    unsigned char key[CPS_AUTH_KEY_SIZE];
    int bad_secret =
        cfg->secret_file[0] && cps__auth_load_file(cfg->secret_file, key, err, sizeof err) != 0;
    OPENSSL_cleanse(key, sizeof key); /* the job's children load it themselves */
    if (bad_secret) {
        fprintf(stderr, "chainps %s: --secret-file: %s\n", cmd, err);
        return 2;
    }
    if (check_program(prog[0], err, sizeof err) != 0) {
        fprintf(stderr, "chainps %s: %s\n", cmd, err);
        return 2;
    }
    return 0;
}
