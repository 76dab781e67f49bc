/* ll_json: a fast compact JSON writer and parser for jansson values (any
 * thread).
 *
 * jansson's json_dumpb goes through a per-character callback and costs
 * ~50 instructions per byte of string; the kernel's hottest path (a stream
 * message carrying a cell's printed output) is almost all string.  This
 * writer copies runs of plain bytes with memcpy and only stops at bytes that
 * need escaping.  Output matches Python's json.dumps(ensure_ascii=False,
 * separators=(",", ":")): UTF-8 kept, control characters, '"' and '\\'
 * escaped, reals in their shortest round-trip form ("0.1", "1.0").
 *
 * Strings are assumed valid UTF-8 (jansson checks that unless a value was
 * made with json_string_nocheck).
 *
 * The parser exists for the same reason: json_loadb reads ~8 ns per byte
 * through its stream layer, five times slower than Python's json module on a
 * 64 KiB message.  It accepts exactly RFC 8259 JSON, as jansson with
 * JSON_DECODE_ANY | JSON_ALLOW_NUL does: strict UTF-8 (no overlongs, no
 * surrogates), \u0000 kept inside strings and keys, integers that fit in 64
 * bits (larger ones are an error, not silently rounded), finite reals, at
 * most 2048 levels of nesting, nothing but whitespace after the value. */
#ifndef LL_JSON_H
#define LL_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* A growable byte buffer that starts in caller-provided (stack) storage. */
typedef struct {
    char *data;  /* current storage: the caller's, or malloc'd once outgrown */
    size_t len;  /* bytes written */
    size_t cap;  /* bytes available at data */
    bool heap;   /* data was malloc'd by us and is freed by ll_jbuf_release */
    bool failed; /* an allocation failed; contents are incomplete */
} ll_jbuf_t;

/* Start with STORAGE of CAP bytes (may be NULL/0). */
void ll_jbuf_init(ll_jbuf_t *buf, char *storage, size_t cap);

/* Free heap storage, if any.  The buffer is empty and reusable afterwards
 * only after another ll_jbuf_init. */
void ll_jbuf_release(ll_jbuf_t *buf);

/* Append N raw bytes.  Returns 0, or -1 when memory runs out. */
int ll_jbuf_put(ll_jbuf_t *buf, const void *bytes, size_t n);

/* Append the compact JSON text of VALUE.  Returns 0, or -1 when VALUE is
 * NULL, nested deeper than 2048 levels (or cyclic), or memory runs out. */
int ll_json_write(ll_jbuf_t *buf, const json_t *value);

/* Parse LEN bytes of TEXT (need not be NUL-terminated) into a new value (a
 * new reference the caller owns), or NULL with "at byte N: reason" in ERR.
 * Never reads past TEXT + LEN. */
json_t *ll_json_parse(const char *text, size_t len, char *err, size_t errlen);

/* The same with FLAGS: LL_JSON_NO_DUPLICATE_KEYS makes an object that
 * names a key twice an error (RFC 8259 leaves it open; by default the last
 * one wins, as in Python and jansson). */
#define LL_JSON_NO_DUPLICATE_KEYS 1u
json_t *ll_json_parse_flags(const char *text, size_t len, unsigned flags, char *err, size_t errlen);

#endif
