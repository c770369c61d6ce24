/* `chainps secret FILE`: make a job secret for a cluster started by hand. */
#include <stdio.h>
#include <string.h>

#include "chainps/error.h"
#include "cli.h"
#include "transport/auth.h"

static const char secret_usage[] =
    "usage: chainps secret FILE\n"
    "\n"
    "Create FILE (mode 0600; it must not exist) holding a new random job secret. Give every\n"
    "process of the job the same file: `--secret-file FILE` or CHAINPS_SECRET_FILE=FILE for\n"
    "the scheduler, the servers, the workers and the tools (status, checkpoint). Every message\n"
    "between them then carries a MAC under it, and messages without the right one are dropped.\n"
    "Any file of 16 to 4096 bytes that only its owner may read will do as well (trailing\n"
    "whitespace is ignored). `chainps launch` and `chainps chaos` make one per job.\n"
    "\n"
    "  -h, --help         this text\n";

int cps__cli_secret(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(secret_usage, stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-')
        return cps__cli_usage_error("secret", "expected one FILE (see --help)");
    char err[768];
    if (cps__auth_create_file(argv[1], err, sizeof err) != 0) {
        fprintf(stderr, "chainps secret: %s\n", err);
        return 1;
    }
    printf("chainps secret: wrote a new job secret to %s (mode 0600)\n", argv[1]);
    return 0;
}
