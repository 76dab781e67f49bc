/* ll_lease: signed cluster leases (ll_lease.h; hostd/API.md, "Cluster
 * leases").  Runs in `looseleaf hostd`'s one thread.
 *
 * A lease is a JSON object whose fields (v, uid, user, issuer, target,
 * request, issued, expires, nonce) are signed as one canonical text, a line
 * per field in a fixed order; no field may hold a newline or a space, so no
 * two leases share a text.  The signature is HMAC-SHA256 under the cluster
 * key (the same primitive the kernel's wire signing uses), compared in
 * constant time (CRYPTO_memcmp) on raw bytes after strict hex decoding.
 *
 * What must stay true:
 * - nothing of a lease is believed before its signature checks out, and
 *   a refused redeem spends nothing (the nonce is recorded last);
 * - a nonce is redeemed once: it stays in the replay cache until its lease
 *   expires; when the cache is full of live nonces, redeems are refused
 *   rather than an entry dropped (dropping one would let it be replayed);
 * - a restarted hostd has forgotten its nonces, so it refuses every lease
 *   issued before it started. */
#include "hostd/ll_lease.h"
#include "base/ll_check.h"
#include "base/ll_log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S_NONCE 16  /* bytes of randomness per lease */
#define S_SIG   32  /* HMAC-SHA256 */
#define S_NAME  64  /* host and user names, with their NUL */
#define S_REQ   129 /* a request id, with its NUL */

typedef struct {
    unsigned char nonce[S_NONCE];
    long long expires; /* ms; 0: free */
} s_seen_t;

struct ll_lease_ctx {
    char host[S_NAME];
    unsigned char key[LL_LEASE_KEY_MAX];
    size_t klen;
    long long started;                   /* ms: leases issued before are refused */
    s_seen_t *seen;                      /* LL_LEASE_REPLAY_MAX entries */
    long long issued, redeemed, refused; /* requests answered so (ll_lease_answer) */
};

/* The fields of a lease, checked for shape. */
typedef struct {
    unsigned uid;
    char user[S_NAME], issuer[S_NAME], target[S_NAME], request[S_REQ];
    long long issued, expires;
    unsigned char nonce[S_NONCE];
    unsigned char sig[S_SIG];
} s_lease_t;

static int s_bad(char *why, size_t wlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int s_bad(char *why, size_t wlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* A host or user name: 1..63 of [A-Za-z0-9._@-] (user names from NSS may
 * carry '@' under sssd/LDAP). */
static bool s_name_ok(const char *s, bool user)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= S_NAME)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char) s[i]) && !strchr(user ? "._-@" : "._-", s[i]))
            return false;
    return true;
}

/* A request id: 1..128 printable ASCII characters, no space. */
static bool s_request_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= S_REQ)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    return true;
}

