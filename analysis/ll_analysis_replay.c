/* ll_analysis_replay: the replay of a cell's events against a session:
 * what a cell reads, which live variables and imports it
 * reaches, what it binds, changes and deletes.  The session
 * (ll_analysis_session.c) replays a draft cell to get its closures and an
 * executed cell to record it; the cell object replays against no session
 * to get its reads.  Pure C: no Python, no GIL; runs on the gateway's shell
 * thread (or the CLI).
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
 * When anything reached is opaque (a star import, exec, a function that
 * uses globals()) the replay says so and the session widens the closure. */
#include "analysis/ll_analysis_replay.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the map ----------------------------------------------------------- */

void *ll_map_get(const ll_map_t *m, const char *key)
{
    long at = ll_names_find(&m->keys, key);
    return at < 0 ? NULL : m->vals[at];
}

int ll_map_set(ll_map_t *m, const char *key, void *val)
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

void ll_map_remove(ll_map_t *m, const char *key)
{
    long at = ll_names_find(&m->keys, key);
    if (at < 0)
        return;
    memmove(m->vals + at, m->vals + at + 1, (m->keys.count - (size_t) at - 1) * sizeof *m->vals);
    ll_names_remove(&m->keys, key);
}

void ll_map_free(ll_map_t *m)
{
    ll_names_clear(&m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- bindings ---------------------------------------------------------- */

void ll_binding_free(ll_binding_t *b)
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

/* ---- the replay -------------------------------------------------------- */

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

/* Returns true if B was already visited in this unit (marks it if not). */
static bool s_visited(ll_replay_t *sim, const void *b)
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

static void s_push(ll_replay_t *sim, const char *name, bool cellside, int block)
{
    if (s_grow((void **) &sim->stack, &sim->capstack, sim->nstack + 1, sizeof *sim->stack) != 0) {
        sim->oom = true;
        return;
    }
    sim->stack[sim->nstack++] = (ll_replay_work_t){name, cellside, block};
}

ll_binding_t *ll_replay_base(const ll_replay_t *sim, const char *name)
{
    return sim->s ? ll_map_get(&sim->s->names, name) : NULL;
}

/* NAME resolved to B: note what it needs and expand what it looks up. */
static void s_visit(ll_replay_t *sim, const char *name, ll_binding_t *b, bool in_cell,
                    bool cellside, int block)
{
    if (ll_binding_is_import(b)) {
        if (b->path)
            ll_replay_add(sim, &sim->paths, b->path), ll_replay_add(sim, &sim->uprov, b->path);
        if (ll_analysis_is_kernel_module(b->path))
            sim->kernel_bound = true;
        if (!in_cell && b->stmt)
            ll_replay_add(sim, &sim->stmts, b->stmt);
        return;
    }
    if (!in_cell)
        ll_replay_add(sim, &sim->state, name);
    if (s_visited(sim, b))
        return;
    /* Its prov and deps reach the unit's new bindings in s_end_unit, from
     * the visited set, and only when something will use them. */
    ll_replay_union(sim, &sim->paths, &b->prov);
    if (b->opaque)
        sim->opaque = true;
    if (b->kernel_bound)
        sim->kernel_bound = true;
    for (size_t i = 0; i < b->deps.count; i++)
        s_push(sim, b->deps.items[i], cellside && in_cell, block);
    ll_replay_union(sim, &sim->pending_gwrites, &b->gwrites);
}

static void s_drain(ll_replay_t *sim)
{
    while (sim->nstack && !sim->oom) {
        ll_replay_work_t w = sim->stack[--sim->nstack];
        ll_replay_entry_t *e = ll_map_get(&sim->overlay, w.name);
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
        ll_binding_t *b = ll_replay_base(sim, w.name);
        bool builtin = !b && ll_analysis_is_builtin(w.name);
        if (w.cellside && !builtin)
            ll_replay_add(sim, &sim->reads, w.name);
        if (b) {
            s_visit(sim, w.name, b, false, false, w.block);
            continue;
        }
        if (builtin)
            continue;
        /* Unknown name: a live star import may have bound it. */
        for (size_t i = 0; sim->s && i < sim->s->stars.count; i++) {
            ll_binding_t *star = ll_map_get(&sim->s->names, sim->s->stars.items[i]);
            if (star)
                s_visit(sim, w.name, star, false, false, w.block);
        }
        for (size_t i = 0; i < sim->ostars.count; i++) {
            ll_replay_entry_t *se = ll_map_get(&sim->overlay, sim->ostars.items[i]);
            for (size_t k = 0; se && k < se->nalts; k++)
                s_visit(sim, w.name, se->alts[k], true, false, w.block);
        }
    }
}

static ll_replay_entry_t *s_entry(ll_replay_t *sim, const char *name)
{
    ll_replay_entry_t *e = ll_map_get(&sim->overlay, name);
    if (e)
        return e;
    e = calloc(1, sizeof *e);
    if (!e || ll_map_set(&sim->overlay, name, e) != 0) {
        free(e);
        sim->oom = true;
        return NULL;
    }
    e->base = true;
    return e;
}

static ll_binding_t *s_new_binding(ll_replay_t *sim, int kind)
{
    ll_binding_t *b = calloc(1, sizeof *b);
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

static void s_put(ll_replay_t *sim, const char *name, ll_binding_t *b, bool cond, int block)
{
    ll_replay_entry_t *e = s_entry(sim, name);
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

static void s_bind(ll_replay_t *sim, const ll_ev_t *ev)
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
    ll_binding_t *b = s_new_binding(sim, kind);
    if (!b)
        return;
    if (g) {
        ll_replay_union(sim, &b->deps, &g->globals);
        ll_replay_union(sim, &b->gwrites, &g->gwrites);
        ll_replay_union(sim, &b->prov, &g->paths);
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
        ll_replay_add(sim, &sim->ostars, ev->name);
    }
}

static void s_apply_gwrites(ll_replay_t *sim)
{
    /* A function that assigns globals binds them when it is called. */
    for (size_t i = 0; i < sim->pending_gwrites.count; i++) {
        ll_binding_t *b = s_new_binding(sim, LL_BK_VALUE);
        if (!b)
            return;
        s_put(sim, sim->pending_gwrites.items[i], b, true, -1);
    }
    ll_names_clear(&sim->pending_gwrites);
}

/* What the statement read flows into B: modules and deps. */
static void s_feed(ll_replay_t *sim, ll_binding_t *b)
{
    if (ll_binding_is_import(b))
        return;
    ll_replay_union(sim, &b->prov, &sim->uprov);
    ll_replay_union(sim, &b->deps, &sim->udeps);
    for (size_t i = 0; i < sim->capvisited; i++) {
        const ll_binding_t *v = sim->visited[i];
        if (!v || v == b)
            continue;
        ll_replay_union(sim, &b->prov, &v->prov);
        ll_replay_union(sim, &b->deps, &v->deps);
    }
}

static void s_end_unit(ll_replay_t *sim)
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
        ll_replay_entry_t *e = ll_map_get(&sim->overlay, name);
        for (size_t k = 0; e && k < e->nalts; k++)
            s_feed(sim, e->alts[k]);
        ll_binding_t *b = (!e || e->base) ? ll_replay_base(sim, name) : NULL;
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

static void s_del(ll_replay_t *sim, const ll_ev_t *ev)
{
    ll_replay_entry_t *e = s_entry(sim, ev->name);
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
static size_t s_current(ll_replay_t *sim, const char *name, ll_binding_t **out, size_t max)
{
    size_t n = 0;
    ll_replay_entry_t *e = ll_map_get(&sim->overlay, name);
    for (size_t i = 0; e && i < e->nalts && n < max; i++)
        out[n++] = e->alts[i];
    ll_binding_t *b = (!e || e->base) ? ll_replay_base(sim, name) : NULL;
    if (b && n < max)
        out[n++] = b;
    return n;
}

static bool s_is_code(const ll_binding_t *b)
{
    return b->kind == LL_BK_FUNC || b->kind == LL_BK_CLASS;
}

/* NAME may be changed in place by the current statement. */
static void s_mutates(ll_replay_t *sim, const char *name)
{
    ll_replay_add(sim, &sim->umut, name);
    ll_replay_add(sim, &sim->mutated, name);
}

/* A call received the ARGs: if one of them is a function, class or lambda,
 * whatever the call may store it in needs its globals from now on: the
 * receiver of a method, or the variables a called function's body reads. */
static void s_pass(ll_replay_t *sim, const ll_ev_t *ev)
{
    bool code = sim->plambda;
    ll_binding_t *alts[16];
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
            ll_binding_t *held[16];
            size_t m = s_current(sim, deps->items[i], held, 16);
            for (size_t j = 0; j < m; j++)
                if (!ll_binding_is_import(held[j]) && !s_is_code(held[j])) {
                    s_mutates(sim, deps->items[i]);
                    break;
                }
        }
    }
}

void ll_replay_run(ll_replay_t *sim)
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
                ll_replay_add(sim, &sim->pargs, ev[i].name);
            break;
        case LL_EV_PASS: s_pass(sim, &ev[i]); break;
        case LL_EV_SETTLE: {
            /* every branch rebound it: what it was before the cell is gone */
            ll_replay_entry_t *e = s_entry(sim, ev[i].name);
            if (e && e->nalts)
                e->base = false;
            break;
        }
        case LL_EV_DEL: s_del(sim, &ev[i]); break;
        case LL_EV_DEFER: {
            const ll_group_t *g = ll_analysis_group(sim->a, ev[i].ref);
            if (g) {
                ll_replay_union(sim, &sim->udeps, &g->globals);
                ll_replay_union(sim, &sim->uprov, &g->paths);
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
void ll_replay_init(ll_replay_t *sim, ll_analysis_session_t *s, const ll_analysis_t *a, bool record)
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

void ll_replay_free(ll_replay_t *sim)
{
    for (size_t i = 0; i < sim->overlay.keys.count; i++) {
        ll_replay_entry_t *e = sim->overlay.vals[i];
        free(e->alts);
        free(e->blocks);
        free(e);
    }
    ll_map_free(&sim->overlay);
    ll_names_clear(&sim->ostars);
    for (size_t i = 0; i < sim->nowned; i++)
        if (!sim->owned[i]->moved)
            ll_binding_free(sim->owned[i]);
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
    ll_replay_t sim;
    ll_replay_init(&sim, NULL, cell, false);
    ll_replay_run(&sim);
    int rc = sim.oom ? -1 : 0;
    if (rc == 0)
        rc = ll_names_union(reads, &sim.reads);
    ll_replay_free(&sim);
    return rc;
}
