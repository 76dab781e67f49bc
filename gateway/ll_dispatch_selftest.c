/* Self-test of gateway/ll_dispatch (run by build/ll_selftest): the
 * dispatcher against an in-memory transport.  Its shell and control are
 * ROUTERs on inproc:// endpoints, its iopub publishes on another; a client
 * (DEALERs and a SUB, its own session with the same key) sends signed
 * requests and reads what comes back.  The handlers that would reach the
 * interpreter are stubs here, so no Python starts: the real ones are
 * covered by the integration tests.  Checked: busy -> output -> idle on
 * iopub under the request's header, replies' parent headers, the channel
 * rules of proto/ll_msgtype.c (a shell-only request on control gets an
 * error reply, an unknown or internal type none), shutdown on control,
 * unsigned messages dropped with a log line, stop_on_error aborting what
 * was queued, and kernel_info answered while a GPU cell runs.  With
 * subshells on (a second dispatcher): the routing by header.subshell_id
 * through the relay thread (main shell, a subshell's thread, an unknown id
 * refused), a subshell answering while the main shell serves nothing,
 * stop_on_error per subshell, create/list/delete on control.
 *
 * Waits poll for a condition with a generous limit; nothing is timed. */
#include "gateway/ll_dispatch.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "proto/ll_conn.h"

#define S_WAIT_MS 10000 /* the most any step may take before the test fails */

typedef struct {
    ll_dispatch_t *d;
    ll_session_t *kernel, *client;
    ll_iopub_t *iopub;
    zsock_t *shell, *control;           /* the dispatcher's ROUTERs */
    zsock_t *c_shell, *c_control, *sub; /* the client's */
    int log_pipe[2];
    int saved_log_fd;
    /* what the stubs saw */
    int executes, forwarded, after_shell, shutdowns;
    atomic_int sub_served; /* requests the subshell stub served (its thread) */
} s_test_t;

static bool s_ok(bool cond, const char *what)
{
    if (!cond)
        fprintf(stderr, "ll_dispatch selftest: %s\n", what);
    return cond;
}

/* ---- the stub handlers ------------------------------------------------------ */

/* execute_request: code "fail" fails (taking the queue, as stop_on_error
 * does); anything else prints a line and succeeds. */
static void s_stub_execute(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    s_test_t *t = ctx;
    t->executes++;
    const char *code = ll_msg_content_str(req, "code");
    if (code && strcmp(code, "fail") == 0) {
        /* The test sends the next request at once: wait until the relay
         * passed it, so that it is queued behind the failure for sure. */
        for (int waited = 0; !(zsock_events(sock) & ZMQ_POLLIN) && waited < S_WAIT_MS; waited++)
            usleep(1000);
        ll_dispatch_take_queue(d);
        json_t *err = ll_dispatch_error_content("ValueError", "failed");
        json_object_set_new(err, "execution_count", json_integer(t->executes));
        ll_dispatch_reply(d, sock, req, "execute_reply", err, NULL);
        return;
    }
    ll_iopub_stream_write(t->iopub, "stdout", "hi\n", 3);
    ll_dispatch_reply(d, sock, req, "execute_reply",
                      json_pack("{s:s, s:i}", "status", "ok", "execution_count", t->executes),
                      NULL);
}

static void s_stub_ok(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    char reply_type[96];
    if (ll_dispatch_reply_type(req->msg_type, reply_type, sizeof reply_type))
        ll_dispatch_reply(d, sock, req, reply_type, json_pack("{s:s}", "status", "ok"), NULL);
}

static void s_stub_forward(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan, zsock_t *sock)
{
    ((s_test_t *) ctx)->forwarded++;
    s_stub_ok(d, ctx, req, chan, sock);
}

/* A subshell's interpreter stand-in, on its thread: execute "fail" fails
 * (taking that subshell's queue), anything else prints and succeeds; it
 * notes the subshell it ran on in the reply. */
static void s_stub_subshell(ll_dispatch_t *d, void *ctx, ll_msg_t *req, unsigned chan,
                            zsock_t *sock)
{
    s_test_t *t = ctx;
    atomic_fetch_add(&t->sub_served, 1);
    const char *code = ll_msg_content_str(req, "code");
    const char *on = ll_dispatch_current_subshell();
    char reply_type[96];
    if (!ll_dispatch_reply_type(req->msg_type, reply_type, sizeof reply_type))
        return;
    if (code && strcmp(code, "fail") == 0) {
        /* The test sends the next request at once: wait until the relay
         * passed it, so that it is queued behind the failure for sure. */
        for (int waited = 0; !(zsock_events(sock) & ZMQ_POLLIN) && waited < S_WAIT_MS; waited++)
            usleep(1000);
        ll_dispatch_take_queue(d);
        ll_dispatch_reply(d, sock, req, reply_type, ll_dispatch_error_content("ValueError", "x"),
                          NULL);
        return;
    }
    ll_iopub_stream_write(t->iopub, "stdout", "sub\n", 4);
    ll_dispatch_reply(d, sock, req, reply_type,
                      json_pack("{s:s, s:s}", "status", "ok", "on", on ? on : ""), NULL);
}

