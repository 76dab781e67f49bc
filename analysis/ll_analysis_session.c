/* ll_analysis_session: the def-use graph over executed cells, and the
 * closures of a candidate cell.  Pure C: no Python, no GIL; runs
 * on the gateway's shell thread (or the CLI).
 *
 * The session is the live names and their bindings (ll_analysis_replay.h).
 * Recording a cell replays its events (ll_analysis_replay.c) and makes the
 * replay's overlay the session's new state; a closure replays a draft cell
 * the same way and reads the result, so draft analysis and recording can
 * never disagree.
 *
 * When anything reached is opaque the closure is every live variable and
 * every live import: imprecision may cost time, never correctness. */
#include "analysis/ll_analysis_replay.h"
#include "base/ll_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- session ----------------------------------------------------------- */

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
        ll_binding_free(s->names.vals[i]);
    ll_map_free(&s->names);
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
        n += !ll_binding_is_import(self->names.vals[i]);
    return n;
}

/* One binding standing for several that may each be current. */
static ll_binding_t *s_merge(ll_replay_t *sim, ll_binding_t **alts, size_t n, ll_binding_t *old)
{
    ll_binding_t *m = calloc(1, sizeof *m);
    if (!m) {
        sim->oom = true;
        return NULL;
    }
    m->cell = alts[0]->cell;
    bool same_import = true;
    for (size_t i = 0; i <= n; i++) {
        ll_binding_t *b = i < n ? alts[i] : old;
        if (!b)
            continue;
        ll_replay_union(sim, &m->prov, &b->prov);
        ll_replay_union(sim, &m->deps, &b->deps);
        ll_replay_union(sim, &m->gwrites, &b->gwrites);
        m->opaque |= b->opaque;
        m->kernel_bound |= b->kernel_bound;
        if (ll_binding_is_import(b) && b->path)
            ll_replay_add(sim, &m->prov, b->path);
        if (!ll_binding_is_import(b) || !b->path || !alts[0]->path ||
            strcmp(b->path, alts[0]->path) != 0 || b->kind != alts[0]->kind)
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

static void s_commit(ll_replay_t *sim)
{
    ll_analysis_session_t *s = sim->s;
    for (size_t i = 0; i < sim->overlay.keys.count && !sim->oom; i++) {
        const char *name = sim->overlay.keys.items[i];
        ll_replay_entry_t *e = sim->overlay.vals[i];
        ll_binding_t *old = ll_map_get(&s->names, name);
        if (e->deleted) {
            if (old) {
                ll_map_remove(&s->names, name);
                ll_names_remove(&s->stars, name);
                ll_binding_free(old);
            }
            continue;
        }
        if (e->nalts == 0)
            continue;
        ll_binding_t *nb;
        if (e->nalts == 1 && (!e->base || !old)) {
            nb = e->alts[0];
            nb->moved = true;
        } else
            nb = s_merge(sim, e->alts, e->nalts, e->base ? old : NULL);
        if (!nb)
            return;
        if (ll_map_set(&s->names, name, nb) != 0) {
            sim->oom = true;
            if (!nb->moved)
                ll_binding_free(nb);
            nb->moved = false;
            return;
        }
        if (old)
            ll_binding_free(old);
        if (nb->kind == LL_BK_STAR)
            ll_replay_add(sim, &s->stars, name);
    }
}

int ll_analysis_session_record(ll_analysis_session_t *self, const ll_analysis_t *cell)
{
    if (!self || !cell)
        return -1;
    if (ll_analysis_error(cell))
        return 0;
    ll_replay_t sim;
    ll_replay_init(&sim, self, cell, true);
    ll_replay_run(&sim);
    if (!sim.oom)
        s_commit(&sim);
    int rc = sim.oom ? -1 : 0;
    ll_replay_free(&sim);
    self->cells++;
    return rc;
}

/* ---- what the namespace showed ------------------------------------------
 *
 * exec, %run, globals()[k] = v, setattr(sys.modules['__main__'], ...) bind
 * names no static analysis sees.  The process that ran the cell diffs its
 * namespace afterwards and the gateway tells the session here, after
 * recording the cell: such a name is live like any other, so later closures
 * name it and it moves between the kernel and workers. */

int ll_analysis_session_bind(ll_analysis_session_t *self, const char *name, const char *path,
                             const char *stmt, ll_analysis_strs_t deps, bool opaque)
{
    if (!self || !name || !*name || name[0] == '*')
        return -1;
    ll_binding_t *b = calloc(1, sizeof *b);
    if (!b)
        return -1;
    b->kind = stmt && path ? LL_BK_IMPORT : LL_BK_VALUE;
    b->cell = self->cells;
    b->opaque = opaque;
    int rc = 0;
    if (b->kind == LL_BK_IMPORT) {
        b->path = strdup(path);
        b->stmt = strdup(stmt);
        rc = b->path && b->stmt ? 0 : -1;
    } else if (path && *path) {
        rc = ll_names_add(&b->prov, path) < 0 ? -1 : 0;
    }
    for (size_t i = 0; rc == 0 && i < deps.count; i++)
        if (deps.items[i] && *deps.items[i] && strcmp(deps.items[i], name) != 0)
            rc = ll_names_add(&b->deps, deps.items[i]) < 0 ? -1 : 0;
    ll_binding_t *old = ll_map_get(&self->names, name);
    if (rc == 0)
        rc = ll_map_set(&self->names, name, b);
    if (rc != 0) {
        ll_binding_free(b);
        return -1;
    }
    ll_binding_free(old);
    return 0;
}

void ll_analysis_session_unbind(ll_analysis_session_t *self, const char *name)
{
    ll_binding_t *old = self && name ? ll_map_get(&self->names, name) : NULL;
    if (!old)
        return;
    ll_map_remove(&self->names, name);
    ll_binding_free(old);
}

/* ---- closures ---------------------------------------------------------- */

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
    ll_replay_t sim;
    ll_replay_init(&sim, self, cell, false);
    ll_replay_run(&sim);
    ll_analysis_closure_t *c = calloc(1, sizeof *c);
    /* Scratch sets borrow from the replay, the session and the cell; only
     * the closure's own sets copy. */
    ll_names_t state = {.borrow = true}, stmts = {.borrow = true}, paths = {.borrow = true},
               imports = {0};
    int rc = sim.oom || !c ? -1 : 0;
    if (rc == 0 && sim.opaque) {
        /* Everything live, and every module anything live was built with. */
        for (size_t i = 0; rc == 0 && i < self->names.keys.count; i++) {
            ll_binding_t *b = self->names.vals[i];
            const char *name = self->names.keys.items[i];
            if (ll_binding_is_import(b)) {
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
            const ll_replay_entry_t *e = sim.overlay.vals[i];
            if (name[0] == '*')
                continue;
            if (e->nalts && ll_names_add(&writes, name) < 0)
                rc = -1;
            if (e->deleted && ll_names_add(&deletes, name) < 0)
                rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < sim.mutated.count; i++) {
            ll_binding_t *b = ll_replay_base(&sim, sim.mutated.items[i]);
            ll_replay_entry_t *e = ll_map_get(&sim.overlay, sim.mutated.items[i]);
            bool module = (b && ll_binding_is_import(b) && !e) ||
                          (e && e->nalts && ll_binding_is_import(e->alts[e->nalts - 1]));
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
    ll_replay_free(&sim);
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

/* ---- self-test: closures over a session, from scripted event streams --- */

/* A cell built from a script instead of Python: tokens separated by ';'.
 *   U            a new top-level statement      L n    n is read now
 *   B n          n bound to a value             M n    n may change in place
 *   F n = a,b/w  def n, body reads a,b, assigns global w (after /)
 *   C n = a      class n, methods read a
 *   I n mod      import mod as n (import mod when n is mod)
 *   D n          del n          S n   every branch bound n (settled)
 *   A n          n passed to a call (A lambda: a lambda)
 *   P n          ... the call was n(...)        R n    ... it was n.method(...)
 *   {  }         enter / leave a conditional block (tokens of their own)
 *   O  K         the cell is opaque / uses get_ipython().kernel
 *   gpu cpu      the cell forces its label */
typedef struct {
    ll_analysis_t *a;
    int depth;    /* conditional blocks entered */
    int block;    /* current block */
    int stack[8]; /* enclosing blocks */
} s_st_build_t;

static const char *s_st_intern(ll_analysis_t *a, const char *name)
{
    if (!name)
        return NULL;
    if (ll_names_add(&a->pool, name) < 0)
        return NULL;
    return a->pool.items[ll_names_find(&a->pool, name)];
}

static void s_st_ev(s_st_build_t *b, int type, int kind, const char *name, int ref)
{
    ll_analysis_t *a = b->a;
    if (a->nev == a->capev) {
        a->capev = a->capev ? a->capev * 2 : 16;
        a->ev = realloc(a->ev, a->capev * sizeof *a->ev);
    }
    a->ev[a->nev++] = (ll_ev_t){.type = (uint8_t) type,
                                .kind = (uint8_t) kind,
                                .cond = b->depth > 0,
                                .direct = type == LL_EV_LOAD,
                                .block = b->block,
                                .name = s_st_intern(a, name),
                                .ref = ref};
}

/* "a,b/w": body globals a, b; global writes w. */
static int s_st_group(ll_analysis_t *a, const char *name, int kind, const char *spec)
{
    a->groups = realloc(a->groups, (a->ngroups + 1) * sizeof *a->groups);
    ll_group_t *g = &a->groups[a->ngroups];
    *g = (ll_group_t){.name = s_st_intern(a, name), .kind = kind};
    char buf[128];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    char *slash = strchr(buf, '/');
    if (slash)
        *slash++ = '\0';
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
        ll_names_add(&g->globals, t);
    for (char *t = slash ? strtok_r(slash, ", ", &save) : NULL; t; t = strtok_r(NULL, ", ", &save))
        ll_names_add(&g->gwrites, t);
    return (int) a->ngroups++;
}

static int s_st_import(ll_analysis_t *a, const char *bound, const char *module)
{
    char stmt[128];
    if (strcmp(bound, module) == 0)
        snprintf(stmt, sizeof stmt, "import %s", module);
    else
        snprintf(stmt, sizeof stmt, "import %s as %s", module, bound);
    a->imports = realloc(a->imports, (a->nimports + 1) * sizeof *a->imports);
    a->imports[a->nimports] = (ll_import_t){.bound = s_st_intern(a, bound),
                                            .module = strdup(module),
                                            .path = strdup(module),
                                            .stmt = strdup(stmt)};
    return (int) a->nimports++;
}

static void s_st_token(s_st_build_t *b, char *tok)
{
    char op[8] = "", n[64] = "", arg[64] = "";
    sscanf(tok, "%7s %63s %63[^\n]", op, n, arg);
    const char *spec = arg[0] == '=' ? arg + 1 + strspn(arg + 1, " ") : arg;
    ll_analysis_t *a = b->a;
    if (!strcmp(op, "U"))
        s_st_ev(b, LL_EV_UNIT, 0, NULL, -1);
    else if (!strcmp(op, "L"))
        s_st_ev(b, LL_EV_LOAD, 0, n, -1);
    else if (!strcmp(op, "B"))
        s_st_ev(b, LL_EV_BIND, LL_BK_VALUE, n, -1);
    else if (!strcmp(op, "F") || !strcmp(op, "C")) {
        int kind = op[0] == 'F' ? LL_BK_FUNC : LL_BK_CLASS;
        s_st_ev(b, LL_EV_BIND, kind, n, s_st_group(a, n, kind, spec));
    } else if (!strcmp(op, "I"))
        s_st_ev(b, LL_EV_BIND, LL_BK_IMPORT, n, s_st_import(a, n, arg));
    else if (!strcmp(op, "M"))
        s_st_ev(b, LL_EV_MUTATE, 0, n, -1);
    else if (!strcmp(op, "D"))
        s_st_ev(b, LL_EV_DEL, 0, n, -1);
    else if (!strcmp(op, "S"))
        s_st_ev(b, LL_EV_SETTLE, 0, n, -1);
    else if (!strcmp(op, "A"))
        s_st_ev(b, LL_EV_ARG, !strcmp(n, "lambda"), strcmp(n, "lambda") ? n : NULL, -1);
    else if (!strcmp(op, "P") || !strcmp(op, "R"))
        s_st_ev(b, LL_EV_PASS, op[0] == 'R', n, -1);
    else if (!strcmp(op, "{") && b->depth < 8) {
        b->stack[b->depth++] = b->block;
        b->block = ll_blocks_add(&a->blocks, b->block);
    } else if (!strcmp(op, "}") && b->depth > 0)
        b->block = b->stack[--b->depth];
    else if (!strcmp(op, "O"))
        a->opaque = true;
    else if (!strcmp(op, "K"))
        a->kernel_bound = true;
    else if (!strcmp(op, "gpu") || !strcmp(op, "cpu"))
        a->forced = op[0] == 'g' ? LL_ANALYSIS_GPU : LL_ANALYSIS_CPU;
}

static ll_analysis_t *s_st_cell(const char *script)
{
    s_st_build_t b = {.a = calloc(1, sizeof(ll_analysis_t))};
    b.a->forced = -1;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", script);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save))
        s_st_token(&b, tok + strspn(tok, " "));
    ll_analysis_facts(b.a);
    return b.a;
}

/* Record each script as an executed cell. */
static void s_st_record(ll_analysis_session_t *s, const char *const *scripts)
{
    for (; *scripts; scripts++) {
        ll_analysis_t *a = s_st_cell(*scripts);
        ll_analysis_session_record(s, a);
        ll_analysis_destroy(&a);
    }
}

/* Whether L is exactly the comma-separated names of EXPECT ("" for none). */
static bool s_st_is(ll_analysis_strs_t l, const char *expect, bool verbose)
{
    char buf[256], got[256] = "";
    snprintf(buf, sizeof buf, "%s", expect);
    size_t n = 0, at = 0;
    char *save = NULL;
    bool same = true;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), n++) {
        bool found = false;
        for (size_t i = 0; i < l.count; i++)
            found |= strcmp(l.items[i], t) == 0;
        same &= found;
    }
    same &= n == l.count;
    for (size_t i = 0; i < l.count && at < sizeof got; i++)
        at += (size_t) snprintf(got + at, sizeof got - at, "%s%s", i ? "," : "", l.items[i]);
    if (!same && verbose)
        fprintf(stderr, "ll_analysis_session: expected {%s}, got {%s}\n", expect, got);
    return same;
}

/* The closure of SCRIPT as a draft cell in S; the caller destroys it. */
static ll_analysis_closure_t *s_st_closure(ll_analysis_session_t *s, const char *script)
{
    ll_analysis_t *a = s_st_cell(script);
    ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
    ll_analysis_destroy(&a);
    return c;
}

/* SCRIPT's reads against an empty session, as a comma-separated list. */
static bool s_st_reads(const char *script, const char *expect, bool verbose)
{
    ll_analysis_t *a = s_st_cell(script);
    ll_names_t reads = {0};
    bool ok = ll_analysis_compute_reads(a, &reads) == 0 &&
              s_st_is((ll_analysis_strs_t){(const char *const *) reads.items, reads.count}, expect,
                      verbose);
    ll_names_clear(&reads);
    ll_analysis_destroy(&a);
    return ok;
}

#define S_IS(list, expect) s_st_is(list, expect, verbose)

/* What a cell reaches: functions' globals, values' held code, imports,
 * the label. */
static int s_st_reach(ll_analysis_session_t *s, bool verbose)
{
    int fails = 0;
    ll_analysis_closure_t *c;
    /* Calling f needs f and what its body reads. */
    c = s_st_closure(s, "U; L f");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "f,x") && !ll_analysis_closure_is_opaque(c));
    S_CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_CPU &&
            ll_analysis_closure_live_count(c) == 7);
    S_CHECK(c && S_IS(ll_analysis_closure_writes(c), "") &&
            S_IS(ll_analysis_closure_imports(c), ""));
    ll_analysis_closure_destroy(&c);
    /* A value does not need what it was computed from ... */
    c = s_st_closure(s, "U; L b");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "b"));
    ll_analysis_closure_destroy(&c);
    /* ... but one built by calling a function may hold its code. */
    c = s_st_closure(s, "U; L z");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "z,x"));
    ll_analysis_closure_destroy(&c);
    /* Imports are re-created by their statement, not restored. */
    c = s_st_closure(s, "U; L np; B arr");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), ""));
    S_CHECK(c && S_IS(ll_analysis_closure_import_stmts(c), "import numpy as np"));
    S_CHECK(c && S_IS(ll_analysis_closure_imports(c), "numpy") &&
            S_IS(ll_analysis_closure_writes(c), "arr"));
    S_CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
    ll_analysis_closure_destroy(&c);
    /* A GPU framework reached directly, or through what a value was built
     * with (t never names torch in the cell that uses it), labels GPU;
     * a forced label wins. */
    c = s_st_closure(s, "U; L t");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "t") &&
            S_IS(ll_analysis_closure_imports(c), "torch"));
    S_CHECK(c && S_IS(ll_analysis_closure_import_stmts(c), "") &&
            ll_analysis_closure_label(c) == LL_ANALYSIS_GPU);
    ll_analysis_closure_destroy(&c);
    c = s_st_closure(s, "cpu; U; L torch");
    S_CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
    ll_analysis_closure_destroy(&c);
    /* Comm machinery keeps the cell in the kernel, whatever else it uses. */
    c = s_st_closure(s, "U; I ipywidgets ipywidgets; U; L ipywidgets; L torch");
    S_CHECK(c && ll_analysis_closure_is_kernel_bound(c) &&
            ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
    ll_analysis_closure_destroy(&c);
    c = s_st_closure(s, "K; U; L t");
    S_CHECK(c && ll_analysis_closure_is_kernel_bound(c) &&
            ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
    ll_analysis_closure_destroy(&c);
    return fails;
}

/* The cell's own bindings, branches, in-place changes, global writes. */
static int s_st_bindings(ll_analysis_session_t *s, bool verbose)
{
    int fails = 0;
    ll_analysis_closure_t *c;
    /* The cell's own bindings hide the session's, unless made in a branch
     * that may not run; when every branch binds, the old value is gone. */
    c = s_st_closure(s, "U; B y; U; L y");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), ""));
    ll_analysis_closure_destroy(&c);
    c = s_st_closure(s, "U; L x; {; B y; }; U; L y");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "x,y") &&
            S_IS(ll_analysis_closure_writes(c), "y"));
    ll_analysis_closure_destroy(&c);
    c = s_st_closure(s, "U; L x; {; B y; }; {; B y; }; S y; U; L y");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "x"));
    ll_analysis_closure_destroy(&c);
    S_CHECK(s_st_reads("U; L c; {; B w; }; U; L w", "c,w", verbose));
    S_CHECK(s_st_reads("U; B w; U; L w; L len", "len", verbose));
    /* A binding made earlier in an enclosing block is certainly done. */
    S_CHECK(s_st_reads("U; L c; {; B w; {; L w; }; }", "c", verbose));

    /* In-place changes: reg.append(g) makes reg hold g, and so need what
     * g's body reads; the change is a write.  Changing a module is not. */
    c = s_st_closure(s, "U; F g = y; U; L reg; L g; A g; R reg; M reg; U; L np; M np");
    S_CHECK(c && S_IS(ll_analysis_closure_writes(c), "g,reg"));
    ll_analysis_closure_destroy(&c);
    static const char *const more[] = {"U; F g = y",
                                       "U; L reg; L g; A g; R reg; M reg",
                                       "U; F register = registry",
                                       "U; B registry",
                                       "U; F h = x",
                                       "U; L register; L h; A h; P register",
                                       NULL};
    s_st_record(s, more);
    c = s_st_closure(s, "U; L reg");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "reg,y"));
    ll_analysis_closure_destroy(&c);
    /* register(h): h may now be kept in what register's body reads. */
    c = s_st_closure(s, "U; L registry");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), "registry,x"));
    ll_analysis_closure_destroy(&c);
    /* A function's global writes are the caller's writes. */
    static const char *const setter[] = {"U; F setter = /counter", NULL};
    s_st_record(s, setter);
    c = s_st_closure(s, "U; L setter");
    S_CHECK(c && S_IS(ll_analysis_closure_writes(c), "counter"));
    ll_analysis_closure_destroy(&c);
    return fails;
}

