/* Fuzz target (libFuzzer, under ASan/UBSan): the HMAC check.  The input is
 * a key and four parts; each is signed with ll_session_sign and checked
 * against OpenSSL's HMAC (they must agree), then decoded: a correct
 * signature must pass the check (the message is then refused only for its
 * JSON, never for its signature), the same message again is a replay, and
 * one changed hex digit is refused for its signature. */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ll_log.h"
#include "proto/ll_wire.h"

/* Cut DATA into N pieces at 0xFF bytes (the last piece takes the rest). */
static size_t s_cut(const uint8_t *data, size_t size, const uint8_t **piece, size_t *len, size_t n)
{
    size_t got = 0, start = 0;
    for (size_t i = 0; i <= size && got < n; i++) {
        if (i == size || (data[i] == 0xFF && got < n - 1)) {
            piece[got] = data + start;
            len[got++] = i - start;
            start = i + 1;
        }
    }
    return got;
}

static zmsg_t *s_frames(const char *sig, const uint8_t *const parts[4], const size_t lens[4])
{
    zmsg_t *m = zmsg_new();
    zmsg_addstr(m, "<IDS|MSG>");
    zmsg_addmem(m, sig, strlen(sig));
    for (int i = 0; i < 4; i++)
        zmsg_addmem(m, parts[i], lens[i]);
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ll_log_level = -1;
    const uint8_t *piece[5];
    size_t len[5];
    if (s_cut(data, size, piece, len, 5) != 5 || len[0] == 0)
        return 0;
    ll_session_t *s = ll_session_new(piece[0], len[0], "hmac-sha256", 16);
    if (!s)
        __builtin_trap();
    const void *parts[4] = {piece[1], piece[2], piece[3], piece[4]};
    const size_t lens[4] = {len[1], len[2], len[3], len[4]};
    char hex[65];
    if (ll_session_sign(s, parts, lens, hex) != 0)
        __builtin_trap();
    /* The same digest as OpenSSL's one-shot HMAC over the concatenated parts. */
    size_t total = lens[0] + lens[1] + lens[2] + lens[3];
    unsigned char *cat = malloc(total ? total : 1), md[32];
    unsigned int mdlen = 0;
    for (size_t i = 0, off = 0; i < 4; off += lens[i], i++)
        if (lens[i])
            memcpy(cat + off, parts[i], lens[i]);
    HMAC(EVP_sha256(), piece[0], (int) len[0], cat, total, md, &mdlen);
    free(cat);
    char want[65];
    for (unsigned i = 0; i < 32; i++)
        snprintf(want + 2 * i, 3, "%02x", md[i]);
    if (mdlen != 32 || strcmp(hex, want) != 0)
        __builtin_trap();
    char why[256];
    const uint8_t *const *p = (const uint8_t *const *) parts;
    zmsg_t *raw = s_frames(hex, p, lens);
    ll_msg_t *msg = ll_session_decode(s, &raw, why, sizeof why);
    if (!msg && (strstr(why, "signature") || strstr(why, "replay")))
        __builtin_trap(); /* a correct signature was refused */
    ll_msg_destroy(&msg);
    raw = s_frames(hex, p, lens);
    msg = ll_session_decode(s, &raw, why, sizeof why);
    if (msg || !strstr(why, "replayed"))
        __builtin_trap(); /* the same message twice */
    /* One hex digit changed: refused for its signature. */
    char bad[65];
    memcpy(bad, hex, sizeof bad);
    size_t at = len[1] % 64;
    bad[at] = bad[at] == '0' ? '1' : '0';
    raw = s_frames(bad, p, lens);
    msg = ll_session_decode(s, &raw, why, sizeof why);
    if (msg || !strstr(why, "signature does not match"))
        __builtin_trap();
    ll_session_destroy(&s);
    return 0;
}
