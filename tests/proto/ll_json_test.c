/* Self-test of proto/ll_json (run by build/ll_selftest): exact output for
 * known values (as Python's json.dumps(ensure_ascii=False, separators=(",",
 * ":")) writes them), growth past the caller's storage, the depth limit, and
 * random trees that must parse back equal. */
#include "proto/ll_json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int s_failures;

static void s_check(bool ok, const char *what, int line)
{
    if (!ok) {
        fprintf(stderr, "\n  ll_json_test.c:%d: check failed: %s", line, what);
        s_failures++;
    }
}
#define LL_CHECK(cond) s_check((cond), #cond, __LINE__)

/* Writing V (stolen) gives exactly WANT (WANT_LEN bytes). */
static void s_expect(json_t *v, const char *want, size_t want_len, int line)
{
    char small[8];   /* tiny, so growth is exercised everywhere */
    ll_jbuf_t buf;
    ll_jbuf_init(&buf, small, sizeof small);
    int rc = ll_json_write(&buf, v);
    if (rc != 0 || buf.len != want_len || memcmp(buf.data, want, want_len) != 0) {
        fprintf(stderr, "\n  ll_json_test.c:%d: got rc=%d \"%.*s\", want \"%s\"", line, rc,
                (int)buf.len, buf.data, want);
        s_failures++;
    }
    ll_jbuf_release(&buf);
    json_decref(v);
}
#define S_EXPECT(v, want) s_expect((v), (want), sizeof(want) - 1, __LINE__)

static uint64_t s_rng = 88172645463325252ULL;
static uint64_t s_rand(void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return s_rng;
}

