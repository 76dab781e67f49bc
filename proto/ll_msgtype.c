/* ll_msgtype: the table of request types (see ll_msgtype.h). */
#include "proto/ll_msgtype.h"

#include <stddef.h>
#include <string.h>

#define SHELL   LL_MSG_ON_SHELL
#define CONTROL LL_MSG_ON_CONTROL
#define INTERP  LL_MSG_INTERP
#define RO      LL_MSG_READ_ONLY

static const ll_msgtype_t s_types[] = {
    /* The Jupyter requests.  Shell-only ones run on the main thread, where
     * the interpreter lives; control's are answered while a cell runs. */
    {"execute_request", SHELL, INTERP},
    {"kernel_info_request", SHELL | CONTROL, INTERP | RO}, /* asked once, answered from a cache */
    {"shutdown_request", SHELL | CONTROL, INTERP}, /* the interpreter's runs exit handlers */
    {"interrupt_request", SHELL | CONTROL, 0},
    {"connect_request", SHELL | CONTROL, 0},
    {"usage_request", CONTROL, 0},
    {"debug_request", CONTROL, 0}, /* its own entry point: it runs while a cell runs */
    /* Subshells (JEP 91): the dispatcher's own registry of shell threads. */
    {"create_subshell_request", CONTROL, 0},
    {"delete_subshell_request", CONTROL, 0},
    {"list_subshell_request", CONTROL, 0},
    {"complete_request", SHELL, INTERP | RO},
    {"inspect_request", SHELL, INTERP | RO},
    {"history_request", SHELL, INTERP | RO},
    {"is_complete_request", SHELL, INTERP | RO},
    {"comm_info_request", SHELL, INTERP | RO},
    /* Comm messages may run a widget's callback, so they are user code. */
    {"comm_open", SHELL, INTERP},
    {"comm_msg", SHELL, INTERP},
    {"comm_close", SHELL, INTERP},
    /* The gateway's own requests, around GPU cells run by workers
     * (looseleaf_kernel/coherence.py): never from a frontend. */
    {"looseleaf_before_gpu", 0, INTERP},
    {"looseleaf_after_gpu", 0, INTERP},
    {"looseleaf_commit_idle", 0, INTERP},
    {"looseleaf_commit_slow", 0, INTERP},
    {"looseleaf_home_lost", 0, INTERP},
    /* ... and the debugger's in GPU cells (looseleaf_kernel/debugger.py). */
    {"looseleaf_debug_gpu", 0, INTERP},
    {"looseleaf_debug_worker", 0, INTERP},
    {NULL, 0, 0},
};

const ll_msgtype_t *ll_msgtype_table(void)
{
    return s_types;
}

const ll_msgtype_t *ll_msgtype_find(const char *msg_type)
{
    for (const ll_msgtype_t *t = s_types; msg_type && t->msg_type; t++)
        if (strcmp(t->msg_type, msg_type) == 0)
            return t;
    return NULL;
}

bool ll_msgtype_has(const char *msg_type, unsigned flags)
{
    const ll_msgtype_t *t = ll_msgtype_find(msg_type);
    return t && (t->flags & flags) == flags;
}
