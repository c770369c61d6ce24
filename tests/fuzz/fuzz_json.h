/* Shared between the JSON libFuzzer target and its deterministic replay driver. */
#ifndef CPS_FUZZ_JSON_H
#define CPS_FUZZ_JSON_H

#include <stddef.h>
#include <stdint.h>

/* How far inputs got: the replay shows mutations still parse (and reach the tree walk). */
typedef struct fuzz_json_counts {
    uint64_t inputs, ok, headers;
} fuzz_json_counts;

extern fuzz_json_counts fuzz_json_n;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
