/* Self-test of proto/ll_wire (run by build/ll_selftest, single process).
 *
 * Known-answer vectors come from jupyter_client's Session
 * (tests/proto/wire_vectors.h, made by make_vectors.py): our decoder must
 * accept Session's frames and our HMAC must equal Session's signature.  Then
 * every bad-input case the decoder must drop (each named field missing or of
 * the wrong type, bad signatures, replays), encode/decode round trips, replay
 * history eviction, concurrent decoding, waiting on a socket and a stop fd,
 * and a randomized mutation loop that must never crash the decoder. */
#include "proto/ll_wire.h"

#include "base/ll_log.h"

#include "tests/proto/wire_vectors.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static int s_failures;

static void s_check(bool ok, const char *what, int line)
{
    if (!ok) {
        fprintf(stderr, "\n  ll_wire_test.c:%d: check failed: %s", line, what);
        s_failures++;
    }
}
#define LL_CHECK(cond) s_check((cond), #cond, __LINE__)

static const unsigned char s_key[] = "0123456789abcdef-test-key";
#define S_KEY_LEN (sizeof s_key - 1)

static zmsg_t *s_from_vector(const ll_wire_vector_t *v)
{
    zmsg_t *m = zmsg_new();
    for (size_t i = 0; i < v->nframes; i++)
        zmsg_addmem(m, v->frames[i].data, v->frames[i].len);
    return m;
}

/* [identity] <IDS|MSG> sig p0 p1 p2 p3 with SIG computed by SIGNER (or the
 * literal SIG_OVERRIDE when not NULL). */
static zmsg_t *s_raw(const ll_session_t *signer, const char *const parts[4],
                     const char *sig_override)
{
    const void *data[4];
    size_t lens[4];
    for (int i = 0; i < 4; i++) {
        data[i] = parts[i];
        lens[i] = strlen(parts[i]);
    }
    char sig[65] = "";
    if (signer)
        ll_session_sign(signer, data, lens, sig);
    zmsg_t *m = zmsg_new();
    zmsg_addstr(m, "peer");
    zmsg_addstr(m, "<IDS|MSG>");
    zmsg_addstr(m, sig_override ? sig_override : sig);
    for (int i = 0; i < 4; i++)
        zmsg_addmem(m, parts[i], lens[i]);
    return m;
}

static int s_counter;

/* A distinct valid header each call, so replay checks do not interfere. */
static void s_header(char *buf, size_t len, const char *msg_type)
{
    snprintf(buf, len,
             "{\"msg_id\":\"id-%d\",\"msg_type\":\"%s\",\"session\":\"s\","
             "\"username\":\"u\",\"date\":\"2026-11-30T00:00:00.000000Z\",\"version\":\"5.3\"}",
             ++s_counter, msg_type);
}

/* Decode and report whether it was accepted; WHY gets the reason. */
static bool s_accepts(ll_session_t *session, zmsg_t *raw, char *why, size_t whylen)
{
    ll_msg_t *msg = ll_session_decode(session, &raw, why, whylen);
    bool ok = msg != NULL;
    ll_msg_destroy(&msg);
    return ok && raw == NULL;
}

static bool s_contains(const char *haystack, const char *needle)
{
    return strstr(haystack, needle) != NULL;
}

