/* ll_iopub: the IOPub XPUB socket, the stream coalescer feeding it, and the
 * current parent (see ll_iopub.h).  Kernel process; every function is called
 * from several threads (shell loop, control thread, Python threads through
 * the hooks, the fd-capture reader, the stream flusher, the welcome watcher).
 *
 * What must stay true: the XPUB socket and `parent` are touched only with
 * the coalescer's send lock held, i.e. inside an ll_stream emit callback or
 * an ll_stream_flush_then function.
 *
 * Welcomes (protocol 5.5): a subscription arrives as a message on the XPUB
 * socket and is answered by an iopub_welcome.  Nobody may block in a
 * receive on a socket that other threads send on, so the watcher thread
 * waits on the socket's ZMQ_FD (a plain file descriptor: poll() on it is not
 * a use of the socket) and only then takes the lock.  That fd is reset by
 * whichever call on the socket processes libzmq's pending commands, sends
 * included, so every holder of the lock that used the socket answers the
 * subscriptions waiting there before letting go (s_welcome_locked): a
 * subscription that a send took in is answered by that sender, one that
 * came later leaves the fd readable for the watcher. */
#include "gateway/ll_iopub.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/ll_stream.h"
#include "base/ll_log.h"

/* How long queued iopub messages may take to leave at shutdown. */
#define LL_IOPUB_LINGER_MS 1000

struct ll_iopub_t {
    ll_session_t *session; /* borrowed */
    zsock_t *pub;          /* XPUB; send lock */
    ll_stream_t *stream;   /* coalescer; owns the send lock */
    ll_msg_t *parent;      /* current parent (identities + header); send lock */
    int pub_fd;            /* the XPUB socket's ZMQ_FD, polled by the watcher */
    int stop_fd;           /* eventfd: the watcher leaves */
    pthread_t watcher;     /* answers subscriptions while nobody sends */
    bool watcher_started;
};

/* Topic frame as ipykernel writes it; subscribers filter on a prefix, and
 * every Jupyter client subscribes to everything. */
static void s_set_topic(ll_iopub_t *self, ll_msg_t *msg)
{
    zmsg_destroy(&msg->identities);
    msg->identities = zmsg_new();
    if (msg->identities)
        zmsg_addstrf(msg->identities, "kernel.%s.%s", ll_session_id(self->session),
                     msg->msg_type ? msg->msg_type : "");
}

/* iopub_welcome for a subscription to TOPIC (LEN bytes), as ipykernel 7
 * sends it: no parent, content {"subscription": topic}, the topic itself as
 * the topic frame (none for the empty topic, which every client uses), so
 * it reaches the subscriber that asked.  A topic that is not UTF-8 cannot
 * be put in the content and gets no welcome (ipykernel skips it too). */
static void s_send_welcome(ll_iopub_t *self, const char *topic, size_t len)
{
    json_t *content = json_pack("{s:s%}", "subscription", topic, len);
    ll_msg_t *msg = content ? ll_msg_new(self->session, "iopub_welcome", NULL, content) : NULL;
    if (!msg)
        return;
    if (len)
        zmsg_addmem(msg->identities, topic, len);
    if (ll_session_send(self->session, self->pub, &msg) != 0)
        ll_warn("iopub", "cannot send an iopub_welcome");
}

/* Answer every subscription waiting on the socket.  Send lock held; called
 * by every holder that used the socket (see the top of the file).  What else
 * a peer may send up an XPUB (unsubscriptions, XSUB messages) is dropped. */
static void s_welcome_locked(ll_iopub_t *self)
{
    while (zsock_events(self->pub) & ZMQ_POLLIN) {
        zmsg_t *in = zmsg_recv(self->pub); /* receive timeout 0: never waits */
        if (!in)
            break;
        zframe_t *f = zmsg_first(in);
        if (zmsg_size(in) == 1 && zframe_size(f) >= 1 && zframe_data(f)[0] == 1)
            s_send_welcome(self, (const char *) zframe_data(f) + 1, zframe_size(f) - 1);
        zmsg_destroy(&in);
    }
}

/* Send under the send lock; consumes *MSG_P. */
static int s_send_locked(ll_iopub_t *self, ll_msg_t **msg_p)
{
    s_set_topic(self, *msg_p);
    int rc = ll_session_send(self->session, self->pub, msg_p);
    if (rc != 0)
        ll_warn("iopub", "cannot send an iopub message");
    s_welcome_locked(self);
    return rc != 0 ? -1 : 0;
}

