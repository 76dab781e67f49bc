/* ll_wire: Jupyter messages on the wire: signing, verification, replay
 * protection, JSON encode/decode (called from every thread of the kernel
 * process that owns a socket: shell loop, control, iopub, stdin).
 *
 * Verification order (ll_session_decode) is the security property of this
 * file: delimiter, frame count, signature length and alphabet, constant-time
 * HMAC over the frames exactly as received, replay history, and only then
 * JSON.  With a key, nothing from the wire reaches the JSON parser (ll_json)
 * before its HMAC checked out, so an unauthenticated peer can only make us
 * hash bytes.  Encoding uses ll_json's writer, not json_dumps (see ll_json.h
 * for why both are ours).
 *
 * Signing uses one HMAC context keyed at session creation and duplicated per
 * message, so the key schedule is paid once (MEASURED.md: 1.1 us per KiB).
 * The replay history is a FIFO ring of the last N verified digests plus an
 * open-addressing hash set over it, guarded by one mutex held for a lookup
 * and an insert (no allocation under the lock).  Unlike jupyter_client we
 * add a digest only after the HMAC matched, so forged messages cannot fill
 * the history, and we compare digests as bytes, so re-casing the hex of a
 * captured signature does not make a replay look new.
 *
 * Message ids: 60 random bits per process (re-drawn in a forked child) and
 * a bijective 62-bit mix of an atomic counter, so ids are unique without a
 * syscall per message. */
#include "proto/ll_wire.h"

#include "proto/ll_json.h"
#include "base/ll_log.h"

#include <errno.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define LL_WIRE_DELIM           "<IDS|MSG>"
#define LL_WIRE_DELIM_LEN       9
#define LL_WIRE_DIGEST_LEN      32
#define LL_WIRE_SIG_HEX_LEN     64
#define LL_WIRE_DEFAULT_HISTORY 65536 /* jupyter_client's digest_history_size */
#define LL_WIRE_MAX_HISTORY     (1u << 24)
#define LL_WIRE_EMPTY_SLOT      UINT32_MAX

struct ll_session_t {
    bool is_signed;     /* key non-empty: sign and verify */
    EVP_MAC *mac;       /* HMAC implementation (fetched once) */
    EVP_MAC_CTX *keyed; /* initialised with the key; duplicated per message */
    char id[40];        /* this session's uuid, in every header we write */
    char username[64];  /* $USER or "username", like jupyter_client */

    pthread_mutex_t history_lock; /* guards every history_* field */
    uint32_t history_cap;         /* ring capacity (max digests remembered) */
    uint32_t history_len;         /* digests in the ring */
    uint32_t history_head;        /* ring index of the oldest digest */
    unsigned char (*history_ring)[LL_WIRE_DIGEST_LEN];
    uint32_t *history_table; /* hash set: ring indices, LL_WIRE_EMPTY_SLOT when free */
    uint32_t history_mask;   /* table size - 1 (a power of two, >= 2 * cap) */
};

/* ---- ids and dates ------------------------------------------------------ */

static pthread_once_t s_ids_once = PTHREAD_ONCE_INIT;
static uint64_t s_ids_prefix; /* random per process */
static uint64_t s_ids_salt;   /* random per process */
static atomic_uint_fast64_t s_ids_counter;

static void s_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n <= 0) {
            /* getrandom cannot fail on Linux >= 3.17 once seeded; if it
             * does, fall back to something unique per process and time. */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t x = ((uint64_t) getpid() << 32) ^ (uint64_t) ts.tv_nsec ^ (uint64_t) ts.tv_sec;
            memcpy(p, &x, len < sizeof x ? len : sizeof x);
            n = (ssize_t) (len < sizeof x ? len : sizeof x);
        }
        p += n;
        len -= (size_t) n;
    }
}

static void s_ids_seed(void)
{
    s_random_bytes(&s_ids_prefix, sizeof s_ids_prefix);
    s_random_bytes(&s_ids_salt, sizeof s_ids_salt);
}