static void s_hex(const unsigned char *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Exactly 2N lowercase hex digits into N bytes (one spelling per value:
 * re-cased text is not the same lease). */
static bool s_unhex(const char *s, unsigned char *out, size_t n)
{
    if (!s || strlen(s) != 2 * n)
        return false;
    for (size_t i = 0; i < 2 * n; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return false;
        if (i % 2 == 0)
            out[i / 2] = (unsigned char) (v << 4);
        else
            out[i / 2] |= (unsigned char) v;
    }
    return true;
}

/* The canonical text L's signature covers, into BUF. */
static int s_text(const s_lease_t *l, char *buf, size_t len)
{
    char nonce[2 * S_NONCE + 1];
    s_hex(l->nonce, S_NONCE, nonce);
    int n = snprintf(buf, len, "looseleaf-lease-v1\n%u\n%s\n%s\n%s\n%s\n%lld\n%lld\n%s\n", l->uid,
                     l->user, l->issuer, l->target, l->request, l->issued, l->expires, nonce);
    return n > 0 && (size_t) n < len ? n : -1;
}

static int s_sign(const ll_lease_ctx_t *ctx, const s_lease_t *l, unsigned char sig[S_SIG])
{
    char text[512];
    int n = s_text(l, text, sizeof text);
    unsigned sl = 0;
    if (n < 0 ||
        !HMAC(EVP_sha256(), ctx->key, (int) ctx->klen, (const unsigned char *) text, (size_t) n,
              sig, &sl) ||
        sl != S_SIG)
        return -1;
    return 0;
}

int ll_lease_key_load(const char *path, unsigned char *key, size_t cap, size_t *klen, char *why,
                      size_t wlen)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return s_bad(why, wlen, "cluster key %s: %s%s", path, strerror(e),
                     e == ENOENT  ? " (make one with `looseleaf cluster keygen`, as root, and copy "
                                    "it to every host of the cluster, mode 0600)"
                     : e == ELOOP ? " (a symbolic link: refused)"
                                  : "");
    }
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) < 0) {
        s_bad(why, wlen, "cluster key %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        s_bad(why, wlen, "cluster key %s: not a regular file", path);
    } else if (st.st_uid != geteuid() || (st.st_mode & 077)) {
        s_bad(why, wlen,
              "cluster key %s: must be owned by uid %u and readable by it alone (chown, chmod "
              "600); it is uid %u's, mode %04o",
              path, (unsigned) geteuid(), (unsigned) st.st_uid, (unsigned) (st.st_mode & 07777));
    } else if (cap < LL_LEASE_KEY_MAX) {
        s_bad(why, wlen, "cluster key %s: no room", path);
    } else {
        unsigned char buf[LL_LEASE_KEY_MAX + 2];
        ssize_t n = read(fd, buf, sizeof buf);
        size_t a = 0, b = n > 0 ? (size_t) n : 0;
        while (a < b && isspace(buf[a]))
            a++;
        while (b > a && isspace(buf[b - 1]))
            b--;
        if (n < 0)
            s_bad(why, wlen, "cluster key %s: %s", path, strerror(errno));
        else if ((size_t) n == sizeof buf || b - a > LL_LEASE_KEY_MAX)
            s_bad(why, wlen, "cluster key %s: longer than %d bytes", path, LL_LEASE_KEY_MAX);
        else if (b - a < LL_LEASE_KEY_MIN)
            s_bad(why, wlen, "cluster key %s: %zu bytes, at least %d needed", path, b - a,
                  LL_LEASE_KEY_MIN);
        else {
            memcpy(key, buf + a, b - a);
            *klen = b - a;
            rc = 0;
        }
        OPENSSL_cleanse(buf, sizeof buf);
    }
    close(fd);
    return rc;
}

ll_lease_ctx_t *ll_lease_ctx_new(const char *host, const unsigned char *key, size_t klen,
                                 long long started_ms)
{
    if (!s_name_ok(host, false) || klen < LL_LEASE_KEY_MIN || klen > LL_LEASE_KEY_MAX)
        return NULL;
    ll_lease_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    ctx->seen = calloc(LL_LEASE_REPLAY_MAX, sizeof *ctx->seen);
    if (!ctx->seen) {
        free(ctx);
        return NULL;
    }
    snprintf(ctx->host, sizeof ctx->host, "%s", host);
    memcpy(ctx->key, key, klen);
    ctx->klen = klen;
    ctx->started = started_ms;
    return ctx;
}

void ll_lease_ctx_destroy(ll_lease_ctx_t **ctx)
{
    if (!ctx || !*ctx)
        return;
    OPENSSL_cleanse((*ctx)->key, sizeof(*ctx)->key);
    free((*ctx)->seen);
    free(*ctx);
    *ctx = NULL;
}

const char *ll_lease_ctx_host(const ll_lease_ctx_t *ctx)
{
    return ctx->host;
}

int ll_lease_ctx_replay_count(const ll_lease_ctx_t *ctx, long long now_ms)
{
    int n = 0;
    for (int i = 0; i < LL_LEASE_REPLAY_MAX; i++)
        n += ctx->seen[i].expires > now_ms;
    return n;
}

