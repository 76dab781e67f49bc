/* ll_analysis_session: the def-use graph over executed cells, and the
 * closures of a candidate cell (issue 3).  Pure C: no Python, no GIL; runs
 * on the gateway's shell thread (or the CLI).
 *
 * DESIGN
 * The session maps each live top-level name to its current binding: the
 * kind (value, function, class, import), the cell that made it (the most
 * recently executed binder wins, whatever the cells' order in the
 * notebook), and two sets computed when that cell was recorded:
 *   prov  the module paths the object was built with: the import-bound
 *         names its statement read, the prov of the variables it read, the
 *         modules reached through the functions it called.  This is why an
 *         object of a `datasets` type pulls in `datasets` even though the
 *         cell that uses it never names the package.
 *   deps  names the object looks up when it is used.  For a function or
 *         class: the globals its body (its methods) reads.  For a value:
 *         the body globals of every function or lambda its statement
 *         referenced, since the value may hold it (Trainer(compute_metrics=
 *         f) needs f's globals when it evaluates, and a model built by
 *         Net() needs Net's methods' globals) -- but not the names of the
 *         values it was computed from: `b = a + 1` does not need `a` later.
 *
 * A cell is replayed event by event (ll_analysis_internal.h) against an
 * overlay holding its own bindings so far; a binding made in a branch is an
 * alternative that does not hide the older one.  A LOAD resolves through
 * the overlay first, then the session; reaching a function or a value
 * expands its deps, which are loaded in turn (each binding once per
 * statement).  Every non-import name resolved in the session on the way is
 * in the state closure; every import binding reached gives its statement
 * and module path.  So the state closure is exactly: the live variables the
 * cell's code and the code it may call will look up in the namespace; a
 * name a definer cell merely read to build a variable is not included (the
 * variable is restored as an object; it does not re-run its definer).  The
 * closure stops at import-bound names, which are re-created by their import
 * statement instead.  Recording replays the same way and then makes the
 * overlay the session's new state, so draft analysis and recording can
 * never disagree.
 *
 * Values change in place too: a statement that mutates x (x.a = f,
 * x[k] = v, x.append(f), a decorator @x.register, a call x.add(f) or
 * register(f) given a function, which marks the variables register's body
 * reads) passes its prov and deps on to x's binding when it is recorded.
 *
 * When anything reached is opaque the closure is every live variable and
 * every live import: imprecision may cost time, never correctness. */
#include "analysis/ll_analysis.h"
#include "analysis/ll_analysis_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small map from names to pointers -------------------------------- */

typedef struct {
    ll_names_t keys; /* names, in insertion order */
    void **vals;     /* vals[i] belongs to keys.items[i] */
    size_t cap;
} s_map_t;

static void *s_map_get(const s_map_t *m, const char *key)
{
    long at = ll_names_find(&m->keys, key);
    return at < 0 ? NULL : m->vals[at];
}

static int s_map_set(s_map_t *m, const char *key, void *val)
{
    long at = ll_names_find(&m->keys, key);
    if (at >= 0) {
        m->vals[at] = val;
        return 0;
    }
    if (m->keys.count == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        void **v = realloc(m->vals, cap * sizeof *v);
        if (!v)
            return -1;
        m->vals = v;
        m->cap = cap;
    }
    if (ll_names_add(&m->keys, key) < 0)
        return -1;
    m->vals[m->keys.count - 1] = val;
    return 0;
}

static void s_map_remove(s_map_t *m, const char *key)
{
    long at = ll_names_find(&m->keys, key);
    if (at < 0)
        return;
    memmove(m->vals + at, m->vals + at + 1, (m->keys.count - (size_t) at - 1) * sizeof *m->vals);
    ll_names_remove(&m->keys, key);
}