/* A forked child must not repeat its parent's ids. */
static void s_ids_after_fork(void)
{
    s_ids_seed();
}

static void s_ids_init(void)
{
    s_ids_seed();
    pthread_atfork(NULL, NULL, s_ids_after_fork);
}

/* A bijection on 62-bit values (xor-shifts and odd multipliers modulo
 * 2^62, after splitmix64), so distinct counters give distinct ids while the
 * other two bits carry the uuid variant. */
#define LL_WIRE_MASK62 ((1ULL << 62) - 1)
static uint64_t s_mix62(uint64_t x)
{
    x &= LL_WIRE_MASK62;
    x ^= x >> 30;
    x = (x * 0xbf58476d1ce4e5b9ULL) & LL_WIRE_MASK62;
    x ^= x >> 27;
    x = (x * 0x94d049bb133111ebULL) & LL_WIRE_MASK62;
    x ^= x >> 31;
    return x;
}

static const char s_hex_digits[] = "0123456789abcdef";

static void s_hex(const unsigned char *in, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = s_hex_digits[in[i] >> 4];
        out[2 * i + 1] = s_hex_digits[in[i] & 15];
    }
}

/* 16 bytes as 8-4-4-4-12 hex with the uuid4 version nibble and the RFC 4122
 * variant bits (Python's uuid.UUID(...).version is None without them). */
static void s_format_uuid(unsigned char b[16], char out[37])
{
    b[6] = (unsigned char) ((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char) ((b[8] & 0x3f) | 0x80);
    char hex[32];
    s_hex(b, 16, hex);
    memcpy(out, hex, 8);
    out[8] = '-';
    memcpy(out + 9, hex + 8, 4);
    out[13] = '-';
    memcpy(out + 14, hex + 12, 4);
    out[18] = '-';
    memcpy(out + 19, hex + 16, 4);
    out[23] = '-';
    memcpy(out + 24, hex + 20, 12);
    out[36] = '\0';
}

void ll_wire_new_id(char out[37])
{
    pthread_once(&s_ids_once, s_ids_init);
    uint64_t n = atomic_fetch_add_explicit(&s_ids_counter, 1, memory_order_relaxed);
    uint64_t lo = s_mix62(n + s_ids_salt) | (2ULL << 62);
    unsigned char b[16];
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char) (s_ids_prefix >> (56 - 8 * i));
        b[8 + i] = (unsigned char) (lo >> (56 - 8 * i));
    }
    s_format_uuid(b, out);
}

/* WIDTH decimal digits of V (zero-padded) at OUT. */
static char *s_digits(char *out, unsigned v, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        out[i] = (char) ('0' + v % 10);
        v /= 10;
    }
    return out + width;
}

void ll_wire_now(char out[32])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char *p = out;
    p = s_digits(p, (unsigned) (tm.tm_year + 1900) % 10000, 4);
    *p++ = '-';
    p = s_digits(p, (unsigned) tm.tm_mon + 1, 2);
    *p++ = '-';
    p = s_digits(p, (unsigned) tm.tm_mday, 2);
    *p++ = 'T';
    p = s_digits(p, (unsigned) tm.tm_hour, 2);
    *p++ = ':';
    p = s_digits(p, (unsigned) tm.tm_min, 2);
    *p++ = ':';
    p = s_digits(p, (unsigned) tm.tm_sec, 2);
    *p++ = '.';
    p = s_digits(p, (unsigned) (ts.tv_nsec / 1000), 6);
    *p++ = 'Z';
    *p = '\0';
}

/* ---- session ------------------------------------------------------------ */

