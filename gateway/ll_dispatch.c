/* ll_dispatch: the request dispatcher (see ll_dispatch.h).
 *
 * DESIGN.  One function (s_serve) owns the busy -> handler -> idle order;
 * every path that answers a request goes through it, or (an aborted
 * execute) writes the same three steps itself.  Which handler serves a type
 * is decided in one place (s_resolve): the caller's table, then the
 * dispatcher's own, then the interpreter for the types proto/ll_msgtype.c
 * flags for it.  A type the table allows only on the other channel is
 * answered with an error reply, not left unanswered: a client waiting for
 * the reply would otherwise wait forever.  An unknown type is logged and
 * gets no reply, as ipykernel does.
 *
 * stop_on_error: when an execute fails, the execute_requests already queued
 * on shell are taken before the error reply leaves and answered "aborted"
 * after the failing request's idle; a request the client sends after seeing
 * the reply therefore always runs.
 *
 * Subshells.  With them the relay thread (s_relay_main) is the only user
 * of the shell ROUTER: it decodes (verifies) each request once and passes
 * the decoded message by pointer over inproc PAIRs, to the main shell's
 * pipe or a subshell's; replies come back over the same pipes as raw frames
 * and leave by the ROUTER.  So the main thread, busy in a CPU cell with the
 * GIL, or waiting on a worker for a GPU cell, never stands between a
 * subshell and its requests.  A subshell is deleted in two steps: the
 * control thread unlists it (new requests to it are refused as unknown) and
 * tells its thread to stop; the thread finishes the request it serves,
 * answers what was queued for it with an error, and sends one one-frame
 * "gone" message; only then does the relay close its pipe and free it, so
 * no reply is lost on the way. */
#include "gateway/ll_dispatch.h"

#include <errno.h>
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

#include "base/ll_log.h"
#include "proto/ll_conn.h"

/* One subshell.  Listed in its dispatcher's registry from create until
 * delete; freed by the relay once its thread said "gone". */
typedef struct s_sub {
    char id[40];        /* a uuid4, as ipykernel names them; immutable */
    ll_dispatch_t *d;   /* its dispatcher */
    zsock_t *pipe;      /* PAIR, the subshell's end: its thread only */
    zsock_t *relay_end; /* PAIR, the relay's end: relay thread only */
    int stop_fd;        /* eventfd: delete or teardown asked it to end */
    pthread_t thread;   /* serves its requests (s_sub_main) */
    atomic_bool stop;   /* deleted: serve nothing more */
    zlist_t *to_abort;  /* stop_on_error on this subshell: its thread */
    bool listed;        /* in the registry (false once deleted); subs_lock */
    struct s_sub *next; /* registry, creation order; subs_lock */
} s_sub_t;

struct ll_dispatch_t {
    ll_dispatch_env_t env; /* borrowed sockets, session, iopub; the handler table */
    /* Subshells (env.subshell_forward set); see DESIGN. */
    zsock_t *main_pipe;            /* PAIR, main thread's end: requests in, replies out */
    zsock_t *main_relay;           /* PAIR, the relay's end of it */
    int relay_wake_fd;             /* eventfd: the registry changed, or stop */
    atomic_bool relay_stop;        /* the relay thread should return */
    pthread_t relay;               /* s_relay_main */
    bool relay_started;            /* main thread */
    pthread_mutex_t subs_lock;     /* guards the registry */
    s_sub_t *subs;                 /* subs_lock */
    ll_log_limit_t drop_log_relay; /* relay thread */
    json_t *kernel_info;           /* cached kernel_info_reply content; read-only */
    zlist_t *queued;               /* decoded shell requests read ahead; shell thread */
    zlist_t *to_abort;             /* taken when an execute failed (stop_on_error); shell thread */
    atomic_bool shutdown;          /* a shutdown_request was answered */
    ll_log_limit_t drop_log;       /* lines about dropped wire input: shell thread */
    ll_log_limit_t drop_log_control; /* the same, control thread */
};

/* ---- replies ------------------------------------------------------------- */

bool ll_dispatch_reply_type(const char *req_type, char *buf, size_t len)
{
    size_t n = strlen(req_type);
    const char *suffix = "_request";
    size_t sl = strlen(suffix);
    if (n <= sl || strcmp(req_type + n - sl, suffix) != 0)
        return false;
    int w = snprintf(buf, len, "%.*s_reply", (int) (n - sl), req_type);
    return w > 0 && (size_t) w < len;
}

json_t *ll_dispatch_error_content(const char *ename, const char *evalue)
{
    return json_pack("{s:s, s:s, s:s, s:[]}", "status", "error", "ename", ename, "evalue", evalue,
                     "traceback");
}

