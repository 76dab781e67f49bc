/* ll_hash_avx2: the AVX2 build of ll_hash_impl.h (store.mk adds -mavx2 for
 * this file only); ll_hash.c calls it only on CPUs that have AVX2. */
#include <stddef.h>
#include <stdint.h>

#define LL_HASH_NAME(x) ll_##x##_avx2
uint64_t ll_hash_avx2(const void *p, size_t n);
uint64_t ll_hash_copy_avx2(void *dst, const void *src, size_t n);
#include "store/ll_hash_impl.h"
