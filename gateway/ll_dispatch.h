/* ll_dispatch: the kernel's request dispatcher, apart from the process
 * around it.  It owns the ordering every frontend relies on: status busy ->
 * handler (output, reply) -> status idle, each under the request's header;
 * which request types are served on which channel (proto/ll_msgtype.h);
 * the shell queue (requests read ahead while a GPU cell runs, the execute
 * requests aborted after an error with stop_on_error); and the requests it
 * can answer without the interpreter (kernel_info from a cache, connect,
 * shutdown).  Everything else is the caller's handler table: the kernel
 * process (gateway/ll_kernel.c) gives the real ones, which reach the
 * interpreter; the self-test gives stubs and in-process sockets.
 *
 * Threads: the shell functions run on one thread (the kernel's main
 * thread); ll_dispatch_control on another (the control thread).  Both send
 * on the shared iopub (ll_iopub locks) and read the handler table and the
 * cached kernel_info, which do not change after ll_dispatch_new.  What
 * crosses threads is atomic: the shutdown flag.
 *
 * Subshells (JEP 91, as ipykernel 7 has them), when the env gives
 * SUBSHELL_FORWARD: a relay thread then owns the shell ROUTER.  It verifies
 * each request and routes it by header.subshell_id: none to the main shell
 * (an inproc pipe the main thread reads and replies on, so the functions
 * below keep their meaning), a live subshell's to that subshell's thread,
 * an unknown one gets an error reply at once (busy, reply, idle).  Each
 * subshell thread serves its requests in order, busy -> handler -> idle
 * like the main shell, its output under its own request
 * (ll_iopub_set_thread_parent); the interpreter's types go to
 * SUBSHELL_FORWARD there.  A subshell's queue is its own: stop_on_error
 * (ll_dispatch_take_queue on that thread) aborts its requests only.
 * create/delete/list_subshell_request on control manage them.
 *
 * Bad wire input (a bad signature, a replay, a malformed header) is logged,
 * the reason only and at most a line per interval, and dropped: nothing
 * here asserts on it. */
#ifndef LL_DISPATCH_H
#define LL_DISPATCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "gateway/ll_iopub.h"
#include "proto/ll_msgtype.h"
#include "proto/ll_wire.h"

typedef struct ll_dispatch_t ll_dispatch_t;

/* A handler: serve REQ, which came on CHAN (LL_MSG_ON_SHELL or
 * LL_MSG_ON_CONTROL), replying on SOCK (ll_dispatch_reply).  CTX is the
 * env's.  It is called between the busy and the idle status. */
typedef void(ll_dispatch_fn)(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan,
                             zsock_t *sock);

typedef struct {
    const char *msg_type; /* a type of proto/ll_msgtype.c */
    ll_dispatch_fn *fn;
} ll_dispatch_handler_t;

/* What the dispatcher needs of its process; borrowed, must outlive it. */
typedef struct {
    ll_session_t *session; /* signs and verifies */
    ll_iopub_t *iopub;     /* status, output, shutdown_reply */
    zsock_t *shell;        /* ROUTER, receive timeout 0; read only by the shell thread */
    zsock_t *control;      /* ROUTER; read only by the control thread */
    /* The caller's handlers, ended by a NULL msg_type.  A type flagged
     * LL_MSG_INTERP with no entry here goes to FORWARD (the interpreter);
     * kernel_info, connect and shutdown are served here unless named. */
    const ll_dispatch_handler_t *handlers;
    ll_dispatch_fn *forward;
    /* Called after every shell request's handler, before its idle: make
     * what it wrote to fds 1/2 stream text, put signal handlers back. */
    void (*after_shell)(void *ctx);
    /* Called after a shutdown_request was answered (RESTART: the request's
     * restart flag): wake whoever waits. */
    void (*on_shutdown)(void *ctx, bool restart);
    /* Whether the process is going anyway (SIGTERM); may be NULL.  Requests
     * taken from the queue are then dropped unanswered. */
    bool (*stopping)(void *ctx);
    /* Subshells on when set: serves every LL_MSG_INTERP type on a subshell
     * thread (not the main thread: it must not need the interpreter's
     * main-thread state).  NULL: subshell_id is ignored, as before JEP 91,
     * and create_subshell_request gets an error reply. */
    ll_dispatch_fn *subshell_forward;
    /* Called on a subshell's thread as it ends, after its last request;
     * may be NULL. */
    void (*subshell_end)(void *ctx);
    void *ctx;
    const int *ports;    /* connect_reply's, indexed by ll_channel_t (LL_CHAN_COUNT) */
    json_t *kernel_info; /* kernel_info_reply content; the dispatcher takes the reference */
} ll_dispatch_env_t;

