/* ll_redis: the store's Redis: a private redis-server per runtime directory,
 * and a hiredis connection that reconnects after Redis restarted.
 * Not thread-safe: one connection per ll_store_t, used under its mutex. */
#ifndef LL_REDIS_H
#define LL_REDIS_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ll_redis_t ll_redis_t;

/* Start a private redis-server in RUNTIME_DIR (created 0700; must be ours
 * and not accessible to others) on the unix socket RUNTIME_DIR/redis.sock,
 * no TCP port, append-only file in the directory so a restarted server gets
 * its data back, unless one already answers there.  Polls until it answers.
 * Returns the socket path (caller frees) or NULL with a reason in ERR.
 * *STARTED says whether this call started it. */
char *ll_redis_start(const char *runtime_dir, bool *started, char *err, size_t errlen);

/* Stop the private redis-server of RUNTIME_DIR (SIGTERM, then wait until it
 * is gone).  Returns 1 when one was stopped, 0 when none ran, -1 on error. */
int ll_redis_stop(const char *runtime_dir, char *err, size_t errlen);

/* Connect to URL ("unix:///path", "redis://host:port", or a bare socket
 * path).  Returns NULL with a reason in ERR. */
ll_redis_t *ll_redis_connect(const char *url, char *err, size_t errlen);
void ll_redis_destroy(ll_redis_t **r_p);

/* Run one command (redisCommandArgv), reconnecting and retrying once when
 * the connection broke (callers use it only for commands that may run
 * twice).  Returns a reply the caller frees (an error reply is returned as
 * such) or NULL with the reason in ll_redis_errstr. */
redisReply *ll_redis_cmd(ll_redis_t *r, int argc, const char **argv, const size_t *lens);
redisReply *ll_redis_cmdf(ll_redis_t *r, const char *fmt, ...);

/* Pipelining without retry: append commands, then read their replies. */
int ll_redis_append(ll_redis_t *r, int argc, const char **argv, const size_t *lens);
redisReply *ll_redis_reply(ll_redis_t *r);

/* Whether the connection is up (no sticky error). */
bool ll_redis_connected(ll_redis_t *r);

/* Make sure the connection is usable (reconnect if broken).  0 or -1. */
int ll_redis_ensure(ll_redis_t *r);

/* Drop the connection and anything queued on it; the next call reconnects. */
void ll_redis_reset(ll_redis_t *r);

/* Tests: send what is buffered, then cut the connection before any reply
 * is read (LL_STORE_FAULT=drop_after_exec). */
void ll_redis_fault_drop(ll_redis_t *r);

/* The last error (sticky until the next successful reconnect). */
const char *ll_redis_errstr(ll_redis_t *r);
const char *ll_redis_url(ll_redis_t *r);
unsigned long ll_redis_reconnects(ll_redis_t *r);

#endif
