/* The job's secret for a node or a tool (see roles.h). */
#include <stdatomic.h>

#include "chainps/error.h"
#include "core/log.h"
#include "node/roles.h"
#include "transport/auth.h"

int cps__node_load_secret(cps__config *cfg, const char *who)
{
    if (cfg->secret_loaded)
        return 0;
    if (cfg->secret_file[0]) {
        char err[768];
        int rc = cps__auth_load_file(cfg->secret_file, cfg->secret_key, err, sizeof err);
        if (rc != 0) {
            cps__log(CPS_LOG_ERROR, who, "%s", err);
            return CPS_ECONFIG;
        }
        cfg->secret_loaded = 1;
        return 0;
    }
    if (!cfg->insecure) {
        cps__log(CPS_LOG_ERROR, who,
                 "no job secret: give --secret-file FILE (or CHAINPS_SECRET_FILE=FILE; "
                 "`chainps secret FILE` makes one, `chainps launch` makes one per job), or "
                 "--insecure (CHAINPS_INSECURE=1) to run a job anyone who reaches its ports can "
                 "join, read, overwrite and end");
        return CPS_ECONFIG;
    }
    static atomic_int warned;
    if (atomic_exchange(&warned, 1) == 0)
        cps__log(CPS_LOG_WARN, who,
                 "running without a job secret (--insecure): messages are not authenticated, so "
                 "anyone who reaches this job's ports can join it, push, read, restore or end it");
    return 0;
}

const unsigned char *cps__node_key(const cps__config *cfg)
{
    return cfg->secret_loaded ? cfg->secret_key : NULL;
}