static void s_welcome_cb(void *arg)
{
    s_welcome_locked(arg);
}

/* The watcher: wakes when the socket may have a subscription and no sender
 * took it in, and answers it under the lock. */
static void *s_watch_main(void *arg)
{
    ll_iopub_t *self = arg;
    struct pollfd fds[2] = {{.fd = self->pub_fd, .events = POLLIN},
                            {.fd = self->stop_fd, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            ll_error("iopub", "poll: %s: no more iopub_welcome", strerror(errno));
            break;
        }
        if (fds[1].revents)
            break;
        if (fds[0].revents)
            ll_stream_flush_then(self->stream, s_welcome_cb, self);
    }
    return NULL;
}

/* Stream emit callback: one "stream" message per coalesced chunk. */
static void s_emit_stream(void *ctx, const char *name, const char *text, size_t len)
{
    ll_iopub_t *self = ctx;
    json_t *content = json_object();
    if (!content)
        return;
    /* The coalescer guarantees valid UTF-8; skip jansson's second check. */
    json_object_set_new(content, "name", json_string(name));
    json_object_set_new(content, "text", json_stringn_nocheck(text, len));
    ll_msg_t *msg = ll_msg_new(self->session, "stream", self->parent, content);
    if (msg)
        s_send_locked(self, &msg);
}

ll_iopub_t *ll_iopub_new(ll_session_t *session, const char *endpoint, char *err, size_t errlen)
{
    return ll_iopub_new_curve(session, endpoint, NULL, err, errlen);
}

ll_iopub_t *ll_iopub_new_curve(ll_session_t *session, const char *endpoint, const ll_curve_t *curve,
                               char *err, size_t errlen)
{
    ll_iopub_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->session = session;
    self->stop_fd = -1;
    /* XPUB (protocol 5.5), so that subscriptions reach us and get their
     * iopub_welcome; verbose, so that every client's subscription does, not
     * only the first to a topic (ipykernel 7.4 welcomes only that one, and a
     * second frontend waiting for its welcome would wait forever). */
    self->pub = zsock_new(ZMQ_XPUB);
    if (!self->pub) {
        snprintf(err, errlen, "cannot create the iopub socket");
        goto out_fail;
    }
    zsock_set_linger(self->pub, LL_IOPUB_LINGER_MS);
    /* Never drop output because a slow frontend fills the queue (the
     * default high-water mark of 1000 messages loses text silently). */
    zsock_set_sndhwm(self->pub, 0);
    zsock_set_xpub_verbose(self->pub, 1);
    zsock_set_rcvtimeo(self->pub, 0);
    if (strstr(endpoint, "://["))
        zsock_set_ipv6(self->pub, 1); /* tcp://[::1]:port */
    ll_wire_limit_frames(self->pub);  /* (what comes in on PUB: subscriptions) */
    if (ll_curve_serve(curve, self->pub, err, errlen) != 0)
        goto out_fail;
    if (zsock_bind(self->pub, "%s", endpoint) == -1) {
        snprintf(err, errlen, "cannot bind iopub to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        goto out_fail;
    }
    self->stream = ll_stream_new(s_emit_stream, self, 0, 0);
    if (!self->stream) {
        snprintf(err, errlen, "cannot start the stream flusher");
        goto out_fail;
    }
    self->pub_fd = zsock_fd(self->pub);
    self->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->stop_fd < 0 || pthread_create(&self->watcher, NULL, s_watch_main, self) != 0) {
        snprintf(err, errlen, "cannot start the iopub subscription watcher");
        goto out_fail;
    }
    self->watcher_started = true;
    return self;

out_fail:
    ll_stream_destroy(&self->stream);
    if (self->stop_fd >= 0)
        close(self->stop_fd);
    zsock_destroy(&self->pub);
    free(self);
    return NULL;
}

void ll_iopub_destroy(ll_iopub_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_iopub_t *self = *self_p;
    if (self->watcher_started) {
        uint64_t one = 1;
        ssize_t w = write(self->stop_fd, &one, sizeof one);
        (void) w;
        pthread_join(self->watcher, NULL);
    }
    if (self->stop_fd >= 0)
        close(self->stop_fd);
    ll_stream_destroy(&self->stream); /* flushes */
    ll_msg_destroy(&self->parent);
    zsock_destroy(&self->pub); /* lingers for queued messages */
    free(self);
    *self_p = NULL;
}

