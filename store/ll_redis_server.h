/* ll_redis_server: a session's private redis-server (one per runtime
 * directory) and its guard.
 *
 * The server listens only on RUNTIME_DIR/redis.sock, keeps an append-only
 * file there (appendfsync always: an acknowledged commit survives a kill),
 * lets in only its ACL user (the default user is off) and dies with the
 * thread that started it (PR_SET_PDEATHSIG), so it never outlives its kernel.
 * The guard, a thread of the process that owns the server (the kernel),
 * notices when the server dies (a pidfd), reaps it, and starts it again on
 * the same data; a server that stops answering (SIGSTOP, a stall) is killed
 * after half the store's timeout and started again the same way.
 *
 * Any process; the guard runs on a thread of its own. */
#ifndef LL_REDIS_SERVER_H
#define LL_REDIS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Start a private redis-server in RUNTIME_DIR (created 0700; must be ours
 * and not accessible to others) on the unix socket RUNTIME_DIR/redis.sock,
 * no TCP port, append-only file in the directory so a restarted server gets
 * its data back, unless one already answers there.  Its only user is
 * "looseleaf" (password in RUNTIME_DIR/redis.pass, 0600), allowed the
 * store's commands on the keys of SESSION (ll:SESSION:*; every ll:* key
 * when SESSION is NULL).  Polls until it answers.  Returns the socket path
 * (caller frees) or NULL with a reason in ERR.  *STARTED says whether this
 * call started it.  The server gets SIGKILL when the calling thread ends. */
char *ll_redis_start(const char *runtime_dir, const char *session, bool *started, char *err,
                     size_t errlen);

/* Stop the private redis-server of RUNTIME_DIR (SIGTERM, then wait until it
 * is gone).  Returns 1 when one was stopped, 0 when none ran, -1 on error. */
int ll_redis_stop(const char *runtime_dir, char *err, size_t errlen);

/* The pid of RUNTIME_DIR's redis-server (from its pid file, checked to be a
 * running redis-server), or 0. */
pid_t ll_redis_server_pid(const char *runtime_dir);

typedef struct ll_redis_guard_t ll_redis_guard_t;

/* Watch the server of RUNTIME_DIR (started for SESSION, see
 * ll_redis_start) from a thread of this process, as described above.
 * Returns a guard the caller destroys, or NULL (no thread; logged). */
ll_redis_guard_t *ll_redis_guard_new(const char *runtime_dir, const char *session);

/* Stop watching (the server is left running); nulls *G_P; NULL ok.  A
 * no-op but for the memory in a fork child. */
void ll_redis_guard_destroy(ll_redis_guard_t **g_p);

/* Servers the guard started again since it began (it died or stalled). */
unsigned long ll_redis_guard_restarts(ll_redis_guard_t *g);

#endif
