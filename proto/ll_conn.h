/* ll_conn: the Jupyter connection file (JSON written by the frontend that
 * starts the kernel) and the endpoints of the five channels.
 *
 * Validation is strict because a mistyped file must stop the kernel with a
 * message naming the field, never run it half-configured. */
#ifndef LL_CONN_H
#define LL_CONN_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    LL_CHAN_SHELL = 0,
    LL_CHAN_CONTROL,
    LL_CHAN_STDIN,
    LL_CHAN_IOPUB,
    LL_CHAN_HB,
    LL_CHAN_COUNT
} ll_channel_t;

typedef struct {
    char transport[8];         /* "tcp" or "ipc" */
    char ip[256];              /* host for tcp, path prefix for ipc */
    int ports[LL_CHAN_COUNT];  /* indexed by ll_channel_t; 1..65535 (ipc: suffix) */
    char signature_scheme[32]; /* "hmac-sha256" (only scheme supported) */
    unsigned char key[512];    /* HMAC key bytes as found in the file */
    size_t key_len;            /* 0: unsigned messages (loud warning) */
    char kernel_name[128];     /* optional, "" when absent */
    /* CurveZMQ server keypair (Z85, 40 characters) that jupyter_client
     * writes when it asks for transport encryption; both "" when absent,
     * never only one (see gateway/ll_curve.h). */
    char curve_publickey[41];
    char curve_secretkey[41];
} ll_conn_info_t;

/* ll_conn_load FLAGS. */
#define LL_CONN_ALLOW_INSECURE 1u /* accept a symlink or a file others may read or write */

/* Read and validate PATH into *INFO.  The file holds the key that lets
 * whoever knows it run code as us, so unless FLAGS has LL_CONN_ALLOW_INSECURE
 * it must be a regular file (not a symbolic link) of this user that no group
 * or other user may read or write (Jupyter writes 0600).  Returns 0, or -1
 * with a one-line reason naming the offending field, the problem with the
 * file or the I/O error in ERR. */
int ll_conn_load(const char *path, unsigned flags, ll_conn_info_t *info, char *err, size_t errlen);

/* Same, from a JSON text already in memory (used by tests). */
int ll_conn_parse(const char *json_text, ll_conn_info_t *info, char *err, size_t errlen);

/* Write the ZeroMQ endpoint of channel CH ("tcp://127.0.0.1:5555",
 * "ipc://kernel-ipc-3").  Returns 0, or -1 if BUF is too small. */
int ll_conn_endpoint(const ll_conn_info_t *info, ll_channel_t ch, char *buf, size_t len);

/* Wipe the keys (HMAC key, CurveZMQ secret key) from memory. */
void ll_conn_clear(ll_conn_info_t *info);

const char *ll_conn_channel_name(ll_channel_t ch);

#endif