ll_msg_t *ll_iopub_parent_copy(const ll_msg_t *req)
{
    if (!req || !req->header)
        return NULL;
    ll_msg_t *copy = calloc(1, sizeof *copy);
    if (!copy)
        return NULL;
    copy->identities = req->identities ? zmsg_dup(req->identities) : zmsg_new();
    copy->header = json_incref(req->header); /* read-only once decoded; refcount is atomic */
    copy->parent_header = json_object();
    copy->metadata = json_object();
    copy->content = json_object();
    copy->buffers = zmsg_new();
    copy->msg_type = req->msg_type;
    if (!copy->identities || !copy->parent_header || !copy->metadata || !copy->content ||
        !copy->buffers)
        ll_msg_destroy(&copy);
    return copy;
}

typedef struct {
    ll_iopub_t *self;
    ll_msg_t *parent;
} s_swap_t;

static void s_swap_parent(void *arg)
{
    s_swap_t *a = arg;
    ll_msg_destroy(&a->self->parent);
    a->self->parent = a->parent;
}

void ll_iopub_set_parent(ll_iopub_t *self, const ll_msg_t *req)
{
    s_swap_t a = {self, ll_iopub_parent_copy(req)};
    ll_stream_flush_then(self->stream, s_swap_parent, &a);
}

typedef struct {
    ll_iopub_t *self;
    const ll_msg_t *parent;
    const char *msg_type;
    json_t *content;
    json_t *metadata;
    zmsg_t *buffers;
    int rc;
} s_pub_t;

static void s_publish(void *arg)
{
    s_pub_t *a = arg;
    const ll_msg_t *parent = a->parent ? a->parent : a->self->parent;
    ll_msg_t *msg = ll_msg_new(a->self->session, a->msg_type, parent, a->content);
    a->content = NULL;
    if (!msg)
        return;
    if (a->metadata) {
        json_decref(msg->metadata);
        msg->metadata = a->metadata;
        a->metadata = NULL;
    }
    if (a->buffers) {
        zmsg_destroy(&msg->buffers);
        msg->buffers = a->buffers;
        a->buffers = NULL;
    }
    a->rc = s_send_locked(a->self, &msg);
}

/* The request a subshell thread serves (ll_iopub_set_thread_parent); NULL
 * on every other thread. */
static _Thread_local const ll_msg_t *s_thread_parent;

/* That thread's stream text not yet sent: a line goes out once complete
 * (print() writes its text and the newline apart), the rest before any other
 * message of the thread and at a flush. */
static _Thread_local struct {
    char name[8]; /* "stdout" or "stderr" */
    char *data;   /* malloc'd */
    size_t len, cap;
} s_tbuf;

static int s_send_now(ll_iopub_t *self, const char *msg_type, const ll_msg_t *parent,
                      json_t *content, json_t *metadata, zmsg_t **buffers_p);

static void s_thread_flush(ll_iopub_t *self)
{
    if (!s_tbuf.len || !s_thread_parent)
        return;
    /* Text that is not UTF-8 keeps what it can (Python sends whole strings). */
    json_t *text = json_stringn(s_tbuf.data, s_tbuf.len);
    if (!text)
        text = json_string("\ufffd");
    s_tbuf.len = 0;
    s_send_now(self, "stream", s_thread_parent,
               json_pack("{s:s, s:o}", "name", s_tbuf.name, "text", text), NULL, NULL);
}

static void s_thread_write(ll_iopub_t *self, const char *name, const char *data, size_t len)
{
    if (strncmp(s_tbuf.name, name, sizeof s_tbuf.name) != 0) {
        s_thread_flush(self);
        snprintf(s_tbuf.name, sizeof s_tbuf.name, "%s", name);
    }
    if (s_tbuf.len + len > s_tbuf.cap) {
        size_t cap = s_tbuf.len + len + 4096;
        char *p = realloc(s_tbuf.data, cap);
        if (!p) {
            s_thread_flush(self); /* and lose this piece: no memory */
            return;
        }
        s_tbuf.data = p;
        s_tbuf.cap = cap;
    }
    memcpy(s_tbuf.data + s_tbuf.len, data, len);
    s_tbuf.len += len;
    if (memchr(data, '\n', len) || s_tbuf.len >= 65536)
        s_thread_flush(self);
}

void ll_iopub_set_thread_parent(ll_iopub_t *self, const ll_msg_t *req)
{
    s_thread_flush(self);
    s_thread_parent = req;
    if (!req) {
        free(s_tbuf.data);
        memset(&s_tbuf, 0, sizeof s_tbuf);
    }
}

bool ll_iopub_has_thread_parent(void)
{
    return s_thread_parent != NULL;
}