ll_lease_ctx_t *ll_lease_ctx_setup(const char *config, const char *key_file, const char *host,
                                   long long now_ms, char *why, size_t wlen)
{
    why[0] = '\0';
    config = config && *config ? config : NULL;
    if (!config && !key_file && !host)
        return NULL;
    char hostbuf[S_NAME] = "", keybuf[1024] = LL_LEASE_DEFAULT_KEY;
    if (config) {
        json_error_t err;
        json_t *c = json_load_file(config, JSON_REJECT_DUPLICATES, &err);
        if (!c) {
            s_bad(why, wlen, "cluster config %s: %s (line %d, column %d)", config, err.text,
                  err.line, err.column);
            return NULL;
        }
        const json_t *h = json_object_get(c, "host"), *k = json_object_get(c, "key_file");
        int bad = !json_is_object(c)          ? s_bad(why, wlen, "is not a JSON object")
                  : (h && !json_is_string(h)) ? s_bad(why, wlen, "'host' must be a string")
                  : (k && !json_is_string(k)) ? s_bad(why, wlen, "'key_file' must be a string")
                  : (k && json_string_length(k) >= sizeof keybuf)
                      ? s_bad(why, wlen, "'key_file' is too long")
                      : 0;
        if (!bad && h)
            snprintf(hostbuf, sizeof hostbuf, "%.*s", (int) sizeof hostbuf - 1,
                     json_string_value(h));
        if (!bad && k)
            snprintf(keybuf, sizeof keybuf, "%s", json_string_value(k));
        json_decref(c);
        if (bad) {
            char what[256];
            snprintf(what, sizeof what, "%s", why);
            s_bad(why, wlen, "cluster config %s: %s", config, what);
            return NULL;
        }
    }
    if (host)
        snprintf(hostbuf, sizeof hostbuf, "%.*s", (int) sizeof hostbuf - 1, host);
    if (key_file)
        snprintf(keybuf, sizeof keybuf, "%s", key_file);
    if (!hostbuf[0] && gethostname(hostbuf, sizeof hostbuf) < 0)
        hostbuf[0] = '\0';
    hostbuf[sizeof hostbuf - 1] = '\0';
    if (!s_name_ok(hostbuf, false)) {
        s_bad(why, wlen, "cluster host name '%s' must be 1..63 of [A-Za-z0-9._-]", hostbuf);
        return NULL;
    }
    unsigned char key[LL_LEASE_KEY_MAX];
    size_t klen = 0;
    if (ll_lease_key_load(keybuf, key, sizeof key, &klen, why, wlen) < 0)
        return NULL;
    ll_lease_ctx_t *ctx = ll_lease_ctx_new(hostbuf, key, klen, now_ms);
    OPENSSL_cleanse(key, sizeof key);
    if (!ctx)
        s_bad(why, wlen, "cluster leases: out of memory");
    else
        ll_info("hostd", "cluster leases: this is host %s (key %s)", hostbuf, keybuf);
    return ctx;
}

json_t *ll_lease_ctx_stats(const ll_lease_ctx_t *ctx, long long now_ms)
{
    return json_pack("{s:s, s:I, s:I, s:I, s:i}", "host", ctx->host, "issued",
                     (json_int_t) ctx->issued, "redeemed", (json_int_t) ctx->redeemed, "refused",
                     (json_int_t) ctx->refused, "replay_cache",
                     ll_lease_ctx_replay_count(ctx, now_ms));
}

static json_t *s_to_json(const s_lease_t *l)
{
    char nonce[2 * S_NONCE + 1], sig[2 * S_SIG + 1];
    s_hex(l->nonce, S_NONCE, nonce);
    s_hex(l->sig, S_SIG, sig);
    return json_pack("{s:i, s:I, s:s, s:s, s:s, s:s, s:I, s:I, s:s, s:s}", "v", 1, "uid",
                     (json_int_t) l->uid, "user", l->user, "issuer", l->issuer, "target", l->target,
                     "request", l->request, "issued", (json_int_t) l->issued, "expires",
                     (json_int_t) l->expires, "nonce", nonce, "sig", sig);
}