static void s_fail(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void s_fail(char *why, size_t whylen, const char *fmt, ...)
{
    if (!why || whylen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
}

ll_session_t *ll_session_new(const unsigned char *key, size_t key_len, const char *scheme,
                             size_t replay_history)
{
    if (!key)
        key_len = 0;
    if (key_len > 0 && (!scheme || strcmp(scheme, "hmac-sha256") != 0)) {
        ll_error("wire", "signature scheme \"%s\" is not supported (only hmac-sha256)",
                 scheme ? scheme : "(null)");
        return NULL;
    }
    ll_session_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    if (pthread_mutex_init(&self->history_lock, NULL) != 0) {
        free(self);
        return NULL;
    }
    self->is_signed = key_len > 0;

    unsigned char raw_id[16];
    s_random_bytes(raw_id, sizeof raw_id);
    s_format_uuid(raw_id, self->id);
    const char *user = getenv("USER");
    snprintf(self->username, sizeof self->username, "%s", user && *user ? user : "username");

    if (self->is_signed) {
        self->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        if (!self->mac)
            goto out_fail;
        self->keyed = EVP_MAC_CTX_new(self->mac);
        if (!self->keyed)
            goto out_fail;
        OSSL_PARAM params[] = {
            OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *) "SHA256", 0),
            OSSL_PARAM_construct_end(),
        };
        if (!EVP_MAC_init(self->keyed, key, key_len, params))
            goto out_fail;

        if (replay_history == 0)
            replay_history = LL_WIRE_DEFAULT_HISTORY;
        if (replay_history > LL_WIRE_MAX_HISTORY)
            replay_history = LL_WIRE_MAX_HISTORY;
        self->history_cap = (uint32_t) replay_history;
        uint32_t table_size = 16;
        while (table_size < 2 * self->history_cap)
            table_size *= 2;
        self->history_mask = table_size - 1;
        self->history_ring = calloc(self->history_cap, sizeof *self->history_ring);
        self->history_table = malloc((size_t) table_size * sizeof *self->history_table);
        if (!self->history_ring || !self->history_table)
            goto out_fail;
        memset(self->history_table, 0xff, (size_t) table_size * sizeof *self->history_table);
    }
    return self;

out_fail:
    ll_error("wire", "cannot set up HMAC-SHA256 signing");
    ll_session_destroy(&self);
    return NULL;
}

void ll_session_destroy(ll_session_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_session_t *self = *self_p;
    EVP_MAC_CTX_free(self->keyed); /* OpenSSL cleanses the key schedule */
    EVP_MAC_free(self->mac);
    free(self->history_ring);
    free(self->history_table);
    pthread_mutex_destroy(&self->history_lock);
    free(self);
    *self_p = NULL;
}

const char *ll_session_id(const ll_session_t *self)
{
    return self ? self->id : NULL;
}

bool ll_session_is_signed(const ll_session_t *self)
{
    return self && self->is_signed;
}

static int s_hmac(const ll_session_t *self, const void *const parts[4], const size_t lens[4],
                  unsigned char out[LL_WIRE_DIGEST_LEN])
{
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(self->keyed);
    if (!ctx)
        return -1;
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        if (lens[i] > 0 && !EVP_MAC_update(ctx, parts[i], lens[i]))
            rc = -1;
    size_t outl = 0;
    if (rc == 0 &&
        (!EVP_MAC_final(ctx, out, &outl, LL_WIRE_DIGEST_LEN) || outl != LL_WIRE_DIGEST_LEN))
        rc = -1;
    EVP_MAC_CTX_free(ctx);
    return rc;
}

int ll_session_sign(const ll_session_t *self, const void *const parts[4], const size_t lens[4],
                    char hex[65])
{
    if (!self || !parts || !lens || !hex)
        return -1;
    if (!self->is_signed) {
        hex[0] = '\0';
        return 0;
    }
    unsigned char digest[LL_WIRE_DIGEST_LEN];
    if (s_hmac(self, parts, lens, digest))
        return -1;
    s_hex(digest, sizeof digest, hex);
    hex[64] = '\0';
    return 0;
}

/* ---- replay history ----------------------------------------------------- */

/* A verified HMAC is uniformly distributed and unforgeable without the key,
 * so its first bytes are a hash nobody can aim at our table. */
static uint32_t s_history_home(const ll_session_t *self, const unsigned char *digest)
{
    uint64_t h;
    memcpy(&h, digest, sizeof h);
    return (uint32_t) (h & self->history_mask);
}