static void s_map_free(s_map_t *m)
{
    ll_names_clear(&m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- bindings --------------------------------------------------------- */

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
} s_binding_t;

static void s_binding_free(s_binding_t *b)
{
    if (!b)
        return;
    ll_names_clear(&b->prov);
    ll_names_clear(&b->deps);
    ll_names_clear(&b->gwrites);
    free(b->path);
    free(b->stmt);
    free(b);
}

static bool s_is_import(const s_binding_t *b)
{
    return b->kind == LL_BK_IMPORT || b->kind == LL_BK_STAR;
}

struct ll_analysis_session_t {
    s_map_t names;    /* live name -> s_binding_t* */
    ll_names_t stars; /* keys ("*m") of live star imports */
    size_t cells;     /* cells recorded */
};

/* ---- the replay ------------------------------------------------------- */

typedef struct {
    s_binding_t **alts; /* the cell's own bindings that may be current */
    int *blocks;        /* blocks[i]: the conditional block alts[i] was made in */
    size_t nalts, cap;
    bool base;    /* the binding from before the cell may be current */
    bool deleted; /* certainly deleted by the cell */
} s_entry_t;

typedef struct {
    const char *name;
    bool cellside; /* reached from the cell's code or its own bindings */
    int block;     /* the conditional block where the lookup happens */
} s_work_t;

typedef struct {
    ll_analysis_session_t *s; /* NULL: empty session */
    const ll_analysis_t *a;
    bool record;
    bool oom;
    s_map_t overlay;   /* name -> s_entry_t* */
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
    s_binding_t **ubinds;
    const char **ubinds_names; /* the names ubinds[i] were bound to */
    size_t nubinds, capubinds;
    const void **visited; /* open-addressing set of bindings */
    size_t nvisited, capvisited;
    s_work_t *stack;
    size_t nstack, capstack;
    s_binding_t **owned; /* every binding this replay created */
    size_t nowned, capowned;
} s_sim_t;

static int s_grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, n * size);
    if (!p)
        return -1;
    *arr = p;
    *cap = n;
    return 0;
}

static void s_add(s_sim_t *sim, ll_names_t *set, const char *name)
{
    if (ll_names_add(set, name) < 0)
        sim->oom = true;
}

static void s_union(s_sim_t *sim, ll_names_t *set, const ll_names_t *other)
{
    if (ll_names_union(set, other) < 0)
        sim->oom = true;
}

/* Returns true if B was already visited in this unit (marks it if not). */
static bool s_visited(s_sim_t *sim, const void *b)
{
    if ((sim->nvisited + 1) * 2 > sim->capvisited) {
        size_t cap = sim->capvisited ? sim->capvisited * 2 : 64;
        const void **v = calloc(cap, sizeof *v);
        if (!v) {
            sim->oom = true;
            return true;
        }
        for (size_t i = 0; i < sim->capvisited; i++) {
            if (!sim->visited[i])
                continue;
            size_t slot = ((uintptr_t) sim->visited[i] >> 4) & (cap - 1);
            while (v[slot])
                slot = (slot + 1) & (cap - 1);
            v[slot] = sim->visited[i];
        }
        free(sim->visited);
        sim->visited = v;
        sim->capvisited = cap;
    }
    size_t slot = ((uintptr_t) b >> 4) & (sim->capvisited - 1);
    while (sim->visited[slot]) {
        if (sim->visited[slot] == b)
            return true;
        slot = (slot + 1) & (sim->capvisited - 1);
    }
    sim->visited[slot] = b;
    sim->nvisited++;
    return false;
}

static void s_push(s_sim_t *sim, const char *name, bool cellside, int block)
{
    if (s_grow((void **) &sim->stack, &sim->capstack, sim->nstack + 1, sizeof *sim->stack) != 0) {
        sim->oom = true;
        return;
    }
    sim->stack[sim->nstack++] = (s_work_t){name, cellside, block};
}

static s_binding_t *s_base(const s_sim_t *sim, const char *name)
{
    return sim->s ? s_map_get(&sim->s->names, name) : NULL;
}

/* NAME resolved to B: note what it needs and expand what it looks up. */
static void s_visit(s_sim_t *sim, const char *name, s_binding_t *b, bool in_cell, bool cellside,
                    int block)
{
    if (s_is_import(b)) {
        if (b->path)
            s_add(sim, &sim->paths, b->path), s_add(sim, &sim->uprov, b->path);
        if (ll_analysis_is_kernel_module(b->path))
            sim->kernel_bound = true;
        if (!in_cell && b->stmt)
            s_add(sim, &sim->stmts, b->stmt);
        return;
    }
    if (!in_cell)
        s_add(sim, &sim->state, name);
    if (s_visited(sim, b))
        return;
    /* Its prov and deps reach the unit's new bindings in s_end_unit, from
     * the visited set, and only when something will use them. */
    s_union(sim, &sim->paths, &b->prov);
    if (b->opaque)
        sim->opaque = true;
    if (b->kernel_bound)
        sim->kernel_bound = true;
    for (size_t i = 0; i < b->deps.count; i++)
        s_push(sim, b->deps.items[i], cellside && in_cell, block);
    s_union(sim, &sim->pending_gwrites, &b->gwrites);
}