json_t *ll_lease_issue(ll_lease_ctx_t *ctx, const json_t *m, unsigned caller, long long now_ms,
                       ll_lease_user_fn user, void *arg, char *why, size_t wlen)
{
    s_lease_t l = {0};
    const char *target = json_string_value(json_object_get(m, "target"));
    const char *request = json_string_value(json_object_get(m, "request"));
    const json_t *ttl = json_object_get(m, "ttl_s"), *uid = json_object_get(m, "uid");
    if (!s_name_ok(target, false)) {
        s_bad(why, wlen, "lease_issue: 'target' must be a host name of 1..63 [A-Za-z0-9._-]");
        return NULL;
    }
    if (!s_request_ok(request)) {
        s_bad(why, wlen, "lease_issue: 'request' must be 1..128 printable characters, no space");
        return NULL;
    }
    if (ttl && (!json_is_integer(ttl) || json_integer_value(ttl) < 1 ||
                json_integer_value(ttl) > LL_LEASE_TTL_MAX_S)) {
        s_bad(why, wlen, "lease_issue: 'ttl_s' must be an integer 1..%d", LL_LEASE_TTL_MAX_S);
        return NULL;
    }
    l.uid = caller;
    if (uid) {
        if (!json_is_integer(uid) || json_integer_value(uid) < 0 ||
            json_integer_value(uid) > (json_int_t) UINT_MAX - 1) {
            s_bad(why, wlen, "lease_issue: 'uid' must be a uid");
            return NULL;
        }
        if ((unsigned) json_integer_value(uid) != caller && caller != 0) {
            s_bad(why, wlen,
                  "lease_issue: refused: uid %lld is not the caller's (uid %u): a lease names its "
                  "caller's own user",
                  (long long) json_integer_value(uid), caller);
            return NULL;
        }
        l.uid = (unsigned) json_integer_value(uid);
    }
    const char *name = user(l.uid, arg);
    if (!s_name_ok(name, true)) {
        s_bad(why, wlen,
              "lease_issue: uid %u has no user name on host %s (cluster users must be the same "
              "on every host: NSS, LDAP)",
              l.uid, ctx->host);
        return NULL;
    }
    snprintf(l.user, sizeof l.user, "%s", name);
    snprintf(l.issuer, sizeof l.issuer, "%s", ctx->host);
    snprintf(l.target, sizeof l.target, "%s", target);
    snprintf(l.request, sizeof l.request, "%s", request);
    l.issued = now_ms;
    l.expires = now_ms + 1000LL * (ttl ? json_integer_value(ttl) : LL_LEASE_TTL_DEFAULT_S);
    if (getrandom(l.nonce, S_NONCE, 0) != S_NONCE || s_sign(ctx, &l, l.sig) < 0) {
        s_bad(why, wlen, "lease_issue: cannot sign (no randomness or HMAC)");
        return NULL;
    }
    return s_to_json(&l);
}

/* A string field KEY of O that passes OK, into OUT. */
static int s_str(const json_t *o, const char *key, char *out, size_t len, bool (*ok)(const char *),
                 char *why, size_t wlen)
{
    const char *s = json_string_value(json_object_get(o, key));
    if (!ok(s) || strlen(s) >= len)
        return s_bad(why, wlen, "lease_redeem: malformed lease: bad '%s'", key);
    snprintf(out, len, "%s", s);
    return 0;
}

static bool s_host_ok(const char *s)
{
    return s_name_ok(s, false);
}

static bool s_user_ok(const char *s)
{
    return s_name_ok(s, true);
}

static int s_ms(const json_t *o, const char *key, long long *out, char *why, size_t wlen)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return s_bad(why, wlen, "lease_redeem: malformed lease: bad '%s'", key);
    *out = (long long) json_integer_value(v);
    return 0;
}

/* L from lease object O, for shape only (nothing believed yet). */
static int s_parse(const json_t *o, s_lease_t *l, char *why, size_t wlen)
{
    memset(l, 0, sizeof *l);
    if (!json_is_object(o))
        return s_bad(why, wlen, "lease_redeem: 'lease' must be an object");
    const json_t *v = json_object_get(o, "v"), *uid = json_object_get(o, "uid");
    if (!json_is_integer(v) || json_integer_value(v) != 1)
        return s_bad(why, wlen, "lease_redeem: not a version 1 lease");
    if (!json_is_integer(uid) || json_integer_value(uid) < 0 ||
        json_integer_value(uid) > (json_int_t) UINT_MAX - 1)
        return s_bad(why, wlen, "lease_redeem: malformed lease: bad 'uid'");
    l->uid = (unsigned) json_integer_value(uid);
    if (s_str(o, "user", l->user, sizeof l->user, s_user_ok, why, wlen) < 0 ||
        s_str(o, "issuer", l->issuer, sizeof l->issuer, s_host_ok, why, wlen) < 0 ||
        s_str(o, "target", l->target, sizeof l->target, s_host_ok, why, wlen) < 0 ||
        s_str(o, "request", l->request, sizeof l->request, s_request_ok, why, wlen) < 0 ||
        s_ms(o, "issued", &l->issued, why, wlen) < 0 ||
        s_ms(o, "expires", &l->expires, why, wlen) < 0)
        return -1;
    if (!s_unhex(json_string_value(json_object_get(o, "nonce")), l->nonce, S_NONCE))
        return s_bad(why, wlen, "lease_redeem: malformed lease: 'nonce' must be 32 hex digits");
    if (!s_unhex(json_string_value(json_object_get(o, "sig")), l->sig, S_SIG))
        return s_bad(why, wlen, "lease_redeem: malformed lease: 'sig' must be 64 hex digits");
    return 0;
}