/* Slot holding DIGEST, or the free slot where it would go.  Lock held. */
static uint32_t s_history_probe(const ll_session_t *self, const unsigned char *digest, bool *found)
{
    uint32_t i = s_history_home(self, digest);
    while (self->history_table[i] != LL_WIRE_EMPTY_SLOT) {
        if (memcmp(self->history_ring[self->history_table[i]], digest, LL_WIRE_DIGEST_LEN) == 0) {
            *found = true;
            return i;
        }
        i = (i + 1) & self->history_mask;
    }
    *found = false;
    return i;
}

/* Remove the entry at SLOT by shifting later members of its probe run back
 * (linear-probing deletion without tombstones).  Lock held. */
static void s_history_unlink(ll_session_t *self, uint32_t slot)
{
    uint32_t hole = slot, j = slot;
    for (;;) {
        j = (j + 1) & self->history_mask;
        uint32_t entry = self->history_table[j];
        if (entry == LL_WIRE_EMPTY_SLOT)
            break;
        uint32_t home = s_history_home(self, self->history_ring[entry]);
        /* ENTRY may fill the hole unless its home lies cyclically in (hole, j]. */
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays)
            continue;
        self->history_table[hole] = entry;
        hole = j;
    }
    self->history_table[hole] = LL_WIRE_EMPTY_SLOT;
}

/* True if DIGEST was seen before; otherwise remember it (evicting the
 * oldest when full) and return false. */
static bool s_history_check_and_add(ll_session_t *self, const unsigned char *digest)
{
    pthread_mutex_lock(&self->history_lock);
    bool found;
    s_history_probe(self, digest, &found);
    if (found) {
        pthread_mutex_unlock(&self->history_lock);
        return true;
    }
    uint32_t idx;
    if (self->history_len == self->history_cap) {
        idx = self->history_head;
        bool old_found;
        uint32_t old_slot = s_history_probe(self, self->history_ring[idx], &old_found);
        if (old_found)
            s_history_unlink(self, old_slot);
        self->history_head = (self->history_head + 1) % self->history_cap;
    } else {
        idx = (self->history_head + self->history_len) % self->history_cap;
        self->history_len++;
    }
    memcpy(self->history_ring[idx], digest, LL_WIRE_DIGEST_LEN);
    uint32_t slot = s_history_probe(self, digest, &found);
    self->history_table[slot] = idx;
    pthread_mutex_unlock(&self->history_lock);
    return false;
}

/* ---- decode ------------------------------------------------------------- */

static int s_hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static const char *const s_part_names[4] = {"header", "parent_header", "metadata", "content"};

static json_t *s_parse_part(zframe_t *frame, int part, char *why, size_t whylen)
{
    char err[160];
    /* A header naming a key twice (two msg_types, two sessions) is one
     * that different readers would read differently: refused. */
    json_t *v = ll_json_parse_flags((const char *) zframe_data(frame), zframe_size(frame),
                                    part == 0 ? LL_JSON_NO_DUPLICATE_KEYS : 0, err, sizeof err);
    if (!v) {
        s_fail(why, whylen, "%s: invalid JSON %s", s_part_names[part], err);
        return NULL;
    }
    if (!json_is_object(v)) {
        s_fail(why, whylen, "%s: not a JSON object", s_part_names[part]);
        json_decref(v);
        return NULL;
    }
    return v;
}

/* Whether V is a protocol version: a string of numbers joined by dots
 * ("5.3", "5"), each of at most 9 digits.  (Absent is fine too: old
 * clients wrote none.) */
static bool s_version_ok(const json_t *v)
{
    if (!json_is_string(v))
        return false;
    const char *p = json_string_value(v), *end = p + json_string_length(v);
    if (p == end)
        return false;
    while (p < end) {
        int digits = 0;
        while (p < end && *p >= '0' && *p <= '9' && digits < 10) {
            p++;
            digits++;
        }
        if (digits == 0 || digits > 9)
            return false;
        if (p < end && (*p != '.' || ++p == end))
            return false;
    }
    return true;
}