static void s_test_vectors(bool verbose)
{
    for (size_t i = 0; i < LL_WIRE_VECTOR_COUNT; i++) {
        const ll_wire_vector_t *v = &s_wire_vectors[i];
        if (verbose)
            printf("\n    vector %s", v->name);
        ll_session_t *session =
            ll_session_new((const unsigned char *) v->key.data, v->key.len, "hmac-sha256", 0);
        LL_CHECK(session);
        if (!session)
            continue;
        /* Our HMAC over Session's four parts equals Session's signature. */
        const void *data[4];
        size_t lens[4];
        for (int p = 0; p < 4; p++) {
            data[p] = v->frames[v->nident + 2 + p].data;
            lens[p] = v->frames[v->nident + 2 + p].len;
        }
        char sig[65];
        LL_CHECK(ll_session_sign(session, data, lens, sig) == 0);
        LL_CHECK(strlen(sig) == v->signature.len);
        LL_CHECK(memcmp(sig, v->signature.data, v->signature.len) == 0);

        zmsg_t *raw = s_from_vector(v);
        char why[256];
        ll_msg_t *msg = ll_session_decode(session, &raw, why, sizeof why);
        LL_CHECK(msg);
        LL_CHECK(raw == NULL);
        if (!msg) {
            fprintf(stderr, "\n  vector %s rejected: %s", v->name, why);
            ll_session_destroy(&session);
            continue;
        }
        LL_CHECK(strcmp(msg->msg_type, v->msg_type) == 0);
        LL_CHECK(strcmp(json_string_value(json_object_get(msg->header, "msg_id")), v->msg_id) == 0);
        LL_CHECK(zmsg_size(msg->identities) == v->nident);
        LL_CHECK(zmsg_size(msg->buffers) == v->nbuffers);
        for (size_t b = 0; b < v->nbuffers && b < zmsg_size(msg->buffers); b++) {
            zframe_t *f = b == 0 ? zmsg_first(msg->buffers) : zmsg_next(msg->buffers);
            const ll_vec_bytes_t *want = &v->frames[v->nident + 6 + b];
            LL_CHECK(zframe_size(f) == want->len &&
                     memcmp(zframe_data(f), want->data, want->len) == 0);
        }
        for (size_t d = 0; d < v->nident && d < zmsg_size(msg->identities); d++) {
            zframe_t *f = d == 0 ? zmsg_first(msg->identities) : zmsg_next(msg->identities);
            LL_CHECK(zframe_size(f) == v->frames[d].len &&
                     memcmp(zframe_data(f), v->frames[d].data, v->frames[d].len) == 0);
        }
        if (v->code.data) {
            /* NUL bytes inside code survive: compare the full length. */
            json_t *code = json_object_get(msg->content, "code");
            LL_CHECK(json_is_string(code));
            LL_CHECK(json_string_length(code) == v->code.len);
            LL_CHECK(json_string_length(code) == v->code.len &&
                     memcmp(json_string_value(code), v->code.data, v->code.len) == 0);
        }
        ll_msg_destroy(&msg);

        if (ll_session_is_signed(session)) {
            /* The same frames again are a replay. */
            raw = s_from_vector(v);
            LL_CHECK(!s_accepts(session, raw, why, sizeof why));
            LL_CHECK(s_contains(why, "replayed"));
            /* Upper-case hex of the same digest is the same signature. */
            raw = s_from_vector(v);
            zframe_t *f = zmsg_first(raw);
            for (size_t k = 0; k < v->nident + 2; k++)
                f = k == 0 ? f : zmsg_next(raw);
            char upper[65];
            for (int k = 0; k < 64; k++) {
                char c = ((const char *) zframe_data(f))[k];
                upper[k] = (char) (c >= 'a' && c <= 'f' ? c - 32 : c);
            }
            zframe_reset(f, upper, 64);
            LL_CHECK(!s_accepts(session, raw, why, sizeof why));
            LL_CHECK(s_contains(why, "replayed"));
            /* A fresh session with the same key accepts upper case. */
            ll_session_t *fresh =
                ll_session_new((const unsigned char *) v->key.data, v->key.len, "hmac-sha256", 0);
            raw = s_from_vector(v);
            f = zmsg_first(raw);
            for (size_t k = 1; k < v->nident + 2; k++)
                f = zmsg_next(raw);
            zframe_reset(f, upper, 64);
            LL_CHECK(s_accepts(fresh, raw, why, sizeof why));
            ll_session_destroy(&fresh);
            /* A session with another key rejects the vector. */
            ll_session_t *other = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 0);
            raw = s_from_vector(v);
            LL_CHECK(!s_accepts(other, raw, why, sizeof why));
            LL_CHECK(s_contains(why, "does not match"));
            ll_session_destroy(&other);
        }
        ll_session_destroy(&session);
    }
}

