/* ll_msgtype: the one list of the request types the kernel knows, with the
 * channels each is served on and what it may do.  Everything else derives
 * from it: the gateway's dispatcher (gateway/ll_dispatch.c) takes the
 * channels from here and checks in its self-test that every type has a
 * handler; the interpreter's handlers (looseleaf_kernel.kernel.Kernel) are
 * the types flagged LL_MSG_INTERP, which Python reads through
 * _looseleaf_kernel.request_types(); and the execution side
 * (gateway/ll_exec.c) asks LL_MSG_READ_ONLY whether a request can have
 * changed a variable.  Adding a type means one line here, a handler on the
 * side that serves it, and nothing else.  Pure data: any thread. */
#ifndef LL_MSGTYPE_H
#define LL_MSGTYPE_H

#include <stdbool.h>

/* Where a request is accepted (bits).  A type with neither is the kernel's
 * own: the gateway asks the interpreter for it, and a frontend sending it is
 * answered like any unknown type. */
#define LL_MSG_ON_SHELL   0x1u
#define LL_MSG_ON_CONTROL 0x2u

/* What a type is (bits). */
#define LL_MSG_INTERP    0x1u /* the interpreter has a handler for it */
#define LL_MSG_READ_ONLY 0x2u /* runs no user code: can never change a variable */

typedef struct {
    const char *msg_type; /* the request's header.msg_type */
    unsigned channels;    /* LL_MSG_ON_* where a frontend may send it */
    unsigned flags;       /* LL_MSG_INTERP, LL_MSG_READ_ONLY */
} ll_msgtype_t;

/* The table, ended by an entry whose msg_type is NULL.  Static storage. */
const ll_msgtype_t *ll_msgtype_table(void);

/* The entry of MSG_TYPE, or NULL for a type the kernel does not know. */
const ll_msgtype_t *ll_msgtype_find(const char *msg_type);

/* Whether MSG_TYPE is known and has every bit of FLAGS. */
bool ll_msgtype_has(const char *msg_type, unsigned flags);

#endif
