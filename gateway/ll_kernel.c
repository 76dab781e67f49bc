/* ll_kernel: the kernel process (see ll_kernel.h for the threads).
 *
 * DESIGN.  The protocol's rules (busy -> handler -> idle, the channels,
 * the shell queue, stop_on_error) are gateway/ll_dispatch.c's; this file
 * is the process around it: sockets and threads, the handlers that reach
 * the interpreter, the interpreter's hooks, signals, start-up and teardown.
 * What serves a request the interpreter answers (where a cell runs, the
 * store around GPU cells, edit-time prefetch, idle commit) is
 * gateway/ll_exec.h, whose fd and timers the shell loop polls.  Shell
 * requests run on the main thread, one at a time, because that is where the
 * interpreter lives; control requests run on the control thread and touch
 * the interpreter only through ll_interp_interrupt / ll_interp_busy
 * (async-signal-safe), the kernel_info reply cached at start-up, and
 * ll_interp_debug (debug_request: it takes the GIL like any Python thread,
 * so it is served while a cell runs or sits at a breakpoint).
 *
 * Interrupts, by signal or by interrupt_request (which raises SIGINT on our
 * process group, as ipykernel does, so `!sleep` children stop too), end in
 * s_on_sigint: a running cell gets KeyboardInterrupt, an input() waiting on
 * stdin is woken, and when idle nothing happens.  User code can replace the
 * SIGINT handler (asyncio.run does), so it is re-installed after every shell
 * request.  SIGTERM and a shutdown request wake the main loop, which leaves
 * and tears down in order: interpreter (atexit handlers still reach iopub),
 * fd capture, threads, sockets; a watchdog ends a teardown that hangs.
 *
 * Bad wire input is logged (the reason only, never the key or user code)
 * and dropped; nothing here asserts on it. */
#include "gateway/ll_kernel.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_fdcap.h"
#include "gateway/ll_curve.h"
#include "gateway/ll_dispatch.h"
#include "gateway/ll_iopub.h"
#include "gateway/ll_kernelspec.h"
#include "gateway/ll_exec.h"
#include "gateway/ll_stdin.h"
#include "gateway/ll_usage.h"
#include "kernel/ll_interp.h"
#include "proto/ll_conn.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "proto/ll_wire.h"
#include "store/ll_store.h"

/* The kernel process's state.  A singleton because signal handlers and the
 * interpreter hooks (plain C callbacks) need it; the protocol's state (the
 * shell queue, the cached kernel_info, shutdown) is the dispatcher's. */
static struct {
    ll_conn_info_t conn;     /* ports (the key is wiped after start) */
    ll_session_t *session;   /* signing, ids, replay history */
    zsock_t *shell;          /* main thread */
    zsock_t *control;        /* control thread */
    zsock_t *stdin_sock;     /* through stdin_chan */
    zsock_t *hb;             /* heartbeat thread */
    ll_iopub_t *iopub;       /* any thread */
    ll_stdin_t *stdin_chan;  /* input() prompts; any thread that runs a cell */
    ll_fdcap_t *fdcap;       /* fds 1/2 capture, NULL if it failed */
    ll_exec_t *exec;         /* where cells run and what happens around them; main thread */
    ll_dispatch_t *dispatch; /* the protocol; set once the interpreter answered kernel_info */
    int wake_fd;             /* eventfd: wakes the main loop (shutdown, SIGTERM) */
    int intr_fd;             /* eventfd: wakes an input() wait (SIGINT) */
    int stop_fd;             /* eventfd: tells control and heartbeat to exit */
    pthread_t control_thread, hb_thread;
    bool control_started, hb_started;
    long long exec_count;    /* last execution_count the interpreter replied; main thread */
    atomic_bool interrupted; /* SIGINT since the main thread last looked: drop speculative work */
    atomic_bool allow_stdin; /* of the execute_request now running */
    volatile sig_atomic_t terminate; /* SIGTERM arrived */
} s_k = {.wake_fd = -1, .intr_fd = -1, .stop_fd = -1};

/* ---- small helpers ------------------------------------------------------- */

static void s_eventfd_signal(int fd)
{
    if (fd < 0)
        return;
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof one); /* async-signal-safe */
    (void) w;
}

static void s_eventfd_drain(int fd)
{
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof v); /* EFD_NONBLOCK: never waits */
    (void) r;
}

/* Make everything the request wrote to fds 1/2 (C stdio buffers included)
 * stream text before its idle status. */
static void s_collect_output(void)
{
    fflush(NULL);
    ll_fdcap_sync(s_k.fdcap);
}

/* Interrupt the running cell (or an input() wait) the way a frontend's
 * SIGINT would: to the whole process group when we lead one, so shell
 * commands started by the cell stop as well. */
static void s_raise_interrupt(void)
{
    if (getpgrp() == getpid())
        killpg(0, SIGINT);
    else
        kill(getpid(), SIGINT);
}

static void s_install_handlers(void);

static bool s_stopping(void)
{
    return (s_k.dispatch && ll_dispatch_shutting_down(s_k.dispatch)) || s_k.terminate;
}

/* ---- the handlers that reach the interpreter --------------------------------- */

/* Resource figures for monitors (ipykernel answers this on control only). */
static void s_on_usage(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    json_t *content = ll_usage_reply();
    if (!content)
        content = ll_dispatch_error_content("MemoryError", "cannot build usage_reply");
    /* The session's GPU-seconds, so a monitor sees what its warm worker holds. */
    json_t *gpu = ll_exec_usage();
    if (gpu)
        json_object_set_new(content, "looseleaf", gpu);
    ll_dispatch_reply(d, sock, req, "usage_reply", content, NULL);
}

