/* ll_stdin: input() over the stdin channel (see ll_stdin.h).  Kernel
 * process, on whichever thread runs the cell; the lock keeps one prompt out
 * at a time. */
#include "gateway/ll_stdin.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ll_log.h"

struct ll_stdin_t {
    zsock_t *sock;         /* ROUTER; borrowed */
    ll_session_t *session; /* borrowed */
    ll_iopub_t *iopub;     /* its parent addresses prompts; borrowed */
    pthread_mutex_t lock;  /* held from ask to release */
    zmsg_t *asked;         /* routing identity the pending prompt went to (under lock) */
};

ll_stdin_t *ll_stdin_new(zsock_t *sock, ll_session_t *session, ll_iopub_t *iopub)
{
    ll_stdin_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->sock = sock;
    self->session = session;
    self->iopub = iopub;
    pthread_mutex_init(&self->lock, NULL);
    return self;
}

void ll_stdin_destroy(ll_stdin_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    zmsg_destroy(&(*self_p)->asked);
    pthread_mutex_destroy(&(*self_p)->lock);
    free(*self_p);
    *self_p = NULL;
}

zsock_t *ll_stdin_sock(ll_stdin_t *self)
{
    return self->sock;
}

bool ll_stdin_ask(ll_stdin_t *self, const char *prompt, bool password)
{
    pthread_mutex_lock(&self->lock);
    zmsg_t *stale; /* answers to earlier, interrupted prompts */
    while ((stale = zmsg_recv(self->sock)))
        zmsg_destroy(&stale);
    ll_msg_t *msg = ll_iopub_msg_to_parent(
        self->iopub, "input_request",
        json_pack("{s:s, s:b}", "prompt", prompt ? prompt : "", "password", password));
    zmsg_destroy(&self->asked);
    self->asked = msg && msg->identities ? zmsg_dup(msg->identities) : NULL;
    if (!msg || ll_session_send(self->session, self->sock, &msg) != 0) {
        ll_warn("stdin", "cannot send input_request (no frontend on stdin?)");
        pthread_mutex_unlock(&self->lock);
        return false;
    }
    return true;
}

/* Whether message identities A and B are the same frames. */
static bool s_same_identity(zmsg_t *a, zmsg_t *b)
{
    if (!a || !b || zmsg_size(a) != zmsg_size(b))
        return false;
    for (zframe_t *fa = zmsg_first(a), *fb = zmsg_first(b); fa && fb;
         fa = zmsg_next(a), fb = zmsg_next(b))
        if (!zframe_eq(fa, fb))
            return false;
    return true;
}

/* Messages dropped on stdin: at most one line per interval (a peer can send
 * junk at will). */
static ll_log_limit_t s_drop_stdin = LL_LOG_LIMIT_INIT;

char *ll_stdin_take(ll_stdin_t *self)
{
    char why[256];
    zmsg_t *raw;
    while ((raw = zmsg_recv(self->sock))) {
        ll_msg_t *reply = ll_session_decode(self->session, &raw, why, sizeof why);
        if (!reply) {
            ll_warn_limited(&s_drop_stdin, "stdin", "dropped a message on stdin: %s", why);
            continue;
        }
        char *value = NULL;
        if (strcmp(reply->msg_type, "input_reply") == 0 &&
            !s_same_identity(reply->identities, self->asked)) {
            /* Another frontend (another socket identity) must not answer
             * the prompt of the one whose cell asked. */
            ll_warn_limited(&s_drop_stdin, "stdin",
                            "an input_reply from a frontend that was not asked: dropped");
        } else if (strcmp(reply->msg_type, "input_reply") == 0) {
            const char *v = ll_msg_content_str(reply, "value");
            value = strdup(v ? v : "");
        } else {
            ll_warn("stdin", "unexpected %.64s on stdin: ignored", reply->msg_type);
        }
        ll_msg_destroy(&reply);
        if (value)
            return value;
    }
    return NULL;
}

void ll_stdin_release(ll_stdin_t *self)
{
    pthread_mutex_unlock(&self->lock);
}

static void s_drain(int fd)
{
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof v); /* EFD_NONBLOCK: never waits */
    (void) r;
}

char *ll_stdin_input(ll_stdin_t *self, const char *prompt, bool password, int intr_fd,
                     bool (*stopping)(void), int *err)
{
    *err = 0;
    s_drain(intr_fd); /* an interrupt from before this prompt is not for it */
    if (!ll_stdin_ask(self, prompt, password)) {
        *err = 2;
        return NULL;
    }
    char *value = NULL;
    while (!value) {
        if (stopping()) {
            *err = 1;
            break;
        }
        if (ll_wire_wait(self->sock, intr_fd) <= 0) {
            s_drain(intr_fd);
            *err = 1; /* interrupted (or the socket failed): KeyboardInterrupt */
            break;
        }
        value = ll_stdin_take(self);
    }
    ll_stdin_release(self);
    return value;
}

/* ---- self-test ----------------------------------------------------------- */

static bool s_never(void)
{
    return false;
}

/* A frontend on a DEALER answers the kernel's ROUTER: the prompt arrives
 * signed and addressed, another frontend's answer and an unrelated message
 * are dropped, the reply is taken, and an interrupt ends a wait. */