/* RFC 4231 HMAC-SHA256 vectors, the data split over the four parts. */
static void s_test_rfc4231(void)
{
    unsigned char big_key[131];
    memset(big_key, 0xaa, sizeof big_key);
    static const char data6[] = "Test Using Larger Than Block-Size Key - Hash Key First";
    struct {
        const unsigned char *key;
        size_t key_len;
        const char *data;
        const char *hex;
    } cases[] = {
        {(const unsigned char *) "Jefe", 4, "what do ya want for nothing?",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {big_key, sizeof big_key, data6,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ll_session_t *s = ll_session_new(cases[i].key, cases[i].key_len, "hmac-sha256", 16);
        size_t n = strlen(cases[i].data), cut1 = n / 3, cut2 = n / 2;
        const void *parts[4] = {cases[i].data, cases[i].data + cut1, cases[i].data + cut2,
                                cases[i].data + n};
        size_t lens[4] = {cut1, cut2 - cut1, n - cut2, 0};
        char hex[65];
        LL_CHECK(s && ll_session_sign(s, parts, lens, hex) == 0 && strcmp(hex, cases[i].hex) == 0);
        ll_session_destroy(&s);
    }
}

static void s_test_bad_input(void)
{
    ll_session_t *session = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 0);
    LL_CHECK(session);
    char why[256], header[256];
    s_header(header, sizeof header, "execute_request");
    const char *good[4] = {header, "{}", "{}", "{\"code\":\"1+1\"}"};

    /* Sanity: the well-formed message is accepted. */
    LL_CHECK(s_accepts(session, s_raw(session, good, NULL), why, sizeof why));

    /* No delimiter. */
    zmsg_t *raw = zmsg_new();
    zmsg_addstr(raw, "peer");
    zmsg_addstr(raw, "<IDS|MSG");
    for (int i = 0; i < 5; i++)
        zmsg_addstr(raw, "{}");
    LL_CHECK(!s_accepts(session, raw, why, sizeof why));
    LL_CHECK(s_contains(why, "delimiter"));
    raw = zmsg_new();
    LL_CHECK(!s_accepts(session, raw, why, sizeof why));

    /* Too few frames after the delimiter (0..4). */
    for (int keep = 0; keep < 5; keep++) {
        s_header(header, sizeof header, "execute_request");
        raw = s_raw(session, good, NULL);
        while (zmsg_size(raw) > (size_t) (2 + keep)) {
            zframe_t *last = zmsg_last(raw);
            zmsg_remove(raw, last);
            zframe_destroy(&last);
        }
        LL_CHECK(!s_accepts(session, raw, why, sizeof why));
        LL_CHECK(s_contains(why, "need at least 5"));
    }

    /* Signature: short, long, non-hex, empty with a key, wrong digest. */
    const char *bad_sigs[] = {
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeg",
        "0123456789abcdef0123456789abcdef 123456789abcdef0123456789abcdef",
        "",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    };
    const char *reasons[] = {"64 hex",  "64 hex",   "not hex",
                             "not hex", "unsigned", "does not match"};
    for (size_t i = 0; i < sizeof bad_sigs / sizeof bad_sigs[0]; i++) {
        s_header(header, sizeof header, "execute_request");
        LL_CHECK(!s_accepts(session, s_raw(session, good, bad_sigs[i]), why, sizeof why));
        LL_CHECK(s_contains(why, reasons[i]));
    }
    /* One flipped hex digit of a correct signature. */
    s_header(header, sizeof header, "execute_request");
    {
        const void *data[4] = {good[0], good[1], good[2], good[3]};
        size_t lens[4] = {strlen(good[0]), strlen(good[1]), strlen(good[2]), strlen(good[3])};
        char sig[65];
        ll_session_sign(session, data, lens, sig);
        char original = sig[10];
        sig[10] = original == '0' ? '1' : '0';
        LL_CHECK(!s_accepts(session, s_raw(session, good, sig), why, sizeof why));
        LL_CHECK(s_contains(why, "does not match"));
        /* A byte of the content altered after signing. */
        sig[10] = original;
        const char *altered[4] = {good[0], good[1], good[2], "{\"code\":\"1+2\"}"};
        LL_CHECK(!s_accepts(session, s_raw(session, altered, sig), why, sizeof why));
        LL_CHECK(s_contains(why, "does not match"));
        /* The untouched message still goes through once, then is a replay. */
        LL_CHECK(s_accepts(session, s_raw(session, good, sig), why, sizeof why));
        LL_CHECK(!s_accepts(session, s_raw(session, good, sig), why, sizeof why));
        LL_CHECK(s_contains(why, "replayed"));
    }

    /* Invalid JSON, and valid JSON that is not an object, in each part (correctly signed). */
    const char *not_json[] = {"{", "{\"a\":}", "", "\xff\xfe", "{\"a\":\"\\ud800\"}x"};
    const char *not_object[] = {"[]", "1", "\"text\"", "null"};
    const char *names[4] = {"header", "parent_header", "metadata", "content"};
    for (int part = 0; part < 4; part++) {
        for (size_t j = 0; j < sizeof not_json / sizeof not_json[0]; j++) {
            s_header(header, sizeof header, "execute_request");
            const char *parts[4] = {good[0], good[1], good[2], good[3]};
            parts[part] = not_json[j];
            LL_CHECK(!s_accepts(session, s_raw(session, parts, NULL), why, sizeof why));
            LL_CHECK(s_contains(why, names[part]));
        }
        for (size_t j = 0; j < sizeof not_object / sizeof not_object[0]; j++) {
            s_header(header, sizeof header, "execute_request");
            const char *parts[4] = {good[0], good[1], good[2], good[3]};
            parts[part] = not_object[j];
            LL_CHECK(!s_accepts(session, s_raw(session, parts, NULL), why, sizeof why));
            LL_CHECK(s_contains(why, names[part]));
        }
    }

    /* Header without msg_type / msg_id, or with the wrong types. */
    const char *bad_headers[] = {
        "{\"msg_id\":\"h1\",\"session\":\"s\"}",           "{\"msg_id\":\"h2\",\"msg_type\":7}",
        "{\"msg_id\":\"h3\",\"msg_type\":null}",           "{\"msg_type\":\"execute_request\"}",
        "{\"msg_type\":\"execute_request\",\"msg_id\":5}",
    };
    for (size_t j = 0; j < sizeof bad_headers / sizeof bad_headers[0]; j++) {
        const char *parts[4] = {bad_headers[j], "{}", "{}", "{}"};
        LL_CHECK(!s_accepts(session, s_raw(session, parts, NULL), why, sizeof why));
        LL_CHECK(s_contains(why, j < 3 ? "msg_type" : "msg_id"));
    }

    /* A header that names a key twice (readers would disagree on which
     * counts) or whose version does not read as one is dropped too; a
     * version in any good form, or none, is fine (ipykernel accepts all of those). */
    const char *bad_more[] = {
        "{\"msg_id\":\"d1\",\"msg_type\":\"kernel_info_request\",\"msg_type\":\"execute_request\"}",
        "{\"msg_id\":\"d2\",\"msg_id\":\"d3\",\"msg_type\":\"execute_request\"}",
        "{\"msg_id\":\"v1\",\"msg_type\":\"execute_request\",\"version\":\"x.y\"}",
        "{\"msg_id\":\"v2\",\"msg_type\":\"execute_request\",\"version\":5.3}",
        "{\"msg_id\":\"v3\",\"msg_type\":\"execute_request\",\"version\":\"\"}",
        "{\"msg_id\":\"v4\",\"msg_type\":\"execute_request\",\"version\":\"5.\"}",
        "{\"msg_id\":\"v5\",\"msg_type\":\"execute_request\",\"version\":\"5..3\"}",
        "{\"msg_id\":\"v6\",\"msg_type\":\"execute_request\",\"version\":\"99999999999.1\"}",
        "{\"msg_id\":\"v7\",\"msg_type\":\"execute_request\",\"version\":\"5.3\\u0000\"}",
    };
    for (size_t j = 0; j < sizeof bad_more / sizeof bad_more[0]; j++) {
        const char *parts[4] = {bad_more[j], "{}", "{}", "{}"};
        LL_CHECK(!s_accepts(session, s_raw(session, parts, NULL), why, sizeof why));
        LL_CHECK(s_contains(why, j < 2 ? "duplicate key" : "version"));
    }
    const char *good_versions[] = {
        "{\"msg_id\":\"g1\",\"msg_type\":\"execute_request\",\"version\":\"5.3\"}",
        "{\"msg_id\":\"g2\",\"msg_type\":\"execute_request\",\"version\":\"5\"}",
        "{\"msg_id\":\"g3\",\"msg_type\":\"execute_request\",\"version\":\"10.0.1\"}",
        "{\"msg_id\":\"g4\",\"msg_type\":\"execute_request\"}",
    };
    for (size_t j = 0; j < sizeof good_versions / sizeof good_versions[0]; j++) {
        const char *parts[4] = {good_versions[j], "{}", "{}", "{\"x\":1,\"x\":2}"};
        LL_CHECK(s_accepts(session, s_raw(session, parts, NULL), why, sizeof why));
    }

    /* NUL inside code (\u0000) is kept whole; a raw NUL byte is not JSON. */
    s_header(header, sizeof header, "execute_request");
    const char *nul_parts[4] = {header, "{}", "{}", "{\"code\":\"a\\u0000b\\u0000\"}"};
    raw = s_raw(session, nul_parts, NULL);
    ll_msg_t *msg = ll_session_decode(session, &raw, why, sizeof why);
    LL_CHECK(msg);
    if (msg) {
        json_t *code = json_object_get(msg->content, "code");
        LL_CHECK(json_string_length(code) == 4 &&
                 memcmp(json_string_value(code), "a\0b\0", 4) == 0);
        ll_msg_destroy(&msg);
    }
    {
        s_header(header, sizeof header, "execute_request");
        static const char content[] = "{\"code\":\"a\0b\"}";
        const void *data[4] = {header, "{}", "{}", content};
        size_t lens[4] = {strlen(header), 2, 2, sizeof content - 1};
        char sig[65];
        ll_session_sign(session, data, lens, sig);
        raw = zmsg_new();
        zmsg_addstr(raw, "<IDS|MSG>");
        zmsg_addstr(raw, sig);
        for (int i = 0; i < 4; i++)
            zmsg_addmem(raw, data[i], lens[i]);
        LL_CHECK(!s_accepts(session, raw, why, sizeof why));
        LL_CHECK(s_contains(why, "content"));
    }

    /* Bad arguments never crash. */
    LL_CHECK(ll_session_decode(session, NULL, why, sizeof why) == NULL);
    raw = NULL;
    LL_CHECK(ll_session_decode(session, &raw, why, sizeof why) == NULL);
    raw = s_raw(session, good, NULL);
    LL_CHECK(ll_session_decode(NULL, &raw, why, sizeof why) == NULL && raw == NULL);
    int saved_level = ll_log_level;
    ll_log_level = -1; /* the two refusals below log an expected error */
    LL_CHECK(ll_session_new(s_key, S_KEY_LEN, "hmac-md5", 0) == NULL);
    LL_CHECK(ll_session_new(s_key, S_KEY_LEN, NULL, 0) == NULL);
    ll_log_level = saved_level;
    ll_session_destroy(&session);
    ll_session_destroy(&session); /* twice is safe */
    LL_CHECK(session == NULL);
}

static void s_test_unsigned(void)
{
    /* An empty key means unsigned mode: any scheme, empty signatures. */
    ll_session_t *session = ll_session_new(NULL, 0, "whatever", 0);
    LL_CHECK(session);
    LL_CHECK(!ll_session_is_signed(session));
    char why[256], header[256];
    s_header(header, sizeof header, "kernel_info_request");
    const char *parts[4] = {header, "{}", "{}", "{}"};
    LL_CHECK(s_accepts(session, s_raw(NULL, parts, NULL), why, sizeof why));
    /* No history without signatures: the same frames again are fine. */
    LL_CHECK(s_accepts(session, s_raw(NULL, parts, NULL), why, sizeof why));
    /* Like jupyter_client, an unsigned session ignores a signature frame. */
    LL_CHECK(s_accepts(session, s_raw(NULL, parts, "junk"), why, sizeof why));
    /* But JSON is still checked. */
    const char *bad[4] = {header, "{}", "[", "{}"};
    LL_CHECK(!s_accepts(session, s_raw(NULL, bad, NULL), why, sizeof why));

    /* Encode leaves the signature frame empty. */
    ll_msg_t *msg =
        ll_msg_new(session, "status", NULL, json_pack("{s:s}", "execution_state", "idle"));
    zmsg_t *frames = ll_session_encode(session, msg);
    LL_CHECK(frames && zmsg_size(frames) == 6);
    if (frames) {
        zframe_t *f = zmsg_first(frames);
        LL_CHECK(zframe_streq(f, "<IDS|MSG>"));
        f = zmsg_next(frames);
        LL_CHECK(zframe_size(f) == 0);
    }
    /* A keyed session refuses the unsigned message. */
    ll_session_t *keyed = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 0);
    LL_CHECK(!s_accepts(keyed, frames, why, sizeof why));
    LL_CHECK(s_contains(why, "unsigned"));
    ll_msg_destroy(&msg);
    ll_session_destroy(&keyed);
    ll_session_destroy(&session);
}

