/* Shared between the libFuzzer target and its deterministic replay driver. */
#ifndef CPS_FUZZ_WIRE_H
#define CPS_FUZZ_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* How far inputs got: lets the replay show that mutations reach every decoder, not just the
 * header check. */
typedef struct fuzz_wire_counts {
    uint64_t inputs, hdr_ok, snappy_ok, kv_ok, declare_ok, view_ok, view_prefix_ok, hello_ok,
        spec_ok, lossy_ok, suspects_ok, frame_ok, entries_ok, ring_ok, part_ok, part_taken;
} fuzz_wire_counts;

extern fuzz_wire_counts fuzz_wire_n;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