static void s_drain(s_sim_t *sim)
{
    while (sim->nstack && !sim->oom) {
        s_work_t w = sim->stack[--sim->nstack];
        s_entry_t *e = s_map_get(&sim->overlay, w.name);
        if (e) {
            /* Newest first; a binding made in a block enclosing this lookup
             * is certainly done and hides everything older.  s_visit never
             * changes the overlay, so the arrays stay put. */
            bool hidden = !e->base;
            for (size_t i = e->nalts; i-- > 0;) {
                s_visit(sim, w.name, e->alts[i], true, w.cellside, w.block);
                if (ll_analysis_block_encloses(sim->a, e->blocks[i], w.block)) {
                    hidden = true;
                    break;
                }
            }
            if (hidden)
                continue;
        }
        s_binding_t *b = s_base(sim, w.name);
        bool builtin = !b && ll_analysis_is_builtin(w.name);
        if (w.cellside && !builtin)
            s_add(sim, &sim->reads, w.name);
        if (b) {
            s_visit(sim, w.name, b, false, false, w.block);
            continue;
        }
        if (builtin)
            continue;
        /* Unknown name: a live star import may have bound it. */
        for (size_t i = 0; sim->s && i < sim->s->stars.count; i++) {
            s_binding_t *star = s_map_get(&sim->s->names, sim->s->stars.items[i]);
            if (star)
                s_visit(sim, w.name, star, false, false, w.block);
        }
        for (size_t i = 0; i < sim->ostars.count; i++) {
            s_entry_t *se = s_map_get(&sim->overlay, sim->ostars.items[i]);
            for (size_t k = 0; se && k < se->nalts; k++)
                s_visit(sim, w.name, se->alts[k], true, false, w.block);
        }
    }
}

static s_entry_t *s_entry(s_sim_t *sim, const char *name)
{
    s_entry_t *e = s_map_get(&sim->overlay, name);
    if (e)
        return e;
    e = calloc(1, sizeof *e);
    if (!e || s_map_set(&sim->overlay, name, e) != 0) {
        free(e);
        sim->oom = true;
        return NULL;
    }
    e->base = true;
    return e;
}

static s_binding_t *s_new_binding(s_sim_t *sim, int kind)
{
    s_binding_t *b = calloc(1, sizeof *b);
    if (!b ||
        s_grow((void **) &sim->owned, &sim->capowned, sim->nowned + 1, sizeof *sim->owned) != 0) {
        free(b);
        sim->oom = true;
        return NULL;
    }
    sim->owned[sim->nowned++] = b;
    b->kind = kind;
    b->cell = (sim->s ? sim->s->cells : 0) + 1;
    return b;
}

static void s_put(s_sim_t *sim, const char *name, s_binding_t *b, bool cond, int block)
{
    s_entry_t *e = s_entry(sim, name);
    if (!e)
        return;
    if (!cond) {
        e->nalts = 0;
        e->base = false;
    }
    e->deleted = false;
    size_t cap = e->cap;
    if (s_grow((void **) &e->alts, &cap, e->nalts + 1, sizeof *e->alts) ||
        s_grow((void **) &e->blocks, &e->cap, e->nalts + 1, sizeof *e->blocks)) {
        sim->oom = true;
        return;
    }
    e->alts[e->nalts] = b;
    e->blocks[e->nalts++] = block;
    size_t capnames = sim->capubinds;
    if (s_grow((void **) &sim->ubinds_names, &capnames, sim->nubinds + 1,
               sizeof *sim->ubinds_names) ||
        s_grow((void **) &sim->ubinds, &sim->capubinds, sim->nubinds + 1, sizeof *sim->ubinds)) {
        sim->oom = true;
        return;
    }
    sim->ubinds_names[sim->nubinds] = name;
    sim->ubinds[sim->nubinds++] = b;
}

static void s_bind(s_sim_t *sim, const ll_ev_t *ev)
{
    int kind = ev->kind;
    const ll_group_t *g = NULL;
    const ll_import_t *im = NULL;
    if (kind == LL_BK_FUNC || kind == LL_BK_CLASS) {
        g = ll_analysis_group(sim->a, ev->ref);
        if (!g)
            kind = LL_BK_VALUE;
    } else if (kind == LL_BK_IMPORT || kind == LL_BK_STAR) {
        im = ll_analysis_import(sim->a, ev->ref);
        if (!im)
            kind = LL_BK_VALUE;
    }
    s_binding_t *b = s_new_binding(sim, kind);
    if (!b)
        return;
    if (g) {
        s_union(sim, &b->deps, &g->globals);
        s_union(sim, &b->gwrites, &g->gwrites);
        s_union(sim, &b->prov, &g->paths);
        b->opaque = g->opaque;
        b->kernel_bound = g->kernel_bound;
    }
    if (im) {
        b->path = strdup(im->path);
        b->stmt = strdup(im->stmt);
        if (!b->path || !b->stmt)
            sim->oom = true;
    }
    s_put(sim, ev->name, b, ev->cond, ev->block);
    if (kind == LL_BK_STAR) {
        sim->opaque = true;
        s_add(sim, &sim->ostars, ev->name);
    }
}