static bool s_is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static bool s_is_uuid(const char *s)
{
    if (strlen(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' ||
        s[14] != '4')
        return false;
    if (!strchr("89ab", s[19])) /* RFC 4122 variant */
        return false;
    return s_is_hex(s, 8) && s_is_hex(s + 9, 4) && s_is_hex(s + 14, 4) && s_is_hex(s + 19, 4) &&
           s_is_hex(s + 24, 12);
}

static int s_cmp_ids(const void *a, const void *b)
{
    return memcmp(a, b, 37);
}

static void s_test_encode(void)
{
    ll_session_t *client = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 0);
    ll_session_t *kernel = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 0);
    LL_CHECK(client && kernel);
    LL_CHECK(s_is_uuid(ll_session_id(kernel)));
    LL_CHECK(strcmp(ll_session_id(client), ll_session_id(kernel)) != 0);

    /* A request from the "client" with identities, decoded by the kernel. */
    ll_msg_t *req =
        ll_msg_new(client, "execute_request", NULL,
                   json_pack("{s:s%,s:b}", "code", "x = 'h\xc3\xa9'\0!", (size_t) 12, "silent", 0));
    LL_CHECK(req);
    zmsg_addstr(req->identities, "frontend-7");
    zmsg_addmem(req->buffers, "\0\1\2", 3);
    zmsg_t *wire = ll_session_encode(client, req);
    LL_CHECK(wire && zmsg_size(wire) == 1 + 1 + 5 + 1);
    if (wire) {
        /* Content is compact UTF-8, not \u escapes; the NUL is escaped. */
        zframe_t *f = zmsg_first(wire);
        for (int i = 0; i < 6; i++)
            f = zmsg_next(wire);
        char *text = zframe_strdup(f);
        LL_CHECK(strstr(text, "h\xc3\xa9") != NULL);
        LL_CHECK(strstr(text, "\\u0000!") != NULL);
        LL_CHECK(strstr(text, ": ") == NULL);
        free(text);
    }
    char why[256];
    ll_msg_t *got = ll_session_decode(kernel, &wire, why, sizeof why);
    LL_CHECK(got);
    if (got) {
        LL_CHECK(strcmp(got->msg_type, "execute_request") == 0);
        LL_CHECK(json_equal(got->header, req->header));
        LL_CHECK(json_equal(got->content, req->content));
        LL_CHECK(zmsg_size(got->identities) == 1 &&
                 zframe_streq(zmsg_first(got->identities), "frontend-7"));
        LL_CHECK(zmsg_size(got->buffers) == 1 && zframe_size(zmsg_first(got->buffers)) == 3);
        const char *code = ll_msg_content_str(got, "code");
        LL_CHECK(code && memcmp(code, "x = 'h\xc3\xa9'\0!", 12) == 0);
        LL_CHECK(ll_msg_content_str(got, "silent") == NULL);
        LL_CHECK(ll_msg_content_str(got, "absent") == NULL);

        /* The kernel's reply: routed back, parent header = request header. */
        ll_msg_t *reply = ll_msg_new(kernel, "execute_reply", got, NULL);
        LL_CHECK(reply);
        LL_CHECK(json_equal(reply->parent_header, got->header));
        LL_CHECK(zmsg_size(reply->identities) == 1);
        LL_CHECK(json_is_object(reply->content) && json_object_size(reply->content) == 0);
        const char *rid = json_string_value(json_object_get(reply->header, "msg_id"));
        LL_CHECK(rid && s_is_uuid(rid));
        const char *date = json_string_value(json_object_get(reply->header, "date"));
        /* 2026-11-30T07:09:57.123456Z */
        LL_CHECK(date && strlen(date) == 27 && date[4] == '-' && date[10] == 'T' &&
                 date[19] == '.' && date[26] == 'Z');
        const char *version = json_string_value(json_object_get(reply->header, "version"));
        LL_CHECK(version && strcmp(version, LL_PROTOCOL_VERSION) == 0);
        LL_CHECK(strcmp(json_string_value(json_object_get(reply->header, "session")),
                        ll_session_id(kernel)) == 0);
        LL_CHECK(json_is_string(json_object_get(reply->header, "username")));
        zmsg_t *back = ll_session_encode(kernel, reply);
        ll_msg_t *seen = ll_session_decode(client, &back, why, sizeof why);
        LL_CHECK(seen && strcmp(seen->msg_type, "execute_reply") == 0);
        if (seen)
            LL_CHECK(json_equal(seen->parent_header, req->header));
        ll_msg_destroy(&seen);
        ll_msg_destroy(&reply);
        ll_msg_destroy(&got);
    }
    ll_msg_destroy(&req);
    LL_CHECK(req == NULL);

    /* Encode refuses a header-less message; send refuses a NULL socket. */
    ll_msg_t blank = {0};
    LL_CHECK(ll_session_encode(kernel, &blank) == NULL);
    LL_CHECK(ll_session_encode(kernel, NULL) == NULL);
    ll_msg_t *orphan = ll_msg_new(kernel, "status", NULL, NULL);
    LL_CHECK(ll_session_send(kernel, NULL, &orphan) == -1 && orphan == NULL);

    /* Ids: uuid4-shaped and unique. */
    enum { N = 100000 };
    char(*ids)[37] = malloc(sizeof(char[37]) * N);
    for (int i = 0; i < N; i++)
        ll_wire_new_id(ids[i]);
    bool shaped = true;
    for (int i = 0; i < N; i++)
        shaped = shaped && s_is_uuid(ids[i]);
    LL_CHECK(shaped);
    qsort(ids, N, 37, s_cmp_ids);
    int dups = 0;
    for (int i = 1; i < N; i++)
        dups += memcmp(ids[i - 1], ids[i], 37) == 0;
    LL_CHECK(dups == 0);
    free(ids);

    ll_session_destroy(&client);
    ll_session_destroy(&kernel);
}