/* A dispatcher over ENV, or NULL (out of memory; ENV's kernel_info is then
 * released). */
ll_dispatch_t *ll_dispatch_new(const ll_dispatch_env_t *env);

/* Stop the subshells: each finishes the request it serves (waiting at most
 * WAIT_MS for it), answers what it had queued with an error, and ends; the
 * relay keeps going.  Before the interpreter is finalized.  Main thread. */
void ll_dispatch_stop_subshells(ll_dispatch_t *self, int wait_ms);

/* The socket the main thread polls for shell requests: the ROUTER, or with
 * subshells the relay's pipe (borrowed). */
zsock_t *ll_dispatch_shell_socket(ll_dispatch_t *self);

/* The subshell that the calling thread serves, or NULL (the main shell, or
 * any other thread).  The id is borrowed for the request's handler. */
const char *ll_dispatch_current_subshell(void);

/* Destroy *SELF_P (requests still queued are dropped unanswered); NULL-safe,
 * nulls the caller's pointer. */
void ll_dispatch_destroy(ll_dispatch_t **self_p);

/* The next shell request to serve: one read ahead first, else one waiting
 * on the socket (never blocks), else NULL.  The caller owns it. */
ll_msg_t *ll_dispatch_next_shell(ll_dispatch_t *self);

/* Serve REQ from shell (busy, handler, idle), then answer what an error
 * with stop_on_error took from the queue.  REQ stays the caller's. */
void ll_dispatch_shell(ll_dispatch_t *self, ll_msg_t *req);

/* Read and serve every request waiting on control (never blocks).  Control
 * thread. */
void ll_dispatch_control(ll_dispatch_t *self);

/* Reply REPLY_TYPE with CONTENT (and METADATA, may be NULL; both taken) to
 * REQ on SOCK.  0, or -1 (logged). */
int ll_dispatch_reply(ll_dispatch_t *self, zsock_t *sock, const ll_msg_t *req,
                      const char *reply_type, json_t *content, json_t *metadata);

/* An error reply's content, shaped like ipykernel's so frontends show it. */
json_t *ll_dispatch_error_content(const char *ename, const char *evalue);

/* stop_on_error: take every request already queued on shell, to be served
 * after the failing request's idle, its execute requests answered
 * "aborted".  Called by the execute handler before its error reply leaves,
 * so a request sent after the client saw that reply always runs. */
void ll_dispatch_take_queue(ll_dispatch_t *self);

/* Read shell ahead into the queue (a GPU cell runs elsewhere) and return
 * the first execute_request waiting there, or NULL. */
const ll_msg_t *ll_dispatch_next_queued_execute(ll_dispatch_t *self);

/* Read shell ahead into the queue, answering each kernel_info_request at
 * once from the cache (jupyter_server's nudge on every new connection must
 * not wait for a running cell), with its busy/idle but without becoming the
 * running cell's parent. */
void ll_dispatch_shell_readable(ll_dispatch_t *self);

/* How many shell requests were read ahead and wait in the queue. */
size_t ll_dispatch_queued(const ll_dispatch_t *self);

/* The cached kernel_info_reply content (borrowed). */
const json_t *ll_dispatch_kernel_info(const ll_dispatch_t *self);

/* Whether a shutdown_request was answered.  Any thread. */
bool ll_dispatch_shutting_down(const ll_dispatch_t *self);

/* Whether HANDLERS (with FORWARD for the interpreter's types) and the
 * dispatcher's own serve every type proto/ll_msgtype.c lets a frontend
 * send, on its channels, and name no type it does not: 0, or -1 with the
 * first mismatch in WHY.  ll_dispatch_new refuses a table that fails. */
int ll_dispatch_check(const ll_dispatch_handler_t *handlers, ll_dispatch_fn *forward, char *why,
                      size_t whylen);

/* "xxx_request" -> "xxx_reply" into BUF; false for types that get no
 * reply (comm_open, comm_msg, comm_close). */
bool ll_dispatch_reply_type(const char *req_type, char *buf, size_t len);

int ll_dispatch_selftest(bool verbose);

#endif