static void s_on_interrupt(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    ll_info("kernel", "interrupt_request on %s", chan == LL_MSG_ON_SHELL ? "shell" : "control");
    s_raise_interrupt();
    ll_dispatch_reply(d, sock, req, "interrupt_reply", json_pack("{s:s}", "status", "ok"), NULL);
}

/* The debugger (JupyterLab's panel): the request's content is one Debug
 * Adapter Protocol request, served by looseleaf_kernel.debugger with the
 * GIL taken on this (the control) thread, so it is answered while a cell
 * runs or is stopped at a breakpoint on the main thread; its events go out
 * on iopub as debug_event through the publish hook. */
/* The last debug_request (its identities and header): the debugger's
 * debug_events go out under it, as ipykernel's do (its debugpy client runs
 * on the control thread), not under the cell that runs.  JupyterLab reads
 * any iopub message of an execute_request, while it knows no stopped thread,
 * as the cue to refresh its variable explorer from inspectVariables (the
 * kernel's globals): a `stopped` event under the cell raced the stopped
 * frame's own variables, and a GPU cell's panel could end up listing the
 * kernel's namespace instead of the worker's frame.  Set on the control
 * thread, read by whichever thread publishes the event. */
static pthread_mutex_t s_debug_parent_lock = PTHREAD_MUTEX_INITIALIZER;
static ll_msg_t *s_debug_parent;

static void s_debug_parent_set(const ll_msg_t *req)
{
    ll_msg_t *copy = req ? ll_iopub_parent_copy(req) : NULL;
    pthread_mutex_lock(&s_debug_parent_lock);
    ll_msg_t *old = s_debug_parent;
    s_debug_parent = copy;
    pthread_mutex_unlock(&s_debug_parent_lock);
    ll_msg_destroy(&old);
}

static ll_msg_t *s_debug_parent_get(void)
{
    pthread_mutex_lock(&s_debug_parent_lock);
    ll_msg_t *copy = s_debug_parent ? ll_iopub_parent_copy(s_debug_parent) : NULL;
    pthread_mutex_unlock(&s_debug_parent_lock);
    return copy;
}

static void s_on_debug(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    s_debug_parent_set(req);
    char *text = json_dumps(req->content, JSON_COMPACT);
    char *reply_text = text && !s_stopping() ? ll_interp_debug(text) : NULL;
    free(text);
    json_error_t jerr;
    json_t *reply = reply_text ? json_loads(reply_text, 0, &jerr) : NULL;
    free(reply_text);
    if (!json_is_object(reply)) {
        /* A DAP error response, which frontends show, rather than none. */
        json_decref(reply);
        json_t *seq = json_object_get(req->content, "seq");
        json_t *cmd = json_object_get(req->content, "command");
        reply = json_pack("{s:s, s:O?, s:b, s:O?, s:s}", "type", "response", "request_seq",
                          json_is_integer(seq) ? seq : NULL, "success", 0, "command",
                          json_is_string(cmd) ? cmd : NULL, "message",
                          "the kernel's debugger is not available");
    }
    ll_dispatch_reply(d, sock, req, "debug_reply", reply, NULL);
}

/* Forward a request to the interpreter and send its reply, if it has one. */
static void s_on_interp(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    char reply_type[96];
    bool has_reply = ll_dispatch_reply_type(req->msg_type, reply_type, sizeof reply_type);
    char *md_text = NULL;
    char *reply_text = ll_exec_request(s_k.exec, req, &md_text);
    s_collect_output();
    if (!has_reply) {
        free(reply_text);
        free(md_text);
        return;
    }
    json_error_t jerr;
    json_t *reply = reply_text ? json_loads(reply_text, JSON_ALLOW_NUL, &jerr) : NULL;
    if (!json_is_object(reply)) {
        ll_error("kernel", "no valid %s from the interpreter", reply_type);
        json_decref(reply);
        reply = ll_dispatch_error_content("InternalError", "the interpreter gave no valid reply");
    }
    json_t *md = md_text ? json_loads(md_text, 0, &jerr) : NULL;
    if (md && !json_is_object(md)) {
        json_decref(md);
        md = NULL;
    }
    free(reply_text);
    free(md_text);
    ll_dispatch_reply(d, sock, req, reply_type, reply, md);
}

/* Read the shell queue ahead (ll_exec_env_t): the first execute_request
 * waiting behind the running one, or NULL. */
static const ll_msg_t *s_next_queued_execute(void *ctx)
{
    return s_k.dispatch ? ll_dispatch_next_queued_execute(s_k.dispatch) : NULL;
}

/* A GPU cell runs on a worker and shell became readable (ll_exec_env_t). */
static void s_shell_readable(void *ctx)
{
    if (s_k.dispatch)
        ll_dispatch_shell_readable(s_k.dispatch);
}