json_t *ll_lease_redeem(ll_lease_ctx_t *ctx, const json_t *m, unsigned caller, long long now_ms,
                        ll_lease_user_fn user, void *arg, char *why, size_t wlen)
{
    s_lease_t l;
    unsigned char want[S_SIG];
    if (s_parse(json_object_get(m, "lease"), &l, why, wlen) < 0)
        return NULL;
    if (s_sign(ctx, &l, want) < 0 || CRYPTO_memcmp(want, l.sig, S_SIG) != 0) {
        s_bad(why, wlen,
              "lease_redeem: refused: bad signature (forged or altered, or signed with another "
              "cluster key)");
        return NULL;
    }
    /* Signed by a hostd of this cluster: from here on its fields are true. */
    if (strcmp(l.target, ctx->host) != 0) {
        s_bad(why, wlen, "lease_redeem: refused: the lease is for host %s, this is host %s",
              l.target, ctx->host);
        return NULL;
    }
    if (now_ms >= l.expires) {
        s_bad(why, wlen, "lease_redeem: refused: the lease expired %.1f s ago",
              (double) (now_ms - l.expires) / 1000.0);
        return NULL;
    }
    if (l.issued > now_ms + LL_LEASE_SKEW_MS) {
        s_bad(why, wlen,
              "lease_redeem: refused: issued %.1f s in this host's future (the hosts' clocks "
              "differ: synchronise them)",
              (double) (l.issued - now_ms) / 1000.0);
        return NULL;
    }
    if (l.issued < ctx->started) {
        s_bad(why, wlen,
              "lease_redeem: refused: issued before this hostd started (a restart forgets which "
              "leases were redeemed): ask for a new lease");
        return NULL;
    }
    if (caller != 0 && caller != l.uid) {
        s_bad(why, wlen,
              "lease_redeem: refused: the lease is for uid %u (%s), the caller is uid %u", l.uid,
              l.user, caller);
        return NULL;
    }
    const char *here = user(l.uid, arg);
    if (!here || strcmp(here, l.user) != 0) {
        s_bad(why, wlen,
              "lease_redeem: refused: uid %u is %s on host %s but %s on host %s (cluster users "
              "must be the same on every host)",
              l.uid, l.user, l.issuer, here ? here : "nobody", ctx->host);
        return NULL;
    }
    int free_slot = -1;
    for (int i = 0; i < LL_LEASE_REPLAY_MAX; i++) {
        s_seen_t *e = &ctx->seen[i];
        if (e->expires > now_ms && memcmp(e->nonce, l.nonce, S_NONCE) == 0) {
            s_bad(why, wlen, "lease_redeem: refused: replayed (this lease was redeemed already)");
            return NULL;
        }
        if (e->expires <= now_ms && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0) {
        s_bad(why, wlen,
              "lease_redeem: refused: %d leases redeemed are still live here (the replay "
              "cache is full): try again when some expire",
              LL_LEASE_REPLAY_MAX);
        return NULL;
    }
    /* Remembered until it expires (plus the skew: an entry must outlive
     * the lease's acceptance on this clock). */
    memcpy(ctx->seen[free_slot].nonce, l.nonce, S_NONCE);
    ctx->seen[free_slot].expires = l.expires + LL_LEASE_SKEW_MS;
    return json_pack("{s:s, s:I, s:s, s:s, s:s, s:s, s:I}", "type", "redeemed", "uid",
                     (json_int_t) l.uid, "user", l.user, "issuer", l.issuer, "target", l.target,
                     "request", l.request, "expires", (json_int_t) l.expires);
}

long long ll_lease_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

json_t *ll_lease_answer(ll_lease_ctx_t *ctx, const json_t *m, unsigned caller,
                        ll_lease_user_fn user, void *arg, char *line, size_t llen)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    bool issue = type && strcmp(type, "lease_issue") == 0;
    if (!type || (!issue && strcmp(type, "lease_redeem") != 0))
        return NULL;
    json_t *r = NULL;
    if (!ctx)
        snprintf(line, llen,
                 "%s: this hostd has no cluster key (looseleaf hostd --cluster-config PATH, or "
                 "--cluster-key PATH --host NAME)",
                 type);
    else if (issue)
        r = ll_lease_issue(ctx, m, caller, ll_lease_now_ms(), user, arg, line, llen);
    else
        r = ll_lease_redeem(ctx, m, caller, ll_lease_now_ms(), user, arg, line, llen);
    if (!r) {
        if (ctx)
            ctx->refused++;
        return json_pack("{s:s, s:s}", "type", "error", "error", line);
    }
    if (issue)
        ctx->issued++;
    else
        ctx->redeemed++;
    const json_t *l = r;
    if (issue)
        r = json_pack("{s:s, s:o}", "type", "lease", "lease", r);
    snprintf(line, llen, "lease %s: uid %u (%s), host %s, request %s, caller uid %u",
             issue ? "issued" : "redeemed",
             (unsigned) json_integer_value(json_object_get(l, "uid")),
             json_string_value(json_object_get(l, "user")),
             json_string_value(json_object_get(l, "target")),
             json_string_value(json_object_get(l, "request")), caller);
    return r;
}

