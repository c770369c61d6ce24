/* netdelay: a user-space router that adds a fixed one-way delay between network namespaces (the
 * multi-host tests and bench/run_netns.sh; this kernel has neither `tc netem` nor the `fq`
 * qdisc that would honour a BPF-set departure time).
 *
 *   netdelay [--delay-us US] [--rt-prio P] [--ifname NAME] [--mtu N] [--slots N] NETNS=IPv4 ...
 *
 * For each NETNS (a name under /run/netns, as `ip netns add` makes) it creates a TUN device
 * NAME (default eth0) inside that namespace and keeps its file descriptor; the caller then gives
 * the device the IPv4 address and brings it up (`ip -n NETNS addr add IPv4/24 dev NAME; ip -n
 * NETNS link set NAME up`). Every IP packet a namespace sends out of its device is read here,
 * held for --delay-us microseconds (default 2000) and written into the device of the namespace
 * that owns its destination address. One queue in arrival order, one delay for all: packets
 * leave in the order they came, so nothing is reordered, duplicated or changed. The delay is
 * one-way, per packet, from any node to any other: a round trip between two nodes gains twice
 * it, as `tc qdisc add dev eth0 root netem delay US` on every node's interface would give.
 *
 * Why packets rather than a TCP relay in front of each inbox: the kernels of the namespaces
 * still run TCP end to end, so connection set-up, half-close, reset and a refused connection
 * (a killed server's address answering a SYN with RST, which is how the scheduler tells a dead
 * process from a slow one) reach the peer as they would across a real link, only later. A
 * relay accepting connections on behalf of a dead server would turn "refused" into "accepted,
 * then closed".
 *
 * --rt-prio P (1-99) runs it under SCHED_FIFO at that priority: a wire's delay does not wait
 * for a CPU, and the kernel's netem runs from timer interrupts, ahead of every process; a
 * delaying process of normal priority on a loaded 2-core machine left packets tens of
 * milliseconds late. It never spins (it sleeps in ppoll until the next packet is due), so it
 * cannot starve the machine (and the kernel's RT throttling caps it anyway).
 *
 * Not modelled: bandwidth (a packet is copied as soon as it is read), jitter beyond this
 * process's own wake-up latency, loss (use nftables in the namespaces). A packet that finds the
 * queue full (--slots packets held) is dropped and counted, as a router's would be; so is one
 * for an address nobody owns, and anything but IPv4.
 *
 * --forge-port P --forge-after N (issue 30's forged-frame test): once the TCP segments sent to
 * port P (from any node) have carried N bytes of payload, one byte in the middle of the next
 * segment's payload is flipped and its TCP checksum mended, so the receiving kernel takes it and
 * the application gets a stream with one forged byte, as from a forger on the path. Once only;
 * reported at the end ("forged 1 byte ..."). --forge-from IPv4 counts and forges only segments
 * from that address: which sender's messages get the byte (a worker's pushes to a chain's head,
 * or the head's forwards to the next replica).
 *
 * Prints "netdelay: ready" on stdout once every device exists. Ends on SIGTERM or SIGINT:
 * closing the devices removes them from their namespaces; prints what it forwarded and dropped
 * on stderr and exits 0. Root (CAP_NET_ADMIN and CAP_SYS_ADMIN for setns). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setns, ppoll */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "flags.h"

#define MAX_NODES  64
#define READ_BATCH 64 /* packets read from one device before looking at the others */

typedef struct node {
    const char *netns;
    uint32_t addr; /* network order */
    int fd;
    uint64_t in, out; /* packets read from / written to this device */
} node;

typedef struct slot {
    uint64_t due_ns;
    int dst; /* index into nodes */
    uint32_t len;
} slot;

static volatile sig_atomic_t stop_now;