static void s_on_execute(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    json_t *content = req->content;
    json_t *code = json_object_get(content, "code");
    bool silent = json_is_true(json_object_get(content, "silent"));
    json_t *stop = json_object_get(content, "stop_on_error");
    bool stop_on_error = stop ? json_is_true(stop) : true;
    /* ipykernel's default when the field is missing. */
    atomic_store(&s_k.allow_stdin, json_is_true(json_object_get(content, "allow_stdin")));

    if (!json_is_string(code)) {
        ll_warn("kernel", "execute_request without a string 'code': error reply");
        json_t *err =
            ll_dispatch_error_content("ValueError", "execute_request has no 'code' string");
        json_object_set_new(err, "execution_count", json_integer(s_k.exec_count));
        ll_dispatch_reply(d, sock, req, "execute_reply", err, NULL);
        return;
    }
    char started[32];
    ll_wire_now(started);
    json_t *reply = NULL, *md = NULL;
    ll_exec_execute(s_k.exec, req, &reply, &md);
    s_collect_output();
    if (!json_is_object(reply)) {
        ll_error("kernel", "no valid execute_reply from the interpreter");
        json_decref(reply);
        reply = ll_dispatch_error_content("InternalError", "the interpreter gave no valid reply");
        json_object_set_new(reply, "execution_count", json_integer(s_k.exec_count));
    }
    json_t *count = json_object_get(reply, "execution_count");
    if (json_is_integer(count))
        s_k.exec_count = json_integer_value(count);
    const char *status = json_string_value(json_object_get(reply, "status"));
    if (!status)
        status = "error";

    /* Reply metadata as ipykernel writes it; the interpreter's (or the
     * worker's), if any, wins. */
    if (!json_is_object(md)) {
        json_decref(md);
        md = json_object();
    }
    json_t *ours = json_pack("{s:s, s:b, s:s, s:s}", "started", started, "dependencies_met", 1,
                             "engine", ll_session_id(s_k.session), "status", status);
    json_object_update_missing(md, ours);
    json_decref(ours);
    if (strcmp(status, "error") == 0 && stop_on_error && !silent) {
        ll_dispatch_take_queue(d);
        ll_exec_cancel_prefetch(s_k.exec); /* prepared for a cell that will not run */
    }
    ll_dispatch_reply(d, sock, req, "execute_reply", reply, md);
}

/* A subshell's request for the interpreter (ll_dispatch_env_t
 * subshell_forward), on that subshell's thread.  It goes to Python
 * directly: no cell analysis, no worker, no prefetch, which are the main
 * thread's (ll_exec); coherence.py keeps what a subshell's cell rebinds
 * dirty for the next GPU cell.  execute_request gets its reply metadata
 * and stop_on_error (aborting this subshell's queue only) as on the main
 * shell. */
static void s_on_subshell(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    enum { S_MAX_BUFS = 64 };
    const void *bufs[S_MAX_BUFS];
    size_t lens[S_MAX_BUFS], nbufs = 0;
    for (zframe_t *f = req->buffers ? zmsg_first(req->buffers) : NULL; f && nbufs < S_MAX_BUFS;
         f = zmsg_next(req->buffers)) {
        bufs[nbufs] = zframe_data(f);
        lens[nbufs++] = zframe_size(f);
    }
    char reply_type[96], started[32];
    bool has_reply = ll_dispatch_reply_type(req->msg_type, reply_type, sizeof reply_type);
    bool execute = strcmp(req->msg_type, "execute_request") == 0;
    ll_wire_now(started);
    char *content = json_dumps(req->content, JSON_COMPACT);
    char *header = json_dumps(req->header, JSON_COMPACT);
    char *metadata = req->metadata ? json_dumps(req->metadata, JSON_COMPACT) : NULL;
    char *md_text = NULL, *reply_text = NULL;
    if (content && header && !s_stopping()) {
        ll_interp_request_t r = {.msg_type = req->msg_type,
                                 .content_json = content,
                                 .parent_json = header,
                                 .metadata_json = metadata,
                                 .bufs = bufs,
                                 .buflens = lens,
                                 .nbufs = nbufs};
        reply_text = ll_interp_call(&r, &md_text);
    }
    free(content);
    free(header);
    free(metadata);
    json_error_t jerr;
    json_t *reply = reply_text ? json_loads(reply_text, JSON_ALLOW_NUL, &jerr) : NULL;
    json_t *md = md_text ? json_loads(md_text, 0, &jerr) : NULL;
    free(reply_text);
    free(md_text);
    if (!has_reply) {
        json_decref(reply);
        json_decref(md);
        return;
    }
    if (!json_is_object(reply)) {
        json_decref(reply);
        reply = ll_dispatch_error_content("InternalError", "the interpreter gave no valid reply");
    }
    if (!json_is_object(md)) {
        json_decref(md);
        md = execute ? json_object() : NULL;
    }
    /* What the cell bound beyond any analysis: for the session's analysis
     * (so a later GPU cell restores it), not for the frontend. */
    json_t *ll = json_object_get(md, "looseleaf");
    if (json_is_object(ll)) {
        ll_exec_note_dynamic(s_k.exec, json_object_get(ll, "dynamic"));
        json_object_del(md, "looseleaf");
    }
    if (execute) {
        const char *status = json_string_value(json_object_get(reply, "status"));
        json_t *ours =
            json_pack("{s:s, s:b, s:s, s:s}", "started", started, "dependencies_met", 1, "engine",
                      ll_session_id(s_k.session), "status", status ? status : "error");
        json_object_update_missing(md, ours);
        json_decref(ours);
        json_t *stop = json_object_get(req->content, "stop_on_error");
        if ((!status || strcmp(status, "error") == 0) && (stop ? json_is_true(stop) : true) &&
            !json_is_true(json_object_get(req->content, "silent")))
            ll_dispatch_take_queue(d); /* this subshell's queue */
    }
    ll_dispatch_reply(d, sock, req, reply_type, reply, md);
}

