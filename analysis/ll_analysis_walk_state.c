/* ll_analysis_walk_state: what the AST walker records into a cell (issue
 * 3): events, groups (deferred bodies), import bindings and conditional
 * blocks; reads and bindings resolved against the walker's scope stack
 * (the rules are ll_analysis_scope.c's); the pre-scan that finds the names
 * a function, class or comprehension binds before its body is walked, the
 * way CPython's symtable does; and the guard that keeps a deep tree from
 * overflowing the C stack.  See ll_analysis_walk.h.  GIL held, on the
 * thread that analyses.  Calls nothing of the other walk files. */
#include "analysis/ll_analysis_walk.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How much C stack the walk may use on this thread: what lies below the
 * caller's frame, less a margin for the Python calls made during the walk
 * (parsing and transforming magic code).  The gateway's threads and the CLI
 * differ; a deep cell must end in an error, not a stack overflow. */
size_t ll_walk_stack_budget(const char *base)
{
    const size_t margin = 128 * 1024;
    /* A thread's stack does not move: ask once per thread.  For the main
     * thread glibc reads /proc/self/maps to answer, which in a kernel that
     * imported torch (thousands of mappings) took 10-20 ms per cell. */
    static _Thread_local void *lo;
    static _Thread_local bool known;
    if (!known) {
        pthread_attr_t attr;
        size_t size = 0;
        if (pthread_getattr_np(pthread_self(), &attr) != 0)
            return 512 * 1024;
        int rc = pthread_attr_getstack(&attr, &lo, &size);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            lo = NULL;
        known = true;
    }
    if (!lo || base <= (const char *) lo)
        return 512 * 1024;
    size_t room = (size_t) (base - (const char *) lo);
    return room > 2 * margin ? room - margin : room / 2;
}

static const char *s_intern(ll_walker_t *w, const char *name)
{
    ll_names_t *pool = &w->a->pool;
    long at = ll_names_find(pool, name);
    if (at >= 0)
        return pool->items[at];
    if (ll_names_add(pool, name) < 0) {
        w->oom = true;
        return NULL;
    }
    return pool->items[pool->count - 1];
}

void ll_walk_emit(ll_walker_t *w, int type, int kind, const char *name, int ref, bool direct)
{
    ll_analysis_t *a = w->a;
    const char *interned = NULL;
    if (name && !(interned = s_intern(w, name)))
        return;
    if (a->nev == a->capev) {
        size_t cap = a->capev ? a->capev * 2 : 64;
        ll_ev_t *ev = realloc(a->ev, cap * sizeof *ev);
        if (!ev) {
            w->oom = true;
            return;
        }
        a->ev = ev;
        a->capev = cap;
    }
    a->ev[a->nev++] = (ll_ev_t){.type = (uint8_t) type,
                                .kind = (uint8_t) kind,
                                .cond = w->cond > 0,
                                .direct = direct,
                                .block = w->block,
                                .name = interned,
                                .ref = ref};
}

int ll_walk_new_group(ll_walker_t *w, const char *name, int kind)
{
    ll_analysis_t *a = w->a;
    if (a->ngroups == a->capgroups) {
        size_t cap = a->capgroups ? a->capgroups * 2 : 8;
        ll_group_t *g = realloc(a->groups, cap * sizeof *g);
        if (!g) {
            w->oom = true;
            return -1;
        }
        a->groups = g;
        a->capgroups = cap;
    }
    const char *interned = name ? s_intern(w, name) : NULL;
    if (name && !interned)
        return -1;
    a->groups[a->ngroups] = (ll_group_t){.name = interned, .kind = kind};
    return (int) a->ngroups++;
}

void ll_walk_add(ll_walker_t *w, ll_names_t *set, const char *name)
{
    if (ll_names_add(set, name) < 0)
        w->oom = true;
}

/* Enter a conditional block (branch, loop body, try body, handler, case);
 * returns the block to give back to ll_walk_leave_block. */