/* A signed wire message with a unique header, from SIGNER. */
static zmsg_t *s_unique(ll_session_t *signer, int n)
{
    char header[128];
    snprintf(header, sizeof header, "{\"msg_id\":\"m%d\",\"msg_type\":\"t\"}", n);
    const char *parts[4] = {header, "{}", "{}", "{}"};
    return s_raw(signer, parts, NULL);
}

static void s_test_history(void)
{
    char why[256];
    /* Capacity 4: the fifth message evicts the first. */
    ll_session_t *s = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 4);
    for (int i = 0; i < 5; i++)
        LL_CHECK(s_accepts(s, s_unique(s, i), why, sizeof why));
    LL_CHECK(s_accepts(s, s_unique(s, 0), why, sizeof why));  /* forgotten: accepted */
    LL_CHECK(!s_accepts(s, s_unique(s, 4), why, sizeof why)); /* still remembered */
    LL_CHECK(!s_accepts(s, s_unique(s, 0), why, sizeof why)); /* just re-added */
    ll_session_destroy(&s);

    /* Many evictions through the hash set: exactly the last CAP are remembered. */
    enum { CAP = 61, TOTAL = 3000 };
    s = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", CAP);
    for (int i = 0; i < TOTAL; i++)
        LL_CHECK(s_accepts(s, s_unique(s, 1000000 + i), why, sizeof why));
    int remembered = 0;
    for (int i = TOTAL - CAP; i < TOTAL; i++)
        remembered += !s_accepts(s, s_unique(s, 1000000 + i), why, sizeof why);
    LL_CHECK(remembered == CAP);
    ll_session_destroy(&s);
}