ll_msg_t *ll_session_decode(ll_session_t *self, zmsg_t **raw_p, char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = '\0';
    if (!raw_p || !*raw_p) {
        s_fail(why, whylen, "no message");
        return NULL;
    }
    zmsg_t *raw = *raw_p;
    *raw_p = NULL;
    if (!self) {
        s_fail(why, whylen, "no session");
        zmsg_destroy(&raw);
        return NULL;
    }

    /* 1. Delimiter: everything before it is routing identities. */
    size_t ids = 0;
    bool delim = false;
    for (zframe_t *f = zmsg_first(raw); f; f = zmsg_next(raw), ids++)
        if (zframe_size(f) == LL_WIRE_DELIM_LEN &&
            memcmp(zframe_data(f), LL_WIRE_DELIM, LL_WIRE_DELIM_LEN) == 0) {
            delim = true;
            break;
        }
    if (!delim) {
        s_fail(why, whylen, "no <IDS|MSG> delimiter among %zu frames", zmsg_size(raw));
        zmsg_destroy(&raw);
        return NULL;
    }
    /* 2. Signature + four JSON parts must follow. */
    size_t after = zmsg_size(raw) - ids - 1;
    if (after < 5) {
        s_fail(why, whylen, "%zu frames after <IDS|MSG>, need at least 5", after);
        zmsg_destroy(&raw);
        return NULL;
    }

    ll_msg_t *msg = calloc(1, sizeof *msg);
    zframe_t *frames[5] = {NULL};
    if (!msg)
        goto out_nomem;
    msg->identities = zmsg_new();
    if (!msg->identities)
        goto out_nomem;
    for (size_t i = 0; i < ids; i++) {
        zframe_t *f = zmsg_pop(raw);
        zmsg_append(msg->identities, &f);
    }
    zframe_t *delim_frame = zmsg_pop(raw);
    zframe_destroy(&delim_frame);
    for (int i = 0; i < 5; i++)
        frames[i] = zmsg_pop(raw);
    msg->buffers = raw; /* what is left are the binary buffers */
    raw = NULL;

    /* 3. Signature: length and alphabet, then constant-time HMAC. */
    if (self->is_signed) {
        size_t sig_len = zframe_size(frames[0]);
        const unsigned char *sig = zframe_data(frames[0]);
        if (sig_len == 0) {
            s_fail(why, whylen, "unsigned message (empty signature) but the session has a key");
            goto out_drop;
        }
        if (sig_len != LL_WIRE_SIG_HEX_LEN) {
            s_fail(why, whylen, "signature is %zu bytes, expected %d hex characters", sig_len,
                   LL_WIRE_SIG_HEX_LEN);
            goto out_drop;
        }
        unsigned char claimed[LL_WIRE_DIGEST_LEN];
        for (int i = 0; i < LL_WIRE_DIGEST_LEN; i++) {
            int hi = s_hex_value(sig[2 * i]), lo = s_hex_value(sig[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                s_fail(why, whylen, "signature is not hexadecimal");
                goto out_drop;
            }
            claimed[i] = (unsigned char) (hi << 4 | lo);
        }
        const void *parts[4];
        size_t lens[4];
        for (int i = 0; i < 4; i++) {
            parts[i] = zframe_data(frames[i + 1]);
            lens[i] = zframe_size(frames[i + 1]);
        }
        unsigned char expected[LL_WIRE_DIGEST_LEN];
        if (s_hmac(self, parts, lens, expected)) {
            s_fail(why, whylen, "cannot compute HMAC (out of memory?)");
            goto out_drop;
        }
        if (CRYPTO_memcmp(claimed, expected, LL_WIRE_DIGEST_LEN) != 0) {
            s_fail(why, whylen, "signature does not match (wrong key or altered message)");
            goto out_drop;
        }
        /* 4. Replay: an authentic message is accepted once. */
        if (s_history_check_and_add(self, claimed)) {
            s_fail(why, whylen, "replayed message (signature seen before)");
            goto out_drop;
        }
    }

    /* 5. Only now parse JSON. */
    json_t **dst[4] = {&msg->header, &msg->parent_header, &msg->metadata, &msg->content};
    for (int i = 0; i < 4; i++) {
        *dst[i] = s_parse_part(frames[i + 1], i, why, whylen);
        if (!*dst[i])
            goto out_drop;
    }
    json_t *type = json_object_get(msg->header, "msg_type");
    if (!json_is_string(type)) {
        s_fail(why, whylen, "header: msg_type missing or not a string");
        goto out_drop;
    }
    if (!json_is_string(json_object_get(msg->header, "msg_id"))) {
        s_fail(why, whylen, "header: msg_id missing or not a string");
        goto out_drop;
    }
    json_t *version = json_object_get(msg->header, "version");
    if (version && !s_version_ok(version)) {
        s_fail(why, whylen, "header: version is not a protocol version (\"5.3\")");
        goto out_drop;
    }
    msg->msg_type = json_string_value(type);
    for (int i = 0; i < 5; i++)
        zframe_destroy(&frames[i]);
    return msg;

out_nomem:
    s_fail(why, whylen, "out of memory");
out_drop:
    for (int i = 0; i < 5; i++)
        zframe_destroy(&frames[i]);
    zmsg_destroy(&raw);
    ll_msg_destroy(&msg);
    return NULL;
}

/* ---- limits --------------------------------------------------------------- */

int64_t ll_wire_max_frame_bytes(void)
{
    const char *v = getenv("LOOSELEAF_MAX_FRAME_BYTES");
    char *end;
    long long n = v ? strtoll(v, &end, 10) : 0;
    if (!v || end == v || *end)
        return LL_WIRE_MAX_FRAME_DEFAULT;
    return n > 0 ? (int64_t) n : -1;
}

int ll_wire_limit_frames(zsock_t *sock)
{
    int64_t max = ll_wire_max_frame_bytes();
    return zmq_setsockopt(zsock_resolve(sock), ZMQ_MAXMSGSIZE, &max, sizeof max);
}

int ll_wire_wait(zsock_t *sock, int stop_fd)
{
    zmq_pollitem_t items[2] = {{zsock_resolve(sock), 0, ZMQ_POLLIN, 0},
                               {NULL, stop_fd, ZMQ_POLLIN, 0}};
    for (;;) {
        int rc = zmq_poll(items, 2, -1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return -1;
        if (items[1].revents)
            return 0;
        if (items[0].revents)
            return 1;
    }
}

/* ---- encode ------------------------------------------------------------- */

zmsg_t *ll_session_encode(ll_session_t *self, const ll_msg_t *msg)
{
    if (!self || !msg || !msg->header) /* a message without a header cannot be routed */
        return NULL;
    /* The four parts are written one after another into one buffer (on the
     * stack for all but large messages), signed in place, then copied into
     * their frames. */
    char storage[16384];
    ll_jbuf_t buf;
    ll_jbuf_init(&buf, storage, sizeof storage);
    static const char empty_object[] = "{}";
    const json_t *src[4] = {msg->header, msg->parent_header, msg->metadata, msg->content};
    size_t offsets[5] = {0};
    zmsg_t *out = NULL;
    for (int i = 0; i < 4; i++) {
        offsets[i] = buf.len;
        if (!src[i]) {
            if (ll_jbuf_put(&buf, empty_object, 2) != 0)
                goto out_fail;
        } else if (ll_json_write(&buf, src[i]) != 0) {
            ll_warn("wire", "cannot serialize the %s of a %s message", s_part_names[i],
                    msg->msg_type ? msg->msg_type : "?");
            goto out_fail;
        }
    }
    offsets[4] = buf.len;
    const void *data[4];
    size_t lens[4];
    for (int i = 0; i < 4; i++) {
        data[i] = buf.data + offsets[i];
        lens[i] = offsets[i + 1] - offsets[i];
    }

    char sig[65] = "";
    if (self->is_signed && ll_session_sign(self, data, lens, sig))
        goto out_fail;

    out = msg->identities ? zmsg_dup(msg->identities) : zmsg_new();
    if (!out)
        goto out_fail;
    if (zmsg_addmem(out, LL_WIRE_DELIM, LL_WIRE_DELIM_LEN) ||
        zmsg_addmem(out, sig, self->is_signed ? LL_WIRE_SIG_HEX_LEN : 0))
        goto out_fail;
    for (int i = 0; i < 4; i++)
        if (zmsg_addmem(out, data[i], lens[i]))
            goto out_fail;
    if (msg->buffers)
        for (zframe_t *f = zmsg_first(msg->buffers); f; f = zmsg_next(msg->buffers)) {
            zframe_t *copy = zframe_dup(f);
            if (!copy || zmsg_append(out, &copy))
                goto out_fail;
        }
    ll_jbuf_release(&buf);
    return out;

out_fail:
    zmsg_destroy(&out);
    ll_jbuf_release(&buf);
    return NULL;
}

int ll_session_send(ll_session_t *self, zsock_t *sock, ll_msg_t **msg_p)
{
    if (!msg_p || !*msg_p)
        return -1;
    zmsg_t *frames = sock ? ll_session_encode(self, *msg_p) : NULL;
    ll_msg_destroy(msg_p);
    if (!frames)
        return -1;
    if (zmsg_send(&frames, sock) != 0) {
        zmsg_destroy(&frames); /* zmsg_send keeps the message on failure */
        return -1;
    }
    return 0;
}

/* ---- messages ----------------------------------------------------------- */

static json_t *s_header_new(const ll_session_t *self, const char *msg_type)
{
    char msg_id[37], date[32];
    ll_wire_new_id(msg_id);
    ll_wire_now(date);
    json_t *h = json_object();
    if (!h)
        return NULL;
    if (json_object_set_new(h, "msg_id", json_string(msg_id)) ||
        json_object_set_new(h, "msg_type", json_string(msg_type)) ||
        json_object_set_new(h, "username", json_string(self->username)) ||
        json_object_set_new(h, "session", json_string(self->id)) ||
        json_object_set_new(h, "date", json_string(date)) ||
        json_object_set_new(h, "version", json_string(LL_PROTOCOL_VERSION))) {
        json_decref(h);
        return NULL;
    }
    return h;
}

ll_msg_t *ll_msg_new(ll_session_t *self, const char *msg_type, const ll_msg_t *parent,
                     json_t *content)
{
    ll_msg_t *msg = calloc(1, sizeof *msg);
    if (!msg || !self || !msg_type)
        goto out_fail;
    msg->identities = parent && parent->identities ? zmsg_dup(parent->identities) : zmsg_new();
    msg->header = s_header_new(self, msg_type);
    /* Shared, not copied: a decoded header is read-only (see ll_wire.h),
     * and a stream of replies to one request then costs no copies. */
    msg->parent_header = parent && parent->header ? json_incref(parent->header) : json_object();
    msg->metadata = json_object();
    msg->content = content ? content : json_object();
    content = NULL;
    msg->buffers = zmsg_new();
    if (!msg->identities || !msg->header || !msg->parent_header || !msg->metadata ||
        !msg->content || !msg->buffers)
        goto out_fail;
    msg->msg_type = json_string_value(json_object_get(msg->header, "msg_type"));
    return msg;

out_fail:
    json_decref(content);
    ll_msg_destroy(&msg);
    return NULL;
}

void ll_msg_destroy(ll_msg_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_msg_t *self = *self_p;
    zmsg_destroy(&self->identities);
    json_decref(self->header);
    json_decref(self->parent_header);
    json_decref(self->metadata);
    json_decref(self->content);
    zmsg_destroy(&self->buffers);
    free(self);
    *self_p = NULL;
}

const char *ll_msg_content_str(const ll_msg_t *msg, const char *key)
{
    if (!msg || !key)
        return NULL;
    return json_string_value(json_object_get(msg->content, key));
}
