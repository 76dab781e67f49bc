/* ll_hash_impl.h: the body of ll_hash.c, compiled twice (ll_hash.c for the
 * baseline ISA, ll_hash_avx2.c with -mavx2) so xxhash's inline code picks
 * the vector width at compile time.  LL_HASH_NAME(x) names the variant. */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <string.h>
#include <xxhash.h>

#define LL_HASH_PIECE ((size_t) 64 << 10)

uint64_t LL_HASH_NAME(hash)(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

uint64_t LL_HASH_NAME(hash_copy)(void *dst, const void *src, size_t n)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (size_t off = 0; off < n; off += LL_HASH_PIECE) {
        size_t k = n - off < LL_HASH_PIECE ? n - off : LL_HASH_PIECE;
        memcpy((char *) dst + off, (const char *) src + off, k);
        XXH3_64bits_update(&st, (char *) dst + off, k);
    }
    return XXH3_64bits_digest(&st);
}
