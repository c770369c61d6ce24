/* CRC-32 as zlib computes it (ISO-HDLC: reflected polynomial 0xEDB88320, initial and final
 * inversion), the checksum of chainps checkpoints, which Python's zlib.crc32 verifies.
 *
 * With PCLMULQDQ (x86-64, checked at run time) the bulk of a buffer is folded 64 bytes at a time
 * by carry-less multiplication: 14.5 GB/s against zlib's 4.2 here (bench_crc32), and zlib was a
 * sixth of a checkpoint export's CPU (perf, issue 14). Elsewhere zlib's crc32_z. */
#ifndef CPS_CORE_CRC32_H
#define CPS_CORE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32 of the bytes before (its value `crc`; 0 for none) followed by buf[0 .. len): the
 * same value as zlib's crc32_z(crc, buf, len). buf may be NULL when len is 0. */
uint32_t cps__crc32(uint32_t crc, const void *buf, size_t len);

/* The same with zlib's implementation only: the reference the tests and the benchmark compare
 * against. */
uint32_t cps__crc32_portable(uint32_t crc, const void *buf, size_t len);

/* 1 if cps__crc32 uses the carry-less multiply on this CPU. */
int cps__crc32_accelerated(void);

#endif
