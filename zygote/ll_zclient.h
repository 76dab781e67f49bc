/* ll_zclient: the kernel's side of the host pool (zygote/API.md tells the
 * whole story).  Runs in the kernel process (the gateway's shell thread);
 * the pool runs in its own process (zygote/ll_hostpool.h).
 *
 * A client is not thread-safe: use it from one thread (its fd fits a poll
 * loop).  The kernel has ZeroMQ threads and never forks: a missing pool is
 * started with posix_spawn and detaches itself. */
#ifndef LL_ZCLIENT_H
#define LL_ZCLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Default runtime dir of the pool of binary EXE (NULL: this process's):
 * $LOOSELEAF_POOL_DIR, else $XDG_RUNTIME_DIR/looseleaf-pool-<build>, else
 * /tmp/looseleaf-pool-<uid>-<build> (<build>: the first 8 digits of EXE's
 * build id), with a suffix for a Python environment other than the
 * build's: kernels of two builds or two environments never share a pool. */
void ll_zclient_default_dir(const char *exe, char *out, size_t outlen);

/* The build id of binary EXE (NULL: this process's own, computed once): 16
 * hex digits of the XXH64 of its bytes, so two checkouts, or a build and
 * its upgrade, differ while copies of one binary agree.  A pool writes its
 * own to pool.build in its runtime dir; a client refuses a pool of another
 * build (the dir named by LOOSELEAF_POOL_DIR is not per build).  0, or -1
 * when EXE cannot be read. */
int ll_zclient_build_id(const char *exe, char *out, size_t outlen);

/* Whether environment entry E ("NAME=value") is one a pool keeps of the
 * kernel that starts it (the rest is that kernel's own). */
bool ll_zclient_env_kept(const char *e);

typedef struct ll_zclient_t ll_zclient_t;

/* Connect to the pool of RUNTIME_DIR (NULL: the default), starting it when
 * none answers: exec of EXE (NULL: /proc/self/exe) with
 * `pool --runtime-dir DIR` plus EXTRA_ARGS (NULL-terminated, may be NULL),
 * which detaches itself.  Returns a client (the caller destroys it) or NULL
 * with a reason in ERR. */
ll_zclient_t *ll_zclient_connect(const char *runtime_dir, const char *exe,
                                 const char *const *extra_args, char *err, size_t errlen);

/* Close the connection (the pool cancels this client's running cells) and
 * null *SELF_P.  Safe on NULL and twice. */
void ll_zclient_destroy(ll_zclient_t **self_p);

/* A fd that becomes readable when an event may be waiting (owned by the
 * client). */
int ll_zclient_fd(ll_zclient_t *self);

/* Run one GPU cell.  REQUEST is a JSON object (borrowed) with:
 *   id (str, unique per client)        session (str)       code (str)
 *   store_dir (str: the store's runtime dir)   redis_url (str, optional)
 *   state_closure, import_closure, defines, deletes (arrays of str)
 *   parent (object: the execute_request's header)   execution_count (int)
 *   allow_stdin (bool)   user_expressions (object, optional)
 * Events for it come back through ll_zclient_next.  Returns 0, or -1 with
 * a reason in ERR (bad request, pool gone). */
int ll_zclient_run(ll_zclient_t *self, const json_t *request, char *err, size_t errlen);

/* Prepare a worker for the session's next GPU cell without running code (an
 * edit-time hint).  REQUEST (borrowed) as for ll_zclient_run, without code:
 * id, session, store_dir, redis_url, state_closure, import_closure,
 * import_stmts, optional closure_bytes.  The session's warm worker restores
 * what moved; else a worker is forked and prepared: into a free slot when
 * no cell waits for one; else into the slot of the idle warm worker it
 * evicts, when that worker's state is older than what the prefetch brings
 * or the session holds its prefetch credit; else staged, without a slot;
 * else it is skipped (zygote/API.md, "Warm workers").  One event answers
 * it: prefetched {ok, warm_hit, staged, restored, ...} or {ok: false,
 * skipped|error}.  ll_zclient_cancel(ID) drops it.  Refused (an error
 * event) when the pool runs without warm workers. */
int ll_zclient_prefetch(ll_zclient_t *self, const json_t *request, char *err, size_t errlen);

/* Next event (a JSON object, the caller owns it) or NULL when none arrived
 * within TIMEOUT_MS (0: do not wait, -1: forever).  Every event has "type"
 * and, for a cell, "id":
 *   wait          {slots, queued}: every slot is held; the cell waits
 *   started       {pid, node, fork_ms}: the worker is ready (pid final)
 *   stream        {name, text}
 *   iopub         {msg_type, content, metadata}: display_data, execute_result,
 *                 error, clear_output, ... to publish under the parent header
 *   input_request {prompt, password}: answer with ll_zclient_input_reply
 *   reply         {content, metadata}: the execute_reply; metadata.looseleaf
 *                 holds the per-cell report.  The last event of a cell.
 *   error         {error}: a malformed request (nothing ran)
 *   stats         answer to ll_zclient_stats (workers, sessions: GPU-seconds)
 *   prefetched    answer to ll_zclient_prefetch
 *   pool_gone     the connection to the pool broke (every running cell is
 *                 lost); returned once, then ll_zclient_ok() is false and
 *                 every later call returns NULL. */
json_t *ll_zclient_next(ll_zclient_t *self, int timeout_ms);

/* Whether the connection to the pool is still up. */
bool ll_zclient_ok(ll_zclient_t *self);

/* Answer the input_request of cell ID with VALUE ("\x04" = EOF).  Returns 0,
 * or -1 when the connection is gone. */
int ll_zclient_input_reply(ll_zclient_t *self, const char *id, const char *value);

/* Interrupt the cell ID (SIGINT to its worker: KeyboardInterrupt in the cell;
 * a waiting cell is dropped with an interrupted reply).  0 or -1. */
int ll_zclient_interrupt(ll_zclient_t *self, const char *id);

/* Cancel the cell ID: its worker is killed (nothing after the last commit is
 * kept) and its reply says "cancelled".  0 or -1. */
int ll_zclient_cancel(ll_zclient_t *self, const char *id);

/* Ask the pool for its state (event type "stats": slots, nodes, workers).
 * 0 or -1. */
int ll_zclient_stats(ll_zclient_t *self);

#endif