static void on_signal(int sig)
{
    (void)sig;
    stop_now = 1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A TUN device `ifname` in the namespace /run/netns/`netns`, opened non-blocking; -1 after
 * printing why. The calling thread's namespace is put back before returning. */
static int tun_in(const char *netns, const char *ifname, int home)
{
    char path[300];
    snprintf(path, sizeof path, "/run/netns/%s", netns);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) {
        fprintf(stderr, "netdelay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int fd = -1;
    if (setns(nsfd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "netdelay: setns %s: %s\n", netns, strerror(errno));
        close(nsfd);
        return -1;
    }
    fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
    if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) {
        fprintf(stderr, "netdelay: tun device %s in %s: %s\n", ifname, netns, strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    if (setns(home, CLONE_NEWNET) != 0) {
        fprintf(stderr, "netdelay: back to our namespace: %s\n", strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    close(nsfd);
    return fd;
}

static int node_of(const node *nodes, int n, uint32_t addr)
{
    for (int i = 0; i < n; i++)
        if (nodes[i].addr == addr)
            return i;
    return -1;
}

/* Flip a byte in the middle of the TCP payload of IPv4 packet p (len bytes) and mend the TCP
 * checksum (RFC 1624: HC' = ~(~HC + ~m + m') over the 16-bit word that changed). Returns 1 if
 * it did, 0 if the packet carries no payload. */
static int forge_byte(unsigned char *p, size_t len)
{
    size_t ihl = (size_t)(p[0] & 15) * 4;
    if (ihl < 20 || len < ihl + 20)
        return 0;
    unsigned char *t = p + ihl;
    size_t thl = (size_t)(t[12] >> 4) * 4, seg = len - ihl;
    if (thl < 20 || seg <= thl)
        return 0;
    size_t at = thl + (seg - thl) / 2, w = at & ~(size_t)1; /* offsets within the segment */
    uint16_t old = (uint16_t)(t[w] << 8 | (w + 1 < seg ? t[w + 1] : 0));
    t[at] ^= 0x5a;
    uint16_t neu = (uint16_t)(t[w] << 8 | (w + 1 < seg ? t[w + 1] : 0));
    uint32_t sum = (uint16_t) ~(t[16] << 8 | t[17]);
    sum += (uint16_t)~old;
    sum += neu;
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    uint16_t hc = (uint16_t)~sum;
    t[16] = (unsigned char)(hc >> 8);
    t[17] = (unsigned char)hc;
    return 1;
}

static void usage(void)
{
    fprintf(stderr, "usage: netdelay [--delay-us US] [--rt-prio P] [--ifname NAME] [--mtu N] "
                    "[--slots N] [--forge-port P --forge-after N [--forge-from IPv4]] NETNS=IPv4 "
                    "...\n");
}

int main(int argc, char **argv)
{
    int delay_us = 2000, mtu = 1500, nslots = 16384, rt_prio = 0, forge_port = 0, forge_after = 0;
    const char *ifname = "eth0", *forge_from = NULL;
    /* Flags first, then the NETNS=IPv4 pairs. */
    int nflag = 1;
    while (nflag < argc && strncmp(argv[nflag], "--", 2) == 0)
        nflag += 2;
    if (nflag > argc)
        nflag = argc;
    const tc_flag flags[] = {{"--delay-us", TC_INT, &delay_us},
                             {"--rt-prio", TC_INT, &rt_prio},
                             {"--ifname", TC_STR, &ifname},
                             {"--mtu", TC_INT, &mtu},
                             {"--slots", TC_INT, &nslots},
                             {"--forge-port", TC_INT, &forge_port},
                             {"--forge-after", TC_INT, &forge_after},
                             {"--forge-from", TC_STR, &forge_from},
                             {NULL, TC_SWITCH, NULL}};
    if (tc_flags_parse(nflag, argv, flags) != 0 || nflag >= argc || delay_us < 0 || mtu < 576 ||
        mtu > 65535 || nslots < 1) {
        usage();
        return 2;
    }
    struct in_addr from = {0};
    if (forge_from && inet_pton(AF_INET, forge_from, &from) != 1) {
        fprintf(stderr, "netdelay: --forge-from '%s' is not an IPv4 address\n", forge_from);
        return 2;
    }
    node nodes[MAX_NODES];
    int n = 0;
    for (int i = nflag; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        struct in_addr a;
        if (!eq || n == MAX_NODES) {
            usage();
            return 2;
        }
        *eq = '\0';
        if (inet_pton(AF_INET, eq + 1, &a) != 1) {
            fprintf(stderr, "netdelay: '%s' is not an IPv4 address\n", eq + 1);
            return 2;
        }
        nodes[n] = (node){.netns = argv[i], .addr = a.s_addr, .fd = -1};
        n++;
    }

    /* SIGTERM/SIGINT stay blocked except inside ppoll, so a signal can only interrupt the
     * wait, never a half-done forward. */
    sigset_t block, waitmask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &waitmask);
    sigdelset(&waitmask, SIGTERM);
    sigdelset(&waitmask, SIGINT);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* Wake-ups as close to each packet's due time as the kernel can (the default slack is 50
     * us). */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    if (rt_prio > 0) {
        struct sched_param sp = {.sched_priority = rt_prio};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
            fprintf(stderr, "netdelay: SCHED_FIFO %d: %s\n", rt_prio, strerror(errno));
            return 1;
        }
    }

    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0) {
        fprintf(stderr, "netdelay: /proc/self/ns/net: %s\n", strerror(errno));
        return 1;
    }
    for (int i = 0; i < n; i++) {
        nodes[i].fd = tun_in(nodes[i].netns, ifname, home);
        if (nodes[i].fd < 0) {
            for (int k = 0; k < i; k++)
                close(nodes[k].fd);
            return 1;
        }
    }
    close(home);

    size_t cap = (size_t)mtu + 4; /* one byte more than a packet may be: a longer read is cut */
    unsigned char *buf = malloc((size_t)nslots * cap);
    slot *q = calloc((size_t)nslots, sizeof *q);
    struct pollfd *pfd = calloc((size_t)n, sizeof *pfd);
    if (!buf || !q || !pfd) {
        fprintf(stderr, "netdelay: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++)
        pfd[i] = (struct pollfd){.fd = nodes[i].fd, .events = POLLIN};
    printf("netdelay: ready: %d devices %s, %d us one-way\n", n, ifname, delay_us);
    fflush(stdout);

    uint64_t delay_ns = (uint64_t)delay_us * 1000u;
    uint64_t dropped_full = 0, dropped_addr = 0, dropped_other = 0, write_err = 0;
    /* How late packets left against their due time: this process's wake-up latency, the one
     * distortion it adds (a loaded machine shows it). */
    uint64_t late_max_ns = 0, late_1ms = 0, late_sum_ns = 0;
    uint64_t forge_seen = 0; /* payload bytes to forge_port so far */
    int forged = 0;
    size_t head = 0, count = 0;
    while (!stop_now) {
        uint64_t now = now_ns();
        /* Everything due leaves, oldest first. */
        while (count > 0 && q[head].due_ns <= now) {
            slot *s = &q[head];
            node *d = &nodes[s->dst];
            uint64_t late = now - s->due_ns;
            late_sum_ns += late;
            late_max_ns = late > late_max_ns ? late : late_max_ns;
            late_1ms += late > 1000000u;
            if (write(d->fd, buf + head * cap, s->len) == (ssize_t)s->len)
                d->out++;
            else
                write_err++; /* device down (being set up or torn down): lost, like a wire */
            head = (head + 1) % (size_t)nslots;
            count--;
        }
        struct timespec ts, *tsp = NULL;
        if (count > 0) {
            uint64_t wait = q[head].due_ns - now;
            ts.tv_sec = (time_t)(wait / 1000000000u);
            ts.tv_nsec = (long)(wait % 1000000000u);
            tsp = &ts;
        }
        int r = ppoll(pfd, (nfds_t)n, tsp, &waitmask);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "netdelay: poll: %s\n", strerror(errno));
            break;
        }
        for (int i = 0; r > 0 && i < n; i++) {
            if (!(pfd[i].revents & POLLIN))
                continue;
            for (int k = 0; k < READ_BATCH; k++) {
                size_t at = (head + count) % (size_t)nslots;
                unsigned char scratch[4];
                unsigned char *p = count < (size_t)nslots ? buf + at * cap : scratch;
                ssize_t len = read(nodes[i].fd, p, count < (size_t)nslots ? cap : sizeof scratch);
                if (len < 0)
                    break; /* EAGAIN: nothing more for now */
                nodes[i].in++;
                if (count == (size_t)nslots) {
                    dropped_full++;
                    continue;
                }
                if (len < 20 || (p[0] >> 4) != 4 || (size_t)len >= cap) {
                    dropped_other++; /* IPv6 neighbour chatter and the like */
                    continue;
                }
                uint32_t dst;
                memcpy(&dst, p + 16, 4);
                int to = node_of(nodes, n, dst);
                if (to < 0) {
                    dropped_addr++;
                    continue;
                }
                if (forge_port > 0 && !forged && p[9] == 6 && len >= 40 &&
                    (!forge_from || memcmp(p + 12, &from.s_addr, 4) == 0)) {
                    size_t ihl = (size_t)(p[0] & 15) * 4;
                    const unsigned char *t = p + ihl;
                    if ((size_t)len >= ihl + 20 && (t[2] << 8 | t[3]) == forge_port) {
                        size_t thl = (size_t)(t[12] >> 4) * 4;
                        size_t pay = (size_t)len > ihl + thl ? (size_t)len - ihl - thl : 0;
                        if (forge_seen >= (uint64_t)forge_after && pay > 0 &&
                            forge_byte(p, (size_t)len)) {
                            forged = 1;
                            fprintf(stderr,
                                    "netdelay: forged 1 byte of a %zu-byte segment to port "
                                    "%d after %llu payload bytes\n",
                                    pay, forge_port, (unsigned long long)forge_seen);
                        }
                        forge_seen += pay;
                    }
                }
                /* The clock is read per packet: one read late in a batch must not shorten the
                 * delay of those after it. */
                q[at] = (slot){.due_ns = now_ns() + delay_ns, .dst = to, .len = (uint32_t)len};
                count++;
            }
        }
    }
    uint64_t in = 0, out = 0;
    for (int i = 0; i < n; i++) {
        in += nodes[i].in;
        out += nodes[i].out;
        close(nodes[i].fd);
    }
    fprintf(stderr,
            "netdelay: %llu packets read, %llu forwarded, %zu still queued; dropped: %llu queue "
            "full, %llu unknown address, %llu not IPv4, %llu not written; late against the "
            "delay: mean %.0f us, max %.0f us, %llu packets over 1 ms\n",
            (unsigned long long)in, (unsigned long long)out, count,
            (unsigned long long)dropped_full, (unsigned long long)dropped_addr,
            (unsigned long long)dropped_other, (unsigned long long)write_err,
            in ? (double)late_sum_ns / 1e3 / (double)in : 0.0, (double)late_max_ns / 1e3,
            (unsigned long long)late_1ms);
    free(buf);
    free(q);
    free(pfd);
    return 0;
}
