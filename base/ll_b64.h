/* ll_b64: standard base64 (RFC 4648, with '=' padding), for binary buffers
 * that cross JSON: a worker's display buffers on their way to the kernel,
 * comm buffers, store metadata.
 *
 * Decoding is strict: the length must be a multiple of 4, only the standard
 * alphabet, at most two '=' and only at the end; no whitespace.  Bad input
 * from another process is an error, never an assert.
 *
 * Threads: any (no state). */
#ifndef LL_B64_H
#define LL_B64_H

#include <stdbool.h>
#include <stddef.h>

/* Characters ll_b64_encode writes for LEN bytes (without the NUL). */
size_t ll_b64_encoded_len(size_t len);

/* DATA (LEN bytes) as NUL-terminated base64; the caller frees the result.
 * NULL when out of memory. */
char *ll_b64_encode(const void *data, size_t len);

/* TEXT (LEN characters) decoded into a new buffer the caller frees, its size
 * in *OUT_LEN (a buffer of at least one byte even for ""). NULL when TEXT is
 * not strict base64 or memory runs out. */
unsigned char *ll_b64_decode(const char *text, size_t len, size_t *out_len);

int ll_b64_selftest(bool verbose);

#endif