int ll_walk_enter_block(ll_walker_t *w)
{
    ll_analysis_t *a = w->a;
    int saved = w->block;
    w->cond++;
    int block = ll_blocks_add(&a->blocks, saved);
    if (block < 0) {
        w->oom = true;
        return saved;
    }
    w->block = block;
    return saved;
}

void ll_walk_leave_block(ll_walker_t *w, int saved)
{
    w->cond--;
    w->block = saved;
}

void ll_walk_add_all(ll_walker_t *w, ll_names_t *set, const ll_names_t *other)
{
    if (ll_names_union(set, other) < 0)
        w->oom = true;
}

/* Mark opaque whatever is running: the cell now, and/or the deferred body. */
void ll_walk_opaque(ll_walker_t *w)
{
    if (w->scope->immediate)
        w->a->opaque = true;
    if (w->group >= 0)
        w->a->groups[w->group].opaque = true;
}

/* Whether attribute node ATTR is get_ipython().something. */
bool ll_walk_is_get_ipython(PyObject *attr)
{
    PyObject *recv = ll_ast_get(attr, ll_ast.a_value);
    bool is_gi = false;
    if (ll_ast_is(recv, ll_ast.t_Call)) {
        PyObject *f = ll_ast_get(recv, ll_ast.a_func);
        PyObject *args = ll_ast_get(recv, ll_ast.a_args);
        const char *id = ll_ast_is(f, ll_ast.t_Name) ? ll_ast_str(f, ll_ast.a_id) : NULL;
        is_gi = id && strcmp(id, "get_ipython") == 0 && args && PyList_Check(args) &&
                PyList_GET_SIZE(args) == 0;
        Py_XDECREF(f);
        Py_XDECREF(args);
    }
    Py_XDECREF(recv);
    return is_gi;
}

/* Mark whatever is running as using the kernel object itself (its comms). */
void ll_walk_kernel_bound(ll_walker_t *w)
{
    if (w->scope->immediate)
        w->a->kernel_bound = true;
    if (w->group >= 0)
        w->a->groups[w->group].kernel_bound = true;
}

/* ---- name resolution --------------------------------------------------- */

void ll_walk_load(ll_walker_t *w, const char *name)
{
    if (!ll_scope_resolves_global(w->scope, name))
        return;
    if (strcmp(name, "get_ipython") == 0 || strcmp(name, "__main__") == 0)
        ll_walk_opaque(w); /* the namespace itself escapes */
    if (w->scope->immediate)
        ll_walk_emit(w, LL_EV_LOAD, 0, name, -1, true);
    if (w->group >= 0)
        ll_walk_add(w, &w->a->groups[w->group].globals, name);
}

/* Bind NAME in scope SC (the current one, or a walrus's target scope). */
void ll_walk_store_in(ll_walker_t *w, ll_scope_t *sc, const char *name, int kind, int ref)
{
    ll_scope_bind_t where = ll_scope_binding(sc, name);
    if (where == LL_SCOPE_BIND_MODULE) {
        ll_walk_emit(w, LL_EV_BIND, kind, name, ref, false);
        if (w->defset && w->block == w->defblock && sc == w->scope)
            ll_walk_add(w, w->defset, name);
        if (w->loopdefs && (kind == LL_BK_FUNC || kind == LL_BK_CLASS))
            ll_walk_add(w, w->loopdefs, name);
        return;
    }
    if (where == LL_SCOPE_BIND_LOCAL)
        return; /* a local of the function, class or comprehension */
    if (sc->immediate)
        ll_walk_emit(w, LL_EV_BIND, kind == LL_BK_IMPORT ? kind : LL_BK_VALUE, name,
                     kind == LL_BK_IMPORT ? ref : -1, false);
    if (w->group >= 0)
        ll_walk_add(w, &w->a->groups[w->group].gwrites, name);
}

void ll_walk_store(ll_walker_t *w, const char *name, int kind, int ref)
{
    ll_walk_store_in(w, w->scope, name, kind, ref);
}

