/* ll_lease: signed cluster leases between hostds (hostd/API.md, "Cluster
 * leases").  A lease says "host TARGET may run a worker for user UID
 * (NAME) for request REQUEST until EXPIRES"; the kernel host's hostd issues
 * it to its caller (the uid SO_PEERCRED gives), signed with HMAC-SHA256
 * under the cluster key that only the hostds hold; TARGET's hostd redeems
 * it once (signature in constant time, target is itself, not expired, nonce
 * never seen) before anything runs there for that user.
 *
 * Pure but for the clock and the key file: the caller passes the time, the
 * caller's uid and the user names its NSS gives, so a self-test can forge,
 * replay and expire leases.  Used by the broker's one thread. */
#ifndef LL_LEASE_H
#define LL_LEASE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define LL_LEASE_KEY_MIN       32    /* bytes: a shorter key is refused */
#define LL_LEASE_KEY_MAX       4096  /* bytes */
#define LL_LEASE_TTL_DEFAULT_S 30    /* a lease's life when its issue asks none */
#define LL_LEASE_TTL_MAX_S     600   /* ... and the longest it may ask */
#define LL_LEASE_SKEW_MS       5000  /* how far ahead of ours another host's clock may be */
#define LL_LEASE_REPLAY_MAX    16384 /* nonces remembered (each until its lease expires) */
#define LL_LEASE_DEFAULT_KEY   "/etc/looseleaf/cluster.key"

typedef struct ll_lease_ctx ll_lease_ctx_t;

/* Read the cluster key at PATH into KEY (CAP >= LL_LEASE_KEY_MAX bytes),
 * its length into *KLEN.  Refused unless PATH is a regular file (not a
 * symlink) owned by this process's euid and neither group- nor
 * world-accessible, holding LL_LEASE_KEY_MIN..LL_LEASE_KEY_MAX bytes (the
 * surrounding whitespace trimmed).  0, or -1 with WHY for the operator. */
int ll_lease_key_load(const char *path, unsigned char *key, size_t cap, size_t *klen, char *why,
                      size_t wlen);

/* A context for host HOST (a name of [A-Za-z0-9._-], 1..63) signing with
 * KEY (copied), whose replay cache starts empty at STARTED_MS (wall clock,
 * ms since the epoch): a lease issued before then is refused, since the
 * nonces it may have used are forgotten.  NULL on a bad name or key, or
 * without memory.  Destroy with ll_lease_ctx_destroy(&ctx) (safe twice). */
ll_lease_ctx_t *ll_lease_ctx_new(const char *host, const unsigned char *key, size_t klen,
                                 long long started_ms);
void ll_lease_ctx_destroy(ll_lease_ctx_t **ctx);
const char *ll_lease_ctx_host(const ll_lease_ctx_t *ctx);
/* Nonces in the replay cache now (expired ones not counted). */
int ll_lease_ctx_replay_count(const ll_lease_ctx_t *ctx, long long now_ms);

/* {host, issued, redeemed, refused, replay_cache}: what CTX did since it
 * started and the live nonces it keeps (a new reference; `looseleaf top`,
 * metrics). */
json_t *ll_lease_ctx_stats(const ll_lease_ctx_t *ctx, long long now_ms);

/* A user as this host's NSS knows it: NAME (NULL when the uid has none). */
typedef const char *(*ll_lease_user_fn)(unsigned uid, void *arg);

/* Request M (`lease_issue`: target, request, optional ttl_s and uid) from
 * a client of uid CALLER at NOW_MS: a new signed lease (a new reference:
 * the `lease` object), or NULL with WHY.  The lease names the caller's own
 * uid; naming another is refused unless the caller is root. */
json_t *ll_lease_issue(ll_lease_ctx_t *ctx, const json_t *m, unsigned caller, long long now_ms,
                       ll_lease_user_fn user, void *arg, char *why, size_t wlen);

/* Request M (`lease_redeem`: lease) from a client of uid CALLER at NOW_MS:
 * checked and its nonce spent.  The `redeemed` frame (a new reference), or
 * NULL with WHY and nothing spent.  A caller may redeem a lease for its own
 * uid, or root for any; the uid must have the lease's user name here. */
json_t *ll_lease_redeem(ll_lease_ctx_t *ctx, const json_t *m, unsigned caller, long long now_ms,
                        ll_lease_user_fn user, void *arg, char *why, size_t wlen);

/* The wall clock, ms since the epoch (leases carry it: the hosts' clocks
 * must agree within LL_LEASE_SKEW_MS). */
long long ll_lease_now_ms(void);

/* Frame M from a client of uid CALLER, if it is a lease request
 * (`lease_issue`, `lease_redeem`): its answer (`lease`, `redeemed` or
 * `error`; a new reference), and a line for the log in LINE.  NULL when M
 * is no lease request.  CTX NULL (no cluster key): an `error` saying so. */
json_t *ll_lease_answer(ll_lease_ctx_t *ctx, const json_t *m, unsigned caller,
                        ll_lease_user_fn user, void *arg, char *line, size_t llen);

/* The hostd's lease context from its arguments: CONFIG (the cluster
 * config, JSON: its "host" and "key_file"; NULL: none), then KEY_FILE and
 * HOST given on the command line (NULL: the config's; the key's default
 * LL_LEASE_DEFAULT_KEY, the host's this machine's hostname), the replay
 * cache starting at NOW_MS.  NULL with WHY empty when none of the three is
 * given (a hostd without cluster leases), NULL with WHY on any error: a
 * missing, unreadable or malformed config, a key file that is missing,
 * too short or readable by others, a bad host name. */
ll_lease_ctx_t *ll_lease_ctx_setup(const char *config, const char *key_file, const char *host,
                                   long long now_ms, char *why, size_t wlen);

#endif
