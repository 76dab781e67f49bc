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
    char small[8]; /* tiny, so growth is exercised everywhere */
    ll_jbuf_t buf;
    ll_jbuf_init(&buf, small, sizeof small);
    int rc = ll_json_write(&buf, v);
    if (rc != 0 || buf.len != want_len || memcmp(buf.data, want, want_len) != 0) {
        fprintf(stderr, "\n  ll_json_test.c:%d: got rc=%d \"%.*s\", want \"%s\"", line, rc,
                (int) buf.len, buf.data, want);
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
    static const char *const pieces[] = {
        "a",           "\xc3\xa9", "\xe2\x98\x83", "\xf0\x9d\x84\x9e",
        "\"",          "\\",       "\n",           "\t",
        "\x01",        "\x1f",     "\x7f",         "/",
        "plain text ", "\0"};
    switch (s_rand() % (depth > 4 ? 6 : 8)) {
    case 0: return json_integer((json_int_t) s_rand());
    case 1: {
        double d = (double) (int64_t) s_rand() / (double) (1 + s_rand() % 1000000);
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
        for (int i = 0, n = (int) (s_rand() % 6); i < n; i++)
            json_array_append_new(a, s_random_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (int i = 0, n = (int) (s_rand() % 6); i < n; i++) {
            char key[16];
            int len = snprintf(key, sizeof key, "k%d\n\"%d", i, (int) (s_rand() % 100));
            json_object_setn_new(o, key, (size_t) len, s_random_value(depth + 1));
        }
        return o;
    }
    }
}

/* Parsing TEXT succeeds and equals WANT (stolen), or fails when WANT is NULL. */
static void s_parse_expect(const char *text, size_t len, json_t *want, int line)
{
    char err[200];
    json_t *got = ll_json_parse(text, len, err, sizeof err);
    bool ok = want ? got && json_equal(got, want) : got == NULL && err[0] != '\0';
    if (!ok) {
        fprintf(stderr, "\n  ll_json_test.c:%d: parse of \"%.*s\": got %s%s%s", line, (int) len,
                text, got ? "a value" : "an error: ", got ? "" : err,
                want ? "" : " (wanted an error)");
        s_failures++;
    }
    json_decref(got);
    json_decref(want);
}
#define S_PARSE_OK(text, want) s_parse_expect((text), sizeof(text) - 1, (want), __LINE__)
#define S_PARSE_BAD(text)      s_parse_expect((text), sizeof(text) - 1, NULL, __LINE__)

static void s_test_parse_cases(void)
{
    S_PARSE_OK("{}", json_object());
    S_PARSE_OK(" \t\r\n[ ] \n", json_array());
    S_PARSE_OK("0", json_integer(0));
    S_PARSE_OK("-0", json_integer(0));
    S_PARSE_OK("9223372036854775807", json_integer(INT64_MAX));
    S_PARSE_OK("-9223372036854775808", json_integer(INT64_MIN));
    S_PARSE_OK("1.5e3", json_real(1500.0));
    S_PARSE_OK("-0.25E-2", json_real(-0.0025));
    S_PARSE_OK("1e-400", json_real(0.0));
    S_PARSE_OK("0.1", json_real(0.1));
    S_PARSE_OK("true", json_true());
    S_PARSE_OK("\"a\\u0000b\"", json_stringn("a\0b", 3));
    S_PARSE_OK("\"\\ud834\\udd1e \\u00e9 \\/ \\b\\f\\n\\r\\t\\\"\\\\\"",
               json_string("\xf0\x9d\x84\x9e \xc3\xa9 / \b\f\n\r\t\"\\"));
    S_PARSE_OK("\"h\xc3\xa9 \xe2\x98\x83 \xf0\x9d\x84\x9e\x7f\"",
               json_string("h\xc3\xa9 \xe2\x98\x83 \xf0\x9d\x84\x9e\x7f"));
    S_PARSE_OK("{\"a\":1,\"a\":2}", json_pack("{s:i}", "a", 2)); /* last wins, as in Python */
    /* A NUL in a key (json_equal cannot compare those: check the text). */
    {
        static const char text[] = "{\"k\\u0000\":[1,{\"x\":null}],\"k\":2}";
        char err[64];
        json_t *v = ll_json_parse(text, sizeof text - 1, err, sizeof err);
        LL_CHECK(v && json_object_size(v) == 2);
        ll_jbuf_t out;
        ll_jbuf_init(&out, NULL, 0);
        LL_CHECK(v && ll_json_write(&out, v) == 0 && out.len == sizeof text - 1 &&
                 memcmp(out.data, text, out.len) == 0);
        ll_jbuf_release(&out);
        json_decref(v);
    }

    S_PARSE_BAD("");
    S_PARSE_BAD("   ");
    S_PARSE_BAD("{");
    S_PARSE_BAD("{\"a\"}");
    S_PARSE_BAD("{\"a\":}");
    S_PARSE_BAD("{\"a\":1,}");
    S_PARSE_BAD("[1,]");
    S_PARSE_BAD("[1 2]");
    S_PARSE_BAD("{a:1}");
    S_PARSE_BAD("{} x");
    S_PARSE_BAD("{}{}");
    S_PARSE_BAD("01");
    S_PARSE_BAD("-");
    S_PARSE_BAD("1.");
    S_PARSE_BAD(".5");
    S_PARSE_BAD("1e");
    S_PARSE_BAD("+1");
    S_PARSE_BAD("9223372036854775808");
    S_PARSE_BAD("-9223372036854775809");
    S_PARSE_BAD("1e400");
    S_PARSE_BAD("NaN");
    S_PARSE_BAD("Infinity");
    S_PARSE_BAD("tru");
    S_PARSE_BAD("nul");
    S_PARSE_BAD("\"abc");
    S_PARSE_BAD("\"a\nb\""); /* raw control character */
    S_PARSE_BAD("\"a\\x\""); /* unknown escape */
    S_PARSE_BAD("\"\\u12\"");
    S_PARSE_BAD("\"\\ud800\""); /* lone high surrogate */
    S_PARSE_BAD("\"\\udc00\""); /* lone low surrogate */
    S_PARSE_BAD("\"\\ud800\\u0041\"");
    S_PARSE_BAD("\"\xc3\"");             /* truncated UTF-8 */
    S_PARSE_BAD("\"\xc0\xaf\"");         /* overlong */
    S_PARSE_BAD("\"\xed\xa0\x80\"");     /* encoded surrogate */
    S_PARSE_BAD("\"\xf4\x90\x80\x80\""); /* above U+10FFFF */
    S_PARSE_BAD("\"\xff\"");
    S_PARSE_BAD("\xef\xbb\xbf{}");                  /* BOM: not JSON text */
    s_parse_expect("{}\0", 3, NULL, __LINE__);      /* NUL after the value */
    s_parse_expect("{\"a\":1}", 4, NULL, __LINE__); /* cut short: never reads past LEN */
    char err[64];
    LL_CHECK(ll_json_parse(NULL, 0, err, sizeof err) == NULL);

    /* Nesting: 2048 levels parse, 2049 do not (jansson's limit). */
    for (int levels = 2048; levels <= 2049; levels++) {
        char *text = malloc(2 * (size_t) levels);
        memset(text, '[', (size_t) levels);
        memset(text + levels, ']', (size_t) levels);
        json_t *v = ll_json_parse(text, 2 * (size_t) levels, err, sizeof err);
        LL_CHECK(levels == 2048 ? v != NULL : v == NULL);
        json_decref(v);
        free(text);
    }
}

/* One random change to TEXT (length *LEN, capacity CAP). */
static void s_mutate_text(char *text, size_t *len, size_t cap)
{
    static const char tokens[] = "{}[]\",:\\u0-9eE.+ tfn\x80\xc3\xa9\xed\xf4\x00";
    size_t n = *len;
    size_t at = n ? s_rand() % n : 0;
    switch (s_rand() % 4) {
    case 0:
        if (n)
            text[at] = tokens[s_rand() % (sizeof tokens - 1)];
        break;
    case 1:
        if (n < cap) {
            memmove(text + at + 1, text + at, n - at);
            text[at] = tokens[s_rand() % (sizeof tokens - 1)];
            *len = n + 1;
        }
        break;
    case 2:
        if (n) {
            memmove(text + at, text + at + 1, n - at - 1);
            *len = n - 1;
        }
        break;
    default: *len = at; break;
    }
}

/* Our parser and jansson agree on TEXT: both reject, or both accept equal
 * values.  jansson refuses NUL in object keys, which Python's json (and we)
 * accept: the one allowed disagreement. */
static bool s_agrees_with_jansson(const char *text, size_t len, bool verbose)
{
    char err[200];
    json_error_t jerr;
    json_t *ours = ll_json_parse(text, len, err, sizeof err);
    json_t *theirs = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    bool agree;
    if (!ours || !theirs)
        agree = !ours && !theirs;
    else
        agree = json_equal(ours, theirs);
    if (!agree && ours && !theirs && strstr(jerr.text, "NUL"))
        agree = true;
    /* jansson's lexer drops a raw NUL byte that follows a number or a
     * literal ("[1\0,2]" parses as [1,2]); RFC 8259 and Python reject it,
     * as we do.  Agreement then means: without its NUL bytes the text
     * parses, for us, to jansson's value. */
    if (!agree && !ours && theirs && memchr(text, '\0', len)) {
        char *stripped = malloc(len);
        size_t n = 0;
        for (size_t i = 0; i < len; i++)
            if (text[i] != '\0')
                stripped[n++] = text[i];
        json_t *again = ll_json_parse(stripped, n, err, sizeof err);
        agree = again && json_equal(again, theirs);
        json_decref(again);
        free(stripped);
    }
    if (!agree && verbose)
        fprintf(stderr, "\n    disagree on \"%.*s\": ours %s, jansson %s", (int) len, text,
                ours ? "accepts" : err, theirs ? "accepts" : jerr.text);
    json_decref(ours);
    json_decref(theirs);
    return agree;
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
                text[i] = i % 5 == 4 ? '\x7f' : (char) (i % 3 ? 'a' + i : 0xc3 - (i & 0));
            /* Keep UTF-8 valid: 0xc3 must be followed by a continuation byte. */
            for (int i = 0; i < 23; i++)
                if ((unsigned char) text[i] == 0xc3)
                    text[i + 1] = (char) 0xa9;
            if ((unsigned char) text[23] == 0xc3)
                text[23] = 'z';
            text[pos] = specials[k];
            if (pos > 0 && (unsigned char) text[pos - 1] == 0xc3)
                text[pos - 1] = 'y';
            if (pos < 23 && (unsigned char) text[pos + 1] == 0xa9)
                text[pos + 1] = 'w';
            size_t w = 0;
            want[w++] = '"';
            for (int i = 0; i < 24; i++) {
                unsigned char c = (unsigned char) text[i];
                if (c == '"' || c == '\\') {
                    want[w++] = '\\';
                    want[w++] = (char) c;
                } else if (c == '\n') {
                    want[w++] = '\\';
                    want[w++] = 'n';
                } else if (c < 0x20) {
                    w += (size_t) snprintf(want + w, 7, "\\u%04x", c);
                } else {
                    want[w++] = (char) c;
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
        big[i] = (char) ('a' + i % 26);
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
                    fprintf(stderr, "\n    mismatch: %.*s (%s)", (int) buf.len, buf.data, err.text);
                mismatches++;
            }
            json_decref(again);
        }
        ll_jbuf_release(&buf);
        json_decref(v);
    }
    LL_CHECK(mismatches == 0);

    s_test_parse_cases();

    /* Random trees, written by us and by jansson in several styles (\u
     * escapes and surrogate pairs with JSON_ENSURE_ASCII), parse back equal;
     * mutated texts are judged the same way jansson judges them. */
    int parse_mismatches = 0, disagreements = 0;
    static const size_t styles[] = {JSON_COMPACT, 0, JSON_ENSURE_ASCII, JSON_INDENT(2)};
    for (int i = 0; i < 3000; i++) {
        json_t *v = s_random_value(0);
        char *text = NULL;
        size_t len = 0;
        if (i % 5 == 4) {
            ll_jbuf_init(&buf, NULL, 0);
            if (ll_json_write(&buf, v) == 0) {
                text = malloc(buf.len + 64);
                memcpy(text, buf.data, buf.len);
                len = buf.len;
            }
            ll_jbuf_release(&buf);
        } else {
            char *dumped = json_dumps(v, JSON_ENCODE_ANY | styles[i % 4]);
            if (dumped) {
                len = strlen(dumped);
                text = malloc(len + 64);
                memcpy(text, dumped, len);
                free(dumped);
            }
        }
        if (!text) {
            parse_mismatches++;
            json_decref(v);
            continue;
        }
        char err[200];
        json_t *parsed = ll_json_parse(text, len, err, sizeof err);
        if (!parsed || !json_equal(parsed, v)) {
            if (verbose)
                fprintf(stderr, "\n    parse mismatch: %.*s (%s)", (int) len, text,
                        parsed ? "" : err);
            parse_mismatches++;
        }
        json_decref(parsed);
        for (int m = 0; m < 4; m++) {
            int rounds = 1 + (int) (s_rand() % 3);
            for (int r = 0; r < rounds; r++)
                s_mutate_text(text, &len, len + 64 - 8);
            disagreements += !s_agrees_with_jansson(text, len, verbose);
        }
        free(text);
        json_decref(v);
    }
    LL_CHECK(parse_mismatches == 0);
    LL_CHECK(disagreements == 0);
    /* Duplicate keys: the last wins by default, an error on request (at
     * any depth), and the error frees what was parsed. */
    char derr[128];
    const char dup[] = "{\"a\":1,\"b\":{\"c\":2,\"c\":3}}";
    json_t *last = ll_json_parse(dup, sizeof dup - 1, derr, sizeof derr);
    LL_CHECK(last && json_integer_value(json_object_get(json_object_get(last, "b"), "c")) == 3);
    json_decref(last);
    LL_CHECK(
        !ll_json_parse_flags(dup, sizeof dup - 1, LL_JSON_NO_DUPLICATE_KEYS, derr, sizeof derr));
    LL_CHECK(strstr(derr, "duplicate key") != NULL);
    const char nul_keys[] = "{\"a\\u0000\":1,\"a\":2}"; /* different keys */
    json_t *two = ll_json_parse_flags(nul_keys, sizeof nul_keys - 1, LL_JSON_NO_DUPLICATE_KEYS,
                                      derr, sizeof derr);
    LL_CHECK(two && json_object_size(two) == 2);
    json_decref(two);
    if (s_failures)
        fprintf(stderr, "\n");
    return s_failures ? -1 : 0;
}