int ll_iopub_send(ll_iopub_t *self, const char *msg_type, const ll_msg_t *parent, json_t *content,
                  json_t *metadata, zmsg_t **buffers_p)
{
    s_thread_flush(self); /* a subshell's text keeps its place */
    return s_send_now(self, msg_type, parent ? parent : s_thread_parent, content, metadata,
                      buffers_p);
}

static int s_send_now(ll_iopub_t *self, const char *msg_type, const ll_msg_t *parent,
                      json_t *content, json_t *metadata, zmsg_t **buffers_p)
{
    s_pub_t a = {self, parent, msg_type, content, metadata, buffers_p ? *buffers_p : NULL, -1};
    if (buffers_p)
        *buffers_p = NULL;
    ll_stream_flush_then(self->stream, s_publish, &a);
    /* Whatever s_publish did not take (allocation failure) is freed here. */
    json_decref(a.content);
    json_decref(a.metadata);
    zmsg_destroy(&a.buffers);
    return a.rc;
}

int ll_iopub_status(ll_iopub_t *self, const char *state, const ll_msg_t *parent)
{
    return ll_iopub_send(self, "status", parent, json_pack("{s:s}", "execution_state", state), NULL,
                         NULL);
}

void ll_iopub_stream_write(ll_iopub_t *self, const char *name, const char *data, size_t len)
{
    if (s_thread_parent) {
        /* A subshell's text: its own messages under its own request, since
         * the coalescer's buffer belongs to the main shell's parent. */
        s_thread_write(self, name, data, len);
        return;
    }
    ll_stream_write(self->stream, name, data, len);
}

void ll_iopub_stream_flush(ll_iopub_t *self)
{
    if (s_thread_parent) {
        s_thread_flush(self);
        return;
    }
    ll_stream_flush_whole(self->stream); /* a cut fd character waits for the drain */
}

typedef struct {
    ll_iopub_t *self;
    const char *msg_type;
    json_t *content;
    ll_msg_t *out;
} s_to_parent_t;

static void s_to_parent(void *arg)
{
    s_to_parent_t *a = arg;
    if (!a->self->parent)
        return;
    a->out = ll_msg_new(a->self->session, a->msg_type, a->self->parent, a->content);
    a->content = NULL;
}

ll_msg_t *ll_iopub_msg_to_parent(ll_iopub_t *self, const char *msg_type, json_t *content)
{
    s_to_parent_t a = {self, msg_type, content, NULL};
    ll_stream_flush_then(self->stream, s_to_parent, &a);
    json_decref(a.content);
    return a.out;
}

/* ---- self-test ----------------------------------------------------------- */

/* Next message on SUB within 5 s, decoded, or NULL; welcomes are skipped. */
static ll_msg_t *s_st_recv(ll_session_t *session, zsock_t *sub)
{
    zpoller_t *poller = zpoller_new(sub, NULL);
    ll_msg_t *msg = NULL;
    char why[128];
    while (poller && !msg && zpoller_wait(poller, 5000)) {
        zmsg_t *raw = zmsg_recv(sub);
        if (raw)
            msg = ll_session_decode(session, &raw, why, sizeof why);
        if (msg && strcmp(msg->msg_type, "iopub_welcome") == 0)
            ll_msg_destroy(&msg);
    }
    zpoller_destroy(&poller);
    return msg;
}

/* Next message on SUB within 5 s, decoded, welcomes included. */
static ll_msg_t *s_st_recv_any(ll_session_t *session, zsock_t *sub)
{
    zpoller_t *poller = zpoller_new(sub, NULL);
    ll_msg_t *msg = NULL;
    char why[128];
    if (poller && zpoller_wait(poller, 5000)) {
        zmsg_t *raw = zmsg_recv(sub);
        if (raw)
            msg = ll_session_decode(session, &raw, why, sizeof why);
    }
    zpoller_destroy(&poller);
    return msg;
}

/* Whether MSG is of TYPE with a parent whose msg_id is PARENT_ID ("" for none). */
static bool s_st_is(const ll_msg_t *msg, const char *type, const char *parent_id)
{
    if (!msg || strcmp(msg->msg_type, type) != 0)
        return false;
    const char *pid = json_string_value(json_object_get(msg->parent_header, "msg_id"));
    return strcmp(pid ? pid : "", parent_id) == 0;
}

