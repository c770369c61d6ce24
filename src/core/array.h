/* Growable arrays: the one realloc-doubling helper, so each growing array does not carry its
 * own copy of the overflow and failure handling. */
#ifndef CPS_CORE_ARRAY_H
#define CPS_CORE_ARRAY_H

#include <stddef.h>

/* Make room for at least `need` elements of `size` bytes in *items (capacity *cap, in
 * elements), doubling from `first` so that appending n elements costs O(n). *items and *cap
 * are updated only on success; on failure the array is left as it was. New room is not
 * zeroed. Errors: CPS_ENOMEM (also when the byte count would overflow). */
int cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first);

#endif