/* A subshell's thread ends: its Python thread state goes with it. */
static void s_subshell_end(void *ctx)
{
    ll_interp_thread_end();
}

/* The process's handlers; the dispatcher serves kernel_info, connect and
 * shutdown itself and forwards the interpreter's other types (s_on_interp). */
static const ll_dispatch_handler_t s_handlers[] = {
    {"execute_request", s_on_execute},
    {"interrupt_request", s_on_interrupt},
    {"usage_request", s_on_usage},
    {"debug_request", s_on_debug},
    {NULL, NULL},
};

/* After every shell request: its output out, our SIGINT handler back. */
static void s_after_shell(void *ctx)
{
    s_collect_output();
    /* User code may have taken SIGINT over (asyncio.run restores Python's
     * own handler when it ends); an interrupt while idle must stay ignored,
     * so the process-level handlers are ours again. */
    s_install_handlers();
}

/* A shutdown_request was answered: wake the main loop and an input() wait,
 * and end a running cell, so we can exit cleanly.  A restart keeps a
 * notebook's store for the next kernel (keep.py). */
static void s_after_shutdown(void *ctx, bool restart)
{
    ll_interp_set_restart(restart);
    s_eventfd_signal(s_k.wake_fd);
    s_eventfd_signal(s_k.intr_fd);
    ll_interp_interrupt();
}

static bool s_terminating(void *ctx)
{
    return s_k.terminate;
}

/* ---- threads ------------------------------------------------------------- */

static void *s_heartbeat_main(void *arg)
{
    /* REP echo: whatever arrives goes straight back. */
    while (ll_wire_wait(s_k.hb, s_k.stop_fd) == 1) {
        zmsg_t *ping = zmsg_recv(s_k.hb);
        if (ping && zmsg_send(&ping, s_k.hb) != 0)
            zmsg_destroy(&ping);
    }
    return NULL;
}

static void *s_control_main(void *arg)
{
    while (ll_wire_wait(s_k.control, s_k.stop_fd) == 1)
        ll_dispatch_control(s_k.dispatch);
    return NULL;
}

/* ---- interpreter hooks --------------------------------------------------- */

static void s_hook_stream_write(void *ctx, const char *name, const char *data, size_t len)
{
    ll_iopub_stream_write(s_k.iopub, name, data, len);
}

static void s_hook_stream_flush(void *ctx)
{
    ll_iopub_stream_flush(s_k.iopub);
}

static void s_hook_publish(void *ctx, const char *msg_type, const char *content_json,
                           const char *metadata_json, const void *const *bufs,
                           const size_t *buflens, size_t nbufs)
{
    json_error_t jerr;
    if (!msg_type || !content_json) {
        ll_warn("kernel", "interpreter published without a type or content: dropped");
        return;
    }
    json_t *content = json_loads(content_json, JSON_ALLOW_NUL, &jerr);
    if (!json_is_object(content)) {
        ll_warn("kernel", "interpreter published a %.64s with invalid content (%s): dropped",
                msg_type, jerr.text);
        json_decref(content);
        return;
    }
    json_t *md = metadata_json ? json_loads(metadata_json, JSON_ALLOW_NUL, &jerr) : NULL;
    if (md && !json_is_object(md)) {
        json_decref(md);
        md = NULL;
    }
    zmsg_t *buffers = NULL;
    if (nbufs && bufs && buflens) {
        buffers = zmsg_new();
        for (size_t i = 0; buffers && i < nbufs; i++)
            zmsg_addmem(buffers, bufs[i], buflens[i]);
    }
    /* A debug_event answers the control channel's last debug_request (see
     * s_debug_parent); anything else belongs to the current parent. */
    ll_msg_t *parent = strcmp(msg_type, "debug_event") == 0 ? s_debug_parent_get() : NULL;
    ll_iopub_send(s_k.iopub, msg_type, parent, content, md, &buffers);
    ll_msg_destroy(&parent);
}

/* input()/getpass(): input_request on stdin to the frontend of the current
 * request, then wait for its input_reply or an interrupt.  Runs on the
 * thread that called input(), with the GIL released. */
static char *s_hook_input(void *ctx, const char *prompt, bool password, int *err)
{
    /* allow_stdin is the main shell's request's; a subshell has no prompt
     * of its own (stdin replies go to the main shell's request). */
    if (!atomic_load(&s_k.allow_stdin) || ll_iopub_has_thread_parent()) {
        *err = 2;
        return NULL;
    }
    return ll_stdin_input(s_k.stdin_chan, prompt, password, s_k.intr_fd, s_stopping, err);
}

/* %looseleaf: the pool's state.  The interpreter thread is the main thread,
 * which owns the pool connection. */
static char *s_hook_pool_stats(void *ctx)
{
    json_t *st = ll_exec_pool_stats(s_k.exec, 2000);
    char *text = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    return text;
}

/* The background commit's check between payloads (coherence.commit_slow):
 * read shell ahead (main thread: it owns the socket) and say whether a
 * request waits there.  Also true once a shutdown or SIGTERM woke us. */
static bool s_hook_request_waiting(void *ctx)
{
    (void) ctx;
    if (s_stopping())
        return true;
    if (!s_k.dispatch)
        return false;
    ll_dispatch_shell_readable(s_k.dispatch);
    return ll_dispatch_queued(s_k.dispatch) > 0;
}

