/* cps_local_fetch (include/chainps/localstate.h): a restored job's workers read their local
 * tensors from the export itself. The export is one file (or shards) every worker can read; the
 * scheduler restores only the servers' part, and nothing would be gained by relaying the rest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "chainps/localstate.h"
#include "checkpoint/ckpt.h"
#include "core/log.h"

#define SUB "local"

int cps_local_fetch(struct cps_client *c, const char *name, float *buf, uint64_t len,
                    uint64_t *step)
{
    cps__why_clear();
    if (!c || !name || !buf || len == 0)
        return CPS_EINVAL;
    const char *from = getenv("CHAINPS_RESTORE_FROM");
    if (!from || !*from)
        return 0;
    cps__ckpt_reader *r = NULL;
    int rc = cps__ckpt_reader_open(from, &r);
    const cps__ckpt_tensor *t = rc == 0 ? cps__ckpt_reader_find(r, name) : NULL;
    char key[CPS_CKPT_NAME_MAX];
    snprintf(key, sizeof key, "kind/%s", name);
    const char *kind = rc == 0 ? cps__ckpt_reader_meta(r, key) : NULL;
    if (rc == 0 && (!t || !kind || strcmp(kind, "local") != 0)) {
        cps__log(CPS_LOG_ERROR, SUB, "%s: the export has no local tensor %s", from, name);
        rc = CPS_ENOTFOUND;
    } else if (rc == 0 && (strcmp(t->dtype, "F32") != 0 || t->numel != len)) {
        cps__log(CPS_LOG_ERROR, SUB,
                 "%s: local tensor %s has %llu %s values, the worker lists %llu float32", from,
                 name, (unsigned long long)t->numel, t->dtype, (unsigned long long)len);
        rc = CPS_ESIZE;
    }
    if (rc == 0)
        rc = cps__ckpt_reader_read(r, t, buf, (size_t)len * sizeof *buf);
    if (rc == 0 && step) {
        const char *st = cps__ckpt_reader_meta(r, "local/step");
        *step = st ? strtoull(st, NULL, 10) : 0;
    }
    cps__ckpt_reader_close(r);
    return rc == 0 ? 1 : rc;
}
