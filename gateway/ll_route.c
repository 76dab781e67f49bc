/* ll_route: per-cell routing decision (see ll_route.h).  Kernel process,
 * main thread.
 *
 * The interpreter releases the GIL between requests, so the analysis calls
 * that parse source (ll_analysis_init, ll_analysis_new) take it here with
 * PyGILState_Ensure; sessions and closures never touch Python. */
#include <Python.h>

#include "gateway/ll_route.h"

#include <stdlib.h>
#include <string.h>

#include "gateway/ll_analysis.h"
#include "proto/ll_log.h"

struct ll_route_t {
    ll_analysis_session_t *session; /* every executed cell, in order */
};

struct ll_route_plan_t {
    ll_analysis_t *cell;            /* NULL if the analysis failed outright */
    ll_analysis_closure_t *closure; /* NULL when the cell did not parse */
};

bool ll_route_enabled(void)
{
    const char *v = getenv("LOOSELEAF_GPU_ROUTING");
    return v && strcmp(v, "1") == 0;
}

ll_route_t *ll_route_new(char *err, size_t errlen)
{
    ll_route_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = ll_analysis_init(err, errlen);
    PyGILState_Release(gil);
    if (rc < 0 || !(self->session = ll_analysis_session_new())) {
        if (rc == 0)
            snprintf(err, errlen, "cannot create the analysis session");
        free(self);
        return NULL;
    }
    return self;
}

void ll_route_destroy(ll_route_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_route_t *self = *self_p;
    ll_analysis_session_destroy(&self->session);
    PyGILState_STATE gil = PyGILState_Ensure();
    ll_analysis_shutdown();
    PyGILState_Release(gil);
    free(self);
    *self_p = NULL;
}

ll_route_plan_t *ll_route_plan(ll_route_t *self, const char *code, size_t len)
{
    ll_route_plan_t *plan = calloc(1, sizeof *plan);
    if (!plan)
        return NULL;
    PyGILState_STATE gil = PyGILState_Ensure();
    plan->cell = ll_analysis_new(code, len);
    PyGILState_Release(gil);
    if (plan->cell && !ll_analysis_error(plan->cell))
        plan->closure = ll_analysis_session_closure(self->session, plan->cell);
    return plan;
}

json_t *ll_route_plan_json(const ll_route_plan_t *plan)
{
    json_t *out = json_object();
    if (!out || !plan)
        return out;
    bool gpu = plan->closure && ll_analysis_closure_label(plan->closure) == LL_ANALYSIS_GPU;
    /* Where the cell ran: the interpreter, until workers are wired in. */
    json_object_set_new(out, "route", json_string("cpu"));
    json_object_set_new(out, "label", json_string(gpu ? "gpu" : "cpu"));
    if (gpu)
        json_object_set_new(out, "note",
                            json_string("GPU routing is not wired yet: the cell ran in the "
                                        "kernel's interpreter"));
    if (plan->cell) {
        const char *error = ll_analysis_error(plan->cell);
        if (error)
            json_object_set_new(out, "analysis_error", json_string(error));
        else
            json_object_set_new(out, "cell", ll_analysis_json(plan->cell));
    }
    if (plan->closure)
        json_object_set_new(out, "closure", ll_analysis_closure_json(plan->closure));
    return out;
}

void ll_route_done(ll_route_t *self, ll_route_plan_t **plan_p)
{
    if (!plan_p || !*plan_p)
        return;
    ll_route_plan_t *plan = *plan_p;
    /* The session mirrors what ran: errors and silent cells included. */
    if (plan->cell && ll_analysis_session_record(self->session, plan->cell) < 0)
        ll_warn("route", "cannot record a cell in the analysis session");
    ll_analysis_closure_destroy(&plan->closure);
    ll_analysis_destroy(&plan->cell);
    free(plan);
    *plan_p = NULL;
}