/* ------------------------------------------------------------------ */
/* Self-test: issue on one context, redeem on another; every forgery,
 * replay, expiry, wrong target and wrong caller is refused, spending
 * nothing. */

static const char *s_test_users(unsigned uid, void *arg)
{
    (void) arg;
    return uid == 1001 ? "alice" : uid == 1002 ? "bob" : uid == 0 ? "root" : NULL;
}

static const char *s_test_users_other(unsigned uid, void *arg)
{
    (void) arg;
    return uid == 1001 ? "mallory" : s_test_users(uid, NULL);
}

static json_t *s_redeem_of(ll_lease_ctx_t *ctx, json_t *lease, unsigned caller, long long now,
                           char *why, size_t wlen)
{
    json_t *m = json_pack("{s:s, s:O}", "type", "lease_redeem", "lease", lease);
    json_t *r = ll_lease_redeem(ctx, m, caller, now, s_test_users, NULL, why, wlen);
    json_decref(m);
    return r;
}

/* Expiry, restarts, clock skew; what an issue refuses. */
static int s_selftest_expiry_and_issue(ll_lease_ctx_t *srv, ll_lease_ctx_t *h1, json_t *req,
                                       long long t0)
{
    int fails = 0;
    char why[300];
    const unsigned char *key = (const unsigned char *) "0123456789abcdef0123456789abcdef";
    json_t *lease, *r, *m;
    /* Expired; issued before the redeeming hostd started; from the future. */
    lease = ll_lease_issue(srv, req, 1001, t0 + 100, s_test_users, NULL, why, sizeof why);
    S_CHECK(!(r = s_redeem_of(h1, lease, 1001, t0 + 100 + 30000, why, sizeof why)) &&
            strstr(why, "expired"));
    ll_lease_ctx_t *late = ll_lease_ctx_new("h1", key, 32, t0 + 200);
    S_CHECK(!(r = s_redeem_of(late, lease, 1001, t0 + 300, why, sizeof why)) &&
            strstr(why, "before this hostd started"));
    S_CHECK(!(r = s_redeem_of(h1, lease, 1001, t0 + 100 - LL_LEASE_SKEW_MS - 1, why, sizeof why)) &&
            strstr(why, "future"));
    /* ... but redeemable in time, by root for its user. */
    S_CHECK((r = s_redeem_of(h1, lease, 0, t0 + 29000, why, sizeof why)) != NULL);
    json_decref(r);
    json_decref(lease);
    ll_lease_ctx_destroy(&late);

    /* Issue: another user's uid from a non-root caller; root may name one. */
    json_object_set_new(req, "uid", json_integer(1001));
    S_CHECK(!ll_lease_issue(srv, req, 1002, t0, s_test_users, NULL, why, sizeof why) &&
            strstr(why, "uid 1001 is not the caller's (uid 1002)"));
    S_CHECK((lease = ll_lease_issue(srv, req, 0, t0, s_test_users, NULL, why, sizeof why)) &&
            json_integer_value(json_object_get(lease, "uid")) == 1001);
    json_decref(lease);
    S_CHECK(!ll_lease_issue(srv, req, 4242, t0, s_test_users, NULL, why, sizeof why));
    json_object_del(req, "uid");
    S_CHECK(!ll_lease_issue(srv, req, 4242, t0, s_test_users, NULL, why, sizeof why) &&
            strstr(why, "no user name"));
    json_object_set_new(req, "ttl_s", json_integer(LL_LEASE_TTL_MAX_S + 1));
    S_CHECK(!ll_lease_issue(srv, req, 1001, t0, s_test_users, NULL, why, sizeof why));
    json_object_set_new(req, "ttl_s", json_integer(5));
    json_object_set_new(req, "target", json_string("h1\nuid=0"));
    S_CHECK(!ll_lease_issue(srv, req, 1001, t0, s_test_users, NULL, why, sizeof why) &&
            strstr(why, "target"));
    json_object_set_new(req, "target", json_string("h1"));
    json_object_set_new(req, "request", json_string("a b"));
    S_CHECK(!ll_lease_issue(srv, req, 1001, t0, s_test_users, NULL, why, sizeof why));
    /* Malformed redeems. */
    m = json_pack("{s:s, s:s}", "type", "lease_redeem", "lease", "x");
    S_CHECK(!ll_lease_redeem(h1, m, 0, t0, s_test_users, NULL, why, sizeof why));
    json_decref(m);
    m = json_pack("{s:s}", "type", "lease_redeem");
    S_CHECK(!ll_lease_redeem(h1, m, 0, t0, s_test_users, NULL, why, sizeof why));
    json_decref(m);

    return fails;
}

