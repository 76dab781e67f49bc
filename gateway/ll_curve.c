/* ll_curve: the CurveZMQ server keypair of the kernel's sockets (see
 * ll_curve.h).  Kernel process, main thread, at start-up.
 *
 * Options are set with zmq_setsockopt rather than czmq's zsock_set_curve_*,
 * which assert when libzmq refuses them (a libzmq without CURVE does): a
 * kernel must report that, not abort. */
#include "gateway/ll_curve.h"

#include <openssl/crypto.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ll_curve_t {
    uint8_t public_key[32]; /* decoded from the connection file */
    uint8_t secret_key[32]; /* wiped by ll_curve_destroy */
};

bool ll_curve_available(void)
{
    return zmq_has("curve") != 0;
}

/* ll_curve_new with AVAILABLE standing for zmq_has("curve"), so the
 * self-test can check the refusal a libzmq without CURVE gets. */
static int s_new(const char *public_z85, const char *secret_z85, bool available,
                 ll_curve_t **self_p, char *err, size_t errlen)
{
    *self_p = NULL;
    bool has_pub = public_z85 && *public_z85, has_sec = secret_z85 && *secret_z85;
    if (!has_pub && !has_sec)
        return 0;
    if (!has_pub || !has_sec) {
        snprintf(err, errlen,
                 "transport encryption needs both curve_publickey and curve_secretkey");
        return -1;
    }
    if (!available) {
        snprintf(err, errlen,
                 "the connection file asks for CurveZMQ transport encryption (curve_publickey, "
                 "curve_secretkey), but this kernel's libzmq was built without CURVE "
                 "(zmq_has(\"curve\") is false): install a libzmq built with libsodium, or start "
                 "the kernel with transport_encryption disabled");
        return -1;
    }
    if (strlen(public_z85) != 40 || strlen(secret_z85) != 40) {
        snprintf(err, errlen, "curve_publickey and curve_secretkey must be 40 characters of Z85");
        return -1;
    }
    ll_curve_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char derived[41];
    if (!zmq_z85_decode(self->public_key, public_z85) ||
        !zmq_z85_decode(self->secret_key, secret_z85)) {
        snprintf(err, errlen, "curve_publickey or curve_secretkey is not valid Z85 text");
        goto out_fail;
    }
    /* A public key that is not the secret key's would make every client's
     * handshake fail with nothing to say why: say it here. */
    if (zmq_curve_public(derived, secret_z85) != 0 || strcmp(derived, public_z85) != 0) {
        snprintf(err, errlen,
                 "the connection file's curve_publickey is not the public key of its "
                 "curve_secretkey");
        goto out_fail;
    }
    OPENSSL_cleanse(derived, sizeof derived);
    *self_p = self;
    return 0;

out_fail:
    OPENSSL_cleanse(derived, sizeof derived);
    ll_curve_destroy(&self);
    return -1;
}

int ll_curve_new(const char *public_z85, const char *secret_z85, ll_curve_t **self_p, char *err,
                 size_t errlen)
{
    return s_new(public_z85, secret_z85, ll_curve_available(), self_p, err, errlen);
}

void ll_curve_destroy(ll_curve_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    OPENSSL_cleanse(*self_p, sizeof **self_p);
    free(*self_p);
    *self_p = NULL;
}

