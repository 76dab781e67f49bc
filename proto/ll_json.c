/* ll_json: compact JSON writer (see ll_json.h for why it exists).  Pure
 * function of its input; safe from any thread. */
#include "proto/ll_json.h"

#include <errno.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jansson's own parser depth limit: what it can parse, we can write back. */
#define LL_JSON_MAX_DEPTH 2048

/* Numbers are written and read in the C locale even if a cell calls
 * locale.setlocale(LC_ALL, "") and LC_NUMERIC starts using ','. */
static locale_t s_c_locale;
static pthread_once_t s_c_locale_once = PTHREAD_ONCE_INIT;

static void s_init_c_locale(void)
{
    s_c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t) 0);
}

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

static bool s_put(ll_jbuf_t *buf, const void *bytes, size_t n)
{
    if (!s_reserve(buf, n))
        return false;
    memcpy(buf->data + buf->len, bytes, n);
    buf->len += n;
    return true;
}

int ll_jbuf_put(ll_jbuf_t *buf, const void *bytes, size_t n)
{
    return buf && s_put(buf, bytes, n) ? 0 : -1;
}

static bool s_putc(ll_jbuf_t *buf, char c)
{
    if (!s_reserve(buf, 1))
        return false;
    buf->data[buf->len++] = c;
    return true;
}

/* 1: the byte must be escaped inside a JSON string. */
/* clang-format off */
static const unsigned char s_escape[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   /* '"' */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,   /* '\\' */
};
/* clang-format on */

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
    while (i < n && !s_escape[(unsigned char) s[i]])
        i++;
    return i;
}

static bool s_write_string(ll_jbuf_t *buf, const char *s, size_t n)
{
    if (!s_put(buf, "\"", 1))
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
            unsigned char c = (unsigned char) s[run];
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
        buf->len = (size_t) (out - buf->data);
        i = run;
    }
    return s_put(buf, "\"", 1);
}

