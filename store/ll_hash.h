/* ll_hash: XXH3-64 of payload regions, and a copy that hashes as it goes.
 * The fastest variant the CPU supports (AVX2, else SSE2) is picked once.
 * Thread-safe; called by ll_store's copy threads. */
#ifndef LL_HASH_H
#define LL_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-64 of N bytes at P (the same value as XXH3_64bits). */
uint64_t ll_hash(const void *p, size_t n);

/* Copy N bytes from SRC to DST and return XXH3-64 of them, hashing each
 * 64 KiB piece while it is still in cache (one pass over memory, not two). */
uint64_t ll_hash_copy(void *dst, const void *src, size_t n);

#endif
