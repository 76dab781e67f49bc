/* ll_iopub: the kernel's IOPub channel (XPUB socket) and the "current parent".
 *
 * Every message on iopub goes through here: status, execute_input, stream
 * text (coalesced by ll_stream), and what the interpreter publishes through
 * its hooks.  One lock (ll_stream's send lock) serializes all use of the XPUB
 * socket and keeps stream text in order with every other message: a publish
 * first flushes buffered text.  ZeroMQ sockets are not thread-safe; a mutex
 * is cheaper than an inproc hop per message, and lets the stream flusher send
 * without waking another thread.
 *
 * The current parent is the request whose output is being produced (set by
 * the shell loop before each request); stream text and hook publishes carry
 * its header as parent_header.  Output from background threads after a
 * request ends stays with that request, as in ipykernel.
 *
 * Threads: all functions are thread-safe. */
#ifndef LL_IOPUB_H
#define LL_IOPUB_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "gateway/ll_curve.h"
#include "proto/ll_wire.h"

typedef struct ll_iopub_t ll_iopub_t;

/* Bind an XPUB socket at ENDPOINT, start the stream coalescer and the
 * thread that welcomes subscriptions (iopub_welcome, protocol 5.5).  SESSION
 * is borrowed and must outlive the result.  Returns NULL with a reason in
 * ERR. */
ll_iopub_t *ll_iopub_new(ll_session_t *session, const char *endpoint, char *err, size_t errlen);

/* The same with the socket a CurveZMQ server of CURVE's keypair (NULL:
 * plain; only read here), for an encrypted kernel (gateway/ll_curve.h). */
ll_iopub_t *ll_iopub_new_curve(ll_session_t *session, const char *endpoint, const ll_curve_t *curve,
                               char *err, size_t errlen);

/* Flush, give queued messages up to a second to leave, close.  Nulls *SELF_P. */
void ll_iopub_destroy(ll_iopub_t **self_p);

/* From now on, output belongs to REQ (copied: identities and header).
 * Buffered text is sent under the previous parent first. */
void ll_iopub_set_parent(ll_iopub_t *self, const ll_msg_t *req);

/* On the calling thread only (a subshell's), output without an explicit
 * parent belongs to REQ (borrowed until cleared with NULL), and stream text
 * goes out under it line by line (and before any other message of the
 * thread) instead of through the coalescer, whose buffer and parent are the
 * main shell's. */
void ll_iopub_set_thread_parent(ll_iopub_t *self, const ll_msg_t *req);

/* Whether the calling thread serves a subshell's request. */
bool ll_iopub_has_thread_parent(void);

/* Publish MSG_TYPE with CONTENT (stolen; NULL = {}), METADATA (stolen, may be
 * NULL) and BUFFERS (*BUFFERS_P taken and nulled; may be NULL) under PARENT,
 * or under the current parent when PARENT is NULL.  Returns 0 or -1. */
int ll_iopub_send(ll_iopub_t *self, const char *msg_type, const ll_msg_t *parent, json_t *content,
                  json_t *metadata, zmsg_t **buffers_p);

/* Publish status STATE ("busy"/"idle"/"starting") for PARENT (may be NULL). */
int ll_iopub_status(ll_iopub_t *self, const char *state, const ll_msg_t *parent);

/* Stream text (coalesced); see ll_stream.  The flush is a program's flush():
 * a character fd capture cut in two waits for the drain and the status or
 * reply that follows (ll_stream_flush_whole). */
void ll_iopub_stream_write(ll_iopub_t *self, const char *name, const char *data, size_t len);
void ll_iopub_stream_flush(ll_iopub_t *self);

/* A new message of MSG_TYPE addressed like the current parent (its routing
 * identities, its header as parent_header), for the stdin channel.  Flushes
 * buffered text first so a prompt follows the output before it.  Steals
 * CONTENT.  NULL when there is no current parent. */
ll_msg_t *ll_iopub_msg_to_parent(ll_iopub_t *self, const char *msg_type, json_t *content);

/* A copy of REQ with its identities and header only (other parts empty),
 * enough to address replies to it; the caller owns it (ll_msg_destroy).
 * NULL on allocation failure. */
ll_msg_t *ll_iopub_parent_copy(const ll_msg_t *req);

int ll_iopub_selftest(bool verbose);

#endif