static bool s_write_integer(ll_jbuf_t *buf, json_int_t v)
{
    char tmp[24];
    char *end = tmp + sizeof tmp, *p = end;
    /* Negate in unsigned arithmetic so the minimum value does not overflow. */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long) v : (unsigned long long) v;
    do {
        *--p = (char) ('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return s_put(buf, p, (size_t) (end - p));
}

static bool s_write_real(ll_jbuf_t *buf, double v)
{
    /* Shortest form that reads back exactly, like Python's repr(). */
    pthread_once(&s_c_locale_once, s_init_c_locale);
    locale_t saved = s_c_locale ? uselocale(s_c_locale) : (locale_t) 0;
    char tmp[40];
    int n = 0;
    for (int precision = 15; precision <= 17; precision++) {
        n = snprintf(tmp, sizeof tmp, "%.*g", precision, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    if (saved)
        uselocale(saved);
    if (n <= 0 || (size_t) n >= sizeof tmp - 3)
        return false;
    if (!strpbrk(tmp, ".eEn")) { /* "1" would read back as an integer */
        tmp[n++] = '.';
        tmp[n++] = '0';
    }
    return s_put(buf, tmp, (size_t) n);
}

static bool s_write(ll_jbuf_t *buf, const json_t *v, int depth)
{
    if (!v || depth >= LL_JSON_MAX_DEPTH)
        return false;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (!s_putc(buf, '{'))
            return false;
        bool first = true;
        for (void *it = json_object_iter((json_t *) v); it;
             it = json_object_iter_next((json_t *) v, it)) {
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
    case JSON_STRING: return s_write_string(buf, json_string_value(v), json_string_length(v));
    case JSON_INTEGER: return s_write_integer(buf, json_integer_value(v));
    case JSON_REAL: return s_write_real(buf, json_real_value(v));
    case JSON_TRUE: return s_put(buf, "true", 4);
    case JSON_FALSE: return s_put(buf, "false", 5);
    case JSON_NULL: return s_put(buf, "null", 4);
    }
    return false;
}

int ll_json_write(ll_jbuf_t *buf, const json_t *value)
{
    if (!buf)
        return -1;
    size_t start = buf->len;
    if (!s_write(buf, value, 0) || buf->failed) {
        buf->len = start; /* leave no half-written value behind */
        return -1;
    }
    return 0;
}

/* ---- parser ------------------------------------------------------------- */

typedef struct {
    const unsigned char *start; /* first byte of the text */
    const unsigned char *p;     /* next byte to read */
    const unsigned char *end;   /* one past the last byte */
    ll_jbuf_t scratch;          /* unescaped string being built */
    char *err;                  /* caller's error buffer */
    size_t errlen;
    bool failed; /* err already holds the first error */
    bool no_dup; /* LL_JSON_NO_DUPLICATE_KEYS */
} s_parser_t;

static void s_perror(s_parser_t *ps, const unsigned char *at, const char *reason)
{
    if (ps->failed)
        return;
    ps->failed = true;
    if (ps->err && ps->errlen)
        snprintf(ps->err, ps->errlen, "at byte %zu: %s", (size_t) (at - ps->start), reason);
}

static void s_skip_ws(s_parser_t *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t'))
        ps->p++;
}

/* Length of the valid UTF-8 sequence at P (first byte >= 0x80), or 0. */
static size_t s_utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    size_t n;
    unsigned min, cp;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1f;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0f;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else {
        return 0; /* continuation byte, overlong lead 0xc0/0xc1, or > U+10FFFF lead */
    }
    if ((size_t) (end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

static int s_hex4(const unsigned char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

static bool s_put_utf8(ll_jbuf_t *buf, unsigned cp)
{
    unsigned char out[4];
    size_t n;
    if (cp < 0x80) {
        out[0] = (unsigned char) cp;
        n = 1;
    } else if (cp < 0x800) {
        out[0] = (unsigned char) (0xc0 | cp >> 6);
        out[1] = (unsigned char) (0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        out[0] = (unsigned char) (0xe0 | cp >> 12);
        out[1] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char) (0x80 | (cp & 0x3f));
        n = 3;
    } else {
        out[0] = (unsigned char) (0xf0 | cp >> 18);
        out[1] = (unsigned char) (0x80 | ((cp >> 12) & 0x3f));
        out[2] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
        out[3] = (unsigned char) (0x80 | (cp & 0x3f));
        n = 4;
    }
    return s_put(buf, out, n);
}

/* Parse the string whose opening quote is at ps->p.  On success *OUT and
 * *OUT_LEN point at its UTF-8 bytes: inside the input when it had no
 * escapes, else in ps->scratch (valid until the next string). */
static bool s_parse_string(s_parser_t *ps, const char **out, size_t *out_len)
{
    const unsigned char *p = ps->p + 1, *end = ps->end;
    const unsigned char *run = p; /* start of bytes not yet copied to scratch */
    bool escaped = false;
    const uint64_t highs = 0x8080808080808080ULL;
    for (;;) {
        /* Fast path: 8 plain ASCII bytes at a time. */
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if ((w & highs) || !s_word_plain(w))
                break;
            p += 8;
        }
        if (p >= end) {
            s_perror(ps, p, "unterminated string");
            return false;
        }
        unsigned char c = *p;
        if (c == '"')
            break;
        if (c >= 0x80) {
            size_t n = s_utf8_len(p, end);
            if (!n) {
                s_perror(ps, p, "invalid UTF-8 in string");
                return false;
            }
            p += n;
            continue;
        }
        if (c < 0x20) {
            s_perror(ps, p, "control character in string");
            return false;
        }
        if (c != '\\') {
            p++;
            continue;
        }
        /* An escape: flush the plain bytes before it into scratch. */
        if (!escaped) {
            ps->scratch.len = 0;
            escaped = true;
        }
        if (!s_put(&ps->scratch, run, (size_t) (p - run)))
            goto out_nomem;
        if (end - p < 2) {
            s_perror(ps, p, "unterminated string");
            return false;
        }
        unsigned char e = p[1];
        const char *simple = NULL;
        switch (e) {
        case '"': simple = "\""; break;
        case '\\': simple = "\\"; break;
        case '/': simple = "/"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'n': simple = "\n"; break;
        case 'r': simple = "\r"; break;
        case 't': simple = "\t"; break;
        case 'u': break;
        default: s_perror(ps, p, "invalid escape in string"); return false;
        }
        if (simple) {
            if (!s_put(&ps->scratch, simple, 1))
                goto out_nomem;
            p += 2;
        } else {
            int cp = end - p >= 6 ? s_hex4(p + 2) : -1;
            if (cp < 0) {
                s_perror(ps, p, "invalid \\u escape in string");
                return false;
            }
            p += 6;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                s_perror(ps, p - 6, "lone low surrogate in \\u escape");
                return false;
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                int lo = end - p >= 6 && p[0] == '\\' && p[1] == 'u' ? s_hex4(p + 2) : -1;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    s_perror(ps, p - 6, "high surrogate without its low half in \\u escape");
                    return false;
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            if (!s_put_utf8(&ps->scratch, (unsigned) cp))
                goto out_nomem;
        }
        run = p;
    }
    if (escaped) {
        if (!s_put(&ps->scratch, run, (size_t) (p - run)))
            goto out_nomem;
        *out = ps->scratch.data;
        *out_len = ps->scratch.len;
    } else {
        *out = (const char *) ps->p + 1;
        *out_len = (size_t) (p - ps->p - 1);
    }
    ps->p = p + 1;
    return true;

out_nomem:
    s_perror(ps, p, "out of memory");
    return false;
}

static json_t *s_parse_number(s_parser_t *ps)
{
    const unsigned char *p = ps->p, *end = ps->end, *start = p;
    bool negative = false, is_real = false;
    if (*p == '-') {
        negative = true;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') {
        s_perror(ps, start, "invalid number");
        return NULL;
    }
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') {
            s_perror(ps, start, "leading zero in number");
            return NULL;
        }
    } else {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && *p == '.') {
        is_real = true;
        p++;
        if (p >= end || *p < '0' || *p > '9') {
            s_perror(ps, start, "invalid number: digit expected after '.'");
            return NULL;
        }
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_real = true;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9') {
            s_perror(ps, start, "invalid number: digit expected in exponent");
            return NULL;
        }
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    ps->p = p;
    if (!is_real) {
        /* Accumulate the magnitude in unsigned arithmetic; the limit
         * differs by one between positive and negative. */
        unsigned long long limit = negative ? (unsigned long long) INT64_MAX + 1 : INT64_MAX;
        unsigned long long v = 0;
        for (const unsigned char *d = start + negative; d < p; d++) {
            unsigned digit = (unsigned) (*d - '0');
            if (v > (limit - digit) / 10) {
                s_perror(ps, start, "integer too big for 64 bits");
                return NULL;
            }
            v = v * 10 + digit;
        }
        json_int_t value = negative ? (json_int_t) (0 - v) : (json_int_t) v;
        return json_integer(value);
    }
    /* strtod needs a NUL-terminated copy; numbers are short, except
     * pathological ones, which go through the heap. */
    char small[64];
    size_t n = (size_t) (p - start);
    char *copy = n < sizeof small ? small : malloc(n + 1);
    if (!copy) {
        s_perror(ps, start, "out of memory");
        return NULL;
    }
    memcpy(copy, start, n);
    copy[n] = '\0';
    /* The C locale, whatever the embedded interpreter did to LC_NUMERIC. */
    pthread_once(&s_c_locale_once, s_init_c_locale);
    errno = 0;
    double d = s_c_locale ? strtod_l(copy, NULL, s_c_locale) : strtod(copy, NULL);
    bool overflow = errno == ERANGE && (d == HUGE_VAL || d == -HUGE_VAL);
    if (copy != small)
        free(copy);
    if (overflow || !isfinite(d)) {
        s_perror(ps, start, "real number out of range");
        return NULL;
    }
    return json_real(d);
}

static json_t *s_parse_value(s_parser_t *ps, int depth);

static json_t *s_parse_object(s_parser_t *ps, int depth)
{
    json_t *obj = json_object();
    if (!obj) {
        s_perror(ps, ps->p, "out of memory");
        return NULL;
    }
    ps->p++; /* '{' */
    s_skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return obj;
    }
    for (;;) {
        s_skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') {
            s_perror(ps, ps->p, "string or '}' expected");
            goto out_fail;
        }
        const char *key;
        size_t key_len;
        if (!s_parse_string(ps, &key, &key_len))
            goto out_fail;
        /* The key may live in scratch, which the value's strings reuse:
         * keep a copy (keys are short; jansson copies it again anyway). */
        char small[128];
        char *key_copy = key_len < sizeof small ? small : malloc(key_len + 1);
        if (!key_copy) {
            s_perror(ps, ps->p, "out of memory");
            goto out_fail;
        }
        memcpy(key_copy, key, key_len);
        s_skip_ws(ps);
        json_t *value = NULL;
        if (ps->p >= ps->end || *ps->p != ':')
            s_perror(ps, ps->p, "':' expected");
        else {
            ps->p++;
            value = s_parse_value(ps, depth + 1);
        }
        if (value && ps->no_dup && json_object_getn(obj, key_copy, key_len)) {
            s_perror(ps, ps->p, "duplicate key");
            json_decref(value);
            if (key_copy != small)
                free(key_copy);
            goto out_fail;
        }
        int rc = value ? json_object_setn_new_nocheck(obj, key_copy, key_len, value) : -1;
        if (key_copy != small)
            free(key_copy);
        if (rc != 0) {
            s_perror(ps, ps->p, "out of memory");
            goto out_fail;
        }
        s_skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return obj;
        }
        s_perror(ps, ps->p, "',' or '}' expected");
        goto out_fail;
    }
out_fail:
    json_decref(obj);
    return NULL;
}

