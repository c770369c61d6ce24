#include "core/bigbuf.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_BYTES ((size_t)2 << 20)
/* Pieces of the prewarm, below the mmap threshold the callers set (32 MB) with room for malloc's
 * chunk header. */
#define PREWARM_PIECE ((size_t)8 << 20)
#define PREWARM_MAX   64

static int thp_usable;
static pthread_once_t thp_once = PTHREAD_ONCE_INIT;

static void thp_probe(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return;
    char line[128] = "";
    if (fgets(line, sizeof line, f))
        thp_usable = strstr(line, "[always]") != NULL || strstr(line, "[madvise]") != NULL;
    fclose(f);
}

int cps__thp_usable(void)
{
    pthread_once(&thp_once, thp_probe);
    return thp_usable;
}

/* The 2 MB-aligned part of [p, p + len), as a madvise range; 0 if it holds no whole huge page. */
static size_t huge_span(void *p, size_t len, char **start)
{
    uintptr_t a = ((uintptr_t)p + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1);
    uintptr_t b = ((uintptr_t)p + len) & ~(uintptr_t)(HUGE_BYTES - 1);
    *start = (char *)a;
    return b > a ? (size_t)(b - a) : 0;
}

void *cps__bigbuf_alloc(size_t len)
{
    if (len == 0)
        len = 1;
    size_t span = len + HUGE_BYTES;
    if (span < len)
        return NULL;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    /* mmap aligns to 4 KB only: map 2 MB more and unmap the slack on both sides, so the buffer
     * starts on a huge page boundary and every 2 MB of it can be one. */
    char *p = (char *)(((uintptr_t)raw + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    size_t head = (size_t)(p - raw), tail = span - head - len;
    if (head)
        munmap(raw, head);
    if (tail)
        munmap(p + len, tail);
    if (cps__thp_usable())
        (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: ordinary pages if refused */
    return p;
}

void cps__bigbuf_free(void *p, size_t len)
{
    if (p)
        munmap(p, len ? len : 1);
}

/* Fault in every huge page that [p, p + len) overlaps with one write, inside the block, of the
 * byte already there (malloc has handed these bytes to us but they hold nothing yet). Only bytes
 * of the block are touched: the space between two blocks is malloc's, or a sanitizer's. */
static void touch_block(char *p, size_t len)
{
    uintptr_t end = (uintptr_t)p + len;
    for (uintptr_t a = (uintptr_t)p; a < end;) {
        volatile char *b = (volatile char *)a;
        *b = *b;
        a = (a & ~(uintptr_t)(HUGE_BYTES - 1)) + HUGE_BYTES;
    }
}

/* madvise(MADV_HUGEPAGE) of the huge pages inside [p, p + len); a hint, so failures are ignored:
 * the touches then fault in ordinary pages, as malloc's users would have. */
static void advise_huge(void *p, size_t len)
{
    char *start;
    size_t span = huge_span(p, len, &start);
    if (span)
        (void)madvise(start, span, MADV_HUGEPAGE);
}

void cps__heap_prewarm(size_t bytes)
{
    if (!cps__thp_usable() || bytes == 0)
        return;
    void *piece[PREWARM_MAX];
    size_t n = 0;
    for (size_t got = 0; got < bytes && n < PREWARM_MAX; got += PREWARM_PIECE) {
        piece[n] = malloc(PREWARM_PIECE);
        if (!piece[n])
            break;
        n++;
    }
    /* The pieces come out of the heap one after the other: advise their whole extent when it is
     * one run, so the huge pages that straddle two pieces qualify too, else each alone. madvise
     * reads nothing; the touches stay inside the pieces. */
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)piece[i];
        lo = a < lo ? a : lo;
        hi = a + PREWARM_PIECE > hi ? a + PREWARM_PIECE : hi;
    }
    int whole = n && hi - lo <= n * (PREWARM_PIECE + 4096);
    if (whole)
        advise_huge((void *)lo, (size_t)(hi - lo));
    for (size_t i = 0; i < n; i++) {
        if (!whole)
            advise_huge(piece[i], PREWARM_PIECE);
        touch_block(piece[i], PREWARM_PIECE);
    }
    for (size_t i = 0; i < n; i++)
        free(piece[i]);
}