int ll_curve_serve(const ll_curve_t *self, zsock_t *sock, char *err, size_t errlen)
{
    if (!self)
        return 0;
    void *handle = zsock_resolve(sock);
    int one = 1;
    /* (The pair first: libzmq takes CURVE_SERVER as the switch to the
     * mechanism and checks nothing else until the first handshake.) */
    if (zmq_setsockopt(handle, ZMQ_CURVE_PUBLICKEY, self->public_key, 32) != 0 ||
        zmq_setsockopt(handle, ZMQ_CURVE_SECRETKEY, self->secret_key, 32) != 0 ||
        zmq_setsockopt(handle, ZMQ_CURVE_SERVER, &one, sizeof one) != 0) {
        snprintf(err, errlen, "cannot make the socket a CurveZMQ server: %s",
                 zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

/* ---- self-test ----------------------------------------------------------- */

/* What a client on ENDPOINT gets from a server that echoes: the reply, or
 * NULL once its handshake failed (awaited on a socket monitor, so nothing
 * here is timed but a generous bound).  SERVERKEY NULL: a plain client. */
static char *s_st_client(const char *endpoint, const char *serverkey, int n)
{
    zsock_t *c = zsock_new(ZMQ_DEALER);
    char mon_ep[64], *got = NULL;
    snprintf(mon_ep, sizeof mon_ep, "inproc://ll-curve-st-mon-%d", n);
    if (!c)
        return NULL;
    zsock_set_linger(c, 0);
    if (serverkey) {
        char pub[41], sec[41];
        zmq_curve_keypair(pub, sec);
        zsock_set_curve_publickey(c, pub);
        zsock_set_curve_secretkey(c, sec);
        zsock_set_curve_serverkey(c, serverkey);
    }
    zmq_socket_monitor(zsock_resolve(c), mon_ep,
                       ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_DISCONNECTED);
    zsock_t *mon = zsock_new_pair(mon_ep);
    if (!mon || zsock_connect(c, "%s", endpoint) != 0)
        goto out;
    zsock_set_rcvtimeo(mon, 10000);
    zmsg_t *ev = zmsg_recv(mon);
    zframe_t *f = ev ? zmsg_first(ev) : NULL;
    uint16_t event = 0;
    if (f && zframe_size(f) >= 2)
        memcpy(&event, zframe_data(f), 2);
    zmsg_destroy(&ev);
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        zstr_send(c, "hello");
        zsock_set_rcvtimeo(c, 10000);
        got = zstr_recv(c);
    }
out:
    zmq_socket_monitor(zsock_resolve(c), NULL, 0);
    zsock_destroy(&mon);
    zsock_destroy(&c);
    return got;
}

/* The echo side of the self-test: answers every message on ROUTER. */
static void s_st_echo(zsock_t *pipe, void *args)
{
    zsock_t *router = args;
    zsock_signal(pipe, 0);
    zpoller_t *poller = zpoller_new(pipe, router, NULL);
    void *which;
    while (poller && (which = zpoller_wait(poller, -1)) == router) {
        zmsg_t *m = zmsg_recv(router);
        if (m)
            zmsg_send(&m, router);
    }
    zpoller_destroy(&poller);
}

int ll_curve_selftest(bool verbose)
{
    char err[300], pub[41], sec[41], other_pub[41], other_sec[41];
    ll_curve_t *curve = NULL;
    int rc = -1;
    zsock_t *server = NULL;
    zactor_t *echo = NULL;

    /* No keys: plain.  Half a pair, a wrong pair, no CURVE: refused. */
    if (s_new("", "", true, &curve, err, sizeof err) != 0 || curve)
        return -1;
    if (zmq_curve_keypair(pub, sec) != 0 || zmq_curve_keypair(other_pub, other_sec) != 0)
        return ll_curve_available() ? -1 : 0; /* nothing more to test without CURVE */
    if (s_new(pub, "", true, &curve, err, sizeof err) == 0 || !strstr(err, "both"))
        return -1;
    if (s_new(other_pub, sec, true, &curve, err, sizeof err) == 0 ||
        !strstr(err, "not the public key"))
        return -1;
    if (s_new(pub, sec, false, &curve, err, sizeof err) == 0 || !strstr(err, "without CURVE"))
        return -1;
    if (ll_curve_new(pub, sec, &curve, err, sizeof err) != 0 || !curve)
        return -1;

    /* A CURVE server answers a client that knows its key, and completes no
     * handshake with a plain client or one trusting another key.  (tcp:
     * inproc connections skip the security handshake.) */
    server = zsock_new(ZMQ_ROUTER);
    zsock_set_linger(server, 0);
    if (!server || ll_curve_serve(curve, server, err, sizeof err) != 0)
        goto out;
    int port = zsock_bind(server, "tcp://127.0.0.1:*");
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    if (port <= 0 || !(echo = zactor_new(s_st_echo, server)))
        goto out;
    char *got = s_st_client(endpoint, pub, 1);
    bool ok = got && strcmp(got, "hello") == 0;
    zstr_free(&got);
    char *plain = s_st_client(endpoint, NULL, 2);
    char *wrong = s_st_client(endpoint, other_pub, 3);
    ok = ok && !plain && !wrong;
    zstr_free(&plain);
    zstr_free(&wrong);
    if (!ok)
        goto out;
    if (verbose)
        printf("(key holder served, plain and wrong-key clients refused) ");
    rc = 0;
out:
    zactor_destroy(&echo);
    zsock_destroy(&server);
    ll_curve_destroy(&curve);
    ll_curve_destroy(&curve); /* safe twice */
    return rc;
}
