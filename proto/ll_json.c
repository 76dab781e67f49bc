/* ll_json: compact JSON writer (see ll_json.h for why it exists).  Pure
 * function of its input; safe from any thread. */
#include "proto/ll_json.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jansson's own parser depth limit: what it can parse, we can write back. */
#define LL_JSON_MAX_DEPTH 2048

void ll_jbuf_init(ll_jbuf_t *buf, char *storage, size_t cap)
{
    buf->data = storage;
    buf->cap = storage ? cap : 0;
    buf->len = 0;
    buf->heap = false;
    buf->failed = false;
}

void ll_jbuf_release(ll_jbuf_t *buf)
{
    if (buf->heap)
        free(buf->data);
    buf->data = NULL;
    buf->cap = buf->len = 0;
    buf->heap = false;
}

/* Make room for NEED more bytes. */
static bool s_reserve(ll_jbuf_t *buf, size_t need)
{
    if (buf->cap - buf->len >= need)
        return true;
    if (buf->failed)
        return false;
    size_t cap = buf->cap ? buf->cap : 256;
    while (cap - buf->len < need) {
        if (cap > SIZE_MAX / 2) {
            buf->failed = true;
            return false;
        }
        cap *= 2;
    }
    char *data = buf->heap ? realloc(buf->data, cap) : malloc(cap);
    if (!data) {
        buf->failed = true;
        return false;
    }
    if (!buf->heap && buf->len)
        memcpy(data, buf->data, buf->len);
    buf->data = data;
    buf->cap = cap;
    buf->heap = true;
    return true;
}

bool ll_jbuf_put(ll_jbuf_t *buf, const void *bytes, size_t n)
{
    if (!s_reserve(buf, n))
        return false;
    memcpy(buf->data + buf->len, bytes, n);
    buf->len += n;
    return true;
}

static bool s_putc(ll_jbuf_t *buf, char c)
{
    if (!s_reserve(buf, 1))
        return false;
    buf->data[buf->len++] = c;
    return true;
}

/* 1: the byte must be escaped inside a JSON string. */
static const unsigned char s_escape[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   /* '"' */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,   /* '\\' */
};

/* True if none of the 8 bytes of W needs escaping (< 0x20, '"', '\\').
 * The classic "has a zero byte" test, exact as to whether one exists. */
static inline bool s_word_plain(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t control = (w - ones * 0x20) & ~w & highs;
    uint64_t q = w ^ (ones * '"');
    uint64_t quote = (q - ones) & ~q & highs;
    uint64_t b = w ^ (ones * '\\');
    uint64_t backslash = (b - ones) & ~b & highs;
    return (control | quote | backslash) == 0;
}

/* Index of the first byte at or after I that needs escaping, or N. */
static size_t s_plain_run_end(const char *s, size_t i, size_t n)
{
    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (!s_word_plain(w))
            break;
        i += 8;
    }
    while (i < n && !s_escape[(unsigned char)s[i]])
        i++;
    return i;
}

static bool s_write_string(ll_jbuf_t *buf, const char *s, size_t n)
{
    if (!ll_jbuf_put(buf, "\"", 1))
        return false;
    size_t i = 0;
    while (i < n) {
        size_t run = s_plain_run_end(s, i, n);
        /* The plain run, plus room for one escape (at most 6 bytes) and
         * the closing quote: sized to the text, never 6x ahead of it. */
        if (!s_reserve(buf, run - i + 7))
            return false;
        char *out = buf->data + buf->len;
        memcpy(out, s + i, run - i);
        out += run - i;
        if (run < n) {
            unsigned char c = (unsigned char)s[run];
            *out++ = '\\';
            switch (c) {
            case '"': *out++ = '"'; break;
            case '\\': *out++ = '\\'; break;
            case '\n': *out++ = 'n'; break;
            case '\r': *out++ = 'r'; break;
            case '\t': *out++ = 't'; break;
            case '\b': *out++ = 'b'; break;
            case '\f': *out++ = 'f'; break;
            default:
                *out++ = 'u';
                *out++ = '0';
                *out++ = '0';
                *out++ = "0123456789abcdef"[c >> 4];
                *out++ = "0123456789abcdef"[c & 15];
            }
            run++;
        }
        buf->len = (size_t)(out - buf->data);
        i = run;
    }
    return ll_jbuf_put(buf, "\"", 1);
}

static bool s_write_integer(ll_jbuf_t *buf, json_int_t v)
{
    char tmp[24];
    char *end = tmp + sizeof tmp, *p = end;
    /* Negate in unsigned arithmetic so the minimum value does not overflow. */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return ll_jbuf_put(buf, p, (size_t)(end - p));
}

static bool s_write_real(ll_jbuf_t *buf, double v)
{
    /* Shortest form that reads back exactly, like Python's repr(). */
    char tmp[40];
    int n = 0;
    for (int precision = 15; precision <= 17; precision++) {
        n = snprintf(tmp, sizeof tmp, "%.*g", precision, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    if (n <= 0 || (size_t)n >= sizeof tmp - 3)
        return false;
    if (!strpbrk(tmp, ".eEn")) {   /* "1" would read back as an integer */
        tmp[n++] = '.';
        tmp[n++] = '0';
    }
    return ll_jbuf_put(buf, tmp, (size_t)n);
}

static bool s_write(ll_jbuf_t *buf, const json_t *v, int depth)
{
    if (!v || depth > LL_JSON_MAX_DEPTH)
        return false;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (!s_putc(buf, '{'))
            return false;
        bool first = true;
        for (void *it = json_object_iter((json_t *)v); it;
             it = json_object_iter_next((json_t *)v, it)) {
            if (!first && !s_putc(buf, ','))
                return false;
            first = false;
            if (!s_write_string(buf, json_object_iter_key(it), json_object_iter_key_len(it)) ||
                !s_putc(buf, ':') || !s_write(buf, json_object_iter_value(it), depth + 1))
                return false;
        }
        return s_putc(buf, '}');
    }
    case JSON_ARRAY: {
        if (!s_putc(buf, '['))
            return false;
        size_t n = json_array_size(v);
        for (size_t i = 0; i < n; i++)
            if ((i && !s_putc(buf, ',')) || !s_write(buf, json_array_get(v, i), depth + 1))
                return false;
        return s_putc(buf, ']');
    }
    case JSON_STRING:
        return s_write_string(buf, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        return s_write_integer(buf, json_integer_value(v));
    case JSON_REAL:
        return s_write_real(buf, json_real_value(v));
    case JSON_TRUE:
        return ll_jbuf_put(buf, "true", 4);
    case JSON_FALSE:
        return ll_jbuf_put(buf, "false", 5);
    case JSON_NULL:
        return ll_jbuf_put(buf, "null", 4);
    }
    return false;
}

int ll_json_write(ll_jbuf_t *buf, const json_t *value)
{
    if (!buf)
        return -1;
    size_t start = buf->len;
    if (!s_write(buf, value, 0) || buf->failed) {
        buf->len = start;   /* leave no half-written value behind */
        return -1;
    }
    return 0;
}