static json_t *s_parse_array(s_parser_t *ps, int depth)
{
    json_t *arr = json_array();
    if (!arr) {
        s_perror(ps, ps->p, "out of memory");
        return NULL;
    }
    ps->p++; /* '[' */
    s_skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return arr;
    }
    for (;;) {
        json_t *value = s_parse_value(ps, depth + 1);
        if (!value || json_array_append_new(arr, value) != 0) {
            s_perror(ps, ps->p, "out of memory");
            json_decref(arr);
            return NULL;
        }
        s_skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
            return arr;
        }
        s_perror(ps, ps->p, "',' or ']' expected");
        json_decref(arr);
        return NULL;
    }
}

static bool s_literal(s_parser_t *ps, const char *word, size_t n)
{
    if ((size_t) (ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return false;
    ps->p += n;
    return true;
}

static json_t *s_parse_value(s_parser_t *ps, int depth)
{
    if (depth >= LL_JSON_MAX_DEPTH) {
        s_perror(ps, ps->p, "nested more than 2048 levels deep");
        return NULL;
    }
    s_skip_ws(ps);
    if (ps->p >= ps->end) {
        s_perror(ps, ps->p, "value expected, found end of text");
        return NULL;
    }
    switch (*ps->p) {
    case '{': return s_parse_object(ps, depth);
    case '[': return s_parse_array(ps, depth);
    case '"': {
        const char *s;
        size_t n;
        if (!s_parse_string(ps, &s, &n))
            return NULL;
        json_t *v = json_stringn_nocheck(s, n); /* validated above */
        if (!v)
            s_perror(ps, ps->p, "out of memory");
        return v;
    }
    case 't':
        if (s_literal(ps, "true", 4))
            return json_true();
        break;
    case 'f':
        if (s_literal(ps, "false", 5))
            return json_false();
        break;
    case 'n':
        if (s_literal(ps, "null", 4))
            return json_null();
        break;
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'))
            return s_parse_number(ps);
        break;
    }
    s_perror(ps, ps->p, "invalid token");
    return NULL;
}

json_t *ll_json_parse(const char *text, size_t len, char *err, size_t errlen)
{
    return ll_json_parse_flags(text, len, 0, err, errlen);
}

json_t *ll_json_parse_flags(const char *text, size_t len, unsigned flags, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!text) {
        if (err && errlen)
            snprintf(err, errlen, "no text");
        return NULL;
    }
    char scratch[1024];
    s_parser_t ps = {
        .start = (const unsigned char *) text,
        .p = (const unsigned char *) text,
        .end = (const unsigned char *) text + len,
        .err = err,
        .errlen = errlen,
        .no_dup = (flags & LL_JSON_NO_DUPLICATE_KEYS) != 0,
    };
    ll_jbuf_init(&ps.scratch, scratch, sizeof scratch);
    json_t *v = s_parse_value(&ps, 0);
    if (v) {
        s_skip_ws(&ps);
        if (ps.p != ps.end) {
            s_perror(&ps, ps.p, "end of text expected after the value");
            json_decref(v);
            v = NULL;
        }
    }
    ll_jbuf_release(&ps.scratch);
    return v;
}
