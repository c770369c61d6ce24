/* Large buffers a short-lived process fills once: backed by transparent huge pages where the
 * kernel offers them.
 *
 * A `chainps checkpoint export` is a fresh process that touches ~100 MB of new memory (its write
 * ring, the answers nanomsg receives): on a VM each 4 KB first touch is a page fault, and those
 * faults with the zeroing under them were a third of the export's CPU (perf, issue 14). A 2 MB
 * page is one fault and one zeroing for 512 of them. */
#ifndef CPS_CORE_BIGBUF_H
#define CPS_CORE_BIGBUF_H

#include <stddef.h>

/* 1 if transparent huge pages can be asked for with madvise here (the kernel's setting is
 * "always" or "madvise"); read once. */
int cps__thp_usable(void);

/* `len` bytes of zeroed memory aligned to 2 MB (so also to any O_DIRECT block), asked to be
 * backed by huge pages (a hint: without them it is ordinary anonymous memory). NULL when out of
 * memory. Free with cps__bigbuf_free(p, len), the same len. */
void *cps__bigbuf_alloc(size_t len);
void cps__bigbuf_free(void *p, size_t len);

/* Fault in `bytes` of this thread's malloc heap with huge pages and give them back to malloc, so
 * that the allocations the process makes next of blocks below malloc's mmap threshold (which the
 * caller must have raised above them with mallopt, and the trim threshold above `bytes`, or the
 * pages go back to the kernel at the first free) reuse pages already there. Does nothing where
 * huge pages are not usable: touching 4 KB pages ahead saves nothing. */
void cps__heap_prewarm(size_t bytes);

#endif
