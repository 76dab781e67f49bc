/* ll_wire: Jupyter messages (protocol 5.5, LL_PROTOCOL_VERSION) on the wire.
 *
 * A message on a ROUTER/DEALER socket is
 *     [identities...] "<IDS|MSG>" signature header parent_header metadata content [buffers...]
 * and the signature is hex(HMAC-SHA256(key, header|parent|metadata|content)).
 *
 * ll_session_t plays the role of jupyter_client's Session: it holds the key,
 * the kernel's session id and the history of seen signatures.  Decoding
 * verifies BEFORE any JSON is parsed, in this order: delimiter present,
 * enough frames, signature of exactly 64 hex chars, constant-time HMAC over
 * the raw received frames, signature not seen before (bounded history).  A
 * message that fails is dropped with a reason; nothing here asserts on wire
 * input.
 *
 * Threads: a session is shared by the kernel's threads (shell loop, control,
 * iopub, stdin).  Encode and decode are safe to call concurrently; the replay
 * history is guarded internally. */
#ifndef LL_WIRE_H
#define LL_WIRE_H

#include <czmq.h>
#include <jansson.h>

/* The Jupyter messaging protocol version the kernel speaks (message headers,
 * kernel_info_reply, the kernelspec).  5.5: debug_request / debug_event,
 * kernel_info on control, supported_features, and an XPUB iopub socket that
 * welcomes each subscription (gateway/ll_iopub.c); kernel subshells, the
 * optional part of 5.5, are not offered (not in supported_features). */
#define LL_PROTOCOL_VERSION "5.5"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ll_session_t ll_session_t;

/* One decoded (or to-be-sent) message.  Fields are public: the dispatcher
 * reads them directly.  All json_t fields are owned references.  Treat a
 * decoded header as read-only: replies built by ll_msg_new share it (by
 * reference) as their parent_header. */
typedef struct {
    zmsg_t *identities;    /* routing frames before the delimiter (owned, may be empty) */
    json_t *header;        /* object; has msg_id, msg_type, session, username, date, version */
    json_t *parent_header; /* object, {} when none */
    json_t *metadata;      /* object */
    json_t *content;       /* object */
    zmsg_t *buffers;       /* extra binary frames after content (owned, may be empty) */
    const char *msg_type;  /* borrowed from header, valid while header lives */
} ll_msg_t;

/* KEY may be NULL/empty: then messages are neither signed nor checked (the
 * caller warns loudly) and SCHEME is ignored.  With a key SCHEME must be
 * "hmac-sha256".  REPLAY_HISTORY is the number of recent signatures
 * remembered (0: default 65536, jupyter_client's digest_history_size); the
 * oldest is forgotten first.  The key is copied into OpenSSL's context.
 * The caller owns the result (ll_session_destroy).  Returns NULL if the
 * scheme is unsupported. */
ll_session_t *ll_session_new(const unsigned char *key, size_t key_len, const char *scheme,
                             size_t replay_history);
void ll_session_destroy(ll_session_t **self_p);

/* This kernel's session id (a uuid), used in every header it writes. */
const char *ll_session_id(const ll_session_t *self);

/* True when the session has a key (signs and verifies). */
bool ll_session_is_signed(const ll_session_t *self);

/* hex(HMAC-SHA256(key, parts[0] | ... | parts[3])) into HEX (64 lowercase
 * hex characters + NUL; "" for an unsigned session).  Returns 0 or -1. */
int ll_session_sign(const ll_session_t *self, const void *const parts[4], const size_t lens[4],
                    char hex[65]);

/* Verify and parse RAW (all frames as received from a ROUTER socket, or from
 * a SUB/DEALER without identities).  Takes ownership of *RAW_P and nulls it.
 * Returns a new message, or NULL with a reason in WHY (message dropped).
 * With a key the signature must be 64 hex characters (either case); without
 * one the signature frame is ignored, as jupyter_client does.  JSON strings
 * may contain \u0000 (a NUL inside `code` is kept; use json_string_length).
 * Frames after content are kept, in order, in msg->buffers.  The header must
 * be an object with string msg_type and msg_id, name no key twice, and a
 * version, when it has one, must read as one ("5.3"). */
ll_msg_t *ll_session_decode(ll_session_t *self, zmsg_t **raw_p, char *why, size_t whylen);

/* Build the signed frames of MSG (identities first, then delimiter, ...).
 * MSG is not consumed.  Returns a new zmsg_t owned by the caller, or NULL
 * if a part fails to serialize. */
zmsg_t *ll_session_encode(ll_session_t *self, const ll_msg_t *msg);

/* Encode and send *MSG_P on SOCK, then destroy the message and null
 * *MSG_P.  Returns 0 or -1. */
int ll_session_send(ll_session_t *self, zsock_t *sock, ll_msg_t **msg_p);

/* A new message of MSG_TYPE in reply to PARENT (may be NULL): copies the
 * parent's identities and its header as parent_header, writes a fresh header
 * (new msg_id, this session, date, version LL_PROTOCOL_VERSION).  Steals the reference to
 * CONTENT (NULL means {}).  The caller owns the result (ll_msg_destroy, or
 * a send that takes it).  Returns NULL only on allocation failure. */
ll_msg_t *ll_msg_new(ll_session_t *self, const char *msg_type, const ll_msg_t *parent,
                     json_t *content);

void ll_msg_destroy(ll_msg_t **self_p);

/* Convenience: a string field of content, or NULL. Borrowed. */
const char *ll_msg_content_str(const ll_msg_t *msg, const char *key);

/* The largest frame a kernel socket accepts: LOOSELEAF_MAX_FRAME_BYTES (bytes;
 * 0 or a negative number: no limit), default LL_WIRE_MAX_FRAME_DEFAULT,
 * generous for real outputs and comm buffers (a cell of 100 MB passes). */
#define LL_WIRE_MAX_FRAME_DEFAULT ((int64_t) 128 << 20)
int64_t ll_wire_max_frame_bytes(void);

/* Set ZMQ_MAXMSGSIZE on SOCK (before it binds or connects) to
 * ll_wire_max_frame_bytes(): a peer that sends a larger frame is
 * disconnected before the frame is buffered, so nobody can make the kernel
 * hold a huge message before its signature is even checked.  (ZeroMQ
 * bounds each frame: a message of many frames below the limit is still
 * buffered whole.)  0, or -1 with errno. */
int ll_wire_limit_frames(zsock_t *sock);

/* Block until SOCK has a message to read or STOP_FD (an eventfd that says
 * stop, or interrupt) is readable, retrying on EINTR.  Returns 1 SOCK is
 * readable, 0 STOP_FD fired (it wins when both are), -1 error (errno).
 * STOP_FD is not read: draining it is the caller's. */
int ll_wire_wait(zsock_t *sock, int stop_fd);

/* A fresh uuid4-formatted id ("8-4-4-4-12" hex + NUL), unique within the
 * process (and across a fork), without a syscall per id.  Thread-safe. */
void ll_wire_new_id(char out[37]);

/* The current time as ISO 8601 UTC with microseconds
 * ("2026-11-30T07:09:57.123456Z"), the format of header.date. */
void ll_wire_now(char out[32]);

#endif