/* ---- signals ------------------------------------------------------------- */

static void s_on_sigint(int sig)
{
    int saved = errno;
    ll_interp_interrupt();                /* no-op when idle: an idle SIGINT is ignored */
    atomic_store(&s_k.interrupted, true); /* speculative work goes (main thread) */
    s_eventfd_signal(s_k.intr_fd);
    errno = saved;
}

static void s_on_sigterm(int sig)
{
    int saved = errno;
    s_k.terminate = 1;
    s_eventfd_signal(s_k.wake_fd);
    s_eventfd_signal(s_k.intr_fd);
    ll_interp_interrupt();
    errno = saved;
}

static void s_install_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocking call must see EINTR */
    sa.sa_handler = s_on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = s_on_sigterm;
    sigaction(SIGTERM, &sa, NULL);
}

static void s_block_signals(bool block)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}

/* ---- start-up and the shell loop ------------------------------------------ */

static zsock_t *s_bind(int type, ll_channel_t ch, const ll_curve_t *curve, char *err, size_t errlen)
{
    char endpoint[300];
    if (ll_conn_endpoint(&s_k.conn, ch, endpoint, sizeof endpoint) < 0) {
        snprintf(err, errlen, "%s: endpoint too long", ll_conn_channel_name(ch));
        return NULL;
    }
    zsock_t *sock = zsock_new(type);
    if (!sock) {
        snprintf(err, errlen, "%s: cannot create a socket", ll_conn_channel_name(ch));
        return NULL;
    }
    zsock_set_linger(sock, 1000); /* let the last replies (shutdown) leave */
    /* A frame beyond the limit disconnects its sender before it is held
     * in memory (it could not be verified until then). */
    ll_wire_limit_frames(sock);
    if (strchr(s_k.conn.ip, ':'))
        zsock_set_ipv6(sock, 1); /* an IPv6 address ("::1") binds only with this */
    if (type == ZMQ_ROUTER) {
        zsock_set_rcvtimeo(sock, 0); /* receive only after polling: never block */
        /* A frontend that reconnects with the same identity (every client of
         * one KernelManager shares its session id) takes the route over, as
         * ipykernel does; otherwise its replies would go to the dead peer. */
        zsock_set_router_handover(sock, 1);
    }
    if (ll_curve_serve(curve, sock, err, errlen) != 0) {
        zsock_destroy(&sock);
        return NULL;
    }
    if (zsock_bind(sock, "%s", endpoint) == -1) {
        snprintf(err, errlen, "%s: cannot bind %.300s: %.100s", ll_conn_channel_name(ch), endpoint,
                 zmq_strerror(zmq_errno()));
        zsock_destroy(&sock);
        return NULL;
    }
    return sock;
}

/* Required fields of kernel_info_reply the gateway answers for. */
static void s_kernel_info_complete(json_t *info)
{
    json_object_set_new(info, "status", json_string("ok"));
    json_object_set_new(info, "protocol_version", json_string(LL_PROTOCOL_VERSION));
    json_object_set_new(info, "implementation", json_string("looseleaf"));
    if (!json_is_string(json_object_get(info, "implementation_version")))
        json_object_set_new(info, "implementation_version", json_string(LL_VERSION));
    /* "debugger" (and "debugger" in supported_features) is the
     * interpreter's to say: true when debugpy is there to serve
     * debug_request (s_on_debug). */
    if (!json_object_get(info, "debugger"))
        json_object_set_new(info, "debugger", json_false());
    /* Protocol 5.5: optional features the kernel implements, in ipykernel
     * 7.4's order (subshells first). */
    if (!json_is_array(json_object_get(info, "supported_features")))
        json_object_set_new(info, "supported_features", json_array());
    json_array_insert_new(json_object_get(info, "supported_features"), 0,
                          json_string("kernel subshells"));
}

/* The interpreter's kernel_info, completed (s_kernel_info_complete), into
 * *INFO_P; 0, or -1 with ERR. */
static int s_cache_kernel_info(json_t **info_p, char *err, size_t errlen)
{
    char *text = ll_interp_handle("kernel_info_request", "{}",
                                  "{\"msg_type\":\"kernel_info_request\",\"msg_id\":\"\"}", NULL);
    json_error_t jerr;
    json_t *info = text ? json_loads(text, 0, &jerr) : NULL;
    free(text);
    if (!json_is_object(info) || !json_is_object(json_object_get(info, "language_info"))) {
        json_decref(info);
        snprintf(err, errlen, "the interpreter gave no kernel_info with language_info");
        return -1;
    }
    s_kernel_info_complete(info);
    *info_p = info;
    return 0;
}

/* ---- the shell loop ------------------------------------------------------- */

/* Wait for what the main thread serves: a request on shell, the wake-up
 * (shutdown, SIGTERM), the execution side's fd and timers.  Returns the
 * next request to serve, or NULL when there is none yet (the caller looks
 * at the stop conditions and calls again); *FAILED is set when polling
 * itself failed. */
