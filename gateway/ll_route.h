/* ll_route: the two mechanisms GPU routing is made of (DESIGN.md
 * "life of a cell"), driven by the execution policy in gateway/ll_exec.h:
 *
 *   the plan   every executed cell is analysed against the session's def-use
 *              graph (analysis/ll_analysis.h) and recorded in it after it ran
 *              (ll_route_plan / ll_route_done): its state and import closure
 *              and its CPU/GPU label;
 *   the relay  a GPU cell is handed to the host pool (zygote/ll_zclient.h),
 *              whose worker restores the closure from the store, runs the
 *              cell, streams its output and saves; this thread relays the
 *              worker's output to iopub, its input() prompts to stdin, SIGINT
 *              to the worker, and waits for the reply (ll_route_run_gpu).
 *              Prefetches, their cancellation and the pool's stats go over
 *              the same connection.
 *
 * Switch: LOOSELEAF_GPU_ROUTING=0 turns routing off (every cell runs in the
 * interpreter, no analysis); on by default.
 *
 * Threads: main (shell) thread only; takes the GIL itself where the
 * analysis needs Python. */
#ifndef LL_ROUTE_H
#define LL_ROUTE_H

#include <czmq.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "gateway/ll_iopub.h"
#include "gateway/ll_stdin.h"
#include "proto/ll_wire.h"

typedef struct ll_route_t ll_route_t;
typedef struct ll_route_plan_t ll_route_plan_t;

/* Whether routing is on (LOOSELEAF_GPU_ROUTING is not "0"). */
bool ll_route_enabled(void);

/* After ll_interp_init.  The caller owns the result (ll_route_destroy).
 * Returns NULL with a reason in ERR. */
ll_route_t *ll_route_new(char *err, size_t errlen);

/* Before ll_interp_finalize: also closes the connection to the host pool
 * (which kills this kernel's running workers).  Nulls *SELF_P; NULL ok. */
void ll_route_destroy(ll_route_t **self_p);

/* Analyse CODE (LEN bytes, may contain NUL) before it runs.  Returns a plan
 * the caller owns until ll_route_done or ll_route_plan_free (never NULL
 * unless out of memory); a cell that does not parse gets a plan without
 * closure. */
ll_route_plan_t *ll_route_plan(ll_route_t *self, const char *code, size_t len);

/* Whether the plan sends the cell to a worker (labelled GPU). */
bool ll_route_is_gpu(const ll_route_plan_t *plan);

/* Connect to the host pool now, starting it if it does not run (the first
 * GPU cell does the same): 0, or -1 with a reason in ERR. */
int ll_route_connect(ll_route_t *self, char *err, size_t errlen);

/* Whether PLAN's cell parsed (a cell too big to analyse counts as parsed). */
bool ll_route_plan_parsed(const ll_route_plan_t *plan);

/* Whether the cell of PLAN reads or deletes a name that is a key of object
 * NAMES (the names whose values live in the session's home worker). */
bool ll_route_plan_reads(const ll_route_plan_t *plan, const json_t *names);

/* {state, writes, deletes, import_stmts, unknown} of the cell's closure (a new object), for
 * the interpreter's coherence bookkeeping; NULL when the cell did not parse.  A cell over
 * LOOSELEAF_ANALYSIS_MAX_BYTES (default 1 MiB) is not analysed at all (its plan says
 * unknown: it may read or change anything, and is never GPU); from then on every plan says
 * unknown and GPU cells restore every variable. */
json_t *ll_route_plan_closure(const ll_route_plan_t *plan);

/* The plan as execute_reply.metadata.looseleaf (a new object): ROUTE is
 * where the cell ran ("cpu", "gpu"). */
json_t *ll_route_plan_json(const ll_route_plan_t *plan, const char *route);

/* The cell ran (successfully or not): record it in the session, then what
 * the namespace showed it bound or deleted beyond its analysis (DYNAMIC,
 * borrowed, may be NULL: {"bound": {name: [path, stmt, [deps], opaque]},
 * "unbound": [name]}, from coherence.namespace_diff in the process that ran
 * it); free the plan, null *PLAN_P. */