typedef struct {
    ll_session_t *session;
    zmsg_t **messages;
    int count;
    int accepted;
} s_thread_arg_t;

/* Decodes its own copies: a zmsg_t is not thread-safe even to read (zmsg_dup
 * walks the frame list with the message's shared cursor), so the copies are
 * made before the threads start. */
static void *s_decoder_thread(void *p)
{
    s_thread_arg_t *arg = p;
    char why[256];
    for (int i = 0; i < arg->count; i++) {
        arg->accepted += s_accepts(arg->session, arg->messages[i], why, sizeof why);
        arg->messages[i] = NULL; /* consumed by the decode */
    }
    return NULL;
}

static void s_test_threads(void)
{
    /* Four threads decode the same 2000 messages: each is accepted exactly once. */
    enum { THREADS = 4, COUNT = 2000 };
    ll_session_t *s = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 0);
    zmsg_t **messages = calloc(COUNT, sizeof *messages);
    for (int i = 0; i < COUNT; i++)
        messages[i] = s_unique(s, 2000000 + i);
    pthread_t tids[THREADS];
    s_thread_arg_t args[THREADS];
    zmsg_t **copies[THREADS];
    for (int t = 0; t < THREADS; t++) {
        copies[t] = calloc(COUNT, sizeof *copies[t]);
        for (int i = 0; i < COUNT; i++)
            copies[t][i] = zmsg_dup(messages[i]);
    }
    for (int t = 0; t < THREADS; t++) {
        args[t] = (s_thread_arg_t){s, copies[t], COUNT, 0};
        pthread_create(&tids[t], NULL, s_decoder_thread, &args[t]);
    }
    int total = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(tids[t], NULL);
        total += args[t].accepted;
        free(copies[t]);
    }
    LL_CHECK(total == COUNT);
    for (int i = 0; i < COUNT; i++)
        zmsg_destroy(&messages[i]);
    free(messages);
    ll_session_destroy(&s);
}