static ll_msg_t *s_wait_shell(bool *failed)
{
    ll_msg_t *req = ll_dispatch_next_shell(s_k.dispatch); /* read ahead first */
    if (req)
        return req;
    int exec_fd = ll_exec_fd(s_k.exec);
    zmq_pollitem_t items[3] = {
        {zsock_resolve(ll_dispatch_shell_socket(s_k.dispatch)), 0, ZMQ_POLLIN, 0},
        {NULL, s_k.wake_fd, ZMQ_POLLIN, 0},
        {NULL, exec_fd, ZMQ_POLLIN, 0}};
    int rc = zmq_poll(items, exec_fd >= 0 ? 3 : 2, ll_exec_timeout(s_k.exec));
    if (rc < 0) {
        if (errno != EINTR) {
            ll_error("kernel", "polling shell failed: %s", zmq_strerror(errno));
            *failed = true;
        }
        return NULL;
    }
    if (exec_fd >= 0 && items[2].revents)
        ll_exec_on_fd(s_k.exec);
    if (items[1].revents) {
        s_eventfd_drain(s_k.wake_fd);
        return NULL;
    }
    if (ll_exec_on_timer(s_k.exec, items[0].revents != 0) || !items[0].revents)
        return NULL;
    return ll_dispatch_next_shell(s_k.dispatch);
}

static void s_shell_loop(void)
{
    bool failed = false;
    while (!s_stopping() && !failed) {
        if (atomic_exchange(&s_k.interrupted, false))
            ll_exec_interrupted(s_k.exec);
        ll_msg_t *req = s_wait_shell(&failed);
        if (req) {
            ll_dispatch_shell(s_k.dispatch, req);
            ll_msg_destroy(&req);
        }
    }
}

/* ---- teardown -------------------------------------------------------------- */

/* How long an exit may take before the watchdog ends the process. */
#define LL_KERNEL_EXIT_GRACE_S 5

static void *s_exit_watchdog(void *arg)
{
    struct timespec ts = {LL_KERNEL_EXIT_GRACE_S, 0};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
    ll_warn("kernel",
            "exit took over %d s (a non-daemon thread or an atexit handler hangs?): "
            "leaving now",
            LL_KERNEL_EXIT_GRACE_S);
    _exit(0);
    return NULL;
}

static void s_teardown(bool interp_started)
{
    /* Python waits for non-daemon threads at finalization; a user thread that
     * never ends must not keep a shut-down kernel alive. */
    pthread_t watchdog;
    s_block_signals(true);
    if (pthread_create(&watchdog, NULL, s_exit_watchdog, NULL) == 0)
        pthread_detach(watchdog);
    s_block_signals(false);
    /* Subshell threads may be inside Python: they end before it does. */
    ll_dispatch_stop_subshells(s_k.dispatch, 2000);
    ll_exec_destroy(&s_k.exec); /* before Python goes */
    if (interp_started)
        ll_interp_finalize(); /* atexit handlers may still print: keep iopub up */
    fflush(NULL);
    if (s_k.fdcap) {
        ll_fdcap_destroy(&s_k.fdcap); /* hands over the rest, restores fds 1/2 */
        ll_log_set_fd(2);
    }
    s_eventfd_signal(s_k.stop_fd);
    if (s_k.control_started)
        pthread_join(s_k.control_thread, NULL);
    if (s_k.hb_started)
        pthread_join(s_k.hb_thread, NULL);
    s_k.control_started = s_k.hb_started = false;
    ll_dispatch_destroy(&s_k.dispatch); /* no thread serves requests any more */
    ll_stdin_destroy(&s_k.stdin_chan);
    ll_iopub_destroy(&s_k.iopub);
    s_debug_parent_set(NULL);
    zsock_destroy(&s_k.shell);
    zsock_destroy(&s_k.control);
    zsock_destroy(&s_k.stdin_sock);
    zsock_destroy(&s_k.hb);
    ll_session_destroy(&s_k.session);
    for (int *fd = &s_k.wake_fd; fd <= &s_k.stop_fd; fd++)
        if (*fd >= 0) {
            close(*fd);
            *fd = -1;
        }
}

/* Whether IP (a tcp address) listens on every interface of the host. */
static bool s_any_address(const char *ip)
{
    return strcmp(ip, "0.0.0.0") == 0 || strcmp(ip, "*") == 0 || strcmp(ip, "::") == 0 ||
           strcmp(ip, "[::]") == 0;
}

/* Read CONNECTION_FILE into s_k.conn and refuse what OPTS do not accept (a
 * file others may read, an empty key; ll_conn_load says why); warn about a
 * kernel that listens everywhere.  0, or -1 (printed on stderr). */
static int s_load_connection(const char *connection_file, const ll_kernel_opts_t *opts)
{
    char err[512];
    if (ll_conn_load(connection_file, opts->allow_insecure_file ? LL_CONN_ALLOW_INSECURE : 0,
                     &s_k.conn, err, sizeof err) < 0) {
        fprintf(stderr, "looseleaf: %s\n", err);
        return -1;
    }
    if (s_k.conn.key_len == 0 && !opts->allow_empty_key) {
        fprintf(stderr,
                "looseleaf: connection file %s: the key is empty, so messages would be neither "
                "signed nor verified and anyone who can reach these ports could run code as you; "
                "--allow-empty-key runs the kernel like that anyway\n",
                connection_file);
        return -1;
    }
    if (s_k.conn.key_len == 0)
        ll_warn("kernel", "!!! the connection file has an EMPTY KEY: messages are neither signed "
                          "nor verified, anyone who can reach these ports can run code !!!");
    if (strcmp(s_k.conn.transport, "tcp") == 0 && s_any_address(s_k.conn.ip))
        ll_warn("kernel",
                "the kernel listens on every network interface (ip %s): anyone who can reach "
                "this host can try its ports, and only the key keeps them out",
                s_k.conn.ip);
    return 0;
}