static void s_stub_after_shell(void *ctx)
{
    ((s_test_t *) ctx)->after_shell++;
}

static void s_stub_on_shutdown(void *ctx, bool restart)
{
    ((s_test_t *) ctx)->shutdowns++;
}

static const ll_dispatch_handler_t s_stubs[] = {
    {"execute_request", s_stub_execute},
    {"interrupt_request", s_stub_ok},
    {"usage_request", s_stub_ok},
    {"debug_request", s_stub_ok},
    {NULL, NULL},
};

/* ---- the client side --------------------------------------------------------- */

/* Send a signed MSG_TYPE with CONTENT (taken) on SOCK, for subshell SUB
 * (header.subshell_id; NULL: none); its msg_id into ID. */
static bool s_send_to(s_test_t *t, zsock_t *sock, const char *msg_type, json_t *content,
                      json_t *sub, char id[64])
{
    ll_msg_t *msg = ll_msg_new(t->client, msg_type, NULL, content ? content : json_object());
    if (!msg) {
        json_decref(sub);
        return false;
    }
    if (sub)
        json_object_set_new(msg->header, "subshell_id", sub);
    snprintf(id, 64, "%s", json_string_value(json_object_get(msg->header, "msg_id")));
    return ll_session_send(t->client, sock, &msg) == 0;
}

/* Send a signed MSG_TYPE with CONTENT (taken) on SOCK; its msg_id into ID. */
static bool s_send(s_test_t *t, zsock_t *sock, const char *msg_type, json_t *content, char id[64])
{
    ll_msg_t *msg = ll_msg_new(t->client, msg_type, NULL, content ? content : json_object());
    if (!msg)
        return false;
    snprintf(id, 64, "%s", json_string_value(json_object_get(msg->header, "msg_id")));
    return ll_session_send(t->client, sock, &msg) == 0;
}

/* The next message on SOCK, decoded, or NULL after S_WAIT_MS. */
static ll_msg_t *s_recv(s_test_t *t, zsock_t *sock)
{
    char why[256];
    zpoller_t *p = zpoller_new(sock, NULL);
    ll_msg_t *msg = NULL;
    if (p && zpoller_wait(p, S_WAIT_MS)) {
        zmsg_t *raw = zmsg_recv(sock);
        msg = raw ? ll_session_decode(t->client, &raw, why, sizeof why) : NULL;
    }
    zpoller_destroy(&p);
    return msg;
}

static bool s_parent_is(const ll_msg_t *msg, const char *id)
{
    const char *pid = json_string_value(json_object_get(msg->parent_header, "msg_id"));
    return pid && strcmp(pid, id) == 0;
}

/* Whether the next message on SOCK is MSG_TYPE under request ID (STATE: a
 * status's execution_state, or NULL); *OUT_P keeps it when given. */
static bool s_expect(s_test_t *t, zsock_t *sock, const char *msg_type, const char *state,
                     const char *id, ll_msg_t **out_p)
{
    ll_msg_t *msg = s_recv(t, sock);
    bool ok = msg && (!msg_type || strcmp(msg->msg_type, msg_type) == 0) && s_parent_is(msg, id);
    if (ok && state) {
        const char *s = json_string_value(json_object_get(msg->content, "execution_state"));
        ok = s && strcmp(s, state) == 0;
    }
    if (!ok)
        fprintf(stderr, "ll_dispatch selftest: wanted %s %s under %s, got %s\n",
                msg_type ? msg_type : "a reply", state ? state : "", id,
                msg ? msg->msg_type : "nothing");
    if (ok && out_p)
        *out_p = msg;
    else
        ll_msg_destroy(&msg);
    return ok;
}

/* busy, then idle, under ID on iopub (what a request with no output shows). */
static bool s_expect_busy_idle(s_test_t *t, const char *id)
{
    return s_expect(t, t->sub, "status", "busy", id, NULL) &&
           s_expect(t, t->sub, "status", "idle", id, NULL);
}

