#include "core/array.h"

#include <stdint.h>
#include <stdlib.h>

#include "chainps/error.h"

int cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : (first ? first : 1);
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return CPS_ENOMEM;
        n *= 2;
    }
    if (size && n > SIZE_MAX / size)
        return CPS_ENOMEM;
    void *p = realloc(*items, n * size);
    if (!p)
        return CPS_ENOMEM;
    *items = p;
    *cap = n;
    return 0;
}
