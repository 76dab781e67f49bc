/* ll_analysis_replay: the types the replay of a cell's events and the
 * session share, private to analysis/: a small map from names to
 * pointers, a binding (what a live name holds, as far as the analysis
 * knows), the session's state, and the replay's own state, which
 * ll_analysis_session.c reads after a run to build a closure or commit a
 * recorded cell.  Pure C: no Python, no GIL.  See ll_analysis_replay.c for
 * the design. */
#ifndef LL_ANALYSIS_REPLAY_H
#define LL_ANALYSIS_REPLAY_H

#include "analysis/ll_analysis.h"
#include "analysis/ll_analysis_internal.h"

#include <stdbool.h>
#include <stddef.h>

/* ---- a small map from names to pointers (insertion-ordered) ------------ */

typedef struct {
    ll_names_t keys; /* names, in insertion order */
    void **vals;     /* vals[i] belongs to keys.items[i] */
    size_t cap;
} ll_map_t;

/* The value of KEY, or NULL. */
void *ll_map_get(const ll_map_t *m, const char *key);
/* Set KEY (copied) to VAL.  0, or -1 when out of memory. */
int ll_map_set(ll_map_t *m, const char *key, void *val);
/* Remove KEY if present; its value is the caller's. */
void ll_map_remove(ll_map_t *m, const char *key);
/* Free the map itself (not the values). */
void ll_map_free(ll_map_t *m);

/* ---- bindings ---------------------------------------------------------- */

/* What a name is bound to, as far as the analysis knows. */
typedef struct {
    int kind;           /* ll_bind_kind_t */
    size_t cell;        /* the recorded cell (1-based) that bound it */
    ll_names_t prov;    /* module paths the object was built with */
    ll_names_t deps;    /* names looked up when the object is used */
    ll_names_t gwrites; /* function: globals it assigns when called */
    bool opaque;        /* using it defeats the analysis */
    bool kernel_bound;  /* using it uses the kernel object (get_ipython().kernel) */
    char *path;         /* import: dotted path of the bound object */
    char *stmt;         /* import: statement that re-creates it */
    bool moved;         /* ownership passed from a replay to the session */
} ll_binding_t;

/* Free B and what it owns; safe on NULL. */
void ll_binding_free(ll_binding_t *b);

static inline bool ll_binding_is_import(const ll_binding_t *b)
{
    return b->kind == LL_BK_IMPORT || b->kind == LL_BK_STAR;
}

/* The session: every live top-level name and its binding. */
struct ll_analysis_session_t {
    ll_map_t names;   /* live name -> ll_binding_t* */
    ll_names_t stars; /* keys ("*m") of live star imports */
    size_t cells;     /* cells recorded */
};

/* ---- the replay -------------------------------------------------------- */

typedef struct {
    ll_binding_t **alts; /* the cell's own bindings that may be current */
    int *blocks;         /* blocks[i]: the conditional block alts[i] was made in */
    size_t nalts, cap;
    bool base;    /* the binding from before the cell may be current */
    bool deleted; /* certainly deleted by the cell */
} ll_replay_entry_t;

typedef struct {
    const char *name;
    bool cellside; /* reached from the cell's code or its own bindings */
    int block;     /* the conditional block where the lookup happens */
} ll_replay_work_t;

typedef struct {
    ll_analysis_session_t *s; /* NULL: empty session */
    const ll_analysis_t *a;
    bool record;
    bool oom;
    ll_map_t overlay;  /* name -> ll_replay_entry_t* */
    ll_names_t ostars; /* overlay keys of the cell's star imports */
    /* results */
    ll_names_t reads; /* read from outside the cell */
    ll_names_t state; /* live non-import names reached */
    ll_names_t stmts; /* import statements reached */
    ll_names_t paths; /* module paths reached */
    bool opaque;
    bool kernel_bound; /* reached comm machinery: the cell must run in the kernel */
    /* the current unit (top-level statement) */
    ll_names_t uprov, udeps, umut, pending_gwrites;
    ll_names_t mutated; /* every name the cell may change in place */
    ll_names_t pargs;   /* names passed to the call being read */
    bool plambda;       /* ... and whether a lambda was passed too */
    ll_binding_t **ubinds;
    const char **ubinds_names; /* the names ubinds[i] were bound to */
    size_t nubinds, capubinds;
    const void **visited; /* open-addressing set of bindings */
    size_t nvisited, capvisited;
    ll_replay_work_t *stack;
    size_t nstack, capstack;
    ll_binding_t **owned; /* every binding this replay created */
    size_t nowned, capowned;
} ll_replay_t;

/* Ready SIM to replay cell A against session S (NULL: an empty session);
 * RECORD when the cell has executed and its bindings will be committed
 * (they then keep their prov and deps whether or not the cell uses them). */
void ll_replay_init(ll_replay_t *sim, ll_analysis_session_t *s, const ll_analysis_t *a,
                    bool record);
/* Replay the cell's events; the results are in SIM (sim->oom on failure). */
void ll_replay_run(ll_replay_t *sim);
/* Free what the replay owns; bindings marked `moved` belong to the session. */
void ll_replay_free(ll_replay_t *sim);
/* NAME's binding in the session before the cell, or NULL. */
ll_binding_t *ll_replay_base(const ll_replay_t *sim, const char *name);

/* Add NAME to SET, or every name of OTHER (union); running out of memory
 * marks the replay failed (sim->oom) rather than returning an error each
 * caller would check. */
static inline void ll_replay_add(ll_replay_t *sim, ll_names_t *set, const char *name)
{
    if (ll_names_add(set, name) < 0)
        sim->oom = true;
}

static inline void ll_replay_union(ll_replay_t *sim, ll_names_t *set, const ll_names_t *other)
{
    if (ll_names_union(set, other) < 0)
        sim->oom = true;
}

#endif