int ll_dispatch_reply(ll_dispatch_t *self, zsock_t *sock, const ll_msg_t *req,
                      const char *reply_type, json_t *content, json_t *metadata)
{
    ll_msg_t *reply = ll_msg_new(self->env.session, reply_type, req, content);
    if (!reply) {
        json_decref(metadata);
        return -1;
    }
    if (metadata) {
        json_decref(reply->metadata);
        reply->metadata = metadata;
    }
    if (ll_session_send(self->env.session, sock, &reply) != 0) {
        ll_warn("kernel", "cannot send %s", reply_type);
        return -1;
    }
    return 0;
}

/* The subshell the calling thread serves (s_sub_main), else NULL. */
static _Thread_local s_sub_t *s_tl_sub;

const char *ll_dispatch_current_subshell(void)
{
    return s_tl_sub ? s_tl_sub->id : NULL;
}

/* Where the main shell replies: the ROUTER, or the relay's pipe. */
static zsock_t *s_shell_out(ll_dispatch_t *self)
{
    return self->main_pipe ? self->main_pipe : self->env.shell;
}

zsock_t *ll_dispatch_shell_socket(ll_dispatch_t *self)
{
    return s_shell_out(self);
}

/* ---- the dispatcher's own handlers (no interpreter) ------------------------ */

static void s_on_kernel_info(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan,
                             zsock_t *sock)
{
    ll_dispatch_reply(d, sock, req, "kernel_info_reply", json_incref(d->kernel_info), NULL);
}

static void s_on_connect(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    static const int none[LL_CHAN_COUNT];
    const int *p = d->env.ports ? d->env.ports : none;
    ll_dispatch_reply(d, sock, req, "connect_reply",
                      json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "status", "ok", "shell_port",
                                p[LL_CHAN_SHELL], "iopub_port", p[LL_CHAN_IOPUB], "stdin_port",
                                p[LL_CHAN_STDIN], "hb_port", p[LL_CHAN_HB], "control_port",
                                p[LL_CHAN_CONTROL]),
                      NULL);
}

static void s_on_shutdown(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    bool restart = json_is_true(json_object_get(req->content, "restart"));
    ll_info("kernel", "shutdown_request (restart: %s)", restart ? "yes" : "no");
    json_t *content = json_pack("{s:s, s:b}", "status", "ok", "restart", restart);
    /* ipykernel 6 also publishes the reply on iopub, for other frontends. */
    ll_iopub_send(d->env.iopub, "shutdown_reply", req, json_deep_copy(content), NULL, NULL);
    ll_dispatch_reply(d, sock, req, "shutdown_reply", content, NULL);
    atomic_store(&d->shutdown, true);
    if (d->env.on_shutdown)
        d->env.on_shutdown(d->env.ctx, restart);
}

static ll_dispatch_fn s_on_create_subshell, s_on_delete_subshell, s_on_list_subshell;

static const ll_dispatch_handler_t s_own[] = {
    {"kernel_info_request", s_on_kernel_info},
    {"connect_request", s_on_connect},
    {"shutdown_request", s_on_shutdown},
    {"create_subshell_request", s_on_create_subshell},
    {"delete_subshell_request", s_on_delete_subshell},
    {"list_subshell_request", s_on_list_subshell},
    {NULL, NULL},
};

/* ---- which handler --------------------------------------------------------- */

static ll_dispatch_fn *s_in_table(const ll_dispatch_handler_t *table, const char *msg_type)
{
    for (const ll_dispatch_handler_t *h = table; h && h->msg_type; h++)
        if (strcmp(h->msg_type, msg_type) == 0)
            return h->fn;
    return NULL;
}

/* The handler of TYPE (whatever the channel), or NULL. */
static ll_dispatch_fn *s_handler_of(const ll_dispatch_handler_t *handlers, ll_dispatch_fn *forward,
                                    const ll_msgtype_t *type)
{
    ll_dispatch_fn *fn = s_in_table(handlers, type->msg_type);
    if (!fn)
        fn = s_in_table(s_own, type->msg_type);
    if (!fn && (type->flags & LL_MSG_INTERP))
        fn = forward;
    return fn;
}

