/* ll_redis_internal: the connection's handle (ll_redis.h), shared by
 * ll_redis.c and its self-test (ll_redis_selftest.c, which shortens a
 * call's timeout and reads the last error).  Nobody else should see it. */
#ifndef LL_REDIS_INTERNAL_H
#define LL_REDIS_INTERNAL_H

#include "store/ll_redis.h"

#include <hiredis/hiredis.h>
#include <stdbool.h>

struct ll_redis_t {
    redisContext *c;          /* NULL or a context (maybe with err set) */
    char *url;                /* as given */
    char *path;               /* unix socket, or NULL */
    char *host;               /* tcp host, or NULL */
    int port;                 /* tcp port */
    char *password;           /* the private server's (AUTH looseleaf ...), or NULL */
    char *user;               /* TCP: the ACL user of LL_REDIS_USER (NULL: S_USER) */
    char err[256];            /* last error */
    unsigned long reconnects; /* successful reconnects after a failure */
    double timeout_ms;        /* of one call */
    double deadline;          /* ll_clock_ms() when the current call gives up */
    int failure;              /* ll_redis_failure_t of the current call */
    int cancel_fd;            /* -1, or: readable ends a wait */
    bool cancel_drain;        /* ll_redis_begin empties cancel_fd */
    bool (*cancel_check)(void *ctx);
    bool quiet; /* this call ignores the cancel fd and check (ll_redis_begin_quiet) */
    void *cancel_ctx;
};

#endif
