/* ll_stdin: the kernel's stdin channel, where input() and getpass() ask the
 * frontend for a line.
 *
 * Cells that run in the interpreter ask through ll_stdin_input (the
 * interpreter's input hook); cells that run on a worker ask through their
 * relay (gateway/ll_route.c), which polls the channel itself with
 * ll_stdin_ask / ll_stdin_take / ll_stdin_release.  Either way one prompt is
 * out at a time: ll_stdin_ask takes the channel's lock and the caller holds
 * it until it has its answer (or gave up) and calls ll_stdin_release.
 *
 * A prompt goes to the frontend of the current request (ll_iopub's parent:
 * its routing identity, its header as parent_header).  Answers to earlier,
 * interrupted prompts are dropped before a new prompt goes out.
 *
 * Threads: the thread that runs the cell (the shell thread, or a user thread
 * of a CPU cell calling input()); the lock serialises them. */
#ifndef LL_STDIN_H
#define LL_STDIN_H

#include <czmq.h>
#include <stdbool.h>

#include "gateway/ll_iopub.h"
#include "proto/ll_wire.h"

typedef struct ll_stdin_t ll_stdin_t;

/* Serve input() on SOCK (a ROUTER, receive timeout 0), signing with SESSION,
 * addressing the current parent of IOPUB.  All three are borrowed and must
 * outlive the result.  NULL when out of memory. */
ll_stdin_t *ll_stdin_new(zsock_t *sock, ll_session_t *session, ll_iopub_t *iopub);

/* Nulls *SELF_P; safe on NULL. */
void ll_stdin_destroy(ll_stdin_t **self_p);

/* The socket, for a caller's poll while it waits for an answer. */
zsock_t *ll_stdin_sock(ll_stdin_t *self);

/* Send an input_request with PROMPT.  True when it went out: the channel is
 * then locked until ll_stdin_release.  False (not locked) when no frontend
 * can receive it. */
bool ll_stdin_ask(ll_stdin_t *self, const char *prompt, bool password);

/* The value of the input_reply among what waits on the socket (the caller
 * frees it), or NULL when none did; other messages are logged and dropped. */
char *ll_stdin_take(ll_stdin_t *self);

/* The caller has its answer or gives up: unlock the channel. */
void ll_stdin_release(ll_stdin_t *self);

/* The whole exchange for a cell in the interpreter: ask, wait for the
 * answer, release.  INTR_FD (an eventfd: SIGINT, shutdown) ends the wait;
 * STOPPING says the kernel is going.  Returns the line (the caller frees
 * it), or NULL with *ERR = 1 (interrupted or shutting down) or 2 (no
 * frontend listens on stdin). */
char *ll_stdin_input(ll_stdin_t *self, const char *prompt, bool password, int intr_fd,
                     bool (*stopping)(void), int *err);

int ll_stdin_selftest(bool verbose);

#endif