int ll_dispatch_check(const ll_dispatch_handler_t *handlers, ll_dispatch_fn *forward, char *why,
                      size_t whylen)
{
    for (const ll_msgtype_t *t = ll_msgtype_table(); t->msg_type; t++)
        if (t->channels && !s_handler_of(handlers, forward, t)) {
            snprintf(why, whylen, "%s is in proto/ll_msgtype.c but nothing serves it", t->msg_type);
            return -1;
        }
    for (const ll_dispatch_handler_t *h = handlers; h && h->msg_type; h++) {
        const ll_msgtype_t *t = ll_msgtype_find(h->msg_type);
        if (!t || !t->channels || !h->fn) {
            snprintf(why, whylen,
                     "a handler for %s, which proto/ll_msgtype.c lets no frontend send",
                     h->msg_type);
            return -1;
        }
    }
    return 0;
}

/* ---- serving --------------------------------------------------------------- */

static const char *s_chan_name(unsigned chan)
{
    return chan == LL_MSG_ON_SHELL ? "shell" : "control";
}

/* Answer a request that the table allows only on the other channel. */
static void s_refuse(ll_dispatch_t *self, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    const char *other = s_chan_name(chan == LL_MSG_ON_SHELL ? LL_MSG_ON_CONTROL : LL_MSG_ON_SHELL);
    ll_warn("kernel", "%.64s on %s, which serves it only on %s: error reply", req->msg_type,
            s_chan_name(chan), other);
    char reply_type[96], evalue[160];
    if (!ll_dispatch_reply_type(req->msg_type, reply_type, sizeof reply_type))
        return;
    snprintf(evalue, sizeof evalue, "this kernel serves %.64s on the %s channel only",
             req->msg_type, other);
    ll_dispatch_reply(self, sock, req, reply_type,
                      ll_dispatch_error_content("ChannelError", evalue), NULL);
}

/* busy -> handler -> (shell: output collected) -> idle, all under REQ's
 * header; on shell REQ also becomes the parent of output published without
 * one (streams, display). */
static void s_serve(ll_dispatch_t *self, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    s_sub_t *sub = s_tl_sub;
    if (sub)
        ll_iopub_set_thread_parent(self->env.iopub, req);
    ll_iopub_status(self->env.iopub, "busy", req);
    if (chan == LL_MSG_ON_SHELL && !sub)
        ll_iopub_set_parent(self->env.iopub, req);
    const ll_msgtype_t *type = ll_msgtype_find(req->msg_type);
    ll_dispatch_fn *fn =
        type && type->channels ? s_handler_of(self->env.handlers, self->env.forward, type) : NULL;
    /* On a subshell the interpreter's types go to its own entry point;
     * kernel_info (the cache) and the process's own handlers stay. */
    if (fn && sub && (type->flags & LL_MSG_INTERP) && !s_in_table(s_own, type->msg_type))
        fn = self->env.subshell_forward;
    if (!fn)
        ll_warn("kernel", "unknown message type '%.64s' on %s: ignored", req->msg_type,
                s_chan_name(chan));
    else if (!(type->channels & chan))
        s_refuse(self, req, chan, sock);
    else
        fn(self, self->env.ctx, req, chan, sock);
    if (chan == LL_MSG_ON_SHELL && !sub && self->env.after_shell)
        self->env.after_shell(self->env.ctx);
    ll_iopub_status(self->env.iopub, "idle", req); /* flushes stream text first */
    if (sub)
        ll_iopub_set_thread_parent(self->env.iopub, NULL);
}

/* The next request waiting on SOCK, decoded (receive timeout 0: never
 * waits), or NULL.  Undecodable messages are logged and dropped here. */
static ll_msg_t *s_recv(ll_dispatch_t *self, zsock_t *sock, ll_log_limit_t *lim, const char *name)
{
    char why[256];
    zmsg_t *raw;
    while ((raw = zmsg_recv(sock))) {
        ll_msg_t *req = ll_session_decode(self->env.session, &raw, why, sizeof why);
        if (req)
            return req;
        ll_warn_limited(lim, "kernel", "dropped a message on %s: %s", name, why);
    }
    return NULL;
}

/* A decoded request the relay passed by pointer on PIPE (receive timeout
 * 0), or NULL. */
static ll_msg_t *s_recv_pipe(zsock_t *pipe)
{
    void *p = NULL;
    return zsock_recv(pipe, "p", &p) == 0 ? p : NULL;
}

/* The next request for the shell this thread serves: a subshell's, or the
 * main shell's (from the relay's pipe, or the ROUTER itself). */
static ll_msg_t *s_recv_shell(ll_dispatch_t *self)
{
    if (s_tl_sub)
        return s_recv_pipe(s_tl_sub->pipe);
    if (self->main_pipe)
        return s_recv_pipe(self->main_pipe);
    return s_recv(self, self->env.shell, &self->drop_log, "shell");
}

/* The list stop_on_error fills on this thread's shell. */
static zlist_t **s_abort_list(ll_dispatch_t *self)
{
    return s_tl_sub ? &s_tl_sub->to_abort : &self->to_abort;
}