static void s_apply_gwrites(s_sim_t *sim)
{
    /* A function that assigns globals binds them when it is called. */
    for (size_t i = 0; i < sim->pending_gwrites.count; i++) {
        s_binding_t *b = s_new_binding(sim, LL_BK_VALUE);
        if (!b)
            return;
        s_put(sim, sim->pending_gwrites.items[i], b, true, -1);
    }
    ll_names_clear(&sim->pending_gwrites);
}

/* What the statement read flows into B: modules and deps. */
static void s_feed(s_sim_t *sim, s_binding_t *b)
{
    if (s_is_import(b))
        return;
    s_union(sim, &b->prov, &sim->uprov);
    s_union(sim, &b->deps, &sim->udeps);
    for (size_t i = 0; i < sim->capvisited; i++) {
        const s_binding_t *v = sim->visited[i];
        if (!v || v == b)
            continue;
        s_union(sim, &b->prov, &v->prov);
        s_union(sim, &b->deps, &v->deps);
    }
}

static void s_end_unit(s_sim_t *sim)
{
    /* A draft replay only needs a binding's prov and deps if the cell
     * itself looks the name up again later. */
    bool need = sim->record;
    for (size_t i = 0; !need && i < sim->nubinds; i++)
        need = ll_analysis_may_load(sim->a, sim->ubinds_names[i]);
    for (size_t i = 0; !need && i < sim->umut.count; i++)
        need = ll_analysis_may_load(sim->a, sim->umut.items[i]);
    for (size_t i = 0; need && i < sim->nubinds; i++)
        s_feed(sim, sim->ubinds[i]);
    for (size_t i = 0; need && i < sim->umut.count; i++) {
        const char *name = sim->umut.items[i];
        s_entry_t *e = s_map_get(&sim->overlay, name);
        for (size_t k = 0; e && k < e->nalts; k++)
            s_feed(sim, e->alts[k]);
        s_binding_t *b = (!e || e->base) ? s_base(sim, name) : NULL;
        if (b && sim->record)
            s_feed(sim, b);
    }
    ll_names_reset(&sim->uprov);
    ll_names_reset(&sim->udeps);
    ll_names_reset(&sim->umut);
    sim->nubinds = 0;
    if (sim->nvisited) {
        memset(sim->visited, 0, sim->capvisited * sizeof *sim->visited);
        sim->nvisited = 0;
    }
}

static void s_del(s_sim_t *sim, const ll_ev_t *ev)
{
    s_entry_t *e = s_entry(sim, ev->name);
    if (!e)
        return;
    if (!ev->cond) {
        e->nalts = 0;
        e->base = false;
        e->deleted = true;
    } else {
        /* A conditional delete (`except ... as e` ending, `if c: del x`)
         * ends the bindings made in its own block; older ones may remain. */
        size_t keep = 0;
        for (size_t i = 0; i < e->nalts; i++) {
            if (e->blocks[i] == ev->block)
                continue;
            e->alts[keep] = e->alts[i];
            e->blocks[keep++] = e->blocks[i];
        }
        e->nalts = keep;
    }
}

/* The bindings NAME may have at this point of the cell: the cell's own
 * alternatives, then (if still possible) the session's. */
static size_t s_current(s_sim_t *sim, const char *name, s_binding_t **out, size_t max)
{
    size_t n = 0;
    s_entry_t *e = s_map_get(&sim->overlay, name);
    for (size_t i = 0; e && i < e->nalts && n < max; i++)
        out[n++] = e->alts[i];
    s_binding_t *b = (!e || e->base) ? s_base(sim, name) : NULL;
    if (b && n < max)
        out[n++] = b;
    return n;
}

static bool s_is_code(const s_binding_t *b)
{
    return b->kind == LL_BK_FUNC || b->kind == LL_BK_CLASS;
}

/* NAME may be changed in place by the current statement. */
static void s_mutates(s_sim_t *sim, const char *name)
{
    s_add(sim, &sim->umut, name);
    s_add(sim, &sim->mutated, name);
}

