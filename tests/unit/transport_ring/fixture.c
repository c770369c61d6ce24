/* The ring tests' fixture (fixture.h). */
#include "fixture.h"

int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    /* Transports make rings only on a memory file system (cps__ring_dir_in_memory). */
    snprintf(f->dir, sizeof f->dir, "%s/cps-ring-test-XXXXXX",
             cps__ring_dir_in_memory("/dev/shm") ? "/dev/shm" : "/tmp");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

int teardown(void **state)
{
    fixture *f = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}