static void s_test_wait(void)
{
    /* ll_wire_wait: 1 for a message, 0 for the stop fd (which wins when both
     * are ready), and the stop fd is left unread. */
    zsock_t *rx = zsock_new_pair("@inproc://ll-wire-test-wait");
    zsock_t *tx = zsock_new_pair(">inproc://ll-wire-test-wait");
    int efd = eventfd(0, EFD_NONBLOCK);
    LL_CHECK(rx && tx && efd >= 0);
    if (!rx || !tx || efd < 0)
        goto out;
    uint64_t one = 1, got = 0;
    zstr_send(tx, "ping");
    LL_CHECK(ll_wire_wait(rx, efd) == 1);
    char *text = zstr_recv(rx);
    LL_CHECK(text && strcmp(text, "ping") == 0);
    zstr_free(&text);
    LL_CHECK(write(efd, &one, sizeof one) == (ssize_t) sizeof one);
    LL_CHECK(ll_wire_wait(rx, efd) == 0);
    zstr_send(tx, "pong");
    LL_CHECK(ll_wire_wait(rx, efd) == 0);
    LL_CHECK(read(efd, &got, sizeof got) == (ssize_t) sizeof got && got == 1);
    LL_CHECK(ll_wire_wait(rx, efd) == 1);
out:
    if (efd >= 0)
        close(efd);
    zsock_destroy(&tx);
    zsock_destroy(&rx);
}

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t s_rng = 0x9e3779b97f4a7c15ULL;
static uint64_t s_rand(void)
{
    s_rng ^= s_rng >> 12;
    s_rng ^= s_rng << 25;
    s_rng ^= s_rng >> 27;
    return s_rng * 2685821657736338717ULL;
}