static bool s_queue_ready(zlist_t **list_p)
{
    return *list_p || (*list_p = zlist_new());
}

static void s_drop_requests(zlist_t **list_p)
{
    ll_msg_t *req;
    while (*list_p && (req = zlist_pop(*list_p)))
        ll_msg_destroy(&req);
    zlist_destroy(list_p);
}

void ll_dispatch_take_queue(ll_dispatch_t *self)
{
    zlist_t **list_p = s_abort_list(self);
    if (!s_queue_ready(list_p))
        return;
    ll_msg_t *req;
    while (!s_tl_sub && self->queued && (req = zlist_pop(self->queued))) /* read ahead first */
        zlist_append(*list_p, req);
    while ((req = s_recv_shell(self)))
        zlist_append(*list_p, req);
}

static bool s_stopping(ll_dispatch_t *self)
{
    return atomic_load(&self->shutdown) ||
           (self->env.stopping && self->env.stopping(self->env.ctx));
}

static void s_abort_execute(ll_dispatch_t *self, ll_msg_t *req)
{
    ll_iopub_status(self->env.iopub, "busy", req);
    json_t *md = json_pack("{s:s, s:b, s:s}", "status", "aborted", "dependencies_met", 1, "engine",
                           ll_session_id(self->env.session));
    ll_dispatch_reply(self, s_tl_sub ? s_tl_sub->pipe : s_shell_out(self), req, "execute_reply",
                      json_pack("{s:s}", "status", "aborted"), md);
    ll_iopub_status(self->env.iopub, "idle", req);
}

/* Execute requests in the taken queue get "aborted" (with busy/idle); other
 * requests in it are served normally, in order. */
static void s_abort_taken(ll_dispatch_t *self)
{
    int aborted = 0;
    ll_msg_t *req;
    zlist_t **list_p = s_abort_list(self);
    zsock_t *out = s_tl_sub ? s_tl_sub->pipe : s_shell_out(self);
    while (*list_p && (req = zlist_pop(*list_p))) {
        if (s_stopping(self)) {
            ll_msg_destroy(&req);
            continue;
        }
        if (strcmp(req->msg_type, "execute_request") == 0) {
            s_abort_execute(self, req);
            aborted++;
        } else {
            s_serve(self, req, LL_MSG_ON_SHELL, out); /* cannot take the queue again */
        }
        ll_msg_destroy(&req);
    }
    if (aborted)
        ll_info("kernel", "aborted %d queued execute_request(s) after an error", aborted);
}

/* ---- subshells ------------------------------------------------------------- */

#define S_GONE "gone" /* a subshell's last message to the relay (one frame) */

static void s_eventfd_signal(int fd)
{
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof one) < 0 && errno != EAGAIN)
        ll_warn("kernel", "cannot wake a thread: %s", strerror(errno));
}

static void s_eventfd_drain(int fd)
{
    uint64_t v;
    if (read(fd, &v, sizeof v) < 0 && errno != EAGAIN)
        ll_warn("kernel", "cannot read an eventfd: %s", strerror(errno));
}