/* ---- the dispatcher side -------------------------------------------------------- */

/* Serve the next shell request, waiting for it to arrive. */
static bool s_serve_shell(s_test_t *t)
{
    ll_msg_t *req = NULL;
    for (int waited = 0; !(req = ll_dispatch_next_shell(t->d)) && waited < S_WAIT_MS; waited++)
        usleep(1000);
    if (!req)
        return false;
    ll_dispatch_shell(t->d, req);
    ll_msg_destroy(&req);
    return true;
}

/* Serve control until a reply reaches the client's control socket. */
static ll_msg_t *s_serve_control(s_test_t *t)
{
    zpoller_t *p = zpoller_new(t->c_control, NULL);
    ll_msg_t *reply = NULL;
    for (int waited = 0; p && !reply && waited < S_WAIT_MS; waited++) {
        ll_dispatch_control(t->d);
        if (zpoller_wait(p, 1))
            reply = s_recv(t, t->c_control);
    }
    zpoller_destroy(&p);
    return reply;
}

/* Whether the log captured since the last call mentions NEEDLE. */
static bool s_logged(s_test_t *t, const char *needle)
{
    static char buf[16384];
    static size_t len;
    ssize_t n;
    while (len < sizeof buf - 1 && (n = read(t->log_pipe[0], buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t) n;
    buf[len] = '\0';
    bool found = strstr(buf, needle) != NULL;
    if (found)
        len = 0;
    else
        fprintf(stderr, "ll_dispatch selftest: no log line with '%s' in:\n%s", needle, buf);
    return found;
}

/* ---- set-up ------------------------------------------------------------------- */

static int s_setup(s_test_t *t, bool subshells)
{
    static const unsigned char key[] = "dispatch-selftest-key";
    char ep[128], err[256];
    t->kernel = ll_session_new(key, sizeof key - 1, "hmac-sha256", 0);
    t->client = ll_session_new(key, sizeof key - 1, "hmac-sha256", 0);
    if (!t->kernel || !t->client)
        return -1;
    /* Endpoints of their own per set-up: a closed socket's may linger. */
    static int setups;
    int pid = (int) getpid() * 10 + setups++;
    snprintf(ep, sizeof ep, "inproc://ll-dispatch-%d-iopub", pid);
    if (!(t->iopub = ll_iopub_new(t->kernel, ep, err, sizeof err)))
        return -1;
    t->sub = zsock_new_sub(NULL, "");
    if (!t->sub || zsock_connect(t->sub, "%s", ep) < 0)
        return -1;
    const char *names[2] = {"shell", "control"};
    zsock_t **servers[2] = {&t->shell, &t->control}, **clients[2] = {&t->c_shell, &t->c_control};
    for (int i = 0; i < 2; i++) {
        snprintf(ep, sizeof ep, "inproc://ll-dispatch-%d-%s", pid, names[i]);
        *servers[i] = zsock_new(ZMQ_ROUTER);
        *clients[i] = zsock_new(ZMQ_DEALER);
        if (!*servers[i] || !*clients[i] || zsock_bind(*servers[i], "%s", ep) < 0 ||
            zsock_connect(*clients[i], "%s", ep) < 0)
            return -1;
        zsock_set_rcvtimeo(*servers[i], 0); /* as the kernel's: receive only what is there */
    }
    /* A subscription takes a moment to reach the publisher: publish probes
     * until one arrives, then start from an empty queue. */
    ll_msg_t *probe = NULL;
    zpoller_t *p = zpoller_new(t->sub, NULL);
    for (int i = 0; p && i < S_WAIT_MS / 10 && !probe; i++) {
        ll_iopub_status(t->iopub, "starting", NULL);
        if (zpoller_wait(p, 10))
            probe = s_recv(t, t->sub);
    }
    for (zmsg_t *more; probe && zpoller_wait(p, 50) && (more = zmsg_recv(t->sub));)
        zmsg_destroy(&more);
    zpoller_destroy(&p);
    if (!probe)
        return -1;
    ll_msg_destroy(&probe);

    zsock_set_rcvtimeo(t->sub, 200); /* a drain ends */
    if (pipe(t->log_pipe) < 0)
        return -1;
    fcntl(t->log_pipe[0], F_SETFL, O_NONBLOCK);
    fcntl(t->log_pipe[1], F_SETFL, O_NONBLOCK);
    t->saved_log_fd = ll_log_fd();
    ll_log_set_fd(t->log_pipe[1]);

    static const int ports[LL_CHAN_COUNT] = {[LL_CHAN_SHELL] = 1,
                                             [LL_CHAN_CONTROL] = 2,
                                             [LL_CHAN_STDIN] = 3,
                                             [LL_CHAN_IOPUB] = 4,
                                             [LL_CHAN_HB] = 5};
    ll_dispatch_env_t env = {.session = t->kernel,
                             .iopub = t->iopub,
                             .shell = t->shell,
                             .control = t->control,
                             .handlers = s_stubs,
                             .forward = s_stub_forward,
                             .subshell_forward = subshells ? s_stub_subshell : NULL,
                             .after_shell = s_stub_after_shell,
                             .on_shutdown = s_stub_on_shutdown,
                             .ctx = t,
                             .ports = ports,
                             .kernel_info = json_pack("{s:s}", "implementation", "stub")};
    t->d = ll_dispatch_new(&env);
    return t->d ? 0 : -1;
}

static void s_teardown(s_test_t *t)
{
    ll_dispatch_destroy(&t->d);
    if (t->log_pipe[1] > 0) {
        ll_log_set_fd(t->saved_log_fd);
        close(t->log_pipe[0]);
        close(t->log_pipe[1]);
    }
    zsock_destroy(&t->c_shell);
    zsock_destroy(&t->c_control);
    zsock_destroy(&t->sub);
    ll_iopub_destroy(&t->iopub);
    zsock_destroy(&t->shell);
    zsock_destroy(&t->control);
    ll_session_destroy(&t->kernel);
    ll_session_destroy(&t->client);
}

/* ---- the checks ---------------------------------------------------------------- */

/* A table that names a type nobody may send, or leaves one unserved, is
 * refused: the check that keeps proto/ll_msgtype.c and the handlers one. */
static bool s_check_tables(void)
{
    char why[256];
#define S_STUBS                                                            \
    {"execute_request", s_stub_execute}, {"interrupt_request", s_stub_ok}, \
        {"usage_request", s_stub_ok},                                      \
    {                                                                      \
        "debug_request", s_stub_ok                                         \
    }
    static const ll_dispatch_handler_t extra[] = {
        S_STUBS, {"no_such_request", s_stub_ok}, {NULL, NULL}};
    static const ll_dispatch_handler_t internal[] = {
        S_STUBS, {"looseleaf_after_gpu", s_stub_ok}, {NULL, NULL}};
    static const ll_dispatch_handler_t missing[] = {{"execute_request", s_stub_ok}, {NULL, NULL}};
#undef S_STUBS
    return s_ok(ll_dispatch_check(s_stubs, s_stub_forward, why, sizeof why) == 0,
                "the stub table is complete") &&
           s_ok(ll_dispatch_check(extra, s_stub_forward, why, sizeof why) < 0 &&
                    strstr(why, "no_such_request"),
                "a handler for an unknown type is refused") &&
           s_ok(ll_dispatch_check(internal, s_stub_forward, why, sizeof why) < 0,
                "a handler for an internal type is refused") &&
           s_ok(ll_dispatch_check(missing, s_stub_forward, why, sizeof why) < 0 &&
                    strstr(why, "interrupt_request"),
                "an unserved type is refused") &&
           s_ok(ll_dispatch_check(s_stubs, NULL, why, sizeof why) < 0,
                "the interpreter's types need a forward");
}

/* execute on shell: busy, its output, idle, all under it; the reply too. */
static bool s_check_execute_order(s_test_t *t)
{
    char id[64];
    ll_msg_t *stream = NULL, *reply = NULL;
    bool ok = s_send(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"), id) &&
              s_serve_shell(t) && s_expect(t, t->sub, "status", "busy", id, NULL) &&
              s_expect(t, t->sub, "stream", NULL, id, &stream) &&
              s_expect(t, t->sub, "status", "idle", id, NULL) &&
              s_expect(t, t->c_shell, "execute_reply", NULL, id, &reply);
    ok = ok && s_ok(strcmp(ll_msg_content_str(stream, "text"), "hi\n") == 0, "stream text") &&
         s_ok(strcmp(ll_msg_content_str(reply, "status"), "ok") == 0, "execute_reply ok") &&
         s_ok(t->executes == 1 && t->after_shell == 1, "handler and after_shell ran once");
    ll_msg_destroy(&stream);
    ll_msg_destroy(&reply);
    return ok;
}

/* The channel rules: a shell-only request on control (and a control-only
 * one on shell) is answered with an error and not run; kernel_info and
 * connect are served on control; an unknown type, and the kernel's own
 * types sent from outside, get busy/idle and no reply. */
static bool s_check_channels(s_test_t *t)
{
    char id[64], id2[64];
    ll_msg_t *reply =
        s_send(t, t->c_control, "execute_request", json_pack("{s:s}", "code", "print"), id)
            ? s_serve_control(t)
            : NULL;
    bool ok =
        s_ok(reply && strcmp(reply->msg_type, "execute_reply") == 0 && s_parent_is(reply, id) &&
                 strcmp(ll_msg_content_str(reply, "status"), "error") == 0 &&
                 strcmp(ll_msg_content_str(reply, "ename"), "ChannelError") == 0,
             "execute_request on control: an error reply") &&
        s_ok(t->executes == 1 && t->after_shell == 1, "not run, no shell steps") &&
        s_expect_busy_idle(t, id) && s_logged(t, "serves it only on shell");
    ll_msg_destroy(&reply);
    if (!ok)
        return false;

    ok = s_send(t, t->c_shell, "usage_request", NULL, id) && s_serve_shell(t) &&
         s_expect_busy_idle(t, id) && s_expect(t, t->c_shell, "usage_reply", NULL, id, &reply) &&
         s_ok(strcmp(ll_msg_content_str(reply, "ename"), "ChannelError") == 0,
              "usage_request on shell: an error reply");
    ll_msg_destroy(&reply);
    if (!ok)
        return false;

    reply = s_send(t, t->c_control, "kernel_info_request", NULL, id) ? s_serve_control(t) : NULL;
    ok = s_ok(reply && s_parent_is(reply, id) &&
                  strcmp(ll_msg_content_str(reply, "implementation"), "stub") == 0,
              "kernel_info on control: the cached reply") &&
         s_expect_busy_idle(t, id);
    ll_msg_destroy(&reply);
    if (!ok)
        return false;

    reply = s_send(t, t->c_control, "connect_request", NULL, id) ? s_serve_control(t) : NULL;
    ok = s_ok(reply && json_integer_value(json_object_get(reply->content, "hb_port")) == 5,
              "connect_reply names the ports") &&
         s_expect_busy_idle(t, id);
    ll_msg_destroy(&reply);
    if (!ok)
        return false;

    /* No reply to these: the next reply on shell is the kernel_info's. */
    char id3[64];
    int forwarded = t->forwarded;
    ok = s_send(t, t->c_shell, "no_such_request", NULL, id) &&
         s_send(t, t->c_shell, "looseleaf_after_gpu", NULL, id2) &&
         s_send(t, t->c_shell, "kernel_info_request", NULL, id3) && s_serve_shell(t) &&
         s_serve_shell(t) && s_serve_shell(t) && s_expect_busy_idle(t, id) &&
         s_expect_busy_idle(t, id2) && s_expect_busy_idle(t, id3) &&
         s_expect(t, t->c_shell, "kernel_info_reply", NULL, id3, NULL) &&
         s_ok(t->forwarded == forwarded, "an internal type from outside is not forwarded") &&
         s_logged(t, "unknown message type 'looseleaf_after_gpu'");
    if (!ok)
        return false;

    /* An interpreter type on its channel goes to the forward. */
    return s_send(t, t->c_shell, "complete_request",
                  json_pack("{s:s, s:i}", "code", "x", "cursor_pos", 1), id) &&
           s_serve_shell(t) && s_expect_busy_idle(t, id) &&
           s_expect(t, t->c_shell, "complete_reply", NULL, id, NULL) &&
           s_ok(t->forwarded == forwarded + 1, "complete_request forwarded");
}

/* An unsigned message, and one signed with another key, are dropped with
 * a log line saying why, before anything is published for them: the first
 * status on iopub is the next good request's. */
static bool s_check_unsigned(s_test_t *t)
{
    zmsg_t *raw = zmsg_new();
    zmsg_addstr(raw, "<IDS|MSG>");
    zmsg_addstr(raw, "");
    zmsg_addstr(raw, "{\"msg_id\":\"unsigned-1\",\"msg_type\":\"execute_request\","
                     "\"session\":\"s\",\"username\":\"u\",\"date\":\"\",\"version\":\"5.3\"}");
    zmsg_addstr(raw, "{}");
    zmsg_addstr(raw, "{}");
    zmsg_addstr(raw, "{\"code\":\"print\"}");
    /* Signed, but with another key. */
    ll_session_t *other = ll_session_new((const unsigned char *) "other", 5, "hmac-sha256", 0);
    ll_msg_t *forged =
        other ? ll_msg_new(other, "execute_request", NULL, json_pack("{s:s}", "code", "print"))
              : NULL;
    char id[64];
    bool ok = forged && zmsg_send(&raw, t->c_shell) == 0 &&
              ll_session_send(other, t->c_shell, &forged) == 0 &&
              s_send(t, t->c_shell, "kernel_info_request", NULL, id) && s_serve_shell(t) &&
              s_expect_busy_idle(t, id) &&
              s_expect(t, t->c_shell, "kernel_info_reply", NULL, id, NULL);
    zmsg_destroy(&raw);
    ll_msg_destroy(&forged);
    ll_session_destroy(&other);
    /* One line for the first; the second falls under the same rate limit. */
    return ok && s_ok(t->executes == 1, "neither execute ran") &&
           s_logged(t, "dropped a message on shell: unsigned message");
}

/* stop_on_error: the executes queued behind a failing one are answered
 * "aborted" after its idle, without running; a kernel_info among them is
 * served in its turn. */
static bool s_check_stop_on_error(s_test_t *t)
{
    char id1[64], id2[64], id3[64], id4[64];
    int executes = t->executes;
    bool ok = s_send(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "fail"), id1) &&
              s_send(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"), id2) &&
              s_send(t, t->c_shell, "kernel_info_request", NULL, id3) &&
              s_send(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"), id4);
    /* All four read ahead first, as a running cell's read-ahead does. */
    for (int waited = 0; ok && ll_dispatch_queued(t->d) < 4 && waited < S_WAIT_MS; waited++) {
        ll_dispatch_next_queued_execute(t->d);
        usleep(1000);
    }
    ll_msg_t *reply = NULL;
    ok = ok && s_ok(ll_dispatch_queued(t->d) == 4, "four requests read ahead") &&
         s_serve_shell(t) && s_expect_busy_idle(t, id1) && s_expect_busy_idle(t, id2) &&
         s_expect_busy_idle(t, id3) && s_expect_busy_idle(t, id4) &&
         s_expect(t, t->c_shell, "execute_reply", NULL, id1, &reply) &&
         s_ok(strcmp(ll_msg_content_str(reply, "status"), "error") == 0, "the failure replied");
    ll_msg_destroy(&reply);
    ok = ok && s_expect(t, t->c_shell, "execute_reply", NULL, id2, &reply) &&
         s_ok(strcmp(ll_msg_content_str(reply, "status"), "aborted") == 0, "aborted");
    ll_msg_destroy(&reply);
    ok = ok && s_expect(t, t->c_shell, "kernel_info_reply", NULL, id3, NULL) &&
         s_expect(t, t->c_shell, "execute_reply", NULL, id4, &reply) &&
         s_ok(strcmp(ll_msg_content_str(reply, "status"), "aborted") == 0, "aborted too");
    ll_msg_destroy(&reply);
    return ok && s_ok(t->executes == executes + 1, "only the failing execute ran") &&
           s_ok(ll_dispatch_queued(t->d) == 0, "nothing left queued");
}

/* While a GPU cell runs elsewhere, a kernel_info on shell is answered at
 * once (busy/idle under it) and the execute behind it waits its turn. */
static bool s_check_read_ahead(s_test_t *t)
{
    char id1[64], id2[64];
    bool ok = s_send(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"), id1) &&
              s_send(t, t->c_shell, "kernel_info_request", NULL, id2);
    zpoller_t *p = zpoller_new(t->c_shell, NULL);
    bool answered = false;
    for (int waited = 0; ok && p && !answered && waited < S_WAIT_MS; waited++) {
        ll_dispatch_shell_readable(t->d);
        answered = zpoller_wait(p, 1) != NULL;
    }
    zpoller_destroy(&p);
    ok = ok && s_ok(answered, "kernel_info answered while a cell runs") &&
         s_expect(t, t->c_shell, "kernel_info_reply", NULL, id2, NULL) &&
         s_expect_busy_idle(t, id2) && s_ok(ll_dispatch_queued(t->d) == 1, "the execute waits") &&
         s_ok(ll_dispatch_next_queued_execute(t->d) != NULL, "and is found by the read-ahead") &&
         s_serve_shell(t) && s_expect(t, t->sub, "status", "busy", id1, NULL) &&
         s_expect(t, t->sub, "stream", NULL, id1, NULL) &&
         s_expect(t, t->sub, "status", "idle", id1, NULL) &&
         s_expect(t, t->c_shell, "execute_reply", NULL, id1, NULL);
    return ok;
}

/* shutdown_request on control: the reply, the same on iopub for other
 * frontends, and the process told. */
static bool s_check_shutdown(s_test_t *t)
{
    char id[64];
    ll_msg_t *reply =
        s_send(t, t->c_control, "shutdown_request", json_pack("{s:b}", "restart", 1), id)
            ? s_serve_control(t)
            : NULL;
    bool ok =
        s_ok(reply && strcmp(reply->msg_type, "shutdown_reply") == 0 && s_parent_is(reply, id) &&
                 json_is_true(json_object_get(reply->content, "restart")),
             "shutdown_reply on control") &&
        s_expect(t, t->sub, "status", "busy", id, NULL) &&
        s_expect(t, t->sub, "shutdown_reply", NULL, id, NULL) &&
        s_expect(t, t->sub, "status", "idle", id, NULL) &&
        s_ok(t->shutdowns == 1 && ll_dispatch_shutting_down(t->d), "the process told");
    ll_msg_destroy(&reply);
    return ok;
}

/* A control request and its reply (served here); NULL when none came. */
static ll_msg_t *s_control(s_test_t *t, const char *msg_type, json_t *content)
{
    char id[64];
    ll_msg_t *reply = s_send(t, t->c_control, msg_type, content, id) ? s_serve_control(t) : NULL;
    if (reply && !s_expect_busy_idle(t, id)) /* on iopub, like every request */
        ll_msg_destroy(&reply);
    return reply;
}

/* create_subshell_request: the new id into ID. */
static bool s_create_subshell(s_test_t *t, char id[64])
{
    ll_msg_t *reply = s_control(t, "create_subshell_request", NULL);
    const char *sid = reply ? ll_msg_content_str(reply, "subshell_id") : NULL;
    bool ok = s_ok(sid && strlen(sid) == 36, "create_subshell_reply with a uuid");
    if (ok)
        snprintf(id, 64, "%s", sid);
    ll_msg_destroy(&reply);
    return ok;
}

/* The subshell_id list of list_subshell_reply has exactly N entries, the
 * first (when N > 0) FIRST. */
static bool s_listed(s_test_t *t, size_t n, const char *first)
{
    ll_msg_t *reply = s_control(t, "list_subshell_request", NULL);
    json_t *ids = reply ? json_object_get(reply->content, "subshell_id") : NULL;
    bool ok = json_is_array(ids) && json_array_size(ids) == n &&
              (n == 0 || strcmp(json_string_value(json_array_get(ids, 0)), first) == 0);
    ll_msg_destroy(&reply);
    return s_ok(ok, "list_subshell_reply");
}

/* A reply on the client's shell under ID whose content's KEY is VALUE,
 * after busy (and a stream when STREAM) and idle under ID on iopub; no
 * main-shell serving needed. */
static bool s_expect_sub_answer(s_test_t *t, const char *id, const char *key, const char *value,
                                bool stream)
{
    ll_msg_t *reply = NULL;
    bool ok = s_expect(t, t->sub, "status", "busy", id, NULL) &&
              (!stream || s_expect(t, t->sub, "stream", NULL, id, NULL)) &&
              s_expect(t, t->sub, "status", "idle", id, NULL) &&
              s_expect(t, t->c_shell, NULL, NULL, id, &reply);
    const char *got = reply ? ll_msg_content_str(reply, key) : NULL;
    ok = ok && s_ok(got && strcmp(got, value) == 0, key);
    ll_msg_destroy(&reply);
    return ok;
}

/* The routing rules with subshells on. */
static bool s_check_subshells(s_test_t *t)
{
    char sid[64], id1[64], id2[64], id3[64], id4[64];
    bool ok = s_create_subshell(t, sid) && s_listed(t, 1, sid);
    /* A subshell's request is served on its thread although the main
     * shell serves nothing meanwhile (it would be "busy in a cell"). */
    ok = ok &&
         s_send_to(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"),
                   json_string(sid), id1) &&
         s_expect_sub_answer(t, id1, "on", sid, true) &&
         s_ok(atomic_load(&t->sub_served) == 1, "served by the subshell stub") &&
         s_ok(ll_dispatch_next_shell(t->d) == NULL, "nothing reached the main shell");
    /* Without subshell_id (or a null one): the main shell, replying
     * through the relay. */
    ok = ok &&
         s_send_to(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"),
                   json_null(), id2) &&
         s_serve_shell(t) && s_expect(t, t->sub, "status", "busy", id2, NULL) &&
         s_expect(t, t->sub, "stream", NULL, id2, NULL) &&
         s_expect(t, t->sub, "status", "idle", id2, NULL) &&
         s_expect(t, t->c_shell, "execute_reply", NULL, id2, NULL);
    /* An unknown id, or one that is not a string: an error reply with its
     * busy/idle, from the relay. */
    ok = ok && s_send_to(t, t->c_shell, "complete_request", NULL, json_string("nope"), id3) &&
         s_expect_sub_answer(t, id3, "ename", "UnknownSubshellError", false) &&
         s_send_to(t, t->c_shell, "execute_request", NULL, json_integer(3), id4) &&
         s_expect_sub_answer(t, id4, "ename", "UnknownSubshellError", false) &&
         s_ok(ll_dispatch_next_shell(t->d) == NULL, "refused ones never reach the main shell");
    /* stop_on_error on the subshell aborts its own queue only: the main
     * shell's request sent in between is untouched. */
    char f[64], a[64], m[64];
    int sub_before = atomic_load(&t->sub_served);
    ok =
        ok &&
        s_send_to(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "fail"),
                  json_string(sid), f) &&
        s_send_to(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"), NULL, m) &&
        s_send_to(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"),
                  json_string(sid), a);
    ll_msg_t *r1 = NULL, *r2 = NULL;
    ok = ok && s_expect(t, t->c_shell, "execute_reply", NULL, f, &r1) &&
         s_expect(t, t->c_shell, "execute_reply", NULL, a, &r2) &&
         s_ok(strcmp(ll_msg_content_str(r1, "status"), "error") == 0, "the failure") &&
         s_ok(strcmp(ll_msg_content_str(r2, "status"), "aborted") == 0, "its queue aborted") &&
         s_ok(atomic_load(&t->sub_served) == sub_before + 1, "the aborted one never ran") &&
         s_serve_shell(t);
    ll_msg_destroy(&r1);
    ll_msg_destroy(&r2);
    ok = ok && s_expect(t, t->c_shell, "execute_reply", NULL, m, &r1) &&
         s_ok(strcmp(ll_msg_content_str(r1, "status"), "ok") == 0, "the main shell's ran");
    ll_msg_destroy(&r1);
    for (zmsg_t *old; ok && (old = zmsg_recv(t->sub));) /* the iopub of the checks above */
        zmsg_destroy(&old);
    /* Delete: listed no more, its id unknown from then on; a second delete
     * is an error. */
    ll_msg_t *del =
        ok ? s_control(t, "delete_subshell_request", json_pack("{s:s}", "subshell_id", sid)) : NULL;
    ok = ok && s_ok(del && strcmp(ll_msg_content_str(del, "status"), "ok") == 0, "deleted");
    ll_msg_destroy(&del);
    del =
        ok ? s_control(t, "delete_subshell_request", json_pack("{s:s}", "subshell_id", sid)) : NULL;
    ok = ok && s_ok(del && strcmp(ll_msg_content_str(del, "status"), "error") == 0,
                    "deleted twice: an error");
    ll_msg_destroy(&del);
    ok = ok && s_listed(t, 0, NULL) &&
         s_send_to(t, t->c_shell, "execute_request", json_pack("{s:s}", "code", "print"),
                   json_string(sid), id1) &&
         s_expect_sub_answer(t, id1, "ename", "UnknownSubshellError", false);
    return ok;
}

int ll_dispatch_selftest(bool verbose)
{
    char buf[64];
    if (!s_ok(ll_dispatch_reply_type("execute_request", buf, sizeof buf) &&
                  strcmp(buf, "execute_reply") == 0 &&
                  !ll_dispatch_reply_type("comm_msg", buf, sizeof buf) &&
                  !ll_dispatch_reply_type("_request", buf, sizeof buf),
              "reply types") ||
        !s_check_tables())
        return -1;
    s_test_t t = {.log_pipe = {-1, -1}};
    bool ok = s_ok(s_setup(&t, false) == 0, "set-up") && s_check_execute_order(&t) &&
              s_check_channels(&t) && s_check_unsigned(&t) && s_check_stop_on_error(&t) &&
              s_check_read_ahead(&t) && s_check_shutdown(&t);
    s_teardown(&t);
    if (!ok)
        return -1;
    s_test_t st = {.log_pipe = {-1, -1}};
    atomic_init(&st.sub_served, 0);
    ok = s_ok(s_setup(&st, true) == 0, "set-up with subshells") && s_check_subshells(&st);
    s_teardown(&st);
    if (verbose && ok)
        printf("(inproc transport, %d executes) ", t.executes);
    return ok ? 0 : -1;
}