void ll_route_done(ll_route_t *self, ll_route_plan_t **plan_p, const json_t *dynamic);

/* The session learns DYNAMIC ({bound, unbound}, as ll_route_done's) of code
 * that ran with no plan: a subshell's cells. */
void ll_route_note_dynamic(ll_route_t *self, const json_t *dynamic);

/* What a GPU cell's relay needs from the kernel process (all borrowed). */
typedef struct {
    ll_iopub_t *iopub;      /* output goes out under the current parent */
    ll_stdin_t *stdin_chan; /* the worker's input() prompts */
    int intr_fd;            /* eventfd: SIGINT, shutdown or SIGTERM arrived */
    bool (*stopping)(void); /* the kernel is shutting down */
    double t_run;           /* ll_clock_ms() when the execute_request arrived */
    void *shell_handle;     /* the shell socket (zmq handle), polled while the cell runs, or NULL */
    void (*shell_readable)(void *ctx); /* ... read ahead by this when readable */
    void *ctx;                         /* for shell_readable */
    /* The worker's debugger listens (its "looseleaf_debug_worker" message,
     * CONTENT borrowed: host, port): the kernel's debugger attaches to it.
     * NULL: such messages are dropped. */
    void (*debug_worker)(const json_t *content);
} ll_route_io_t;

/* Run the GPU cell of PLAN for REQ (its execute_request) on a worker.
 * SYNC is the interpreter's looseleaf_before_gpu answer (store coordinates,
 * execution_count).  On 0, *CONTENT_P is the execute_reply content and
 * *MD_P the worker's reply metadata (both new; metadata.looseleaf holds the
 * worker's report, plus visible_wait_ms: Run to the start of execution).  -1 with a reason in ERR when the cell could not be
 * handed to a worker at all (no pool): nothing ran, the caller runs it in
 * the interpreter. */
int ll_route_run_gpu(ll_route_t *self, ll_route_plan_t *plan, const ll_msg_t *req,
                     const json_t *sync, const ll_route_io_t *io, json_t **content_p, json_t **md_p,
                     char *err, size_t errlen);

/* Drop a plan without recording it (an edit-time hint, never executed). */
void ll_route_plan_free(ll_route_plan_t **plan_p);

/* Edit-time prefetch, so a GPU cell starts the moment Run is pressed: ask the
 * host pool to prepare the session's worker for the GPU cell of PLAN (state
 * and import closure), with SYNC the interpreter's looseleaf_before_gpu
 * answer (the kernel committed what CPU cells changed).  A prefetch still in
 * flight is superseded (cancelled when it prepared a different
 * closure).  Answers arrive as `prefetched` events, read by the next
 * ll_route_run_gpu or ll_route_poll.  0, or -1 with ERR. */
int ll_route_prefetch(ll_route_t *self, ll_route_plan_t *plan, const json_t *sync, char *err,
                      size_t errlen);

/* Cancel speculative work (abort, stop_on_error, interrupt). */
void ll_route_cancel_prefetch(ll_route_t *self);

/* The pool connection's fd (-1 when none), for the shell loop's poll, and
 * what to do when it is readable: drain events nobody waits for. */
int ll_route_fd(ll_route_t *self);
void ll_route_poll(ll_route_t *self);

/* The session's workers the host pool said went since the last call, as
 * [{pid, why}] (pid 0: every worker, the pool went away), or NULL: a new
 * reference, which the caller owns (coherence.home_lost takes it). */
json_t *ll_route_take_gone(ll_route_t *self);

/* The pool's `stats` answer (a new object; waits up to TIMEOUT_MS for it,
 * serving other events meanwhile), NULL without a pool connection. */
json_t *ll_route_stats(ll_route_t *self, int timeout_ms);

/* This kernel's GPU time from the pool's latest stats, for usage_request:
 * {gpu_held_s, connected_s, held_share} (a new object) or NULL before any.
 * Thread-safe (the control thread answers usage_request). */
json_t *ll_route_usage(void);

int ll_route_selftest(bool verbose);

#endif
