/* ll_hostd_wire: what a client of `looseleaf hostd` may say (hostd/API.md,
 * "Protocol"), checked before the broker acts on any of it.  Pure: a frame
 * (already parsed JSON) in, a typed request or a reason out; no I/O, no
 * state, so a self-test feeds it every kind of lie.
 *
 * The broker runs as root and its clients are any local user: every field
 * is checked for its type and range (an integer is never truncated to fit,
 * a slot is one of the broker's), a pool's claims at `hello` for number and
 * duplicates.  Whether a claim or a request matches what the broker lent is
 * the broker's own state's question (ll_hostd_policy), asked after this. */
#ifndef LL_HOSTD_WIRE_H
#define LL_HOSTD_WIRE_H

#include "policy/ll_hostd_policy.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* The longest frame a client may send: a `hello` claiming
 * LL_HOSTD_MAX_SLOTS slots is ~7 KiB; anything longer is not a pool's. */
#define LL_HOSTD_FRAME_MAX 16384

/* Where the broker listens, which both ends of the protocol must agree on
 * (the pool's side, zygote/ll_hostpool_hostd.c, includes only this file
 * of hostd/). */
#define LL_HOSTD_DEFAULT_SOCKET "/run/looseleaf/hostd.sock"

/* The broker's socket path: $LL_HOSTD_SOCKET, else the default, into OUT. */
void ll_hostd_socket_path(char *out, size_t len);

typedef enum {
    LL_HOSTD_MSG_STATS,
    LL_HOSTD_MSG_HELLO,
    LL_HOSTD_MSG_WANT,
    LL_HOSTD_MSG_MARK,
    LL_HOSTD_MSG_RELEASE,
} ll_hostd_msg_type_t;

/* A lease as a pool describes it (hello's held entries, mark, release). */
typedef struct {
    int slot;          /* one of the broker's: 0..slots-1 */
    bool idle;         /* a warm worker holds it */
    double value;      /* idle: its GreedyDual value (finite) */
    int pid;           /* the worker on it (0: none said) */
    int cells;         /* cells that worker ran (>= 0) */
    bool prefetch;     /* it holds a prefetch */
    bool has_prefetch; /* ... and the frame said so (mark: else unchanged) */
} ll_hostd_lease_msg_t;

typedef struct {
    ll_hostd_msg_type_t type;
    int nslots;                                    /* hello: the pool's own slots, 1..MAX_SLOTS */
    int nheld;                                     /* hello: claims in held */
    ll_hostd_lease_msg_t held[LL_HOSTD_MAX_SLOTS]; /* hello: slots it holds now, no duplicates */
    int want;                                      /* want: n, 0..MAX_SLOTS */
    int want_prefetch;                             /* want: prefetch, 0..MAX_SLOTS */
    bool has_prefetch;                             /* want: prefetch was given */
    ll_hostd_lease_msg_t lease;                    /* mark, release (release: slot only) */
} ll_hostd_msg_t;

/* Check frame M (borrowed) from a client of a broker of NSLOTS slots into
 * *OUT.  Returns 0, or -1 with WHY (a line for the client's `error` frame
 * and the log; nothing of M is to be acted on). */
int ll_hostd_wire_parse(const json_t *m, int nslots, ll_hostd_msg_t *out, char *why, size_t wlen);

#endif