/* `del x` needs x to exist (NameError otherwise), so it reads it first. */
void ll_walk_delete(ll_walker_t *w, const char *name, bool reads)
{
    if (w->scope->kind != LL_SCOPE_MODULE)
        return;
    if (reads)
        ll_walk_emit(w, LL_EV_LOAD, 0, name, -1, true);
    ll_walk_emit(w, LL_EV_DEL, 0, name, -1, false);
    if (w->defset)
        ll_names_remove(w->defset, name);
}

/* The Name at the bottom of an attribute/subscript chain (x of x.a[0].b). */
const char *ll_walk_base_name(PyObject *node)
{
    PyObject *cur = node;
    Py_INCREF(cur);
    for (int guard = 0; guard < 10000; guard++) {
        PyObject *next = NULL;
        if (ll_ast_is(cur, ll_ast.t_Attribute) || ll_ast_is(cur, ll_ast.t_Subscript))
            next = ll_ast_get(cur, ll_ast.a_value);
        else if (ll_ast_is(cur, ll_ast.t_Call))
            next = ll_ast_get(cur, ll_ast.a_func);
        else if (ll_ast_is(cur, ll_ast.t_Name)) {
            const char *id = ll_ast_str(cur, ll_ast.a_id);
            Py_DECREF(cur);
            return id;
        }
        Py_DECREF(cur);
        if (!next)
            return NULL;
        cur = next;
    }
    Py_DECREF(cur);
    return NULL;
}

void ll_walk_mutate(ll_walker_t *w, PyObject *target)
{
    const char *base = ll_walk_base_name(target);
    if (base && w->scope->kind == LL_SCOPE_MODULE && ll_scope_resolves_global(w->scope, base))
        ll_walk_emit(w, LL_EV_MUTATE, 0, base, -1, false);
}

int ll_walk_add_import(ll_walker_t *w, const char *bound, const char *module, const char *attr,
                       const char *path, const char *stmt)
{
    ll_analysis_t *a = w->a;
    if (a->nimports == a->capimports) {
        size_t cap = a->capimports ? a->capimports * 2 : 8;
        ll_import_t *im = realloc(a->imports, cap * sizeof *im);
        if (!im) {
            w->oom = true;
            return -1;
        }
        a->imports = im;
        a->capimports = cap;
    }
    ll_import_t *im = &a->imports[a->nimports];
    memset(im, 0, sizeof *im);
    im->bound = s_intern(w, bound);
    im->module = strdup(module);
    im->attr = attr ? strdup(attr) : NULL;
    im->path = strdup(path);
    im->stmt = strdup(stmt);
    if (!im->bound || !im->module || (attr && !im->attr) || !im->path || !im->stmt) {
        free(im->module);
        free(im->attr);
        free(im->path);
        free(im->stmt);
        w->oom = true;
        return -1;
    }
    return (int) a->nimports++;
}

/* ---- the pre-scan: a scope's own bindings (symtable's first pass) ------ */

void ll_walk_scan_list(ll_walker_t *w, PyObject *list, ll_scope_t *sc, bool comp)
{
    if (!list || !PyList_Check(list))
        return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++)
        ll_walk_scan(w, PyList_GET_ITEM(list, i), sc, comp);
}

void ll_walk_scan_field(ll_walker_t *w, PyObject *node, PyObject *attr, ll_scope_t *sc, bool comp)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return;
    if (PyList_Check(v))
        ll_walk_scan_list(w, v, sc, comp);
    else if (ll_ast_node(v))
        ll_walk_scan(w, v, sc, comp);
    Py_DECREF(v);
}

/* Collect into SC the names its code binds.  In COMP mode (inside a
 * comprehension of SC) only walrus targets bind in SC. */