/* A call received the ARGs: if one of them is a function, class or lambda,
 * whatever the call may store it in needs its globals from now on: the
 * receiver of a method, or the variables a called function's body reads. */
static void s_pass(s_sim_t *sim, const ll_ev_t *ev)
{
    bool code = sim->plambda;
    s_binding_t *alts[16];
    for (size_t i = 0; !code && i < sim->pargs.count; i++) {
        size_t n = s_current(sim, sim->pargs.items[i], alts, 16);
        for (size_t k = 0; k < n; k++)
            code |= s_is_code(alts[k]);
    }
    ll_names_reset(&sim->pargs);
    sim->plambda = false;
    if (!code)
        return;
    if (ev->kind == 1) {
        s_mutates(sim, ev->name);
        return;
    }
    size_t n = s_current(sim, ev->name, alts, 16);
    for (size_t k = 0; k < n; k++) {
        if (!s_is_code(alts[k]))
            continue;
        const ll_names_t *deps = &alts[k]->deps;
        for (size_t i = 0; i < deps->count; i++) {
            s_binding_t *held[16];
            size_t m = s_current(sim, deps->items[i], held, 16);
            for (size_t j = 0; j < m; j++)
                if (!s_is_import(held[j]) && !s_is_code(held[j])) {
                    s_mutates(sim, deps->items[i]);
                    break;
                }
        }
    }
}

static void s_run(s_sim_t *sim)
{
    size_t nev = 0;
    const ll_ev_t *ev = ll_analysis_events(sim->a, &nev);
    if (ll_analysis_opaque_flag(sim->a))
        sim->opaque = true;
    if (ll_analysis_kernel_bound_flag(sim->a))
        sim->kernel_bound = true;
    for (size_t i = 0; i < nev && !sim->oom; i++) {
        switch (ev[i].type) {
        case LL_EV_UNIT:
            s_end_unit(sim);
            ll_names_reset(&sim->pargs);
            sim->plambda = false;
            break;
        case LL_EV_LOAD:
            s_push(sim, ev[i].name, true, ev[i].block);
            s_drain(sim);
            s_apply_gwrites(sim);
            break;
        case LL_EV_BIND: s_bind(sim, &ev[i]); break;
        case LL_EV_MUTATE: s_mutates(sim, ev[i].name); break;
        case LL_EV_ARG:
            if (ev[i].kind == 1)
                sim->plambda = true;
            else if (ev[i].name)
                s_add(sim, &sim->pargs, ev[i].name);
            break;
        case LL_EV_PASS: s_pass(sim, &ev[i]); break;
        case LL_EV_SETTLE: {
            /* every branch rebound it: what it was before the cell is gone */
            s_entry_t *e = s_entry(sim, ev[i].name);
            if (e && e->nalts)
                e->base = false;
            break;
        }
        case LL_EV_DEL: s_del(sim, &ev[i]); break;
        case LL_EV_DEFER: {
            const ll_group_t *g = ll_analysis_group(sim->a, ev[i].ref);
            if (g) {
                s_union(sim, &sim->udeps, &g->globals);
                s_union(sim, &sim->uprov, &g->paths);
                if (g->opaque)
                    sim->opaque = true;
                if (g->kernel_bound)
                    sim->kernel_bound = true;
            }
            break;
        }
        }
    }
    s_end_unit(sim);
}

/* The replay's scratch sets borrow their strings: every name it handles
 * belongs to the analysis or to a binding that outlives the replay. */
static void s_sim_init(s_sim_t *sim, ll_analysis_session_t *s, const ll_analysis_t *a, bool record)
{
    memset(sim, 0, sizeof *sim);
    sim->s = s;
    sim->a = a;
    sim->record = record;
    ll_names_t *sets[] = {&sim->reads, &sim->state,           &sim->stmts, &sim->paths,
                          &sim->uprov, &sim->udeps,           &sim->umut,  &sim->mutated,
                          &sim->pargs, &sim->pending_gwrites, &sim->ostars};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        sets[i]->borrow = true;
}

