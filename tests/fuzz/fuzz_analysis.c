/* Fuzz target (libFuzzer, under ASan/UBSan): the cell analysis on arbitrary
 * source: a cell is analysed, recorded in a session (which is reset now and
 * then, so it stays small), and a closure is taken; every accessor's result
 * is well formed.  CPython is started once (its own allocations are not
 * instrumented; leaks are not checked: the interpreter keeps caches). */
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "analysis/ll_analysis.h"
#include "base/ll_log.h"
#include "kernel/ll_interp.h"

static ll_analysis_session_t *s_session;
static unsigned s_cells;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    ll_log_level = -1;
    char err[512];
    if (ll_interp_start_python((*argv)[0], err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_analysis: %s\n", err);
        abort();
    }
    if (ll_analysis_init(err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_analysis: %s\n", err);
        abort();
    }
    s_session = ll_analysis_session_new();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0; /* (the gateway limits cells too: LOOSELEAF_ANALYSIS_MAX_BYTES) */
    ll_analysis_t *cell = ll_analysis_new((const char *) data, size);
    if (!cell)
        __builtin_trap();
    json_t *j = ll_analysis_json(cell);
    if (!json_is_object(j))
        __builtin_trap();
    json_decref(j);
    ll_analysis_closure_t *c = ll_analysis_session_closure(s_session, cell);
    if (c) {
        json_t *cj = ll_analysis_closure_json(c);
        if (!json_is_object(cj))
            __builtin_trap();
        json_decref(cj);
        ll_analysis_strs_t st = ll_analysis_closure_state(c);
        for (size_t i = 0; i < st.count; i++)
            if (!st.items[i])
                __builtin_trap();
        ll_analysis_closure_destroy(&c);
    }
    ll_analysis_session_record(s_session, cell);
    ll_analysis_destroy(&cell);
    if (++s_cells % 200 == 0) {
        ll_analysis_session_destroy(&s_session);
        s_session = ll_analysis_session_new();
    }
    return 0;
}