int ll_stdin_selftest(bool verbose)
{
    int rc = -1;
    const char *key = "selftest-key";
    ll_session_t *session =
        ll_session_new((const unsigned char *) key, strlen(key), "hmac-sha256", 0);
    zsock_t *router = zsock_new(ZMQ_ROUTER), *dealer = zsock_new(ZMQ_DEALER);
    ll_iopub_t *iopub = NULL;
    ll_stdin_t *in = NULL;
    ll_msg_t *req = NULL, *got = NULL;
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "inproc://ll-stdin-selftest-%d", (int) getpid());
    if (!session || !router || !dealer)
        goto out;
    zsock_set_rcvtimeo(router, 0);
    zsock_set_identity(dealer, "frontend");
    if (zsock_bind(router, "%s", endpoint) < 0 || zsock_connect(dealer, "%s", endpoint) < 0)
        goto out;
    char iopub_ep[80];
    snprintf(iopub_ep, sizeof iopub_ep, "inproc://ll-stdin-selftest-iopub-%d", (int) getpid());
    char err[256];
    if (!(iopub = ll_iopub_new(session, iopub_ep, err, sizeof err)))
        goto out;
    if (!(in = ll_stdin_new(router, session, iopub)))
        goto out;
    /* The current request came from "frontend". */
    req = ll_msg_new(session, "execute_request", NULL, json_object());
    if (!req)
        goto out;
    zmsg_destroy(&req->identities);
    req->identities = zmsg_new();
    zmsg_addstr(req->identities, "frontend");
    ll_iopub_set_parent(iopub, req);
    if (!ll_stdin_ask(in, "name? ", false))
        goto out;
    zsock_set_rcvtimeo(dealer, 2000);
    zmsg_t *raw = zmsg_recv(dealer);
    char why[128];
    got = raw ? ll_session_decode(session, &raw, why, sizeof why) : NULL;
    if (!got || strcmp(got->msg_type, "input_request") != 0 ||
        strcmp(ll_msg_content_str(got, "prompt"), "name? ") != 0)
        goto out_release;
    /* An answer from another frontend (another identity) is dropped. */
    zsock_t *intruder = zsock_new(ZMQ_DEALER);
    zsock_set_identity(intruder, "intruder");
    ll_msg_t *forged = ll_msg_new(session, "input_reply", got, json_pack("{s:s}", "value", "eve"));
    zmsg_destroy(&forged->identities);
    forged->identities = zmsg_new();
    bool sent_forged = intruder && zsock_connect(intruder, "%s", endpoint) == 0 &&
                       ll_session_send(session, intruder, &forged) == 0;
    ll_msg_destroy(&forged);
    zmq_pollitem_t it = {zsock_resolve(router), 0, ZMQ_POLLIN, 0};
    bool arrived = sent_forged && zmq_poll(&it, 1, 2000) == 1;
    int saved_level = ll_log_level;
    ll_log_level = -1; /* the dropped answer is logged: expected */
    char *stolen = arrived ? ll_stdin_take(in) : NULL;
    ll_log_level = saved_level;
    if (!arrived || stolen) {
        free(stolen);
        zsock_destroy(&intruder);
        goto out_release;
    }
    /* Something else first (dropped), then the answer. */
    ll_msg_t *other = ll_msg_new(session, "comm_msg", got, json_object());
    ll_msg_t *answer = ll_msg_new(session, "input_reply", got, json_pack("{s:s}", "value", "ada"));
    if (!other || !answer || ll_session_send(session, dealer, &other) != 0 ||
        ll_session_send(session, dealer, &answer) != 0) {
        ll_msg_destroy(&other);
        ll_msg_destroy(&answer);
        goto out_release;
    }
    char *value = NULL;
    for (int i = 0; i < 200 && !value; i++) {
        zmq_pollitem_t item = {zsock_resolve(router), 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 10);
        int saved = ll_log_level;
        ll_log_level = -1; /* the dropped comm_msg is logged: expected */
        value = ll_stdin_take(in);
        ll_log_level = saved;
    }
    ll_stdin_release(in);
    zsock_destroy(&intruder);
    bool ok = value && strcmp(value, "ada") == 0;
    free(value);
    if (!ok)
        goto out;
    /* An interrupt ends a wait with *ERR = 1.  (A pipe stands for the eventfd:
     * the drain before the prompt takes the first 8 bytes, the next 8 are an
     * interrupt during the wait.) */
    int fds[2];
    if (pipe(fds) < 0)
        goto out;
    static const char two[16] = {1, 0, 0, 0, 0, 0, 0, 0, 1};
    ok = write(fds[1], two, sizeof two) == (ssize_t) sizeof two;
    int e = 0;
    char *none = ok ? ll_stdin_input(in, "again? ", false, fds[0], s_never, &e) : NULL;
    close(fds[0]);
    close(fds[1]);
    ok = ok && !none && e == 1;
    free(none);
    if (!ok)
        goto out;
    rc = 0;
    if (verbose)
        printf("(prompt, another frontend's answer, dropped message, answer) ");
    goto out;
out_release:
    ll_stdin_release(in);
out:
    ll_msg_destroy(&got);
    ll_msg_destroy(&req);
    ll_stdin_destroy(&in);
    ll_iopub_destroy(&iopub);
    zsock_destroy(&dealer);
    zsock_destroy(&router);
    ll_session_destroy(&session);
    return rc;
}
