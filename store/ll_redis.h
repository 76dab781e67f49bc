/* ll_redis: the store's connection to Redis: a hiredis connection that
 * reconnects after Redis restarted, authenticates as the private server's
 * ACL user (ll_redis_server.h), never waits longer than the call's deadline
 * and ends a wait when the caller is interrupted, and helpers to build and
 * pipeline commands on it (a MULTI ... EXEC is sent as one pipeline and its
 * replies read after).
 *
 * A "call" is one store operation (ll_redis_begin starts it): every wait of
 * the call shares its deadline, and once the call failed for want of Redis
 * (no answer in time, no server to reconnect to) or was interrupted, every
 * further command of the call fails at once, so a store operation never
 * waits much longer than one timeout, whatever it retries.
 * Not thread-safe: one connection per ll_store_t, used under its mutex. */
#ifndef LL_REDIS_H
#define LL_REDIS_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ll_redis_t ll_redis_t;

/* Why the current call failed (sticky until the next ll_redis_begin). */
typedef enum {
    LL_REDIS_OK = 0,
    LL_REDIS_UNAVAILABLE = 1, /* no answer within the deadline, or no server to reach */
    LL_REDIS_CANCELLED = 2,   /* the cancel fd fired or the cancel check said so */
} ll_redis_failure_t;

/* Seconds a store call may wait for Redis: LL_STORE_TIMEOUT_S (a positive
 * number), default 10. */
double ll_redis_timeout_s(void);

/* Connect to URL ("unix:///path", "redis://host:port", or a bare socket
 * path).  A unix socket in a directory holding a private server's password
 * file (ll_redis_server.h) is logged into as its ACL user.  Returns a
 * connection the caller destroys (ll_redis_destroy), or NULL with a reason
 * in ERR. */
ll_redis_t *ll_redis_connect(const char *url, char *err, size_t errlen);
/* The same with calls (and the connect itself) limited to TIMEOUT_MS
 * instead of ll_redis_timeout_s(), and CANCEL_FD (-1: none) ending its waits
 * from the start, the connect's login included (ll_redis_set_cancel, not
 * drained). */
ll_redis_t *ll_redis_connect_timeout(const char *url, double timeout_ms, int cancel_fd, char *err,
                                     size_t errlen);
void ll_redis_destroy(ll_redis_t **r_p);

/* Start a call: its deadline is ll_redis_timeout_s() from now, its failure
 * is cleared, and (when the cancel fd drains) interrupts from before it are
 * dropped. */
void ll_redis_begin(ll_redis_t *r);
/* A call of a background thread (the store's idle reclamation): a
 * deadline of at most MS, and neither the cancel fd (whose interrupts are
 * the caller's main thread's) nor the cancel check (which may take the
 * GIL) is looked at.  The next ll_redis_begin ends it. */
void ll_redis_begin_quiet(ll_redis_t *r, double ms);

/* What ends a wait early, besides the deadline: FD (>= 0) becoming
 * readable (DRAIN: it is an eventfd or pipe of interrupts that ll_redis_begin
 * empties, so only one that comes during the call counts; otherwise it is
 * only polled), and CHECK(CTX) returning true (called every 100 ms of a
 * wait, on the waiting thread).  -1 / NULL: none. */
void ll_redis_set_cancel(ll_redis_t *r, int fd, bool drain, bool (*check)(void *ctx), void *ctx);

/* Why the current call failed, LL_REDIS_OK if it did not (or failed only
 * with an error reply, which is returned as such). */
int ll_redis_failure(ll_redis_t *r);

/* Run one command, reconnecting and retrying once when the connection
 * broke (callers use it only for commands that may run twice), and while a
 * restarted server still loads its data (-LOADING), until the deadline.
 * Returns a reply the caller frees (an error reply is returned as such) or
 * NULL with the reason in ll_redis_errstr. */
redisReply *ll_redis_cmd(ll_redis_t *r, int argc, const char **argv, const size_t *lens);
redisReply *ll_redis_cmdf(ll_redis_t *r, const char *fmt, ...);

/* Pipelining without retry: append commands, then read their replies.
 * ll_redis_reply returns a reply the caller frees (freeReplyObject), or
 * NULL when the connection broke, the deadline passed or the call was
 * cancelled (the reason in ll_redis_errstr; the connection is dropped:
 * what it was in the middle of is unknown). */
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

/* Make sure the connection is usable: reconnect if broken, polling with
 * backoff for up to 3 s (a restarting server needs a moment) within the
 * call's deadline.  0 or -1. */
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