void ll_walk_scan(ll_walker_t *w, PyObject *node, ll_scope_t *sc, bool comp)
{
    if (!ll_ast_node(node) || w->depth > LL_ANALYSIS_MAX_DEPTH)
        return;
    if (ll_walk_stack_low(w)) {
        w->too_deep = true;
        return;
    }
    w->depth++;
    PyObject *t = (PyObject *) Py_TYPE(node);
    if (t == ll_ast.t_Name) {
        PyObject *ctx = ll_ast_get(node, ll_ast.a_ctx);
        if (!comp && ctx && !ll_ast_is(ctx, ll_ast.t_Load)) {
            const char *id = ll_ast_str(node, ll_ast.a_id);
            if (id)
                ll_walk_add(w, &sc->locals, id);
        }
        Py_XDECREF(ctx);
    } else if (t == ll_ast.t_NamedExpr) {
        PyObject *target = ll_ast_get(node, ll_ast.a_target);
        const char *id = target ? ll_ast_str(target, ll_ast.a_id) : NULL;
        if (id)
            ll_walk_add(w, &sc->locals, id);
        Py_XDECREF(target);
        ll_walk_scan_field(w, node, ll_ast.a_value, sc, comp);
    } else if (t == ll_ast.t_FunctionDef || t == ll_ast.t_AsyncFunctionDef ||
               t == ll_ast.t_ClassDef) {
        const char *id = ll_ast_str(node, ll_ast.a_name);
        if (id && !comp)
            ll_walk_add(w, &sc->locals, id);
    } else if (t == ll_ast.t_Lambda) {
        /* its own scope */
    } else if (t == ll_ast.t_ListComp || t == ll_ast.t_SetComp || t == ll_ast.t_DictComp ||
               t == ll_ast.t_GeneratorExp) {
        PyObject *fields = ll_ast_fields(node);
        for (Py_ssize_t i = 0; fields && i < PyTuple_GET_SIZE(fields); i++)
            ll_walk_scan_field(w, node, PyTuple_GET_ITEM(fields, i), sc, true);
    } else if (t == ll_ast.t_Import || t == ll_ast.t_ImportFrom) {
        PyObject *names = ll_ast_get(node, ll_ast.a_names);
        for (Py_ssize_t i = 0; !comp && names && PyList_Check(names) && i < PyList_GET_SIZE(names);
             i++) {
            PyObject *alias = PyList_GET_ITEM(names, i);
            const char *as = ll_ast_str(alias, ll_ast.a_asname);
            const char *nm = ll_ast_str(alias, ll_ast.a_name);
            if (as)
                ll_walk_add(w, &sc->locals, as);
            else if (nm && strcmp(nm, "*") != 0) {
                char buf[256];
                snprintf(buf, sizeof buf, "%s", nm);
                char *dot = strchr(buf, '.');
                if (dot)
                    *dot = '\0';
                ll_walk_add(w, &sc->locals, buf);
            }
        }
        Py_XDECREF(names);
    } else if (t == ll_ast.t_Global || t == ll_ast.t_Nonlocal) {
        PyObject *names = ll_ast_get(node, ll_ast.a_names);
        ll_names_t *into = t == ll_ast.t_Global ? &sc->globals : &sc->nonlocals;
        for (Py_ssize_t i = 0; names && PyList_Check(names) && i < PyList_GET_SIZE(names); i++) {
            PyObject *s = PyList_GET_ITEM(names, i);
            const char *id = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
            if (id)
                ll_walk_add(w, into, id);
            else
                PyErr_Clear();
        }
        Py_XDECREF(names);
    } else {
        if (!comp &&
            (t == ll_ast.t_ExceptHandler || t == ll_ast.t_MatchAs || t == ll_ast.t_MatchStar)) {
            const char *id = ll_ast_str(node, ll_ast.a_name);
            if (id)
                ll_walk_add(w, &sc->locals, id);
        }
        if (!comp && t == ll_ast.t_MatchMapping) {
            const char *id = ll_ast_str(node, ll_ast.a_rest);
            if (id)
                ll_walk_add(w, &sc->locals, id);
        }
        PyObject *fields = ll_ast_fields(node);
        for (Py_ssize_t i = 0; fields && i < PyTuple_GET_SIZE(fields); i++)
            ll_walk_scan_field(w, node, PyTuple_GET_ITEM(fields, i), sc, comp);
    }
    w->depth--;
}
