/* ll_redis: the store's Redis: a private redis-server per runtime directory,
 * a hiredis connection that reconnects after Redis restarted, and helpers
 * to build and pipeline commands on it (a MULTI ... EXEC is sent as one
 * pipeline and its replies read after).
 * Not thread-safe: one connection per ll_store_t, used under its mutex. */
#ifndef LL_REDIS_H
#define LL_REDIS_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
 * path).  Returns a connection the caller destroys (ll_redis_destroy), or
 * NULL with a reason in ERR. */
ll_redis_t *ll_redis_connect(const char *url, char *err, size_t errlen);
void ll_redis_destroy(ll_redis_t **r_p);

/* Run one command (redisCommandArgv), reconnecting and retrying once when
 * the connection broke (callers use it only for commands that may run
 * twice).  Returns a reply the caller frees (an error reply is returned as
 * such) or NULL with the reason in ll_redis_errstr. */
redisReply *ll_redis_cmd(ll_redis_t *r, int argc, const char **argv, const size_t *lens);
redisReply *ll_redis_cmdf(ll_redis_t *r, const char *fmt, ...);

/* Pipelining without retry: append commands, then read their replies.
 * ll_redis_reply returns a reply the caller frees (freeReplyObject), or
 * NULL when the connection broke (the reason in ll_redis_errstr). */
int ll_redis_append(ll_redis_t *r, int argc, const char **argv, const size_t *lens);
redisReply *ll_redis_reply(ll_redis_t *r);

/* One command's arguments, built up for ll_redis_send.  Zero-initialise;
 * the strings are borrowed (they must live until the send). */
typedef struct {
    const char **argv;
    size_t *lens;
    int argc, cap;
} ll_redis_argv_t;

/* Add the LEN bytes at S (ll_redis_argn) or the string S (ll_redis_arg) as
 * the next argument.  0, or -1 when out of memory (A keeps what it had). */
int ll_redis_argn(ll_redis_argv_t *a, const char *s, size_t len);
int ll_redis_arg(ll_redis_argv_t *a, const char *s);

/* Append A's command to R's pipeline (ll_redis_append) and empty A for the
 * next command (its memory is kept).  0 or -1. */
int ll_redis_send(ll_redis_t *r, ll_redis_argv_t *a);

/* Free A's memory (A is empty and reusable after). */
void ll_redis_argv_free(ll_redis_argv_t *a);

/* Read and free N pipelined replies.  0, or -1 when the connection broke. */
int ll_redis_drain(ll_redis_t *r, int n);

/* A reply's number: a string of digits or an integer; 0 for anything else
 * (nil, an error, NULL). */
uint64_t ll_redis_u64(const redisReply *reply);

/* Whether the connection is up (no sticky error). */
bool ll_redis_connected(ll_redis_t *r);

/* Make sure the connection is usable (reconnect if broken).  0 or -1. */
int ll_redis_ensure(ll_redis_t *r);

/* Drop the connection and anything queued on it; the next call reconnects. */
void ll_redis_reset(ll_redis_t *r);

/* Tests: send what is buffered, then cut the connection before any reply
 * is read (LL_STORE_FAULT=drop_after_exec). */
void ll_redis_fault_drop(ll_redis_t *r);

/* The last error (sticky until the next successful reconnect), and the URL
 * as given: the connection's strings, valid while it lives (the error's
 * text changes with the next failure). */
const char *ll_redis_errstr(ll_redis_t *r);
const char *ll_redis_url(ll_redis_t *r);
unsigned long ll_redis_reconnects(ll_redis_t *r);

#endif