static void s_sim_free(s_sim_t *sim)
{
    for (size_t i = 0; i < sim->overlay.keys.count; i++) {
        s_entry_t *e = sim->overlay.vals[i];
        free(e->alts);
        free(e->blocks);
        free(e);
    }
    s_map_free(&sim->overlay);
    ll_names_clear(&sim->ostars);
    for (size_t i = 0; i < sim->nowned; i++)
        if (!sim->owned[i]->moved)
            s_binding_free(sim->owned[i]);
    free(sim->owned);
    ll_names_clear(&sim->reads);
    ll_names_clear(&sim->state);
    ll_names_clear(&sim->stmts);
    ll_names_clear(&sim->paths);
    ll_names_clear(&sim->uprov);
    ll_names_clear(&sim->udeps);
    ll_names_clear(&sim->umut);
    ll_names_clear(&sim->mutated);
    ll_names_clear(&sim->pargs);
    ll_names_clear(&sim->pending_gwrites);
    free(sim->ubinds);
    free(sim->ubinds_names);
    free(sim->visited);
    free(sim->stack);
}

int ll_analysis_compute_reads(const ll_analysis_t *cell, ll_names_t *reads)
{
    s_sim_t sim;
    s_sim_init(&sim, NULL, cell, false);
    s_run(&sim);
    int rc = sim.oom ? -1 : 0;
    if (rc == 0)
        rc = ll_names_union(reads, &sim.reads);
    s_sim_free(&sim);
    return rc;
}

/* ---- session ---------------------------------------------------------- */

ll_analysis_session_t *ll_analysis_session_new(void)
{
    return calloc(1, sizeof(ll_analysis_session_t));
}

void ll_analysis_session_destroy(ll_analysis_session_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_analysis_session_t *s = *self_p;
    for (size_t i = 0; i < s->names.keys.count; i++)
        s_binding_free(s->names.vals[i]);
    s_map_free(&s->names);
    ll_names_clear(&s->stars);
    free(s);
    *self_p = NULL;
}

size_t ll_analysis_session_cells(const ll_analysis_session_t *self)
{
    return self->cells;
}

size_t ll_analysis_session_live_count(const ll_analysis_session_t *self)
{
    size_t n = 0;
    for (size_t i = 0; i < self->names.keys.count; i++)
        n += !s_is_import(self->names.vals[i]);
    return n;
}

/* One binding standing for several that may each be current. */
static s_binding_t *s_merge(s_sim_t *sim, s_binding_t **alts, size_t n, s_binding_t *old)
{
    s_binding_t *m = calloc(1, sizeof *m);
    if (!m) {
        sim->oom = true;
        return NULL;
    }
    m->cell = alts[0]->cell;
    bool same_import = true;
    for (size_t i = 0; i <= n; i++) {
        s_binding_t *b = i < n ? alts[i] : old;
        if (!b)
            continue;
        s_union(sim, &m->prov, &b->prov);
        s_union(sim, &m->deps, &b->deps);
        s_union(sim, &m->gwrites, &b->gwrites);
        m->opaque |= b->opaque;
        m->kernel_bound |= b->kernel_bound;
        if (s_is_import(b) && b->path)
            s_add(sim, &m->prov, b->path);
        if (!s_is_import(b) || !b->path || !alts[0]->path || strcmp(b->path, alts[0]->path) != 0 ||
            b->kind != alts[0]->kind)
            same_import = false;
    }
    if (same_import) {
        m->kind = alts[0]->kind;
        m->path = strdup(alts[0]->path);
        m->stmt = strdup(alts[0]->stmt);
    } else
        m->kind = LL_BK_VALUE; /* restore whatever object is there */
    return m;
}

static void s_commit(s_sim_t *sim)
{
    ll_analysis_session_t *s = sim->s;
    for (size_t i = 0; i < sim->overlay.keys.count && !sim->oom; i++) {
        const char *name = sim->overlay.keys.items[i];
        s_entry_t *e = sim->overlay.vals[i];
        s_binding_t *old = s_map_get(&s->names, name);
        if (e->deleted) {
            if (old) {
                s_map_remove(&s->names, name);
                ll_names_remove(&s->stars, name);
                s_binding_free(old);
            }
            continue;
        }
        if (e->nalts == 0)
            continue;
        s_binding_t *nb;
        if (e->nalts == 1 && (!e->base || !old)) {
            nb = e->alts[0];
            nb->moved = true;
        } else
            nb = s_merge(sim, e->alts, e->nalts, e->base ? old : NULL);
        if (!nb)
            return;
        if (s_map_set(&s->names, name, nb) != 0) {
            sim->oom = true;
            if (!nb->moved)
                s_binding_free(nb);
            nb->moved = false;
            return;
        }
        if (old)
            s_binding_free(old);
        if (nb->kind == LL_BK_STAR)
            s_add(sim, &s->stars, name);
    }
}