static int s_selftest_replay_cache(ll_lease_ctx_t *srv, json_t *req, long long t0)
{
    int fails = 0;
    char why[300];
    const unsigned char *key = (const unsigned char *) "0123456789abcdef0123456789abcdef";
    json_t *lease, *r;
    /* The replay cache is bounded: full of live nonces, a redeem is
     * refused (never an entry dropped); once they expire, room again. */
    json_object_set_new(req, "request", json_string("r"));
    json_object_set_new(req, "ttl_s", json_integer(60));
    ll_lease_ctx_t *h3 = ll_lease_ctx_new("h1", key, 32, t0);
    int ok = 0;
    for (int i = 0; i < LL_LEASE_REPLAY_MAX + 1; i++) {
        lease = ll_lease_issue(srv, req, 1001, t0 + 1000, s_test_users, NULL, why, sizeof why);
        r = s_redeem_of(h3, lease, 1001, t0 + 1000, why, sizeof why);
        ok += r != NULL;
        json_decref(r);
        json_decref(lease);
    }
    S_CHECK(ok == LL_LEASE_REPLAY_MAX && strstr(why, "replay cache is full"));
    lease = ll_lease_issue(srv, req, 1001, t0 + 70000, s_test_users, NULL, why, sizeof why);
    S_CHECK((r = s_redeem_of(h3, lease, 1001, t0 + 70000, why, sizeof why)) != NULL);
    json_decref(r);
    json_decref(lease);
    ll_lease_ctx_destroy(&h3);

    return fails;
}