/* ---- start-up --------------------------------------------------------------- */

/* The wake-up eventfds, the five channels, the stdin prompts and the
 * heartbeat thread.  0, or -1 with ERR. */
static int s_open_channels(const ll_curve_t *curve, char *err, size_t errlen)
{
    s_k.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s_k.intr_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s_k.stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s_k.wake_fd < 0 || s_k.intr_fd < 0 || s_k.stop_fd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        return -1;
    }
    char endpoint[512];
    if (!(s_k.shell = s_bind(ZMQ_ROUTER, LL_CHAN_SHELL, curve, err, errlen)) ||
        !(s_k.control = s_bind(ZMQ_ROUTER, LL_CHAN_CONTROL, curve, err, errlen)) ||
        !(s_k.stdin_sock = s_bind(ZMQ_ROUTER, LL_CHAN_STDIN, curve, err, errlen)) ||
        !(s_k.hb = s_bind(ZMQ_REP, LL_CHAN_HB, curve, err, errlen)))
        return -1;
    if (ll_conn_endpoint(&s_k.conn, LL_CHAN_IOPUB, endpoint, sizeof endpoint) < 0) {
        snprintf(err, errlen, "iopub: endpoint too long");
        return -1;
    }
    /* An input_request nobody can receive (the frontend has no stdin channel
     * under the shell identity) must fail at once, not leave input() waiting
     * forever: the cell then gets StdinNotImplementedError. */
    zsock_set_router_mandatory(s_k.stdin_sock, 1);
    if (!(s_k.iopub = ll_iopub_new_curve(s_k.session, endpoint, curve, err, errlen)))
        return -1;
    if (!(s_k.stdin_chan = ll_stdin_new(s_k.stdin_sock, s_k.session, s_k.iopub))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (pthread_create(&s_k.hb_thread, NULL, s_heartbeat_main, NULL) != 0) {
        snprintf(err, errlen, "cannot start the heartbeat thread");
        return -1;
    }
    s_k.hb_started = true;
    return 0;
}

/* Capture fds 1/2 as stream text; the log keeps going to the original
 * stderr.  Without a capture the kernel still runs (a warning says what
 * is lost). */
static void s_capture_output(void)
{
    static const int fds[2] = {1, 2};
    static const char *const names[2] = {"stdout", "stderr"};
    char cap_err[256];
    fflush(NULL);
    s_k.fdcap = ll_fdcap_new(fds, names, 2, (ll_fdcap_sink_fn *) ll_iopub_stream_write, s_k.iopub,
                             cap_err, sizeof cap_err);
    if (s_k.fdcap) {
        ll_log_set_fd(ll_fdcap_original(s_k.fdcap, 1));
        /* C code printing to stdout should reach the frontend line by line
         * while the cell runs, not in 4 KiB blocks at its end. */
        setvbuf(stdout, NULL, _IOLBF, 0);
    } else {
        ll_warn("kernel", "output written to fds 1/2 will not be captured: %s", cap_err);
    }
}

/* Python with our hooks, then the execution side around it.  *STARTED
 * says whether Python must be finalized.  0, or -1 with ERR. */
static int s_start_interpreter(bool *started, char *err, size_t errlen)
{
    char self_path[PATH_MAX];
    if (ll_kernelspec_self_path(self_path, sizeof self_path) < 0)
        snprintf(self_path, sizeof self_path, "looseleaf");
    ll_interp_hooks_t hooks = {
        .ctx = NULL,
        .stream_write = s_hook_stream_write,
        .stream_flush = s_hook_stream_flush,
        .publish = s_hook_publish,
        .input_request = s_hook_input,
        .pool_stats = s_hook_pool_stats,
        .request_waiting = s_hook_request_waiting,
    };
    /* The store's waits for Redis end on the interrupt eventfd (SIGINT,
     * SIGTERM, a shutdown): coherence.py gives it to its Store. */
    ll_interp_set_interrupt_fd(s_k.intr_fd);
    /* The checkpoint store's module is part of the binary, so nothing to install: cells
     * and the interpreter's own code `import _llstore` without a .so. */
    if (ll_interp_add_builtin("_llstore", ll_store_pyinit) < 0)
        ll_warn("kernel", "cannot register the _llstore module: 'import _llstore' will fail");
    if (ll_interp_init(self_path, &hooks, err, errlen) < 0)
        return -1;
    *started = true;
    s_install_handlers(); /* in case Python's start-up replaced them */
    return 0;
}

/* The execution side, which polls the shell socket the dispatcher gives
 * the main thread.  0, or -1 with ERR. */
