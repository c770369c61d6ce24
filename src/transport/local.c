/* Same-host channels (see local.h). */
#include "transport/local.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chainps/error.h"

int cps__tp_local_host_id(char *out, size_t cap)
{
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f)
        return CPS_ENOTFOUND;
    int ok = fgets(boot, sizeof boot, f) != NULL;
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
    /* The namespace file's device and inode name the namespace (as `ip netns identify` and
     * `lsns` tell them apart). */
    struct stat ns;
    if (!ok || !boot[0] || stat("/proc/self/ns/net", &ns) != 0)
        return CPS_ENOTFOUND;
    int n = snprintf(out, cap, "%s/%llx:%llx", boot, (unsigned long long)ns.st_dev,
                     (unsigned long long)ns.st_ino);
    return n > 0 && (size_t)n < cap ? 0 : CPS_ENOTFOUND;
}

int cps__tp_local_dir_check(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (!dir || !dir[0]) {
        snprintf(err, errlen, "no runtime directory");
        return CPS_ECONFIG;
    }
    if (lstat(dir, &st) != 0) {
        snprintf(err, errlen, "runtime directory %s: %s", dir, strerror(errno));
        return CPS_ECONFIG;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "runtime directory %s: not a directory (a link is refused too)", dir);
        return CPS_ECONFIG;
    }
    if (st.st_uid != geteuid()) {
        snprintf(err, errlen, "runtime directory %s: owned by uid %u, not by this process's uid %u",
                 dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return CPS_ECONFIG;
    }
    if (st.st_mode & 077) {
        snprintf(err, errlen,
                 "runtime directory %s: mode %04o lets group or others in; its sockets carry no "
                 "MAC, so it must be 0700 (chmod 700 %s)",
                 dir, (unsigned)(st.st_mode & 07777), dir);
        return CPS_ECONFIG;
    }
    return 0;
}

/* FNV-1a, 64 bits: a name, not a secret (the directory is the protection). */
static uint64_t fnv(uint64_t h, const char *s)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t cps__tp_local_name(const char *host_id, const char *tcp_url)
{
    return fnv(fnv(fnv(0xcbf29ce484222325ull, host_id), "|"), tcp_url);
}

int cps__tp_local_path(const char *dir, const char *host_id, const char *tcp_url, char *out,
                       size_t cap)
{
    uint64_t h = cps__tp_local_name(host_id, tcp_url);
    int n = snprintf(out, cap, "%s/n%016llx.ipc", dir, (unsigned long long)h);
    return n > 0 && (size_t)n < cap ? 0 : CPS_EINVAL;
}