/* One random structural or byte-level change to M. */
static void s_mutate(zmsg_t *m)
{
    size_t n = zmsg_size(m);
    if (n == 0) {
        zmsg_addmem(m, "<IDS|MSG>", 9);
        return;
    }
    size_t target = s_rand() % n;
    zframe_t *f = zmsg_first(m);
    for (size_t i = 0; i < target; i++)
        f = zmsg_next(m);
    size_t size = zframe_size(f);
    unsigned char *data = zframe_data(f);
    switch (s_rand() % 7) {
    case 0: /* flip a byte */
        if (size)
            data[s_rand() % size] ^= (unsigned char) (1 + s_rand() % 255);
        break;
    case 1: { /* truncate */
        unsigned char keep[64 * 1024];
        size_t k = size ? s_rand() % size : 0;
        if (k > sizeof keep)
            k = sizeof keep;
        memcpy(keep, data, k);
        zframe_reset(f, keep, k);
        break;
    }
    case 2: /* drop the frame */
        zmsg_remove(m, f);
        zframe_destroy(&f);
        break;
    case 3: { /* duplicate it at the end */
        zframe_t *copy = zframe_dup(f);
        zmsg_append(m, &copy);
        break;
    }
    case 4: { /* random junk frame in front */
        unsigned char junk[32];
        size_t k = s_rand() % sizeof junk;
        for (size_t i = 0; i < k; i++)
            junk[i] = (unsigned char) s_rand();
        zmsg_pushmem(m, junk, k);
        break;
    }
    case 5: /* JSON-ish damage: a structural character */
        if (size) {
            static const char chars[] = "{}[]\",:\\0\x80\xc3";
            data[s_rand() % size] = (unsigned char) chars[s_rand() % (sizeof chars - 1)];
        }
        break;
    default: /* an extra delimiter */ zmsg_pushmem(m, "<IDS|MSG>", 9); break;
    }
}

/* Recompute the signature of M's four parts, when it still has that shape,
 * so mutated JSON gets past the HMAC and into the parser. */
static void s_resign(ll_session_t *signer, zmsg_t *m)
{
    zframe_t *f = zmsg_first(m);
    while (f && !(zframe_size(f) == 9 && memcmp(zframe_data(f), "<IDS|MSG>", 9) == 0))
        f = zmsg_next(m);
    if (!f)
        return;
    zframe_t *sig = zmsg_next(m);
    const void *data[4];
    size_t lens[4];
    for (int i = 0; i < 4; i++) {
        zframe_t *p = zmsg_next(m);
        if (!p || !sig)
            return;
        data[i] = zframe_data(p);
        lens[i] = zframe_size(p);
    }
    char hex[65];
    if (ll_session_sign(signer, data, lens, hex) == 0)
        zframe_reset(sig, hex, 64);
}

static void s_test_fuzz(bool verbose)
{
    ll_session_t *keyed = ll_session_new(s_key, S_KEY_LEN, "hmac-sha256", 1024);
    ll_session_t *open = ll_session_new(NULL, 0, "", 0);
    int accepted = 0;
    char why[256];
    for (int iter = 0; iter < 20000; iter++) {
        zmsg_t *m;
        if (iter % 2 == 0) {
            const ll_wire_vector_t *v = &s_wire_vectors[s_rand() % LL_WIRE_VECTOR_COUNT];
            m = s_from_vector(v);
            /* Vectors carry their own keys: use them via the open session
             * or re-sign with ours. */
        } else {
            char header[256];
            snprintf(header, sizeof header,
                     "{\"msg_id\":\"f%d\",\"msg_type\":\"execute_request\",\"version\":\"5.3\"}",
                     iter);
            const char *parts[4] = {header, "{\"msg_id\":\"p\",\"x\":[1,2,{\"y\":null}]}", "{}",
                                    "{\"code\":\"print(1)\\n\\u0000\",\"silent\":false}"};
            m = s_raw(keyed, parts, NULL);
        }
        int rounds = 1 + (int) (s_rand() % 4);
        for (int r = 0; r < rounds; r++)
            s_mutate(m);
        bool resign = s_rand() % 2;
        if (resign)
            s_resign(keyed, m);
        ll_session_t *target = s_rand() % 2 ? keyed : open;
        ll_msg_t *msg = ll_session_decode(target, &m, why, sizeof why);
        LL_CHECK(m == NULL);
        if (msg) {
            accepted++;
            LL_CHECK(msg->msg_type && json_is_object(msg->header) && json_is_object(msg->content) &&
                     json_is_object(msg->metadata) && json_is_object(msg->parent_header));
            /* Whatever was accepted must re-encode. */
            zmsg_t *again = ll_session_encode(keyed, msg);
            LL_CHECK(again != NULL);
            zmsg_destroy(&again);
            ll_msg_destroy(&msg);
        } else {
            LL_CHECK(why[0] != '\0');
        }
    }
    if (verbose)
        printf("\n    fuzz: %d of 20000 mutated messages accepted", accepted);
    ll_session_destroy(&keyed);
    ll_session_destroy(&open);
}

int ll_wire_selftest(bool verbose)
{
    s_failures = 0;
    s_test_rfc4231();
    s_test_vectors(verbose);
    s_test_bad_input();
    s_test_unsigned();
    s_test_encode();
    s_test_history();
    s_test_threads();
    s_test_wait();
    s_test_fuzz(verbose);
    if (s_failures)
        fprintf(stderr, "\n");
    return s_failures ? -1 : 0;
}