int ll_analysis_session_record(ll_analysis_session_t *self, const ll_analysis_t *cell)
{
    if (!self || !cell)
        return -1;
    if (ll_analysis_error(cell))
        return 0;
    s_sim_t sim;
    s_sim_init(&sim, self, cell, true);
    s_run(&sim);
    if (!sim.oom)
        s_commit(&sim);
    int rc = sim.oom ? -1 : 0;
    s_sim_free(&sim);
    self->cells++;
    return rc;
}

/* ---- closures --------------------------------------------------------- */

struct ll_analysis_closure_t {
    ll_names_t state;     /* sorted */
    ll_names_t imports;   /* sorted packages */
    ll_names_t effective; /* sorted packages */
    ll_names_t stmts;     /* sorted import statements */
    ll_names_t reads;     /* as the cell reads them */
    ll_names_t writes;    /* sorted: may bind, rebind or change in place */
    ll_names_t deletes;   /* sorted: certainly deletes */
    bool opaque;
    bool kernel_bound; /* uses comm machinery: runs in the kernel */
    int label;
    size_t live;
};

static int s_sorted_into(ll_names_t *dst, const ll_names_t *src)
{
    const char **sorted = ll_names_sorted(src);
    if (src->count && !sorted)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < src->count && rc == 0; i++)
        rc = ll_names_add(dst, sorted[i]) < 0 ? -1 : 0;
    free(sorted);
    return rc;
}

static int s_packages(ll_names_t *dst, const ll_names_t *paths)
{
    for (size_t i = 0; i < paths->count; i++) {
        char buf[256];
        const char *pkg = ll_analysis_package_of(paths->items[i], buf, sizeof buf);
        if (pkg && ll_names_add(dst, pkg) < 0)
            return -1;
    }
    return 0;
}

void ll_analysis_closure_destroy(ll_analysis_closure_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_analysis_closure_t *c = *self_p;
    ll_names_clear(&c->state);
    ll_names_clear(&c->imports);
    ll_names_clear(&c->effective);
    ll_names_clear(&c->stmts);
    ll_names_clear(&c->reads);
    ll_names_clear(&c->writes);
    ll_names_clear(&c->deletes);
    free(c);
    *self_p = NULL;
}

ll_analysis_closure_t *ll_analysis_session_closure(ll_analysis_session_t *self,
                                                   const ll_analysis_t *cell)
{
    if (!self || !cell || ll_analysis_error(cell))
        return NULL;
    s_sim_t sim;
    s_sim_init(&sim, self, cell, false);
    s_run(&sim);
    ll_analysis_closure_t *c = calloc(1, sizeof *c);
    /* Scratch sets borrow from the replay, the session and the cell; only
     * the closure's own sets copy. */
    ll_names_t state = {.borrow = true}, stmts = {.borrow = true}, paths = {.borrow = true},
               imports = {0};
    int rc = sim.oom || !c ? -1 : 0;
    if (rc == 0 && sim.opaque) {
        /* Everything live, and every module anything live was built with. */
        for (size_t i = 0; rc == 0 && i < self->names.keys.count; i++) {
            s_binding_t *b = self->names.vals[i];
            const char *name = self->names.keys.items[i];
            if (s_is_import(b)) {
                if ((b->stmt && ll_names_add(&stmts, b->stmt) < 0) ||
                    (b->path && ll_names_add(&paths, b->path) < 0))
                    rc = -1;
            } else if (ll_names_add(&state, name) < 0 || ll_names_union(&paths, &b->prov) < 0)
                rc = -1;
        }
    }
    if (rc == 0)
        rc = ll_names_union(&state, &sim.state) | ll_names_union(&stmts, &sim.stmts) |
             ll_names_union(&paths, &sim.paths);
    if (rc == 0)
        rc = s_packages(&imports, &paths);
    if (rc == 0) {
        ll_analysis_strs_t own = ll_analysis_imports(cell);
        for (size_t i = 0; rc == 0 && i < own.count; i++)
            rc = ll_names_add(&imports, own.items[i]) < 0 ? -1 : 0;
    }
    if (rc == 0) {
        ll_names_t eff = {0};
        rc = s_packages(&eff, &paths);
        rc = rc ? rc
                : s_sorted_into(&c->state, &state) | s_sorted_into(&c->stmts, &stmts) |
                      s_sorted_into(&c->imports, &imports) | s_sorted_into(&c->effective, &eff) |
                      ll_names_union(&c->reads, &sim.reads);
        ll_names_clear(&eff);
    }
    if (rc == 0) {
        /* What the worker must save afterwards: the cell's bindings (also
         * those made by functions it calls, through `global`) and whatever
         * it may have changed in place.  A mutation through an alias or by
         * an opaque cell is invisible here: the saver compares versions. */
        ll_names_t writes = {.borrow = true}, deletes = {.borrow = true};
        for (size_t i = 0; rc == 0 && i < sim.overlay.keys.count; i++) {
            const char *name = sim.overlay.keys.items[i];
            const s_entry_t *e = sim.overlay.vals[i];
            if (name[0] == '*')
                continue;
            if (e->nalts && ll_names_add(&writes, name) < 0)
                rc = -1;
            if (e->deleted && ll_names_add(&deletes, name) < 0)
                rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < sim.mutated.count; i++) {
            s_binding_t *b = s_base(&sim, sim.mutated.items[i]);
            s_entry_t *e = s_map_get(&sim.overlay, sim.mutated.items[i]);
            bool module = (b && s_is_import(b) && !e) ||
                          (e && e->nalts && s_is_import(e->alts[e->nalts - 1]));
            if (!module && ll_names_add(&writes, sim.mutated.items[i]) < 0)
                rc = -1;
        }
        if (rc == 0)
            rc = s_sorted_into(&c->writes, &writes) | s_sorted_into(&c->deletes, &deletes);
        ll_names_clear(&writes);
        ll_names_clear(&deletes);
    }
    if (rc == 0) {
        c->opaque = sim.opaque;
        c->kernel_bound = sim.kernel_bound;
        c->live = ll_analysis_session_live_count(self);
        int forced = ll_analysis_forced_label(cell);
        c->label = LL_ANALYSIS_CPU;
        /* A cell that uses comm machinery (a widget, a comm target, the
         * kernel object) runs in the kernel whatever else it reaches: a comm
         * made on a worker would outlive nothing but its cell, and the
         * frontend's messages to it come to the kernel. */
        for (size_t i = 0; i < paths.count && !c->kernel_bound; i++)
            if (ll_analysis_is_gpu_module(paths.items[i]))
                c->label = LL_ANALYSIS_GPU;
        if (forced >= 0)
            c->label = forced;
    }
    ll_names_clear(&state);
    ll_names_clear(&stmts);
    ll_names_clear(&paths);
    ll_names_clear(&imports);
    s_sim_free(&sim);
    if (rc != 0)
        ll_analysis_closure_destroy(&c);
    return c;
}