int ll_lease_selftest(bool verbose)
{
    int fails = 0;
    char why[300];
    const unsigned char *key = (const unsigned char *) "0123456789abcdef0123456789abcdef";
    const unsigned char *other = (const unsigned char *) "fedcba9876543210fedcba9876543210";
    long long t0 = 1800000000000LL;
    ll_lease_ctx_t *srv = ll_lease_ctx_new("srv", key, 32, t0);
    ll_lease_ctx_t *h1 = ll_lease_ctx_new("h1", key, 32, t0);
    ll_lease_ctx_t *h2 = ll_lease_ctx_new("h2", key, 32, t0);
    ll_lease_ctx_t *bad = ll_lease_ctx_new("h1", other, 32, t0);
    S_CHECK(srv && h1 && h2 && bad);
    S_CHECK(!ll_lease_ctx_new("h 1", key, 32, t0) && !ll_lease_ctx_new("h1", key, 31, t0));
    if (!srv || !h1 || !h2 || !bad)
        return 1;

    json_t *req = json_pack("{s:s, s:s, s:s, s:i}", "type", "lease_issue", "target", "h1",
                            "request", "kernel-7/cell-3", "ttl_s", 30);
    json_t *lease = ll_lease_issue(srv, req, 1001, t0 + 10, s_test_users, NULL, why, sizeof why);
    S_CHECK(lease && json_integer_value(json_object_get(lease, "uid")) == 1001 &&
            strcmp(json_string_value(json_object_get(lease, "user")), "alice") == 0 &&
            strcmp(json_string_value(json_object_get(lease, "issuer")), "srv") == 0 &&
            json_integer_value(json_object_get(lease, "expires")) == t0 + 10 + 30000);
    if (!lease)
        return 1;

    /* Forged: another key; every field altered in turn. */
    json_t *r = NULL;
    S_CHECK(!(r = s_redeem_of(bad, lease, 1001, t0 + 20, why, sizeof why)) &&
            strstr(why, "bad signature"));
    const char *fields[] = {"uid",    "user",    "issuer", "target", "request",
                            "issued", "expires", "nonce",  "sig"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        json_t *f = json_deep_copy(lease);
        const json_t *v = json_object_get(f, fields[i]);
        if (json_is_integer(v))
            json_object_set_new(f, fields[i], json_integer(json_integer_value(v) + 1));
        else if (strcmp(fields[i], "nonce") == 0)
            json_object_set_new(f, fields[i], json_string("00000000000000000000000000000000"));
        else if (strcmp(fields[i], "sig") == 0)
            json_object_set_new(f, fields[i],
                                json_string("0000000000000000000000000000000000000000000000000000"
                                            "000000000000"));
        else if (strcmp(fields[i], "user") == 0)
            json_object_set_new(f, fields[i], json_string("bob"));
        else
            json_object_set_new(f, fields[i], json_string("h2"));
        json_t *got = s_redeem_of(h1, f, 0, t0 + 20, why, sizeof why);
        if (got || !strstr(why, "bad signature"))
            fprintf(stderr, "ll_lease: altered '%s' accepted (%s)\n", fields[i], why);
        S_CHECK(!got && strstr(why, "bad signature"));
        json_decref(got);
        json_decref(f);
    }
    /* Re-cased signature text is not the lease (one spelling per value). */
    json_t *f = json_deep_copy(lease);
    char up[65];
    snprintf(up, sizeof up, "%s", json_string_value(json_object_get(f, "sig")));
    for (char *p = up; *p; p++)
        *p = (char) toupper((unsigned char) *p);
    json_object_set_new(f, "sig", json_string(up));
    S_CHECK(!(r = s_redeem_of(h1, f, 1001, t0 + 20, why, sizeof why)) && strstr(why, "sig"));
    json_decref(f);
    /* Wrong target; a different caller; none of these spends the nonce. */
    S_CHECK(!(r = s_redeem_of(h2, lease, 1001, t0 + 20, why, sizeof why)) &&
            strstr(why, "for host h1, this is host h2"));
    S_CHECK(!(r = s_redeem_of(h1, lease, 1002, t0 + 20, why, sizeof why)) &&
            strstr(why, "for uid 1001 (alice), the caller is uid 1002"));
    /* The uid is another user on the redeeming host. */
    json_t *m = json_pack("{s:s, s:O}", "type", "lease_redeem", "lease", lease);
    S_CHECK(!ll_lease_redeem(h1, m, 0, t0 + 20, s_test_users_other, NULL, why, sizeof why) &&
            strstr(why, "alice on host srv but mallory on host h1"));
    json_decref(m);
    S_CHECK(ll_lease_ctx_replay_count(h1, t0 + 20) == 0);
    /* Redeemed once, by its user; then replayed. */
    r = s_redeem_of(h1, lease, 1001, t0 + 20, why, sizeof why);
    S_CHECK(r && json_integer_value(json_object_get(r, "uid")) == 1001 &&
            strcmp(json_string_value(json_object_get(r, "request")), "kernel-7/cell-3") == 0);
    json_decref(r);
    S_CHECK(!(r = s_redeem_of(h1, lease, 1001, t0 + 30, why, sizeof why)) &&
            strstr(why, "replayed"));
    S_CHECK(!(r = s_redeem_of(h1, lease, 0, t0 + 40, why, sizeof why)) && strstr(why, "replayed"));
    S_CHECK(ll_lease_ctx_replay_count(h1, t0 + 40) == 1);
    json_decref(lease);

    fails += s_selftest_expiry_and_issue(srv, h1, req, t0);
    fails += s_selftest_replay_cache(srv, req, t0);
    json_decref(req);
    ll_lease_ctx_destroy(&srv);
    ll_lease_ctx_destroy(&h1);
    ll_lease_ctx_destroy(&h2);
    ll_lease_ctx_destroy(&bad);
    ll_lease_ctx_destroy(&bad);
    if (verbose)
        fprintf(stderr, "ll_lease: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
