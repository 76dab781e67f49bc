/* ll_trace: the fleet simulator's input, a trace of notebook sessions in
 * JSON lines (the format is in sim/API.md, "Traces"), read one session at
 * a time so that a day of ten thousand sessions never sits in memory.
 * Runs in the `looseleaf simulate` process, single-threaded.
 *
 * Lines: an optional header ({"trace": ...}: import times of packages),
 * notebook lines ({"notebook": ID, "cells": [...]}: the facts of a
 * notebook's cells, which session cells may name with {"cell": K}), and
 * session lines ({"session": ID, "arrival_s": T, "cells": [...]}) in
 * order of arrival.  The reader turns each cell into the few numbers the
 * simulator charges for (ll_trace_cell_t), with the import times and the
 * hint model already applied. */
#ifndef LL_TRACE_H
#define LL_TRACE_H

#include "sim/ll_cost.h"

#include <stdbool.h>
#include <stdio.h>

/* One cell of a session, as the simulator needs it. */
typedef struct {
    bool gpu;               /* labelled GPU */
    float exec_s;           /* its execution */
    float edit_s;           /* edit window before Run (draft hints are sent in it) */
    float gap_s;            /* from the previous cell's output to the start of the edit */
    float import_all_s;     /* importing its whole import closure in a fresh process */
    float import_tail_s;    /* ... only what the zygote head does not hold */
    float pf_at[2];         /* prefetches sent at these offsets into the edit (< 0: none) */
    float pf_every;         /* then one every pf_every s while editing (0: no more) */
    double closure_bytes;   /* payload bytes of its state closure */
    double written_bytes;   /* payload bytes of what it binds or changes (saved after it) */
    double namespace_bytes; /* payload bytes of every live variable at Run */
} ll_trace_cell_t;

/* One session: a kernel connected at ARRIVAL_S, its cells in order. */
typedef struct {
    char *id;               /* the trace's session id (owned) */
    long index;             /* 0, 1, ... in the trace's order */
    double arrival_s;       /* when its kernel connected */
    double tail_s;          /* after its last cell's output, it stays connected this long */
    long seat;              /* its seat, 0..1000000 (it connects once the seat's previous
                             * session left, in each design); -1: none */
    int ncells;             /* cells */
    ll_trace_cell_t *cells; /* owned */
} ll_trace_session_t;

typedef struct ll_trace_reader_t ll_trace_reader_t;

/* A reader of the trace at PATH ("-": stdin) with COSTS (borrowed; for the
 * hint model and default import times) and the zygote head HEAD (package
 * names separated by commas; NULL: numpy,torch,IPython).  NULL with ERR
 * set when it cannot open.  The caller destroys it. */
ll_trace_reader_t *ll_trace_reader_new(const char *path, const ll_cost_t *costs, const char *head,
                                       char *err, size_t errlen);

/* Close and free *SELF_P; null it.  Safe on NULL and twice. */
void ll_trace_reader_destroy(ll_trace_reader_t **self_p);

/* The next session into *OUT (the caller destroys it with
 * ll_trace_session_destroy): 1; 0 at the end; -1 with ERR set on a bad
 * line (its number in the message) or sessions out of arrival order. */
int ll_trace_reader_next(ll_trace_reader_t *self, ll_trace_session_t **out, char *err,
                         size_t errlen);

/* Free *S_P and null it.  Safe on NULL and twice. */
void ll_trace_session_destroy(ll_trace_session_t **s_p);

/* The prefetch offsets for hints sent at HINTS[0..N) s into an edit
 * window of EDIT_S (the kernel's debounce rule, gateway/ll_exec.c: a hint
 * waits DEBOUNCE_S for a newer one, a burst at most MAX_WAIT_S after its
 * first): at most two into PF (the rest -1). */
void ll_trace_hint_prefetches(const double *hints, int n, double edit_s, double debounce_s,
                              double max_wait_s, float pf[2]);

#endif