static int s_start_exec(char *err, size_t errlen)
{
    ll_exec_env_t env = {.iopub = s_k.iopub,
                         .stdin_chan = s_k.stdin_chan,
                         .intr_fd = s_k.intr_fd,
                         .stopping = s_stopping,
                         .next_queued_execute = s_next_queued_execute,
                         .shell_handle = zsock_resolve(ll_dispatch_shell_socket(s_k.dispatch)),
                         .shell_readable = s_shell_readable};
    if (!(s_k.exec = ll_exec_new(&env))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* The dispatcher, with the interpreter's kernel_info cached, and the
 * control thread that serves it.  0, or -1 with ERR. */
static int s_start_dispatch(char *err, size_t errlen)
{
    json_t *info = NULL;
    if (s_cache_kernel_info(&info, err, errlen) < 0)
        return -1;
    ll_dispatch_env_t env = {.session = s_k.session,
                             .iopub = s_k.iopub,
                             .shell = s_k.shell,
                             .control = s_k.control,
                             .handlers = s_handlers,
                             .forward = s_on_interp,
                             .subshell_forward = s_on_subshell,
                             .subshell_end = s_subshell_end,
                             .after_shell = s_after_shell,
                             .on_shutdown = s_after_shutdown,
                             .stopping = s_terminating,
                             .ports = s_k.conn.ports,
                             .kernel_info = info};
    if (!(s_k.dispatch = ll_dispatch_new(&env))) {
        snprintf(err, errlen, "cannot set up the dispatcher (see the log)");
        return -1;
    }
    if (s_start_exec(err, errlen) < 0)
        return -1;
    s_block_signals(true);
    int rc = pthread_create(&s_k.control_thread, NULL, s_control_main, NULL);
    s_block_signals(false);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the control thread");
        return -1;
    }
    s_k.control_started = true;
    return 0;
}

int ll_kernel_run(const char *connection_file, const ll_kernel_opts_t *opts)
{
    ll_kernel_opts_t none = {0};
    if (!opts)
        opts = &none;
    char err[512];
    bool interp_started = false;
    /* A kernel started by `jupyter console` shares the user's terminal:
     * only warnings and errors by default (ipykernel prints nothing there);
     * LOOSELEAF_LOG=info|debug asks for more. */
    setenv("LOOSELEAF_LOG", "warn", 0);
    ll_log_init('G');
    if (s_load_connection(connection_file, opts) < 0)
        return 1;
    /* Transport encryption (ll_curve.h): taken before the file's secrets
     * are wiped, kept until every socket is bound. */
    ll_curve_t *curve = NULL;
    if (ll_curve_new(s_k.conn.curve_publickey, s_k.conn.curve_secretkey, &curve, err, sizeof err) !=
        0) {
        ll_conn_clear(&s_k.conn);
        fprintf(stderr, "looseleaf: connection file %s: %s\n", connection_file, err);
        return 1;
    }
    ll_info("kernel", "transport: %s%s", s_k.conn.transport,
            curve ? ", CurveZMQ-encrypted on every socket" : " without encryption");
    s_k.session = ll_session_new(s_k.conn.key, s_k.conn.key_len, s_k.conn.signature_scheme, 0);
    ll_conn_clear(&s_k.conn); /* the session keeps its own copy of the key */
    if (!s_k.session) {
        ll_curve_destroy(&curve);
        fprintf(stderr,
                "looseleaf: bad connection file %s: signature_scheme '%s' is not supported\n",
                connection_file, s_k.conn.signature_scheme);
        return 1;
    }

    /* Threads created from here on (ZeroMQ's, ours) must not take SIGINT or
     * SIGTERM: they belong to the main thread (see ll_kernel.h). */
    s_block_signals(true);
    zsys_handler_set(NULL); /* czmq must not install its own SIGINT handler */
    int open_rc = s_open_channels(curve, err, sizeof err);
    ll_curve_destroy(&curve); /* every socket holds its copy */
    if (open_rc < 0)
        goto out_fail;
    s_capture_output();
    s_block_signals(false);
    s_install_handlers();
    if (s_start_interpreter(&interp_started, err, sizeof err) < 0 ||
        s_start_dispatch(err, sizeof err) < 0)
        goto out_fail;

    ll_iopub_status(s_k.iopub, "starting", NULL);
    ll_info("kernel", "looseleaf %s ready (pid %d)", LL_VERSION, (int) getpid());
    s_shell_loop();
    ll_info("kernel", "%s", s_k.terminate ? "SIGTERM: exiting" : "shutting down");
    s_teardown(interp_started);
    return 0;

out_fail:
    ll_curve_destroy(&curve);
    ll_error("kernel", "cannot start: %s", err);
    s_teardown(interp_started);
    fprintf(stderr, "looseleaf: cannot start: %s\n", err);
    return 1;
}

/* ---- self-test ----------------------------------------------------------- */

/* The process's own parts: its handler table against proto/ll_msgtype.c
 * (the dispatcher itself, busy/idle order and channel rules included, is
 * tested in ll_dispatch_selftest.c), and kernel_info completion. */
int ll_kernel_selftest(bool verbose)
{
    char why[256];
    if (ll_dispatch_check(s_handlers, s_on_interp, why, sizeof why) < 0) {
        fprintf(stderr, "ll_kernel: %s\n", why);
        return -1;
    }
    /* kernel_info completion keeps the interpreter's fields, fixes ours. */
    json_t *info = json_pack("{s:s, s:s, s:{s:s}}", "implementation", "ipython",
                             "implementation_version", "9", "language_info", "name", "python");
    s_kernel_info_complete(info);
    bool ok =
        strcmp(json_string_value(json_object_get(info, "implementation")), "looseleaf") == 0 &&
        strcmp(json_string_value(json_object_get(info, "implementation_version")), "9") == 0 &&
        strcmp(json_string_value(json_object_get(info, "protocol_version")), LL_PROTOCOL_VERSION) ==
            0 &&
        json_is_false(json_object_get(info, "debugger"));
    json_decref(info);
    if (verbose)
        printf("(%zu handlers of its own) ", sizeof s_handlers / sizeof s_handlers[0] - 1);
    return ok ? 0 : -1;
}