static ll_analysis_strs_t s_strs(const ll_names_t *n)
{
    return (ll_analysis_strs_t){(const char *const *) n->items, n->count};
}

ll_analysis_strs_t ll_analysis_closure_state(const ll_analysis_closure_t *self)
{
    return s_strs(&self->state);
}
ll_analysis_strs_t ll_analysis_closure_imports(const ll_analysis_closure_t *self)
{
    return s_strs(&self->imports);
}
ll_analysis_strs_t ll_analysis_closure_import_stmts(const ll_analysis_closure_t *self)
{
    return s_strs(&self->stmts);
}
ll_analysis_strs_t ll_analysis_closure_writes(const ll_analysis_closure_t *self)
{
    return s_strs(&self->writes);
}
ll_analysis_strs_t ll_analysis_closure_deletes(const ll_analysis_closure_t *self)
{
    return s_strs(&self->deletes);
}
ll_analysis_label_t ll_analysis_closure_label(const ll_analysis_closure_t *self)
{
    return self->label;
}
bool ll_analysis_closure_is_opaque(const ll_analysis_closure_t *self)
{
    return self->opaque;
}
bool ll_analysis_closure_is_kernel_bound(const ll_analysis_closure_t *self)
{
    return self->kernel_bound;
}
size_t ll_analysis_closure_live_count(const ll_analysis_closure_t *self)
{
    return self->live;
}

static json_t *s_json_list(const ll_names_t *n)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n->count; i++)
        json_array_append_new(arr, json_string(n->items[i]));
    return arr;
}

json_t *ll_analysis_closure_json(const ll_analysis_closure_t *self)
{
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:s, s:b, s:b, s:I}", "state_closure",
                     s_json_list(&self->state), "import_closure", s_json_list(&self->imports),
                     "effective_imports", s_json_list(&self->effective), "import_statements",
                     s_json_list(&self->stmts), "writes", s_json_list(&self->writes), "deletes",
                     s_json_list(&self->deletes), "label",
                     self->label == LL_ANALYSIS_GPU ? "gpu" : "cpu", "opaque", self->opaque,
                     "kernel_bound", self->kernel_bound, "live", (json_int_t) self->live);
}