/* Deletions, and an opaque cell. */
static int s_st_ends(ll_analysis_session_t *s, bool verbose)
{
    int fails = 0;
    ll_analysis_closure_t *c;
    /* Deleting: the name is no longer live and a later read of it finds
     * nothing; a draft's deletes are reported. */
    c = s_st_closure(s, "U; L y; D y");
    S_CHECK(c && S_IS(ll_analysis_closure_deletes(c), "y") &&
            S_IS(ll_analysis_closure_writes(c), ""));
    ll_analysis_closure_destroy(&c);
    size_t live = ll_analysis_session_live_count(s);
    static const char *const del[] = {"U; L b; D b", NULL};
    s_st_record(s, del);
    S_CHECK(ll_analysis_session_live_count(s) == live - 1);
    c = s_st_closure(s, "U; L b");
    S_CHECK(c && S_IS(ll_analysis_closure_state(c), ""));
    ll_analysis_closure_destroy(&c);

    /* Opaque: everything live and every live import. */
    c = s_st_closure(s, "O; U; L x");
    S_CHECK(c && ll_analysis_closure_is_opaque(c) &&
            ll_analysis_closure_state(c).count == ll_analysis_session_live_count(s));
    S_CHECK(c && S_IS(ll_analysis_closure_import_stmts(c), "import numpy as np,import torch"));
    S_CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_GPU);
    ll_analysis_closure_destroy(&c);
    return fails;
}

int ll_analysis_session_selftest(bool verbose)
{
    int fails = 0;
    ll_analysis_session_t *s = ll_analysis_session_new();
    /* x = 1; y = 2 | def f(): return x | import numpy as np | import torch
     * | b = x + 1 | z = f() | t = torch.ones(3) | reg = [] */
    static const char *const history[] = {"U; B x; U; B y",   "U; F f = x",  "U; I np numpy",
                                          "U; I torch torch", "U; L x; B b", "U; L f; B z",
                                          "U; L torch; B t",  "U; B reg",    NULL};
    s_st_record(s, history);
    S_CHECK(ll_analysis_session_cells(s) == 8);
    S_CHECK(ll_analysis_session_live_count(s) == 7); /* x y f b z t reg; not np, torch */
    fails += s_st_reach(s, verbose);
    fails += s_st_bindings(s, verbose);
    fails += s_st_ends(s, verbose);
    S_CHECK(ll_analysis_session_closure(NULL, NULL) == NULL);
    ll_analysis_session_destroy(&s);
    S_CHECK(s == NULL);
    return fails ? 1 : 0;
}
#undef S_IS
