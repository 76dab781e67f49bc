/* ll_route: the per-cell routing decision of the kernel process (issue 5),
 * built on the cell analysis (gateway/ll_analysis.h).
 *
 * Status: OFF unless LOOSELEAF_GPU_ROUTING=1.  When on, every executed cell
 * is analysed against the session's def-use graph (and recorded in it after
 * it ran), and execute_reply.metadata.looseleaf reports the route, the label
 * and the state and import closures.  Running GPU-labelled cells on forked
 * workers (zygote/ll_zclient) is NOT wired yet: every cell still runs in the
 * embedded interpreter, and the metadata says so.
 *
 * Threads: main (shell) thread only; takes the GIL itself where the
 * analysis needs Python. */
#ifndef LL_ROUTE_H
#define LL_ROUTE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ll_route_t ll_route_t;
typedef struct ll_route_plan_t ll_route_plan_t;

/* Whether LOOSELEAF_GPU_ROUTING asks for routing. */
bool ll_route_enabled(void);

/* After ll_interp_init.  Returns NULL with a reason in ERR. */
ll_route_t *ll_route_new(char *err, size_t errlen);

/* Before ll_interp_finalize.  Nulls *SELF_P; safe on NULL. */
void ll_route_destroy(ll_route_t **self_p);

/* Analyse CODE (LEN bytes, may contain NUL) before it runs.  Returns a plan
 * (never NULL unless out of memory); a cell that does not parse gets a plan
 * without closure. */
ll_route_plan_t *ll_route_plan(ll_route_t *self, const char *code, size_t len);

/* The plan as execute_reply.metadata.looseleaf (a new object). */
json_t *ll_route_plan_json(const ll_route_plan_t *plan);

/* The cell ran (successfully or not): record it in the session, free the
 * plan, null *PLAN_P. */
void ll_route_done(ll_route_t *self, ll_route_plan_t **plan_p);

#endif