/* The listed subshell named ID, or NULL; under subs_lock. */
static s_sub_t *s_sub_find(ll_dispatch_t *self, const char *id)
{
    for (s_sub_t *s = self->subs; id && s; s = s->next)
        if (s->listed && strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

/* An error reply (with busy and idle) to REQ on SOCK, for a request no
 * shell will serve: unknown subshell, or one deleted with REQ queued.
 * Shaped like ipykernel 7's _send_unknown_subshell_reply. */
static void s_refuse_subshell(ll_dispatch_t *self, const ll_msg_t *req, zsock_t *sock,
                              const char *ename, const char *evalue)
{
    ll_warn("kernel", "cannot serve %.64s: %s", req->msg_type, evalue);
    ll_iopub_status(self->env.iopub, "busy", req);
    char reply_type[96];
    if (ll_dispatch_reply_type(req->msg_type, reply_type, sizeof reply_type))
        ll_dispatch_reply(self, sock, req, reply_type, ll_dispatch_error_content(ename, evalue),
                          json_pack("{s:s}", "status", "error"));
    ll_iopub_status(self->env.iopub, "idle", req);
}

/* A subshell's thread: serve what the relay passes, in order, until told to
 * stop; then answer what is still queued and say "gone". */
static void *s_sub_main(void *arg)
{
    s_sub_t *sub = arg;
    ll_dispatch_t *self = sub->d;
    s_tl_sub = sub;
    zmq_pollitem_t items[2] = {{zsock_resolve(sub->pipe), 0, ZMQ_POLLIN, 0},
                               {NULL, sub->stop_fd, ZMQ_POLLIN, 0}};
    for (;;) {
        if (zmq_poll(items, 2, -1) < 0 && errno != EINTR)
            break;
        if (items[1].revents)
            break;
        ll_msg_t *req;
        while (!s_stopping(self) && !atomic_load(&sub->stop) && (req = s_recv_pipe(sub->pipe))) {
            ll_debug("kernel", "subshell %s: %s", sub->id, req->msg_type);
            s_serve(self, req, LL_MSG_ON_SHELL, sub->pipe);
            ll_msg_destroy(&req);
            s_abort_taken(self);
        }
        if (s_stopping(self) || atomic_load(&sub->stop))
            break;
    }
    char evalue[96];
    snprintf(evalue, sizeof evalue, "subshell %s was deleted", sub->id);
    ll_msg_t *req;
    while ((req = s_recv_pipe(sub->pipe)) || (sub->to_abort && (req = zlist_pop(sub->to_abort)))) {
        if (!s_stopping(self))
            s_refuse_subshell(self, req, sub->pipe, "SubshellDeleted", evalue);
        ll_msg_destroy(&req);
    }
    if (self->env.subshell_end)
        self->env.subshell_end(self->env.ctx);
    zstr_send(sub->pipe, S_GONE);
    s_tl_sub = NULL;
    return NULL;
}

static void s_sub_free(s_sub_t **sub_p)
{
    s_sub_t *sub = *sub_p;
    if (!sub)
        return;
    s_drop_requests(&sub->to_abort);
    ll_msg_t *req;
    while (sub->pipe && (req = s_recv_pipe(sub->pipe))) /* passed, never served */
        ll_msg_destroy(&req);
    zsock_destroy(&sub->pipe);
    zsock_destroy(&sub->relay_end);
    if (sub->stop_fd >= 0)
        close(sub->stop_fd);
    free(sub);
    *sub_p = NULL;
}

/* An inproc PAIR pair named after KEY: *A binds, *B connects; both with
 * receive timeout 0.  0, or -1. */
static int s_pipe_pair(const void *key, const char *what, zsock_t **a, zsock_t **b)
{
    /* A name never used before: a socket closed a moment ago may still
     * hold its endpoint (ZeroMQ closes sockets asynchronously), and a new
     * subshell may get the same address as a freed one. */
    static atomic_uint seq;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://ll-dispatch-%s-%p-%u", what, key, atomic_fetch_add(&seq, 1));
    char bind[100], conn[100];
    snprintf(bind, sizeof bind, "@%s", ep);
    snprintf(conn, sizeof conn, ">%s", ep);
    /* No high-water mark (set before the pipe exists): a PAIR at its mark
     * blocks the sender, and a relay blocked behind a main shell busy in a
     * long cell (a burst of completion hints) would starve the subshells.
     * What waits is small: pointers one way, replies the other. */
    *a = zsock_new(ZMQ_PAIR);
    *b = zsock_new(ZMQ_PAIR);
    if (*a && *b) {
        zsock_set_sndhwm(*a, 0);
        zsock_set_rcvhwm(*a, 0);
        zsock_set_sndhwm(*b, 0);
        zsock_set_rcvhwm(*b, 0);
        if (zsock_attach(*a, bind, true) < 0 || zsock_attach(*b, conn, false) < 0)
            zsock_destroy(b);
    }
    if (!*a || !*b) {
        zsock_destroy(a);
        zsock_destroy(b);
        return -1;
    }
    zsock_set_rcvtimeo(*a, 0);
    zsock_set_rcvtimeo(*b, 0);
    return 0;
}

/* A new subshell, its thread running and listed; NULL on failure. */
static s_sub_t *s_sub_start(ll_dispatch_t *self)
{
    s_sub_t *sub = calloc(1, sizeof *sub);
    if (!sub)
        return NULL;
    sub->d = self;
    sub->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    atomic_init(&sub->stop, false);
    zuuid_t *uuid = zuuid_new();
    if (uuid)
        snprintf(sub->id, sizeof sub->id, "%s", zuuid_str_canonical(uuid));
    zuuid_destroy(&uuid);
    if (sub->stop_fd < 0 || !sub->id[0] || s_pipe_pair(sub, "sub", &sub->pipe, &sub->relay_end) < 0)
        goto out_free;
    /* The thread must take no signal: SIGINT and SIGTERM are the main
     * thread's (ll_kernel.h). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&sub->thread, NULL, s_sub_main, sub);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        goto out_free;
    pthread_mutex_lock(&self->subs_lock);
    sub->listed = true;
    s_sub_t **tail = &self->subs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = sub;
    pthread_mutex_unlock(&self->subs_lock);
    s_eventfd_signal(self->relay_wake_fd); /* poll its pipe from now on */
    return sub;

out_free:
    s_sub_free(&sub);
    return NULL;
}

static void s_on_create_subshell(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan,
                                 zsock_t *sock)
{
    s_sub_t *sub = d->main_pipe ? s_sub_start(d) : NULL;
    if (!sub) {
        ll_dispatch_reply(d, sock, req, "create_subshell_reply",
                          json_pack("{s:s, s:s}", "status", "error", "evalue",
                                    d->main_pipe ? "cannot start a subshell"
                                                 : "this kernel runs without subshells"),
                          NULL);
        return;
    }
    ll_info("kernel", "subshell %s created", sub->id);
    ll_dispatch_reply(d, sock, req, "create_subshell_reply",
                      json_pack("{s:s, s:s}", "status", "ok", "subshell_id", sub->id), NULL);
}

/* Unlist the subshell ID and tell its thread to end (it finishes what it
 * runs).  0, or -1 when there is no such subshell. */
static int s_sub_delete(ll_dispatch_t *self, const char *id)
{
    pthread_mutex_lock(&self->subs_lock);
    s_sub_t *sub = s_sub_find(self, id);
    if (sub) {
        sub->listed = false;
        atomic_store(&sub->stop, true);
        s_eventfd_signal(sub->stop_fd);
    }
    pthread_mutex_unlock(&self->subs_lock);
    return sub ? 0 : -1;
}

static void s_on_delete_subshell(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan,
                                 zsock_t *sock)
{
    const char *id = ll_msg_content_str(req, "subshell_id");
    json_t *content;
    if (id && s_sub_delete(d, id) == 0) {
        ll_info("kernel", "subshell %s deleted", id);
        content = json_pack("{s:s}", "status", "ok");
    } else {
        char evalue[160];
        /* ipykernel's reply: status and str(UnknownSubshellError). */
        snprintf(evalue, sizeof evalue, "Unknown subshell_id '%.64s'", id ? id : "");
        content = json_pack("{s:s, s:s, s:s, s:[]}", "status", "error", "ename",
                            "UnknownSubshellError", "evalue", evalue, "traceback");
    }
    ll_dispatch_reply(d, sock, req, "delete_subshell_reply", content, NULL);
}

static void s_on_list_subshell(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan,
                               zsock_t *sock)
{
    json_t *ids = json_array();
    pthread_mutex_lock(&d->subs_lock);
    for (s_sub_t *s = d->subs; s; s = s->next)
        if (s->listed)
            json_array_append_new(ids, json_string(s->id));
    pthread_mutex_unlock(&d->subs_lock);
    ll_dispatch_reply(d, sock, req, "list_subshell_reply",
                      json_pack("{s:s, s:o}", "status", "ok", "subshell_id", ids), NULL);
}

/* The relay: a request from the ROUTER goes where its subshell_id says. */
static void s_relay_route(ll_dispatch_t *self, ll_msg_t *req)
{
    json_t *sid = json_object_get(req->header, "subshell_id");
    zsock_t *to = NULL;
    ll_debug("kernel", "relay: %.64s for %s", req->msg_type,
             sid && !json_is_null(sid) ? "a subshell" : "main");
    if (!sid || json_is_null(sid)) {
        to = self->main_relay;
    } else {
        pthread_mutex_lock(&self->subs_lock);
        s_sub_t *sub = s_sub_find(self, json_string_value(sid));
        to = sub ? sub->relay_end : NULL;
        /* sent under the lock: the relay alone frees a subshell, but a
         * delete between find and send must still find its pipe open */
        if (to && zsock_send(to, "p", req) == 0)
            req = NULL;
        pthread_mutex_unlock(&self->subs_lock);
        if (!to) {
            char evalue[160];
            snprintf(evalue, sizeof evalue, "Unknown subshell_id '%.64s'",
                     json_is_string(sid) ? json_string_value(sid) : "(not a string)");
            s_refuse_subshell(self, req, self->env.shell, "UnknownSubshellError", evalue);
        }
        ll_msg_destroy(&req);
        return;
    }
    if (zsock_send(to, "p", req) != 0) {
        ll_warn("kernel", "relay: cannot pass a request on: %s", zmq_strerror(zmq_errno()));
        ll_msg_destroy(&req);
    }
}

/* Forward every reply waiting on FROM to the ROUTER.  True when FROM's
 * subshell said "gone". */
static bool s_relay_out(ll_dispatch_t *self, zsock_t *from)
{
    zmsg_t *m;
    bool gone = false;
    while ((m = zmsg_recv(from))) {
        if (zmsg_size(m) == 1) { /* only a subshell's last word has one frame */
            gone = true;
            zmsg_destroy(&m);
            continue;
        }
        ll_debug("kernel", "relay: a reply of %zu frames out", zmsg_size(m));
        if (zmsg_send(&m, self->env.shell) != 0) {
            ll_warn("kernel", "relay: cannot send a reply: %s", zmq_strerror(zmq_errno()));
            zmsg_destroy(&m);
        }
    }
    return gone;
}

#define S_RELAY_MAX 256 /* pollable subshells at once; more wait for a slot */

static void *s_relay_main(void *arg)
{
    ll_dispatch_t *self = arg;
    zmq_pollitem_t items[3 + S_RELAY_MAX];
    s_sub_t *polled[S_RELAY_MAX];
    while (!atomic_load(&self->relay_stop)) {
        items[0] = (zmq_pollitem_t){zsock_resolve(self->env.shell), 0, ZMQ_POLLIN, 0};
        items[1] = (zmq_pollitem_t){zsock_resolve(self->main_relay), 0, ZMQ_POLLIN, 0};
        items[2] = (zmq_pollitem_t){NULL, self->relay_wake_fd, ZMQ_POLLIN, 0};
        int n = 0;
        pthread_mutex_lock(&self->subs_lock);
        for (s_sub_t *s = self->subs; s && n < S_RELAY_MAX; s = s->next) {
            polled[n] = s;
            items[3 + n++] = (zmq_pollitem_t){zsock_resolve(s->relay_end), 0, ZMQ_POLLIN, 0};
        }
        pthread_mutex_unlock(&self->subs_lock);
        if (zmq_poll(items, 3 + n, -1) < 0) {
            if (errno == EINTR)
                continue;
            ll_error("kernel", "the shell relay cannot poll: %s", zmq_strerror(errno));
            break;
        }
        if (items[2].revents)
            s_eventfd_drain(self->relay_wake_fd);
        if (items[1].revents)
            s_relay_out(self, self->main_relay);
        for (int i = 0; i < n; i++) {
            if (!items[3 + i].revents || !s_relay_out(self, polled[i]->relay_end))
                continue;
            s_sub_t *sub = polled[i];
            pthread_join(sub->thread, NULL); /* it returns right after "gone" */
            pthread_mutex_lock(&self->subs_lock);
            for (s_sub_t **p = &self->subs; *p; p = &(*p)->next)
                if (*p == sub) {
                    *p = sub->next;
                    break;
                }
            pthread_mutex_unlock(&self->subs_lock);
            s_sub_free(&sub);
        }
        if (items[0].revents) {
            ll_msg_t *req;
            while ((req = s_recv(self, self->env.shell, &self->drop_log_relay, "shell")))
                s_relay_route(self, req);
        }
    }
    return NULL;
}

/* Subshells on: the main pipe and the relay thread.  0, or -1. */
static int s_relay_start(ll_dispatch_t *self)
{
    self->relay_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->relay_wake_fd < 0 ||
        s_pipe_pair(self, "main", &self->main_pipe, &self->main_relay) < 0)
        return -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&self->relay, NULL, s_relay_main, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return -1;
    self->relay_started = true;
    return 0;
}

void ll_dispatch_stop_subshells(ll_dispatch_t *self, int wait_ms)
{
    if (!self || !self->main_pipe)
        return;
    pthread_mutex_lock(&self->subs_lock);
    for (s_sub_t *s = self->subs; s; s = s->next) {
        s->listed = false;
        atomic_store(&s->stop, true);
        s_eventfd_signal(s->stop_fd);
    }
    pthread_mutex_unlock(&self->subs_lock);
    /* The relay frees each subshell once it said "gone"; one still inside a
     * cell after WAIT_MS is left to the process's exit. */
    for (int waited = 0; waited < wait_ms; waited += 10) {
        pthread_mutex_lock(&self->subs_lock);
        bool any = self->subs != NULL;
        pthread_mutex_unlock(&self->subs_lock);
        if (!any)
            return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ll_warn("kernel", "a subshell still runs a cell at exit");
}

/* ---- the public steps --------------------------------------------------------- */

ll_msg_t *ll_dispatch_next_shell(ll_dispatch_t *self)
{
    ll_msg_t *req = self->queued ? zlist_pop(self->queued) : NULL;
    return req ? req : s_recv_shell(self);
}

void ll_dispatch_shell(ll_dispatch_t *self, ll_msg_t *req)
{
    ll_debug("kernel", "shell: %s", req->msg_type);
    s_serve(self, req, LL_MSG_ON_SHELL, s_shell_out(self));
    s_abort_taken(self); /* after the failing request's idle, as ipykernel orders it */
}

void ll_dispatch_control(ll_dispatch_t *self)
{
    ll_msg_t *req;
    while ((req = s_recv(self, self->env.control, &self->drop_log_control, "control"))) {
        s_serve(self, req, LL_MSG_ON_CONTROL, self->env.control);
        ll_msg_destroy(&req);
    }
}

const ll_msg_t *ll_dispatch_next_queued_execute(ll_dispatch_t *self)
{
    if (!s_queue_ready(&self->queued))
        return NULL;
    ll_msg_t *next;
    while ((next = s_recv_shell(self)))
        zlist_append(self->queued, next);
    for (ll_msg_t *q = zlist_first(self->queued); q; q = zlist_next(self->queued))
        if (strcmp(q->msg_type, "execute_request") == 0)
            return q;
    return NULL;
}

void ll_dispatch_shell_readable(ll_dispatch_t *self)
{
    if (!s_queue_ready(&self->queued))
        return;
    ll_msg_t *req;
    while ((req = s_recv_shell(self))) {
        if (strcmp(req->msg_type, "kernel_info_request") != 0) {
            zlist_append(self->queued, req);
            continue;
        }
        ll_iopub_status(self->env.iopub, "busy", req);
        s_on_kernel_info(self, self->env.ctx, req, LL_MSG_ON_SHELL, s_shell_out(self));
        ll_iopub_status(self->env.iopub, "idle", req);
        ll_msg_destroy(&req);
    }
}

size_t ll_dispatch_queued(const ll_dispatch_t *self)
{
    return self->queued ? zlist_size(self->queued) : 0;
}

const json_t *ll_dispatch_kernel_info(const ll_dispatch_t *self)
{
    return self->kernel_info;
}

bool ll_dispatch_shutting_down(const ll_dispatch_t *self)
{
    return atomic_load(&self->shutdown);
}

ll_dispatch_t *ll_dispatch_new(const ll_dispatch_env_t *env)
{
    char why[256];
    if (ll_dispatch_check(env->handlers, env->forward, why, sizeof why) < 0) {
        ll_error("kernel", "the dispatch table is wrong: %s", why);
        json_decref(env->kernel_info);
        return NULL;
    }
    ll_dispatch_t *self = calloc(1, sizeof *self);
    if (!self) {
        json_decref(env->kernel_info);
        return NULL;
    }
    self->env = *env;
    self->kernel_info = env->kernel_info ? env->kernel_info : json_object();
    self->env.kernel_info = NULL;
    self->drop_log = (ll_log_limit_t) LL_LOG_LIMIT_INIT;
    self->drop_log_control = (ll_log_limit_t) LL_LOG_LIMIT_INIT;
    self->drop_log_relay = (ll_log_limit_t) LL_LOG_LIMIT_INIT;
    atomic_init(&self->shutdown, false);
    atomic_init(&self->relay_stop, false);
    self->relay_wake_fd = -1;
    pthread_mutex_init(&self->subs_lock, NULL);
    if (env->subshell_forward && s_relay_start(self) < 0) {
        ll_error("kernel", "cannot start the shell relay for subshells");
        ll_dispatch_destroy(&self);
    }
    return self;
}

void ll_dispatch_destroy(ll_dispatch_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_dispatch_t *self = *self_p;
    if (self->relay_started) {
        ll_dispatch_stop_subshells(self, 1000);
        atomic_store(&self->relay_stop, true);
        s_eventfd_signal(self->relay_wake_fd);
        pthread_join(self->relay, NULL);
    }
    /* What is left: subshells still in a cell at exit (their threads are
     * not waited for: the process ends). */
    pthread_mutex_lock(&self->subs_lock);
    s_sub_t *leftover = self->subs;
    self->subs = NULL;
    pthread_mutex_unlock(&self->subs_lock);
    if (leftover)
        ll_warn("kernel", "leaving subshells that still run a cell");
    ll_msg_t *req;
    while (self->main_pipe && (req = s_recv_pipe(self->main_pipe)))
        ll_msg_destroy(&req);
    zsock_destroy(&self->main_pipe);
    zsock_destroy(&self->main_relay);
    if (self->relay_wake_fd >= 0)
        close(self->relay_wake_fd);
    pthread_mutex_destroy(&self->subs_lock);
    s_drop_requests(&self->to_abort);
    s_drop_requests(&self->queued);
    json_decref(self->kernel_info);
    free(self);
    *self_p = NULL;
}
