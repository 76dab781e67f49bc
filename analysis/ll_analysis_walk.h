/* ll_analysis_walk: the AST walker of the cell analysis: its
 * state and the operations its two files share.  Private to analysis/:
 *   ll_analysis_walk.c        the walk, node by node (statements, scopes,
 *                             definitions, control flow, calls: IPython
 *                             magics, get_ipython(), exec/eval, arguments
 *                             that may be kept) and its entry point
 *                             ll_walk_cell;
 *   ll_analysis_walk_state.c  what the walk records into the cell (events,
 *                             groups, imports, blocks), name resolution
 *                             against the scope stack, the symtable-like
 *                             pre-scan of a scope, the C stack guard.
 * The walk uses the state file, which calls nothing of the walk.
 *
 * Runs with the GIL held on the thread that analyses (the gateway's shell
 * thread, or the `looseleaf analyze` CLI), inside ll_analysis_new. */
#ifndef LL_ANALYSIS_WALK_H
#define LL_ANALYSIS_WALK_H

#include "analysis/ll_analysis_ast.h"
#include "analysis/ll_analysis_internal.h"

#include <stdbool.h>
#include <stddef.h>

/* The deepest AST the walk follows; deeper is an error, not a crash. */
#define LL_ANALYSIS_MAX_DEPTH 1500

/* The walk's state: where in the cell it is and what it found wrong. */
typedef struct {
    ll_analysis_t *a; /* the cell being built */
    ll_scope_t *scope;
    int group;          /* deferred group receiving global reads, or -1 */
    int class_group;    /* group of the top-level class being walked, or -1 */
    int cond;           /* depth of conditional module-level blocks */
    int block;          /* innermost conditional block (0: none) */
    int depth;          /* recursion depth of the walk */
    bool one_unit;      /* magic body walked as one statement (%%capture) */
    bool oom;           /* allocation failed */
    bool too_deep;      /* refused a tree deeper than LL_ANALYSIS_MAX_DEPTH */
    ll_names_t *defset; /* names certainly bound in the current branch
                               (block defblock) of an if/else, or NULL */
    int defblock;
    ll_names_t *loopdefs;   /* functions/classes defined in the loop body
                               being walked, or NULL */
    const char *stack_base; /* a local of ll_walk_cell */
    size_t stack_budget;    /* bytes of C stack the walk may use below it */
} ll_walker_t;

/* ---- ll_analysis_walk.c ------------------------------------------------ */

/* Walk TREE (an ast.Module, borrowed) into cell A's events, groups, imports
 * and blocks.  0; -1 when out of memory; 1 when the tree is deeper than
 * LL_ANALYSIS_MAX_DEPTH or this thread's stack allows (what A holds is then
 * partial and must be dropped).  No Python exception is left set. */
int ll_walk_cell(ll_analysis_t *a, PyObject *tree);
/* Walk one node (anything that is not an AST node is ignored). */
void ll_walk(ll_walker_t *w, PyObject *node);
/* Walk NODE.ATTR: a node or a list of nodes. */
void ll_walk_field(ll_walker_t *w, PyObject *node, PyObject *attr);
/* Walk every field of NODE. */
void ll_walk_generic(ll_walker_t *w, PyObject *node);
/* A statement list; at module level each statement starts a unit. */
void ll_walk_body(ll_walker_t *w, PyObject *list);

/* ---- ll_analysis_walk.c: calls ------------------------------------------ */

/* A Call node: a magic, a call that makes the cell opaque, or a call whose
 * arguments it may keep (ARG/PASS events). */
void ll_walk_call(ll_walker_t *w, PyObject *node);
/* Parse CODE (a magic's argument or body) and walk it here, as cell code or
 * (AS_FUNCTION, %timeit) as a function body that runs now. */
void ll_walk_code(ll_walker_t *w, const char *code, bool as_function);

/* ---- ll_analysis_walk_state.c ------------------------------------------ */

/* Bytes of C stack the walk may use below BASE on this thread. */
size_t ll_walk_stack_budget(const char *base);
/* Whether the walk has used up its stack budget (asked at every node). */
static inline bool ll_walk_stack_low(const ll_walker_t *w)
{
    char here;
    return w->stack_base && (size_t) (w->stack_base - &here) > w->stack_budget;
}
/* Append an event (NAME interned into the cell; NULL for none). */
void ll_walk_emit(ll_walker_t *w, int type, int kind, const char *name, int ref, bool direct);
/* A new group (deferred body) named NAME (NULL for a lambda): its index, or
 * -1 when out of memory. */
int ll_walk_new_group(ll_walker_t *w, const char *name, int kind);
/* Add NAME / every name of OTHER to SET (copied), noting a failure. */
void ll_walk_add(ll_walker_t *w, ll_names_t *set, const char *name);
void ll_walk_add_all(ll_walker_t *w, ll_names_t *set, const ll_names_t *other);
/* Enter a conditional block; the result goes back to ll_walk_leave_block. */
int ll_walk_enter_block(ll_walker_t *w);
void ll_walk_leave_block(ll_walker_t *w, int saved);
/* Mark whatever runs (the cell now, the deferred body) opaque, or as using
 * the kernel object. */
void ll_walk_opaque(ll_walker_t *w);
void ll_walk_kernel_bound(ll_walker_t *w);
/* Whether Attribute node ATTR is get_ipython().something. */
bool ll_walk_is_get_ipython(PyObject *attr);
/* A read of NAME where the walk is. */
void ll_walk_load(ll_walker_t *w, const char *name);
/* A binding of NAME (kind ll_bind_kind_t; REF its group or import) in
 * scope SC, or in the current scope. */
void ll_walk_store_in(ll_walker_t *w, ll_scope_t *sc, const char *name, int kind, int ref);
void ll_walk_store(ll_walker_t *w, const char *name, int kind, int ref);
/* `del NAME` at module level (READS: it needs NAME to exist). */
void ll_walk_delete(ll_walker_t *w, const char *name, bool reads);
/* The Name at the bottom of an attribute/subscript/call chain (x of
 * x.a[0].b()), owned by the AST, or NULL. */
const char *ll_walk_base_name(PyObject *node);
/* TARGET (an attribute or subscript chain) may change its base in place. */
void ll_walk_mutate(ll_walker_t *w, PyObject *target);
/* Record an import binding (strings copied): its index, or -1. */
int ll_walk_add_import(ll_walker_t *w, const char *bound, const char *module, const char *attr,
                       const char *path, const char *stmt);
/* Collect into SC the names NODE (or NODE.ATTR, or the nodes of LIST)
 * binds in it; in COMP mode (inside a comprehension of SC) only walrus
 * targets bind in SC. */
void ll_walk_scan(ll_walker_t *w, PyObject *node, ll_scope_t *sc, bool comp);
void ll_walk_scan_field(ll_walker_t *w, PyObject *node, PyObject *attr, ll_scope_t *sc, bool comp);
void ll_walk_scan_list(ll_walker_t *w, PyObject *list, ll_scope_t *sc, bool comp);

#endif