static json_t *s_random_value(int depth)
{
    static const char *const pieces[] = {"a", "\xc3\xa9", "\xe2\x98\x83", "\xf0\x9d\x84\x9e",
                                         "\"", "\\", "\n", "\t", "\x01", "\x1f", "\x7f", "/",
                                         "plain text ", "\0"};
    switch (s_rand() % (depth > 4 ? 6 : 8)) {
    case 0: return json_integer((json_int_t)s_rand());
    case 1: {
        double d = (double)(int64_t)s_rand() / (double)(1 + s_rand() % 1000000);
        return json_real(s_rand() % 4 ? d : d * 1e-300);
    }
    case 2: {
        char text[256];
        size_t n = 0, parts = s_rand() % 12;
        for (size_t i = 0; i < parts; i++) {
            const char *p = pieces[s_rand() % (sizeof pieces / sizeof pieces[0])];
            size_t len = *p ? strlen(p) : 1;
            memcpy(text + n, p, len);
            n += len;
        }
        return json_stringn(text, n);
    }
    case 3: return json_true();
    case 4: return json_false();
    case 5: return json_null();
    case 6: {
        json_t *a = json_array();
        for (int i = 0, n = (int)(s_rand() % 6); i < n; i++)
            json_array_append_new(a, s_random_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (int i = 0, n = (int)(s_rand() % 6); i < n; i++) {
            char key[16];
            int len = snprintf(key, sizeof key, "k%d\n\"%d", i, (int)(s_rand() % 100));
            json_object_setn_new(o, key, (size_t)len, s_random_value(depth + 1));
        }
        return o;
    }
    }
}

int ll_json_selftest(bool verbose)
{
    s_failures = 0;
    S_EXPECT(json_object(), "{}");
    S_EXPECT(json_array(), "[]");
    S_EXPECT(json_true(), "true");
    S_EXPECT(json_null(), "null");
    S_EXPECT(json_integer(0), "0");
    S_EXPECT(json_integer(-42), "-42");
    S_EXPECT(json_integer(INT64_MAX), "9223372036854775807");
    S_EXPECT(json_integer(INT64_MIN), "-9223372036854775808");
    S_EXPECT(json_real(0.1), "0.1");
    S_EXPECT(json_real(1.0), "1.0");
    S_EXPECT(json_real(-0.0), "-0.0");
    S_EXPECT(json_real(1e16), "1e+16");
    S_EXPECT(json_real(1.2345678901234568e+17), "1.2345678901234568e+17");
    S_EXPECT(json_real(2.5e-300), "2.5e-300");
    S_EXPECT(json_real(1.0 / 3.0), "0.3333333333333333");
    S_EXPECT(json_string("h\xc3\xa9llo \xe2\x98\x83"), "\"h\xc3\xa9llo \xe2\x98\x83\"");
    S_EXPECT(json_string("q\"b\\s/n\nr\rt\tb\bf\f\x01\x1f\x7f"),
             "\"q\\\"b\\\\s/n\\nr\\rt\\tb\\bf\\f\\u0001\\u001f\x7f\"");
    S_EXPECT(json_stringn("a\0b", 3), "\"a\\u0000b\"");
    S_EXPECT(json_pack("{s:i,s:[s,n,b],s:{}}", "x", 1, "y", "z", 0, "e"),
             "{\"x\":1,\"y\":[\"z\",null,false],\"e\":{}}");
    json_t *nul_key = json_object();
    json_object_setn_new(nul_key, "k\0ey", 4, json_integer(1));
    S_EXPECT(nul_key, "{\"k\\u0000ey\":1}");

    /* Escapes at every offset around the 8-byte blocks the writer scans,
     * with bytes on both sides that must not be escaped (0x7f, UTF-8). */
    static const char specials[] = {'"', '\\', '\n', '\x01', '\x1f', '\0'};
    for (size_t k = 0; k < sizeof specials; k++)
        for (int pos = 0; pos < 24; pos++) {
            char text[24], want[64];
            for (int i = 0; i < 24; i++)
                text[i] = i % 5 == 4 ? '\x7f' : (char)(i % 3 ? 'a' + i : 0xc3 - (i & 0));
            /* Keep UTF-8 valid: 0xc3 must be followed by a continuation byte. */
            for (int i = 0; i < 23; i++)
                if ((unsigned char)text[i] == 0xc3)
                    text[i + 1] = (char)0xa9;
            if ((unsigned char)text[23] == 0xc3)
                text[23] = 'z';
            text[pos] = specials[k];
            if (pos > 0 && (unsigned char)text[pos - 1] == 0xc3)
                text[pos - 1] = 'y';
            if (pos < 23 && (unsigned char)text[pos + 1] == 0xa9)
                text[pos + 1] = 'w';
            size_t w = 0;
            want[w++] = '"';
            for (int i = 0; i < 24; i++) {
                unsigned char c = (unsigned char)text[i];
                if (c == '"' || c == '\\') {
                    want[w++] = '\\';
                    want[w++] = (char)c;
                } else if (c == '\n') {
                    want[w++] = '\\';
                    want[w++] = 'n';
                } else if (c < 0x20) {
                    w += (size_t)snprintf(want + w, 7, "\\u%04x", c);
                } else {
                    want[w++] = (char)c;
                }
            }
            want[w++] = '"';
            s_expect(json_stringn(text, 24), want, w, __LINE__);
        }

    /* Depth: 2000 levels are written, 3000 are refused without a crash. */
    for (int levels = 2000; levels <= 3000; levels += 1000) {
        json_t *deep = json_array();
        for (int i = 0; i < levels; i++) {
            json_t *outer = json_array();
            json_array_append_new(outer, deep);
            deep = outer;
        }
        ll_jbuf_t buf;
        ll_jbuf_init(&buf, NULL, 0);
        int rc = ll_json_write(&buf, deep);
        LL_CHECK(levels == 2000 ? rc == 0 && buf.len == 2 * 2001 : rc == -1 && buf.len == 0);
        ll_jbuf_release(&buf);
        json_decref(deep);
    }
    ll_jbuf_t buf;
    ll_jbuf_init(&buf, NULL, 0);
    LL_CHECK(ll_json_write(&buf, NULL) == -1);
    LL_CHECK(ll_json_write(NULL, json_null()) == -1);

    /* A 1 MiB string: heap growth, and several values appended in a row. */
    size_t big_len = 1 << 20;
    char *big = malloc(big_len);
    for (size_t i = 0; i < big_len; i++)
        big[i] = (char)('a' + i % 26);
    big[1000] = '\n';
    json_t *bigv = json_stringn(big, big_len);
    LL_CHECK(ll_json_write(&buf, bigv) == 0);
    LL_CHECK(ll_json_write(&buf, bigv) == 0);
    LL_CHECK(buf.len == 2 * (big_len + 3));
    json_t *back = json_loadb(buf.data, big_len + 3, JSON_DECODE_ANY, NULL);
    LL_CHECK(back && json_equal(back, bigv));
    json_decref(back);
    json_decref(bigv);
    free(big);
    ll_jbuf_release(&buf);

    /* Random trees parse back equal. */
    int mismatches = 0;
    for (int i = 0; i < 2000; i++) {
        json_t *v = s_random_value(0);
        char storage[64];
        ll_jbuf_init(&buf, storage, sizeof storage);
        if (ll_json_write(&buf, v) != 0) {
            mismatches++;
        } else {
            json_error_t err;
            json_t *again = json_loadb(buf.data, buf.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
            if (!again || !json_equal(again, v)) {
                if (verbose)
                    fprintf(stderr, "\n    mismatch: %.*s (%s)", (int)buf.len, buf.data, err.text);
                mismatches++;
            }
            json_decref(again);
        }
        ll_jbuf_release(&buf);
        json_decref(v);
    }
    LL_CHECK(mismatches == 0);
    if (s_failures)
        fprintf(stderr, "\n");
    return s_failures ? -1 : 0;
}
