/* ll_curve: CurveZMQ transport encryption of the kernel's sockets.
 *
 * jupyter_client 8.10+ (KernelManager.transport_encryption "auto" when the
 * kernelspec lists "curve" in metadata.supported_encryption, or "required")
 * makes a server keypair per kernel and writes it into the connection file
 * as curve_publickey / curve_secretkey.  Its clients take the public key as
 * their curve_serverkey.  The kernel then makes every socket it binds
 * (shell, control, stdin, iopub, heartbeat) a CURVE server with that pair,
 * as ipykernel 7.4 does: what crosses the wire is encrypted, and a peer that
 * does not know the server's public key (only in the 0600 connection file)
 * fails the handshake, so it neither reaches the kernel nor receives iopub.
 * There is no ZAP handler (again as ipykernel): any client that knows the
 * public key is admitted, and each message is still checked by its HMAC.
 *
 * Without the two fields the kernel runs as before (plain ZeroMQ).  With
 * them but a libzmq built without CURVE (no libsodium) it refuses to start:
 * running in clear would both fail every client's handshake and silently
 * drop the encryption the frontend asked for.
 *
 * Threads: the kernel's main thread at start-up only. */
#ifndef LL_CURVE_H
#define LL_CURVE_H

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ll_curve_t ll_curve_t;

/* Whether this process's libzmq can do CURVE (zmq_has("curve")). */
bool ll_curve_available(void);

/* The server keypair from the connection file's PUBLIC_Z85 / SECRET_Z85
 * (40 characters of Z85 each, as ll_conn checked).  Both "" (or NULL):
 * *SELF_P = NULL, plain transport, 0.  Otherwise *SELF_P gets a new keypair
 * the caller owns (ll_curve_destroy), or -1 with a one-line reason in ERR:
 * no CURVE in libzmq, a key that does not decode, a public key that is not
 * the secret key's. */
int ll_curve_new(const char *public_z85, const char *secret_z85, ll_curve_t **self_p, char *err,
                 size_t errlen);

/* Wipe the secret key, free; nulls *SELF_P; safe on NULL. */
void ll_curve_destroy(ll_curve_t **self_p);

/* Make SOCK (not yet bound) a CURVE server with SELF's keypair; a no-op
 * when SELF is NULL.  0, or -1 with a reason in ERR. */
int ll_curve_serve(const ll_curve_t *self, zsock_t *sock, char *err, size_t errlen);

int ll_curve_selftest(bool verbose);

#endif