int ll_iopub_selftest(bool verbose)
{
    int rc = -1;
    char err[256];
    ll_msg_t *req1 = NULL, *req2 = NULL, *got = NULL;
    zsock_t *sub = NULL, *sub2 = NULL;
    ll_session_t *session = ll_session_new((const unsigned char *) "k", 1, "hmac-sha256", 0);
    ll_iopub_t *iopub =
        session ? ll_iopub_new(session, "inproc://ll-iopub-selftest", err, sizeof err) : NULL;
    if (!iopub)
        goto out;
    sub = zsock_new_sub(">inproc://ll-iopub-selftest", "");
    if (!sub)
        goto out;
    /* The subscription is answered by a welcome (no parent, the topic in
     * its content), sent by the watcher since nothing else is published:
     * from then on the subscriber gets everything. */
    zpoller_t *p = zpoller_new(sub, NULL);
    if (p && zpoller_wait(p, 5000)) {
        zmsg_t *raw = zmsg_recv(sub);
        got = raw ? ll_session_decode(session, &raw, err, sizeof err) : NULL;
    }
    zpoller_destroy(&p);
    if (!s_st_is(got, "iopub_welcome", "") ||
        strcmp(json_string_value(json_object_get(got->content, "subscription")), "") != 0)
        goto out;
    ll_msg_destroy(&got);
    /* A second subscriber gets its own welcome (verbose XPUB), and so does
     * the first, which must take it as one more to ignore (protocol 5.5). */
    sub2 = zsock_new_sub(">inproc://ll-iopub-selftest", "kernel.");
    got = sub2 ? s_st_recv_any(session, sub2) : NULL;
    if (!s_st_is(got, "iopub_welcome", "") ||
        strcmp(json_string_value(json_object_get(got->content, "subscription")), "kernel.") != 0)
        goto out;
    ll_msg_destroy(&got);

    req1 = ll_msg_new(session, "execute_request", NULL, NULL);
    req2 = ll_msg_new(session, "execute_request", NULL, NULL);
    if (!req1 || !req2)
        goto out;
    const char *id1 = json_string_value(json_object_get(req1->header, "msg_id"));
    const char *id2 = json_string_value(json_object_get(req2->header, "msg_id"));

    /* Text, then a publish: the text arrives first, both under req1. */
    ll_iopub_set_parent(iopub, req1);
    ll_iopub_stream_write(iopub, "stdout", "one ", 4);
    ll_iopub_stream_write(iopub, "stdout", "two\n", 4);
    ll_iopub_send(iopub, "display_data", NULL, json_pack("{s:{s:s}}", "data", "text/plain", "x"),
                  NULL, NULL);
    got = s_st_recv(session, sub);
    if (!s_st_is(got, "stream", id1) ||
        strcmp(json_string_value(json_object_get(got->content, "text")), "one two\n") != 0 ||
        strncmp(zframe_data(zmsg_first(got->identities))
                    ? (char *) zframe_data(zmsg_first(got->identities))
                    : "",
                "kernel.", 7) != 0)
        goto out;
    ll_msg_destroy(&got);
    got = s_st_recv(session, sub);
    if (!s_st_is(got, "display_data", id1))
        goto out;
    ll_msg_destroy(&got);

    /* Text buffered before a parent switch stays with the old parent. */
    ll_iopub_stream_write(iopub, "stderr", "late", 4);
    ll_iopub_set_parent(iopub, req2);
    ll_iopub_stream_write(iopub, "stdout", "new", 3);
    ll_iopub_status(iopub, "idle", req2);
    got = s_st_recv(session, sub);
    if (!s_st_is(got, "stream", id1) ||
        strcmp(json_string_value(json_object_get(got->content, "name")), "stderr") != 0)
        goto out;
    ll_msg_destroy(&got);
    got = s_st_recv(session, sub);
    if (!s_st_is(got, "stream", id2))
        goto out;
    ll_msg_destroy(&got);
    got = s_st_recv(session, sub);
    if (!s_st_is(got, "status", id2))
        goto out;
    ll_msg_destroy(&got);

    /* A message addressed to the parent carries its header. */
    got = ll_iopub_msg_to_parent(iopub, "input_request", json_pack("{s:s}", "prompt", "?"));
    if (!s_st_is(got, "input_request", id2))
        goto out;
    if (verbose)
        printf("(ordering and parents ok) ");
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "ll_iopub selftest failed%s%s\n", iopub ? "" : ": ", iopub ? "" : err);
    ll_msg_destroy(&got);
    ll_msg_destroy(&req1);
    ll_msg_destroy(&req2);
    zsock_destroy(&sub);
    zsock_destroy(&sub2);
    ll_iopub_destroy(&iopub);
    ll_session_destroy(&session);
    return rc;
}
