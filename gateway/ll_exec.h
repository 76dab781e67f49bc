/* ll_exec: how the kernel runs what its dispatcher hands it; the execution
 * policy behind the protocol core (gateway/ll_kernel.c).
 *
 * The dispatcher knows requests, channels and the busy/reply/idle order; this
 * module knows where a cell runs and what has to happen around it:
 *   - every request the interpreter serves (execute, complete, inspect,
 *     history, is_complete, comm_info, comm_open/msg/close) goes through
 *     ll_exec_execute or ll_exec_request;
 *   - with GPU routing on (LOOSELEAF_GPU_ROUTING, default on), each executed
 *     cell gets a plan from the cell analysis (gateway/ll_route.h).  A CPU
 *     cell runs in the interpreter with its plan as an explicit argument
 *     (coherence.py refreshes and marks its closure); a GPU cell has the
 *     interpreter commit what it needs (looseleaf_before_gpu), runs on a
 *     worker through the host pool, then the interpreter records it
 *     (looseleaf_after_gpu).  The interpreter's side of these messages is
 *     kernel/py/looseleaf_kernel/API.md;
 *   - edit-time prefetch: requests that carry draft code are hints; after a
 *     debounce a GPU-labelled hint has the interpreter commit and the pool
 *     prepare the session's worker, and a Run of the same code right after
 *     reuses that commit;
 *   - idle commit: what user code changed in the interpreter is committed
 *     once the kernel stays idle a while, so a GPU cell's Run finds nothing
 *     to commit; what is slow to save, once it stays idle longer
 *     (LOOSELEAF_SLOW_COMMIT_IDLE_S), giving way to any request.
 * Its timers and the pool connection's fd feed the shell loop's poll
 * (ll_exec_fd, ll_exec_timeout, ll_exec_on_fd, ll_exec_on_timer).
 *
 * Knobs (read once, at ll_exec_new): LOOSELEAF_GPU_ROUTING (0: every cell
 * in the interpreter, no analysis), LOOSELEAF_PREFETCH_DEBOUNCE_MS (250),
 * LOOSELEAF_PREFETCH_MAX_WAIT_MS (1000), LOOSELEAF_IDLE_COMMIT_MS (250; 0:
 * never).
 *
 * Threads: the shell (main) thread, where the interpreter lives; except
 * ll_exec_usage, which the control thread calls. */
#ifndef LL_EXEC_H
#define LL_EXEC_H

#include <jansson.h>
#include <stdbool.h>

#include "gateway/ll_iopub.h"
#include "gateway/ll_stdin.h"
#include "proto/ll_wire.h"

typedef struct ll_exec_t ll_exec_t;

/* What the execution side needs of the kernel process (all borrowed). */
typedef struct {
    ll_iopub_t *iopub;      /* output of cells on workers */
    ll_stdin_t *stdin_chan; /* input() of cells on workers */
    int intr_fd;            /* eventfd: SIGINT, shutdown or SIGTERM arrived */
    bool (*stopping)(void); /* the kernel is shutting down */
    /* Read the shell queue ahead and return the first execute_request
     * waiting in it (borrowed, NULL when none): while a CPU cell runs, the
     * next GPU cell of a "Run all" gets its worker prepared. */
    const ll_msg_t *(*next_queued_execute)(void *ctx);
    /* While a GPU cell runs on a worker, SHELL_HANDLE (the shell socket's
     * zmq handle) is polled too; when readable, SHELL_READABLE reads it
     * ahead, answering at once what needs no interpreter (kernel_info). */
    void *shell_handle;
    void (*shell_readable)(void *ctx);
    void *ctx; /* for next_queued_execute and shell_readable */
} ll_exec_env_t;

/* After ll_interp_init.  ENV is copied.  Never NULL unless out of memory:
 * when the cell analysis cannot start, routing is off (logged) and every
 * cell runs in the interpreter. */
ll_exec_t *ll_exec_new(const ll_exec_env_t *env);

/* Before ll_interp_finalize: closes the pool connection (the pool then kills
 * this kernel's running workers).  Nulls *SELF_P; safe on NULL. */
void ll_exec_destroy(ll_exec_t **self_p);

/* Run REQ, an execute_request whose content has a string "code".  On
 * return *REPLY_P is the execute_reply content and *MD_P its metadata, both
 * new, either NULL when the interpreter gave nothing valid (the caller
 * answers with an error).  metadata.looseleaf holds the routing report. */
void ll_exec_execute(ll_exec_t *self, ll_msg_t *req, json_t **reply_p, json_t **md_p);

/* Serve any other interpreter request REQ.  Returns the reply content text
 * (the caller frees it; NULL for messages without a reply) and in *MD_TEXT
 * its metadata text or NULL (the caller frees it). */
char *ll_exec_request(ll_exec_t *self, const ll_msg_t *req, char **md_text);

/* DYNAMIC ({bound, unbound}: what a subshell's cell bound, as the
 * interpreter reports it in metadata.looseleaf.dynamic) reaches the cell
 * analysis before the next cell is planned, so later GPU cells restore
 * those names.  Any thread (a subshell's); DYNAMIC is copied. */
void ll_exec_note_dynamic(ll_exec_t *self, const json_t *dynamic);

/* The cell being edited will not run as prepared (an execute failed with
 * stop_on_error, so the queue is aborted): drop the prefetch. */
void ll_exec_cancel_prefetch(ll_exec_t *self);

/* SIGINT arrived: drop the pending hint and the prefetch. */
void ll_exec_interrupted(ll_exec_t *self);

/* For the shell loop's poll: the pool connection's fd (-1 when none) and the
 * milliseconds until a timer is due (-1 when none). */
int ll_exec_fd(ll_exec_t *self);
long ll_exec_timeout(ll_exec_t *self);

/* The fd was readable: take the pool's events nobody waits for. */
void ll_exec_on_fd(ll_exec_t *self);

/* After the poll: do a timer's work if one is due (a debounced hint first;
 * the idle commit and the background commit of slow-to-save values only
 * when SHELL_WAITING is false: a request goes first, and one arriving during
 * the background commit makes it give way).
 * True when it did something. */
bool ll_exec_on_timer(ll_exec_t *self, bool shell_waiting);

/* %looseleaf: the pool's state (a new object; waits up to TIMEOUT_MS), NULL
 * without a pool connection. */
json_t *ll_exec_pool_stats(ll_exec_t *self, int timeout_ms);

/* usage_request: this kernel's GPU time {gpu_held_s, connected_s,
 * held_share} (a new object) or NULL before any.  Any thread. */
json_t *ll_exec_usage(void);

int ll_exec_selftest(bool verbose);

#endif
