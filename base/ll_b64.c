/* ll_b64: see ll_b64.h.  A table-driven codec of its own: OpenSSL's
 * EVP_DecodeBlock accepts whitespace and counts padding as data, and the
 * worker, which must encode, links no OpenSSL. */
#include "base/ll_b64.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char s_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t ll_b64_encoded_len(size_t len)
{
    return (len + 2) / 3 * 4;
}

char *ll_b64_encode(const void *data, size_t len)
{
    const unsigned char *p = data;
    if (len > (SIZE_MAX - 1) / 4 * 3 - 2)
        return NULL;
    char *out = malloc(ll_b64_encoded_len(len) + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t) p[i] << 16 | (i + 1 < len ? (uint32_t) p[i + 1] << 8 : 0) |
                     (i + 2 < len ? p[i + 2] : 0);
        out[o++] = s_alphabet[(v >> 18) & 63];
        out[o++] = s_alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < len ? s_alphabet[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? s_alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

/* The 6-bit value of C, or -1 when C is not in the alphabet. */
static int s_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

unsigned char *ll_b64_decode(const char *text, size_t len, size_t *out_len)
{
    *out_len = 0;
    if (len % 4 != 0)
        return NULL;
    size_t pad = 0;
    while (pad < 2 && pad < len && text[len - 1 - pad] == '=')
        pad++;
    unsigned char *out = malloc(len / 4 * 3 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        uint32_t v = 0;
        for (size_t k = 0; k < 4; k++) {
            size_t at = i + k;
            int d = at >= len - pad ? 0 : s_value((unsigned char) text[at]);
            if (d < 0) {
                free(out);
                return NULL;
            }
            v = v << 6 | (uint32_t) d;
        }
        out[o++] = (unsigned char) (v >> 16);
        out[o++] = (unsigned char) (v >> 8);
        out[o++] = (unsigned char) v;
    }
    *out_len = o - pad;
    return out;
}

/* ---- self-test ----------------------------------------------------------- */

int ll_b64_selftest(bool verbose)
{
    static const struct {
        const char *raw;
        size_t len;
        const char *text;
    } cases[] = {{"", 0, ""},         {"f", 1, "Zg=="},          {"fo", 2, "Zm8="},
                 {"foo", 3, "Zm9v"},  {"foobar", 6, "Zm9vYmFy"}, {"\0\1\2", 3, "AAEC"},
                 {"\xff", 1, "/w=="}, {"\xfb\xff", 2, "+/8="}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *enc = ll_b64_encode(cases[i].raw, cases[i].len);
        size_t n;
        unsigned char *dec = ll_b64_decode(cases[i].text, strlen(cases[i].text), &n);
        bool ok = enc && strcmp(enc, cases[i].text) == 0 && dec && n == cases[i].len &&
                  memcmp(dec, cases[i].raw, n) == 0;
        free(enc);
        free(dec);
        if (!ok)
            return -1;
    }
    /* Wrong length, foreign characters, padding in the middle or too long. */
    static const char *const bad[] = {"abc", "a===", "ab!d", "Zg==Zg==", "Z===", "Zm 9", "Zm9v\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n;
        unsigned char *dec = ll_b64_decode(bad[i], strlen(bad[i]), &n);
        free(dec);
        if (dec)
            return -1;
    }
    /* Every byte value round-trips. */
    unsigned char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char) i;
    char *enc = ll_b64_encode(all, sizeof all);
    size_t n;
    unsigned char *dec = enc ? ll_b64_decode(enc, strlen(enc), &n) : NULL;
    bool ok = dec && n == sizeof all && memcmp(dec, all, n) == 0 &&
              strlen(enc) == ll_b64_encoded_len(256);
    free(enc);
    free(dec);
    if (verbose)
        printf("(round trips, strict decoding) ");
    return ok ? 0 : -1;
}
