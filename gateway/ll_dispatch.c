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
 * the reply therefore always runs. */
#include "gateway/ll_dispatch.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ll_log.h"
#include "proto/ll_conn.h"

struct ll_dispatch_t {
    ll_dispatch_env_t env;   /* borrowed sockets, session, iopub; the handler table */
    json_t *kernel_info;     /* cached kernel_info_reply content; read-only */
    zlist_t *queued;         /* decoded shell requests read ahead; shell thread */
    zlist_t *to_abort;       /* taken when an execute failed (stop_on_error); shell thread */
    atomic_bool shutdown;    /* a shutdown_request was answered */
    ll_log_limit_t drop_log; /* lines about dropped wire input: shell thread */
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

static const ll_dispatch_handler_t s_own[] = {
    {"kernel_info_request", s_on_kernel_info},
    {"connect_request", s_on_connect},
    {"shutdown_request", s_on_shutdown},
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
    ll_iopub_status(self->env.iopub, "busy", req);
    if (chan == LL_MSG_ON_SHELL)
        ll_iopub_set_parent(self->env.iopub, req);
    const ll_msgtype_t *type = ll_msgtype_find(req->msg_type);
    ll_dispatch_fn *fn =
        type && type->channels ? s_handler_of(self->env.handlers, self->env.forward, type) : NULL;
    if (!fn)
        ll_warn("kernel", "unknown message type '%.64s' on %s: ignored", req->msg_type,
                s_chan_name(chan));
    else if (!(type->channels & chan))
        s_refuse(self, req, chan, sock);
    else
        fn(self, self->env.ctx, req, chan, sock);
    if (chan == LL_MSG_ON_SHELL && self->env.after_shell)
        self->env.after_shell(self->env.ctx);
    ll_iopub_status(self->env.iopub, "idle", req); /* flushes stream text first */
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

static ll_msg_t *s_recv_shell(ll_dispatch_t *self)
{
    return s_recv(self, self->env.shell, &self->drop_log, "shell");
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
    if (!s_queue_ready(&self->to_abort))
        return;
    ll_msg_t *req;
    while (self->queued && (req = zlist_pop(self->queued))) /* read ahead: first in line */
        zlist_append(self->to_abort, req);
    while ((req = s_recv_shell(self)))
        zlist_append(self->to_abort, req);
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
    ll_dispatch_reply(self, self->env.shell, req, "execute_reply",
                      json_pack("{s:s}", "status", "aborted"), md);
    ll_iopub_status(self->env.iopub, "idle", req);
}

/* Execute requests in the taken queue get "aborted" (with busy/idle); other
 * requests in it are served normally, in order. */
static void s_abort_taken(ll_dispatch_t *self)
{
    int aborted = 0;
    ll_msg_t *req;
    while (self->to_abort && (req = zlist_pop(self->to_abort))) {
        if (s_stopping(self)) {
            ll_msg_destroy(&req);
            continue;
        }
        if (strcmp(req->msg_type, "execute_request") == 0) {
            s_abort_execute(self, req);
            aborted++;
        } else {
            s_serve(self, req, LL_MSG_ON_SHELL, self->env.shell); /* cannot take the queue again */
        }
        ll_msg_destroy(&req);
    }
    if (aborted)
        ll_info("kernel", "aborted %d queued execute_request(s) after an error", aborted);
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
    s_serve(self, req, LL_MSG_ON_SHELL, self->env.shell);
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
        s_on_kernel_info(self, self->env.ctx, req, LL_MSG_ON_SHELL, self->env.shell);
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
    atomic_init(&self->shutdown, false);
    return self;
}

void ll_dispatch_destroy(ll_dispatch_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_dispatch_t *self = *self_p;
    s_drop_requests(&self->to_abort);
    s_drop_requests(&self->queued);
    json_decref(self->kernel_info);
    free(self);
    *self_p = NULL;
}
