/* The replay drivers' random numbers: xorshift64*, seeded from the command line, so a failing
 * iteration replays exactly. One generator per program (static state). */
#ifndef CPS_FUZZ_RNG_H
#define CPS_FUZZ_RNG_H

#include <stdint.h>

static uint64_t rng;

static inline uint64_t rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

#endif
