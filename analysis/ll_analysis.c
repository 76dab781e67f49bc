/* ll_analysis: per-cell facts from CPython's own AST (issue 3).
 *
 * Runs on whichever thread calls it, with the GIL held (the gateway's shell
 * thread, or the CLI's main thread).  Python is only used to parse: the cell
 * is compiled with PyCF_ONLY_AST and the resulting ast.Module is walked here
 * in C, comparing node types by pointer and reading fields through interned
 * attribute names, so a typical cell costs tens of microseconds on top of
 * the parse.
 *
 * DESIGN
 * The walker keeps a stack of scopes (module, function/lambda, class,
 * comprehension).  Entering a function, class or comprehension first scans
 * its body for the names it binds and its global/nonlocal declarations, the
 * way CPython's symtable does, so a read can be resolved to "global" or
 * "local somewhere" exactly: class bodies are invisible to the functions and
 * comprehensions inside them, a comprehension's first iterator belongs to
 * the enclosing scope, walrus targets bind in the nearest non-comprehension
 * scope, decorators, defaults and annotations are evaluated where the def
 * stands.
 *
 * What runs now (module level, class bodies, comprehensions at module level)
 * becomes events (see ll_analysis_internal.h): LOAD, BIND, MUTATE, DEL, one
 * UNIT per top-level statement, each flagged `cond` when it sits in a branch,
 * loop, try or handler and so may not happen.  What runs later (function
 * bodies, methods) is collected into a group: the global names the body reads
 * and assigns, the modules it imports, whether it is opaque.  A lambda at
 * module level is both: it may be called at once (sorted(key=...)) or kept,
 * so its globals are LOADs now and deps of whatever the statement binds; so
 * is a generator expression (it runs when iterated, maybe cells later).  A
 * call at module level that gets names or lambdas as arguments also leaves
 * ARG/PASS events, so the session can tell which objects may now keep a
 * function (register(f), reg.add(f)).
 *
 * IPython: the cell first goes through IPython's input transformation
 * (ll_analysis_ipython.c: only the lines that need it, cheaply), which turns
 * magics into get_ipython().run_line_magic(...) calls.  Those calls are
 * recognised here: %time/%%time/%prun/%%capture analyse their
 * code as if it stood in the cell, %timeit/%%timeit as a function body (its
 * assignments stay local), $name and {expr} in shell commands and magic lines
 * are reads, known harmless magics are facts-free, and %run, %reset, %who,
 * %pylab, unknown magics, or get_ipython() used any other way make the cell
 * opaque.  %%gpu / %%cpu on the first line force the label and are removed
 * before anything else sees the cell.
 *
 * Bad input never crashes: NUL bytes and undecodable text are errors, so is
 * a parse failure (CPython bounds nesting: 200 brackets, 100 indents,
 * RecursionError for absurdly deep expressions), and the walker refuses
 * trees deeper than LL_ANALYSIS_MAX_DEPTH, or deeper than the C stack left
 * on the calling thread allows, rather than overflow it. */
#include "analysis/ll_analysis_ast.h"
#include "analysis/ll_analysis.h"
#include "analysis/ll_analysis_internal.h"
#include "base/ll_log.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LL_ANALYSIS_MAX_DEPTH 1500

/* ---- the analysis object ---------------------------------------------- */

struct ll_analysis_t {
    char *error;       /* parse failure, or NULL */
    int forced;        /* -1, LL_ANALYSIS_CPU or LL_ANALYSIS_GPU */
    bool opaque;       /* the cell's own top-level code is opaque */
    bool kernel_bound; /* ... uses get_ipython().kernel */
    ll_names_t pool;   /* interned names events point into */
    ll_ev_t *ev;       /* event stream */
    size_t nev, capev;
    ll_group_t *groups; /* deferred bodies */
    size_t ngroups, capgroups;
    ll_import_t *imports; /* import bindings */
    size_t nimports, capimports;
    /* facts for callers (derived from the events) */
    ll_names_t defs, reads, mutates, deletes, packages;
    bool reads_done;   /* reads are computed on first use (a replay) */
    ll_names_t loaded; /* names LOADed or read by a body anywhere */
    int *funcs;        /* indexes of the named groups, in order */
    size_t nfuncs;
    ll_blocks_t blocks; /* the conditional blocks events are made in */
};

/* ---- scopes and walker ------------------------------------------------ */

typedef struct {
    ll_analysis_t *a;
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
    const char *stack_base; /* a local of ll_analysis_new */
    size_t stack_budget;    /* bytes of C stack the walk may use below it */
} s_walker_t;

/* How much C stack the walk may use on this thread: what lies below the
 * caller's frame, less a margin for the Python calls made during the walk
 * (parsing and transforming magic code).  The gateway's threads and the CLI
 * differ; a deep cell must end in an error, not a stack overflow. */
static size_t s_stack_budget(const char *base)
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

static bool s_stack_low(const s_walker_t *w)
{
    char here;
    return w->stack_base && (size_t) (w->stack_base - &here) > w->stack_budget;
}

static void s_walk(s_walker_t *w, PyObject *node);
static void s_walk_body(s_walker_t *w, PyObject *list);
static void s_scan(s_walker_t *w, PyObject *node, ll_scope_t *sc, bool comp);
static void s_walk_code(s_walker_t *w, const char *code, bool as_function);

static const char *s_intern(s_walker_t *w, const char *name)
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

static void s_emit(s_walker_t *w, int type, int kind, const char *name, int ref, bool direct)
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

static int s_new_group(s_walker_t *w, const char *name, int kind)
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

static void s_add(s_walker_t *w, ll_names_t *set, const char *name)
{
    if (ll_names_add(set, name) < 0)
        w->oom = true;
}

/* Enter a conditional block (branch, loop body, try body, handler, case);
 * returns the block to give back to s_leave_block. */
static int s_enter_block(s_walker_t *w)
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

static void s_leave_block(s_walker_t *w, int saved)
{
    w->cond--;
    w->block = saved;
}

bool ll_analysis_block_encloses(const ll_analysis_t *self, int outer, int inner)
{
    return ll_blocks_encloses(&self->blocks, outer, inner);
}

static void s_add_all(s_walker_t *w, ll_names_t *set, const ll_names_t *other)
{
    if (ll_names_union(set, other) < 0)
        w->oom = true;
}

/* Mark opaque whatever is running: the cell now, and/or the deferred body. */
static void s_opaque(s_walker_t *w)
{
    if (w->scope->immediate)
        w->a->opaque = true;
    if (w->group >= 0)
        w->a->groups[w->group].opaque = true;
}

/* Whether attribute node ATTR is get_ipython().something. */
static bool s_is_get_ipython_call(PyObject *attr)
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
static void s_kernel_bound(s_walker_t *w)
{
    if (w->scope->immediate)
        w->a->kernel_bound = true;
    if (w->group >= 0)
        w->a->groups[w->group].kernel_bound = true;
}

/* ---- name resolution -------------------------------------------------- */

static void s_load(s_walker_t *w, const char *name)
{
    if (!ll_scope_resolves_global(w->scope, name))
        return;
    if (strcmp(name, "get_ipython") == 0 || strcmp(name, "__main__") == 0)
        s_opaque(w); /* the namespace itself escapes */
    if (w->scope->immediate)
        s_emit(w, LL_EV_LOAD, 0, name, -1, true);
    if (w->group >= 0)
        s_add(w, &w->a->groups[w->group].globals, name);
}

/* Bind NAME in scope SC (the current one, or a walrus's target scope). */
static void s_store_in(s_walker_t *w, ll_scope_t *sc, const char *name, int kind, int ref)
{
    ll_scope_bind_t where = ll_scope_binding(sc, name);
    if (where == LL_SCOPE_BIND_MODULE) {
        s_emit(w, LL_EV_BIND, kind, name, ref, false);
        if (w->defset && w->block == w->defblock && sc == w->scope)
            s_add(w, w->defset, name);
        if (w->loopdefs && (kind == LL_BK_FUNC || kind == LL_BK_CLASS))
            s_add(w, w->loopdefs, name);
        return;
    }
    if (where == LL_SCOPE_BIND_LOCAL)
        return; /* a local of the function, class or comprehension */
    if (sc->immediate)
        s_emit(w, LL_EV_BIND, kind == LL_BK_IMPORT ? kind : LL_BK_VALUE, name,
               kind == LL_BK_IMPORT ? ref : -1, false);
    if (w->group >= 0)
        s_add(w, &w->a->groups[w->group].gwrites, name);
}

static void s_store(s_walker_t *w, const char *name, int kind, int ref)
{
    s_store_in(w, w->scope, name, kind, ref);
}

/* `del x` needs x to exist (NameError otherwise), so it reads it first. */
static void s_delete(s_walker_t *w, const char *name, bool reads)
{
    if (w->scope->kind != LL_SCOPE_MODULE)
        return;
    if (reads)
        s_emit(w, LL_EV_LOAD, 0, name, -1, true);
    s_emit(w, LL_EV_DEL, 0, name, -1, false);
    if (w->defset)
        ll_names_remove(w->defset, name);
}

/* The Name at the bottom of an attribute/subscript chain (x of x.a[0].b). */
static const char *s_base_name(PyObject *node)
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

static void s_mutate(s_walker_t *w, PyObject *target)
{
    const char *base = s_base_name(target);
    if (base && w->scope->kind == LL_SCOPE_MODULE && ll_scope_resolves_global(w->scope, base))
        s_emit(w, LL_EV_MUTATE, 0, base, -1, false);
}

/* ---- scanning a scope's own bindings (symtable's first pass) ----------- */

static void s_scan_list(s_walker_t *w, PyObject *list, ll_scope_t *sc, bool comp)
{
    if (!list || !PyList_Check(list))
        return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++)
        s_scan(w, PyList_GET_ITEM(list, i), sc, comp);
}

static void s_scan_field(s_walker_t *w, PyObject *node, PyObject *attr, ll_scope_t *sc, bool comp)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return;
    if (PyList_Check(v))
        s_scan_list(w, v, sc, comp);
    else if (ll_ast_node(v))
        s_scan(w, v, sc, comp);
    Py_DECREF(v);
}

/* Collect into SC the names its code binds.  In COMP mode (inside a
 * comprehension of SC) only walrus targets bind in SC. */
static void s_scan(s_walker_t *w, PyObject *node, ll_scope_t *sc, bool comp)
{
    if (!ll_ast_node(node) || w->depth > LL_ANALYSIS_MAX_DEPTH)
        return;
    if (s_stack_low(w)) {
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
                s_add(w, &sc->locals, id);
        }
        Py_XDECREF(ctx);
    } else if (t == ll_ast.t_NamedExpr) {
        PyObject *target = ll_ast_get(node, ll_ast.a_target);
        const char *id = target ? ll_ast_str(target, ll_ast.a_id) : NULL;
        if (id)
            s_add(w, &sc->locals, id);
        Py_XDECREF(target);
        s_scan_field(w, node, ll_ast.a_value, sc, comp);
    } else if (t == ll_ast.t_FunctionDef || t == ll_ast.t_AsyncFunctionDef ||
               t == ll_ast.t_ClassDef) {
        const char *id = ll_ast_str(node, ll_ast.a_name);
        if (id && !comp)
            s_add(w, &sc->locals, id);
    } else if (t == ll_ast.t_Lambda) {
        /* its own scope */
    } else if (t == ll_ast.t_ListComp || t == ll_ast.t_SetComp || t == ll_ast.t_DictComp ||
               t == ll_ast.t_GeneratorExp) {
        PyObject *fields = ll_ast_fields(node);
        for (Py_ssize_t i = 0; fields && i < PyTuple_GET_SIZE(fields); i++)
            s_scan_field(w, node, PyTuple_GET_ITEM(fields, i), sc, true);
    } else if (t == ll_ast.t_Import || t == ll_ast.t_ImportFrom) {
        PyObject *names = ll_ast_get(node, ll_ast.a_names);
        for (Py_ssize_t i = 0; !comp && names && PyList_Check(names) && i < PyList_GET_SIZE(names);
             i++) {
            PyObject *alias = PyList_GET_ITEM(names, i);
            const char *as = ll_ast_str(alias, ll_ast.a_asname);
            const char *nm = ll_ast_str(alias, ll_ast.a_name);
            if (as)
                s_add(w, &sc->locals, as);
            else if (nm && strcmp(nm, "*") != 0) {
                char buf[256];
                snprintf(buf, sizeof buf, "%s", nm);
                char *dot = strchr(buf, '.');
                if (dot)
                    *dot = '\0';
                s_add(w, &sc->locals, buf);
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
                s_add(w, into, id);
            else
                PyErr_Clear();
        }
        Py_XDECREF(names);
    } else {
        if (!comp &&
            (t == ll_ast.t_ExceptHandler || t == ll_ast.t_MatchAs || t == ll_ast.t_MatchStar)) {
            const char *id = ll_ast_str(node, ll_ast.a_name);
            if (id)
                s_add(w, &sc->locals, id);
        }
        if (!comp && t == ll_ast.t_MatchMapping) {
            const char *id = ll_ast_str(node, ll_ast.a_rest);
            if (id)
                s_add(w, &sc->locals, id);
        }
        PyObject *fields = ll_ast_fields(node);
        for (Py_ssize_t i = 0; fields && i < PyTuple_GET_SIZE(fields); i++)
            s_scan_field(w, node, PyTuple_GET_ITEM(fields, i), sc, comp);
    }
    w->depth--;
}

/* ---- the walk --------------------------------------------------------- */

static void s_walk_list(s_walker_t *w, PyObject *list)
{
    if (!list || !PyList_Check(list))
        return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list) && !w->oom; i++)
        s_walk(w, PyList_GET_ITEM(list, i));
}

static void s_walk_field(s_walker_t *w, PyObject *node, PyObject *attr)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return;
    if (PyList_Check(v))
        s_walk_list(w, v);
    else if (ll_ast_node(v))
        s_walk(w, v);
    Py_DECREF(v);
}

static void s_walk_generic(s_walker_t *w, PyObject *node)
{
    PyObject *fields = ll_ast_fields(node);
    for (Py_ssize_t i = 0; fields && i < PyTuple_GET_SIZE(fields); i++)
        s_walk_field(w, node, PyTuple_GET_ITEM(fields, i));
}

/* A statement list; at module level each statement starts a unit. */
static void s_walk_body(s_walker_t *w, PyObject *list)
{
    if (!list || !PyList_Check(list))
        return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list) && !w->oom; i++) {
        if (w->scope->kind == LL_SCOPE_MODULE && !w->one_unit)
            s_emit(w, LL_EV_UNIT, 0, NULL, -1, false);
        s_walk(w, PyList_GET_ITEM(list, i));
    }
}

static void s_walk_body_field(s_walker_t *w, PyObject *node, PyObject *attr, bool cond)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return;
    int saved = cond ? s_enter_block(w) : 0;
    s_walk_body(w, v);
    if (cond)
        s_leave_block(w, saved);
    Py_DECREF(v);
}

static void s_walk_name(s_walker_t *w, PyObject *node)
{
    const char *id = ll_ast_str(node, ll_ast.a_id);
    PyObject *ctx = ll_ast_get(node, ll_ast.a_ctx);
    if (id && ctx) {
        if (ll_ast_is(ctx, ll_ast.t_Load))
            s_load(w, id);
        else if (ll_ast_is(ctx, ll_ast.t_Store))
            s_store(w, id, LL_BK_VALUE, -1);
        else
            s_delete(w, id, true);
    }
    Py_XDECREF(ctx);
}

/* Parameter names of an `arguments` node into SC's locals. */
static void s_params(s_walker_t *w, PyObject *args, ll_scope_t *sc)
{
    if (!args)
        return;
    PyObject *lists[] = {ll_ast.a_posonlyargs, ll_ast.a_args, ll_ast.a_kwonlyargs};
    for (size_t k = 0; k < 3; k++) {
        PyObject *l = ll_ast_get(args, lists[k]);
        for (Py_ssize_t i = 0; l && PyList_Check(l) && i < PyList_GET_SIZE(l); i++) {
            const char *id = ll_ast_str(PyList_GET_ITEM(l, i), ll_ast.a_arg);
            if (id)
                s_add(w, &sc->locals, id);
        }
        Py_XDECREF(l);
    }
    PyObject *singles[] = {ll_ast.a_vararg, ll_ast.a_kwarg};
    for (size_t k = 0; k < 2; k++) {
        PyObject *a = ll_ast_get(args, singles[k]);
        const char *id = ll_ast_node(a) ? ll_ast_str(a, ll_ast.a_arg) : NULL;
        if (id)
            s_add(w, &sc->locals, id);
        Py_XDECREF(a);
    }
}

/* A decorator receives the function or class: it may call it right away
 * (so its body's globals are read now) and may keep it (`@app.route`,
 * `@registry.register` store it in app / registry, which then need its
 * globals whenever they are used). */
static void s_decorated(s_walker_t *w, PyObject *node, const char *name)
{
    if (w->scope->kind != LL_SCOPE_MODULE)
        return;
    PyObject *decs = ll_ast_get(node, ll_ast.a_decorator_list);
    for (Py_ssize_t i = 0; decs && PyList_Check(decs) && i < PyList_GET_SIZE(decs); i++) {
        PyObject *d = PyList_GET_ITEM(decs, i);
        if (!ll_ast_is(d, ll_ast.t_Name))
            s_mutate(w, d);
    }
    if (decs && PyList_Check(decs) && PyList_GET_SIZE(decs) > 0)
        s_emit(w, LL_EV_LOAD, 0, name, -1, false);
    Py_XDECREF(decs);
}

/* def / async def: decorators, defaults and annotations now, body later. */
static void s_walk_def(s_walker_t *w, PyObject *node)
{
    const char *name = ll_ast_str(node, ll_ast.a_name);
    if (!name)
        return;
    s_walk_field(w, node, ll_ast.a_decorator_list);
    PyObject *args = ll_ast_get(node, ll_ast.a_args);
    if (args)
        s_walk_generic(w, args); /* defaults, kw_defaults, annotations */
    s_walk_field(w, node, ll_ast.a_returns);

    bool own = w->group < 0 && w->class_group < 0;
    int g = w->group >= 0         ? w->group
            : w->class_group >= 0 ? w->class_group
                                  : s_new_group(w, name, LL_BK_FUNC);
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_FUNC, w->scope, false);
    s_params(w, args, &sc);
    Py_XDECREF(args);
    PyObject *body = ll_ast_get(node, ll_ast.a_body);
    s_scan_list(w, body, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    int saved_group = w->group;
    w->scope = &sc;
    w->group = g;
    s_walk_body(w, body);
    w->scope = saved_scope;
    w->group = saved_group;
    Py_XDECREF(body);
    ll_scope_free(&sc);

    s_store(w, name, LL_BK_FUNC, own ? g : -1);
    s_decorated(w, node, name);
}

static void s_walk_class(s_walker_t *w, PyObject *node)
{
    const char *name = ll_ast_str(node, ll_ast.a_name);
    if (!name)
        return;
    s_walk_field(w, node, ll_ast.a_decorator_list);
    s_walk_field(w, node, ll_ast.a_bases);
    s_walk_field(w, node, ll_ast.a_keywords);

    bool own = w->group < 0 && w->class_group < 0;
    int cg = own ? s_new_group(w, name, LL_BK_CLASS) : -1;
    int saved_cg = w->class_group;
    if (own)
        w->class_group = cg;
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_CLASS, w->scope, w->scope->immediate && w->group < 0);
    PyObject *body = ll_ast_get(node, ll_ast.a_body);
    s_scan_list(w, body, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    w->scope = &sc;
    s_walk_body(w, body);
    w->scope = saved_scope;
    w->class_group = saved_cg;
    Py_XDECREF(body);
    ll_scope_free(&sc);

    s_store(w, name, LL_BK_CLASS, own ? cg : -1);
    s_decorated(w, node, name);
}

/* A lambda may run now (sorted(key=...)) or later (kept in a value): its
 * globals are read now when it stands in code that runs now, and they are
 * deps of the statement's bindings. */
static void s_walk_lambda(s_walker_t *w, PyObject *node)
{
    PyObject *args = ll_ast_get(node, ll_ast.a_args);
    if (args)
        s_walk_generic(w, args);
    bool own = w->group < 0 && w->class_group < 0;
    int g = w->group >= 0         ? w->group
            : w->class_group >= 0 ? w->class_group
                                  : s_new_group(w, NULL, LL_BK_VALUE);
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_FUNC, w->scope, w->scope->immediate);
    s_params(w, args, &sc);
    Py_XDECREF(args);
    PyObject *body = ll_ast_get(node, ll_ast.a_body);
    if (body)
        s_scan(w, body, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    int saved_group = w->group;
    w->scope = &sc;
    w->group = g;
    if (body)
        s_walk(w, body);
    w->scope = saved_scope;
    w->group = saved_group;
    Py_XDECREF(body);
    ll_scope_free(&sc);
    if (own && g >= 0)
        s_emit(w, LL_EV_DEFER, 0, NULL, g, false);
}

static void s_walk_comp(s_walker_t *w, PyObject *node)
{
    PyObject *gens = ll_ast_get(node, ll_ast.a_generators);
    if (!gens || !PyList_Check(gens) || PyList_GET_SIZE(gens) == 0) {
        Py_XDECREF(gens);
        s_walk_generic(w, node);
        return;
    }
    /* The first iterable is evaluated in the enclosing scope. */
    s_walk_field(w, PyList_GET_ITEM(gens, 0), ll_ast.a_iter);
    /* A generator expression runs when it is iterated, maybe in a later
     * cell: like a lambda, its globals are read now and are deps of what the
     * statement binds. */
    bool lazy = ll_ast_is(node, ll_ast.t_GeneratorExp) && w->group < 0 && w->class_group < 0;
    int saved_group = w->group;
    int g = lazy ? s_new_group(w, NULL, LL_BK_VALUE) : -1;
    if (g >= 0)
        w->group = g;
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_COMP, w->scope, w->scope->immediate);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(gens); i++)
        s_scan_field(w, PyList_GET_ITEM(gens, i), ll_ast.a_target, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    w->scope = &sc;
    /* A walrus in it binds only if the loop runs. */
    int saved_block = s_enter_block(w);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(gens); i++) {
        PyObject *gen = PyList_GET_ITEM(gens, i);
        if (i > 0)
            s_walk_field(w, gen, ll_ast.a_iter);
        s_walk_field(w, gen, ll_ast.a_target);
        s_walk_field(w, gen, ll_ast.a_ifs);
    }
    if (ll_ast_is(node, ll_ast.t_DictComp)) {
        s_walk_field(w, node, ll_ast.a_key);
        s_walk_field(w, node, ll_ast.a_value);
    } else
        s_walk_field(w, node, ll_ast.a_elt);
    s_leave_block(w, saved_block);
    w->scope = saved_scope;
    ll_scope_free(&sc);
    Py_DECREF(gens);
    w->group = saved_group;
    if (g >= 0)
        s_emit(w, LL_EV_DEFER, 0, NULL, g, false);
}

static void s_walk_namedexpr(s_walker_t *w, PyObject *node)
{
    s_walk_field(w, node, ll_ast.a_value);
    PyObject *target = ll_ast_get(node, ll_ast.a_target);
    const char *id = target ? ll_ast_str(target, ll_ast.a_id) : NULL;
    if (id) {
        s_store_in(w, ll_scope_walrus_target(w->scope), id, LL_BK_VALUE, -1);
    }
    Py_XDECREF(target);
}

static int s_add_import(s_walker_t *w, const char *bound, const char *module, const char *attr,
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

static void s_walk_import(s_walker_t *w, PyObject *node)
{
    bool from = ll_ast_is(node, ll_ast.t_ImportFrom);
    char mod[512] = "";
    if (from) {
        PyObject *lv = ll_ast_get(node, ll_ast.a_level);
        long level = lv && PyLong_Check(lv) ? PyLong_AsLong(lv) : 0;
        Py_XDECREF(lv);
        const char *m = ll_ast_str(node, ll_ast.a_module);
        size_t n = 0;
        for (long i = 0; i < level && n + 1 < sizeof mod; i++)
            mod[n++] = '.';
        snprintf(mod + n, sizeof mod - n, "%s", m ? m : "");
    }
    PyObject *names = ll_ast_get(node, ll_ast.a_names);
    for (Py_ssize_t i = 0; names && PyList_Check(names) && i < PyList_GET_SIZE(names) && !w->oom;
         i++) {
        PyObject *alias = PyList_GET_ITEM(names, i);
        const char *nm = ll_ast_str(alias, ll_ast.a_name);
        const char *as = ll_ast_str(alias, ll_ast.a_asname);
        if (!nm)
            continue;
        if (strcmp(from ? mod : nm, "__main__") == 0)
            s_opaque(w); /* the user namespace itself */
        char bound[512], path[1024], stmt[1280];
        int kind = LL_BK_IMPORT;
        const char *module = nm, *attr = NULL;
        if (!from) {
            snprintf(bound, sizeof bound, "%s", as ? as : nm);
            if (!as) {
                char *dot = strchr(bound, '.');
                if (dot)
                    *dot = '\0';
            }
            snprintf(path, sizeof path, "%s", nm);
            if (as)
                snprintf(stmt, sizeof stmt, "import %s as %s", nm, as);
            else
                snprintf(stmt, sizeof stmt, "import %s", nm);
        } else if (strcmp(nm, "*") == 0) {
            kind = LL_BK_STAR;
            module = mod;
            snprintf(bound, sizeof bound, "*%s", mod);
            snprintf(path, sizeof path, "%s", mod);
            snprintf(stmt, sizeof stmt, "from %s import *", mod);
            s_opaque(w); /* the names it binds are unknown */
        } else {
            module = mod;
            attr = nm;
            snprintf(bound, sizeof bound, "%s", as ? as : nm);
            snprintf(path, sizeof path, "%s%s%s", mod,
                     mod[0] && mod[strlen(mod) - 1] != '.' ? "." : "", nm);
            if (as)
                snprintf(stmt, sizeof stmt, "from %s import %s as %s", mod, nm, as);
            else
                snprintf(stmt, sizeof stmt, "from %s import %s", mod, nm);
        }
        if (w->group >= 0)
            s_add(w, &w->a->groups[w->group].paths, path);
        int idx = -1;
        if (w->scope->kind == LL_SCOPE_MODULE || ll_names_has(&w->scope->globals, bound))
            idx = s_add_import(w, bound, module, attr, path, stmt);
        s_store(w, bound, kind, idx);
    }
    Py_XDECREF(names);
}

/* for / while.  Zero iterations bind nothing, so the body is a block.  A
 * later iteration may call a function an earlier one defined, before the
 * def is reached again: the body's functions and classes are looked up
 * once more at its end, so what they read is in the closure. */
static void s_walk_loop(s_walker_t *w, PyObject *node, bool is_while)
{
    s_walk_field(w, node, is_while ? ll_ast.a_test : ll_ast.a_iter);
    ll_names_t defs = {0};
    ll_names_t *saved_defs = w->loopdefs;
    w->loopdefs = &defs;
    int saved = s_enter_block(w);
    if (!is_while)
        s_walk_field(w, node, ll_ast.a_target);
    s_walk_body_field(w, node, ll_ast.a_body, false);
    if (defs.count && w->scope->kind == LL_SCOPE_MODULE) {
        s_emit(w, LL_EV_UNIT, 0, NULL, -1, false);
        for (size_t i = 0; i < defs.count; i++)
            s_emit(w, LL_EV_LOAD, 0, defs.items[i], -1, false);
    }
    s_leave_block(w, saved);
    w->loopdefs = saved_defs;
    if (saved_defs)
        s_add_all(w, saved_defs, &defs);
    ll_names_clear(&defs);
    s_walk_body_field(w, node, ll_ast.a_orelse, true);
}

/* One branch of an if/else; INTO collects the names it certainly binds.
 * Returns the branch's block. */
static int s_walk_branch(s_walker_t *w, PyObject *node, PyObject *attr, ll_names_t *into)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return w->block;
    int saved = s_enter_block(w);
    int block = w->block;
    ll_names_t *saved_set = w->defset;
    int saved_block = w->defblock;
    w->defset = into;
    w->defblock = w->block;
    s_walk_body(w, v);
    w->defset = saved_set;
    w->defblock = saved_block;
    s_leave_block(w, saved);
    Py_DECREF(v);
    return block;
}

/* if/elif/else: each branch may not run, but when every branch binds x,
 * x is certainly (re)bound afterwards and its older value is gone. */
static void s_walk_if(s_walker_t *w, PyObject *node)
{
    s_walk_field(w, node, ll_ast.a_test);
    ll_names_t then = {0}, other = {0};
    s_walk_branch(w, node, ll_ast.a_body, &then);
    bool has_else = ll_ast_has_items(node, ll_ast.a_orelse);
    s_walk_branch(w, node, ll_ast.a_orelse, &other);
    for (size_t i = 0; has_else && w->scope->kind == LL_SCOPE_MODULE && i < then.count; i++) {
        const char *name = then.items[i];
        if (!ll_names_has(&other, name))
            continue;
        s_emit(w, LL_EV_SETTLE, 0, name, -1, false);
        if (w->defset && w->block == w->defblock)
            s_add(w, w->defset, name);
    }
    ll_names_clear(&then);
    ll_names_clear(&other);
}

/* try/except/else/finally.  Anything in the body may be skipped by an
 * exception, so it is conditional; but when the body (or else) and every
 * handler all bind x, x is certainly rebound once the statement is done. */
static void s_walk_try(s_walker_t *w, PyObject *node)
{
    ll_names_t ok = {0}, common = {0};
    int body_block = s_walk_branch(w, node, ll_ast.a_body, &ok);
    PyObject *handlers = ll_ast_get(node, ll_ast.a_handlers);
    Py_ssize_t nh = handlers && PyList_Check(handlers) ? PyList_GET_SIZE(handlers) : 0;
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *h = PyList_GET_ITEM(handlers, i);
        ll_names_t mine = {0};
        int saved = s_enter_block(w);
        ll_names_t *saved_set = w->defset;
        int saved_block = w->defblock;
        w->defset = &mine;
        w->defblock = w->block;
        if (w->scope->kind == LL_SCOPE_MODULE)
            s_emit(w, LL_EV_UNIT, 0, NULL, -1, false);
        s_walk_field(w, h, ll_ast.a_type);
        const char *name = ll_ast_str(h, ll_ast.a_name);
        if (name)
            s_store(w, name, LL_BK_VALUE, -1);
        s_walk_body_field(w, h, ll_ast.a_body, false);
        /* `except E as e` unbinds e when the handler ends. */
        if (name)
            s_delete(w, name, false);
        w->defset = saved_set;
        w->defblock = saved_block;
        s_leave_block(w, saved);
        if (i == 0)
            s_add_all(w, &common, &mine);
        else
            for (size_t k = common.count; k-- > 0;)
                if (!ll_names_has(&mine, common.items[k]))
                    ll_names_remove(&common, common.items[k]);
        ll_names_clear(&mine);
    }
    Py_XDECREF(handlers);
    /* else runs only after the whole body did: its block sits inside the
     * body's, so what the body bound is certain there. */
    int outer = w->block;
    w->block = body_block;
    s_walk_branch(w, node, ll_ast.a_orelse, &ok);
    w->block = outer;
    s_walk_body_field(w, node, ll_ast.a_finalbody, false);
    for (size_t i = 0; nh > 0 && w->scope->kind == LL_SCOPE_MODULE && i < ok.count; i++) {
        if (!ll_names_has(&common, ok.items[i]))
            continue;
        s_emit(w, LL_EV_SETTLE, 0, ok.items[i], -1, false);
        if (w->defset && w->block == w->defblock)
            s_add(w, w->defset, ok.items[i]);
    }
    ll_names_clear(&ok);
    ll_names_clear(&common);
}

static void s_walk_match(s_walker_t *w, PyObject *node)
{
    s_walk_field(w, node, ll_ast.a_subject);
    PyObject *cases = ll_ast_get(node, ll_ast.a_cases);
    for (Py_ssize_t i = 0; cases && PyList_Check(cases) && i < PyList_GET_SIZE(cases); i++) {
        PyObject *c = PyList_GET_ITEM(cases, i);
        int saved = s_enter_block(w);
        s_walk_field(w, c, ll_ast.a_pattern);
        s_walk_field(w, c, ll_ast.a_guard);
        s_walk_body_field(w, c, ll_ast.a_body, false);
        s_leave_block(w, saved);
    }
    Py_XDECREF(cases);
}

/* ---- IPython magics (the table and its text rules: ll_analysis_magic.c) -- */

static int s_expand_name(void *ctx, const char *name)
{
    s_walker_t *w = ctx;
    s_load(w, name);
    return w->oom ? -1 : 0;
}

/* {expr} in a shell command or magic line: IPython evaluates it here. */
static int s_expand_expr(void *ctx, const char *text, size_t n)
{
    s_walker_t *w = ctx;
    char *expr = malloc(n + 1);
    if (!expr) {
        w->oom = true;
        return -1;
    }
    memcpy(expr, text, n);
    expr[n] = '\0';
    PyCompilerFlags flags = _PyCompilerFlags_INIT;
    flags.cf_flags = PyCF_ONLY_AST;
    PyObject *tree = Py_CompileStringExFlags(expr, "<expand>", Py_eval_input, &flags, -1);
    free(expr);
    if (tree) {
        s_walk_field(w, tree, ll_ast.a_body);
        Py_DECREF(tree);
    } else
        PyErr_Clear(); /* IPython leaves it as text */
    return w->oom ? -1 : 0;
}

/* IPython expands $name and {expr} in shell commands and magic lines. */
static void s_expand(s_walker_t *w, const char *text)
{
    ll_magic_expand(text, s_expand_name, s_expand_expr, w);
}

static int s_bind_name(void *ctx, const char *name)
{
    s_store(ctx, name, LL_BK_VALUE, -1);
    return 0;
}

/* `x?` -> pinfo 'x': the object named is read. */
static void s_walk_magic_object(s_walker_t *w, const char *line)
{
    char buf[1024];
    ll_magic_object(line, buf, sizeof buf);
    PyCompilerFlags flags = _PyCompilerFlags_INIT;
    flags.cf_flags = PyCF_ONLY_AST;
    PyObject *tree = Py_CompileStringExFlags(buf, "<magic>", Py_eval_input, &flags, -1);
    if (tree) {
        s_walk_field(w, tree, ll_ast.a_body);
        Py_DECREF(tree);
    } else
        PyErr_Clear(); /* a wildcard search: reads nothing we can name */
}

/* %%timeit: the setup on the magic's line, then the body, as one function
 * body (timeit runs its code in a function: assignments stay local). */
static void s_walk_timeit_cell(s_walker_t *w, const char *setup, const char *body)
{
    size_t n1 = strlen(setup), n2 = strlen(body);
    char *both = malloc(n1 + n2 + 2);
    if (!both) {
        w->oom = true;
        return;
    }
    memcpy(both, setup, n1);
    both[n1] = '\n';
    memcpy(both + n1 + 1, body, n2 + 1);
    s_walk_code(w, both, true);
    free(both);
}

/* get_ipython().METHOD(ARGS...) with constant string arguments. */
static void s_walk_magic(s_walker_t *w, const char *method, const char **argv, int argc)
{
    const ll_magic_t *m = NULL;
    ll_magic_kind_t kind = ll_magic_classify(method, argc, argc >= 1 ? argv[0] : NULL, &m);
    bool cell = strcmp(method, "run_cell_magic") == 0;
    const char *line = argc >= 2 ? argv[1] : NULL;
    switch (kind) {
    case LL_MAGIC_SHELL:
        if (argc >= 1)
            s_expand(w, argv[0]);
        break;
    case LL_MAGIC_OPAQUE: s_opaque(w); break;
    case LL_MAGIC_HARMLESS: s_expand(w, line); break;
    case LL_MAGIC_EXPR: s_walk_magic_object(w, line); break;
    case LL_MAGIC_CODE:
        if (cell)
            s_walk_code(w, argv[2], false);
        else
            s_walk_code(w, ll_magic_skip_options(line, m->argopts), false);
        break;
    case LL_MAGIC_TIMEIT:
        if (cell)
            s_walk_timeit_cell(w, ll_magic_skip_options(line, m->argopts), argv[2]);
        else
            s_walk_code(w, ll_magic_skip_options(line, m->argopts), true);
        break;
    case LL_MAGIC_CAPTURE: {
        /* The captured output holds whatever the body displayed: one unit,
         * so the variable's modules are all of the body's. */
        bool saved = w->one_unit;
        w->one_unit = true;
        if (cell)
            s_walk_code(w, argv[2], false);
        ll_magic_bound_names(line, true, s_bind_name, w);
        w->one_unit = saved;
        break;
    }
    case LL_MAGIC_SCRIPT: ll_magic_bound_names(line, false, s_bind_name, w); break;
    }
}

/* Returns true when NODE was get_ipython().method('..', ...) and handled. */
static bool s_try_magic(s_walker_t *w, PyObject *node, PyObject *func)
{
    if (!ll_ast_is(func, ll_ast.t_Attribute) || !s_is_get_ipython_call(func))
        return false;
    const char *method = ll_ast_str(func, ll_ast.a_attr);
    if (!method || !ll_magic_is_call(method)) {
        s_opaque(w);
        return false;
    }
    PyObject *args = ll_ast_get(node, ll_ast.a_args);
    const char *argv[3] = {NULL, NULL, NULL};
    int argc = 0;
    bool constant = args && PyList_Check(args);
    for (Py_ssize_t i = 0; constant && i < PyList_GET_SIZE(args) && i < 3; i++) {
        PyObject *c = PyList_GET_ITEM(args, i);
        PyObject *v = ll_ast_is(c, ll_ast.t_Constant) ? ll_ast_get(c, ll_ast.a_value) : NULL;
        if (v && PyUnicode_Check(v)) {
            argv[argc] = PyUnicode_AsUTF8(v); /* owned by the AST */
            if (argv[argc])
                argc++;
            else {
                PyErr_Clear();
                constant = false;
            }
        } else
            constant = false;
        Py_XDECREF(v);
    }
    Py_XDECREF(args);
    if (!constant) {
        s_opaque(w);
        return false;
    }
    s_walk_magic(w, method, argv, argc);
    return true;
}

/* A call that gets a function (or lambda) may keep it: register(f) in a
 * global list that register reads, registry.add(f) in registry.  The
 * arguments that are names or lambdas, then the callee, become ARG/PASS
 * events; the session decides, knowing which names are functions, what may
 * now hold the function and so needs its globals. */
static void s_call_args(s_walker_t *w, PyObject *node, PyObject *func)
{
    bool any = false;
    PyObject *lists[2] = {ll_ast_get(node, ll_ast.a_args), ll_ast_get(node, ll_ast.a_keywords)};
    for (int k = 0; k < 2; k++) {
        PyObject *l = lists[k];
        for (Py_ssize_t i = 0; l && PyList_Check(l) && i < PyList_GET_SIZE(l); i++) {
            PyObject *arg = PyList_GET_ITEM(l, i);
            PyObject *v = k == 0 ? (Py_INCREF(arg), arg) : ll_ast_get(arg, ll_ast.a_value);
            if (ll_ast_is(v, ll_ast.t_Starred)) {
                PyObject *inner = ll_ast_get(v, ll_ast.a_value);
                Py_DECREF(v);
                v = inner;
            }
            if (ll_ast_is(v, ll_ast.t_Name)) {
                const char *id = ll_ast_str(v, ll_ast.a_id);
                if (id) {
                    s_emit(w, LL_EV_ARG, 0, id, -1, false);
                    any = true;
                }
            } else if (ll_ast_is(v, ll_ast.t_Lambda)) {
                s_emit(w, LL_EV_ARG, 1, NULL, -1, false);
                any = true;
            }
            Py_XDECREF(v);
        }
        Py_XDECREF(l);
    }
    if (!any || !func)
        return;
    if (ll_ast_is(func, ll_ast.t_Name)) {
        const char *id = ll_ast_str(func, ll_ast.a_id);
        if (id)
            s_emit(w, LL_EV_PASS, 0, id, -1, false);
        return;
    }
    PyObject *recv = ll_ast_is(func, ll_ast.t_Attribute) ? ll_ast_get(func, ll_ast.a_value) : NULL;
    const char *base = recv ? s_base_name(recv) : NULL;
    if (base && strcmp(base, "get_ipython") != 0)
        s_emit(w, LL_EV_PASS, 1, base, -1, false);
    Py_XDECREF(recv);
}

static void s_walk_call(s_walker_t *w, PyObject *node)
{
    PyObject *func = ll_ast_get(node, ll_ast.a_func);
    if (func && s_try_magic(w, node, func)) {
        Py_DECREF(func);
        return;
    }
    const char *id = ll_ast_is(func, ll_ast.t_Name) ? ll_ast_str(func, ll_ast.a_id) : NULL;
    if (id && ll_scope_resolves_global(w->scope, id)) {
        bool noargs =
            !ll_ast_has_items(node, ll_ast.a_args) && !ll_ast_has_items(node, ll_ast.a_keywords);
        if (strcmp(id, "exec") == 0 || strcmp(id, "eval") == 0 || strcmp(id, "globals") == 0 ||
            strcmp(id, "locals") == 0 || strcmp(id, "execfile") == 0 ||
            ((strcmp(id, "vars") == 0 || strcmp(id, "dir") == 0) && noargs))
            s_opaque(w);
    }
    s_walk_generic(w, node);
    if (w->scope->immediate && w->group < 0 && w->class_group < 0)
        s_call_args(w, node, func);
    Py_XDECREF(func);
}

/* ---- dispatch --------------------------------------------------------- */

static void s_walk(s_walker_t *w, PyObject *node)
{
    if (!ll_ast_node(node) || w->oom)
        return;
    if (w->depth >= LL_ANALYSIS_MAX_DEPTH || s_stack_low(w)) {
        w->too_deep = true;
        return;
    }
    w->depth++;
    PyObject *t = (PyObject *) Py_TYPE(node);
    if (t == ll_ast.t_Name)
        s_walk_name(w, node);
    else if (t == ll_ast.t_Call)
        s_walk_call(w, node);
    else if (t == ll_ast.t_Attribute || t == ll_ast.t_Subscript) {
        s_walk_generic(w, node);
        PyObject *ctx = ll_ast_get(node, ll_ast.a_ctx);
        if (ctx && !ll_ast_is(ctx, ll_ast.t_Load))
            s_mutate(w, node);
        Py_XDECREF(ctx);
        if (t == ll_ast.t_Attribute) {
            const char *attr = ll_ast_str(node, ll_ast.a_attr);
            if (attr && (strcmp(attr, "user_ns") == 0 || strcmp(attr, "user_global_ns") == 0))
                s_opaque(w);
            if (attr && strcmp(attr, "kernel") == 0 && s_is_get_ipython_call(node))
                s_kernel_bound(w);
        }
    } else if (t == ll_ast.t_FunctionDef || t == ll_ast.t_AsyncFunctionDef)
        s_walk_def(w, node);
    else if (t == ll_ast.t_ClassDef)
        s_walk_class(w, node);
    else if (t == ll_ast.t_Lambda)
        s_walk_lambda(w, node);
    else if (t == ll_ast.t_ListComp || t == ll_ast.t_SetComp || t == ll_ast.t_DictComp ||
             t == ll_ast.t_GeneratorExp)
        s_walk_comp(w, node);
    else if (t == ll_ast.t_NamedExpr)
        s_walk_namedexpr(w, node);
    else if (t == ll_ast.t_Assign) {
        s_walk_field(w, node, ll_ast.a_value);
        s_walk_field(w, node, ll_ast.a_targets);
    } else if (t == ll_ast.t_AugAssign) {
        PyObject *target = ll_ast_get(node, ll_ast.a_target);
        if (ll_ast_is(target, ll_ast.t_Name)) {
            const char *id = ll_ast_str(target, ll_ast.a_id);
            if (id)
                s_load(w, id);
            s_walk_field(w, node, ll_ast.a_value);
            if (id) {
                s_store(w, id, LL_BK_VALUE, -1);
                if (w->scope->kind == LL_SCOPE_MODULE)
                    s_emit(w, LL_EV_MUTATE, 0, id, -1, false);
            }
        } else {
            s_walk_field(w, node, ll_ast.a_target);
            s_walk_field(w, node, ll_ast.a_value);
        }
        Py_XDECREF(target);
    } else if (t == ll_ast.t_AnnAssign) {
        s_walk_field(w, node, ll_ast.a_annotation);
        PyObject *value = ll_ast_get(node, ll_ast.a_value);
        bool has_value = value && value != Py_None;
        if (has_value)
            s_walk(w, value);
        Py_XDECREF(value);
        PyObject *target = ll_ast_get(node, ll_ast.a_target);
        if (has_value || !ll_ast_is(target, ll_ast.t_Name))
            s_walk(w, target);
        Py_XDECREF(target);
    } else if (t == ll_ast.t_For || t == ll_ast.t_AsyncFor || t == ll_ast.t_While)
        s_walk_loop(w, node, t == ll_ast.t_While);
    else if (t == ll_ast.t_If)
        s_walk_if(w, node);
    else if (t == ll_ast.t_With || t == ll_ast.t_AsyncWith) {
        s_walk_field(w, node, ll_ast.a_items);
        s_walk_body_field(w, node, ll_ast.a_body, false);
    } else if (t == ll_ast.t_Try || t == ll_ast.t_TryStar)
        s_walk_try(w, node);
    else if (t == ll_ast.t_Match)
        s_walk_match(w, node);
    else if (t == ll_ast.t_MatchAs || t == ll_ast.t_MatchStar) {
        s_walk_generic(w, node);
        const char *name = ll_ast_str(node, ll_ast.a_name);
        if (name)
            s_store(w, name, LL_BK_VALUE, -1);
    } else if (t == ll_ast.t_MatchMapping) {
        s_walk_generic(w, node);
        const char *rest = ll_ast_str(node, ll_ast.a_rest);
        if (rest)
            s_store(w, rest, LL_BK_VALUE, -1);
    } else if (t == ll_ast.t_Import || t == ll_ast.t_ImportFrom)
        s_walk_import(w, node);
    else if (t == ll_ast.t_Global || t == ll_ast.t_Nonlocal) {
        /* declarations only; a global statement at top level is a no-op */
    } else if (t == ll_ast.t_Expr) {
        PyObject *value = ll_ast_get(node, ll_ast.a_value);
        if (value) {
            s_walk(w, value);
            /* x.method(...) as a statement: x may change in place. */
            PyObject *func =
                ll_ast_is(value, ll_ast.t_Call) ? ll_ast_get(value, ll_ast.a_func) : NULL;
            if (ll_ast_is(func, ll_ast.t_Attribute)) {
                PyObject *recv = ll_ast_get(func, ll_ast.a_value);
                if (recv && !ll_ast_is(recv, ll_ast.t_Call))
                    s_mutate(w, recv);
                else if (recv) {
                    /* get_ipython().x(...) is not a mutation of anything */
                    const char *base = s_base_name(recv);
                    if (base && strcmp(base, "get_ipython") != 0)
                        s_mutate(w, recv);
                }
                Py_XDECREF(recv);
            }
            Py_XDECREF(func);
            Py_DECREF(value);
        }
    } else
        s_walk_generic(w, node);
    w->depth--;
}

/* Parse CODE and walk its statements here, as cell code or (timeit) as the
 * body of a function that runs now.  Unparseable code makes it opaque. */
static void s_walk_code(s_walker_t *w, const char *code, bool as_function)
{
    PyCompilerFlags flags = _PyCompilerFlags_INIT;
    flags.cf_flags = PyCF_ONLY_AST;
    /* IPython transforms a cell magic's body too (%%time of %matplotlib). */
    bool whole = false;
    char *prepared = w->depth < 50 ? ll_analysis_prepare(code, &whole) : NULL;
    PyObject *tree =
        Py_CompileStringExFlags(prepared ? prepared : code, "<magic>", Py_file_input, &flags, -1);
    free(prepared);
    if (!tree) {
        PyErr_Clear();
        s_opaque(w);
        return;
    }
    PyObject *body = ll_ast_get(tree, ll_ast.a_body);
    if (as_function) {
        ll_scope_t sc;
        ll_scope_init(&sc, LL_SCOPE_FUNC, w->scope, w->scope->immediate);
        s_scan_list(w, body, &sc, false);
        ll_scope_t *saved = w->scope;
        w->scope = &sc;
        s_walk_body(w, body);
        w->scope = saved;
        ll_scope_free(&sc);
    } else
        s_walk_body(w, body);
    Py_XDECREF(body);
    Py_DECREF(tree);
}

/* ---- building an analysis --------------------------------------------- */

/* The pending exception as one line; clears it.  Malloc'd. */
static char *s_error_text(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const char *tname = type && PyType_Check(type) ? ((PyTypeObject *) type)->tp_name : "Error";
    char buf[600];
    PyObject *msg = NULL, *lineno = NULL;
    if (value && PyErr_GivenExceptionMatches(type, PyExc_SyntaxError)) {
        msg = PyObject_GetAttrString(value, "msg");
        lineno = PyObject_GetAttrString(value, "lineno");
    }
    if (!msg && value)
        msg = PyObject_Str(value);
    PyErr_Clear();
    const char *m = msg && PyUnicode_Check(msg) ? PyUnicode_AsUTF8(msg) : NULL;
    PyErr_Clear();
    long line = lineno && PyLong_Check(lineno) ? PyLong_AsLong(lineno) : -1;
    if (line > 0)
        snprintf(buf, sizeof buf, "%s: %.400s (line %ld)", tname, m ? m : "", line);
    else
        snprintf(buf, sizeof buf, "%s: %.400s", tname, m ? m : "");
    Py_XDECREF(msg);
    Py_XDECREF(lineno);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
    return strdup(buf);
}

/* Parse SRC; on failure set *ERR and *SYNTAX (a SyntaxError, which
 * IPython's transformation might cure, rather than a RecursionError or
 * MemoryError, which it would only make slower). */
static PyObject *s_parse(const char *src, char **err, bool *syntax)
{
    PyCompilerFlags flags = _PyCompilerFlags_INIT;
    flags.cf_flags = PyCF_ONLY_AST;
    /* Building the AST allocates thousands of objects, none of them in a
     * cycle: the cyclic collector would only walk the heap repeatedly. */
    int gc_was_on = PyGC_Disable();
    PyObject *tree = Py_CompileStringExFlags(src, "<cell>", Py_file_input, &flags, -1);
    if (gc_was_on)
        PyGC_Enable();
    if (!tree) {
        *syntax = PyErr_ExceptionMatches(PyExc_SyntaxError);
        free(*err);
        *err = s_error_text();
    }
    return tree;
}

/* Derive the caller-facing facts from the events. */
static int s_facts(ll_analysis_t *a)
{
    for (size_t i = 0; i < a->nev; i++) {
        const ll_ev_t *e = &a->ev[i];
        int rc = 0;
        if (e->type == LL_EV_BIND && e->kind != LL_BK_STAR) {
            rc = ll_names_add(&a->defs, e->name);
            if (rc == 1 && (e->kind == LL_BK_FUNC || e->kind == LL_BK_CLASS) && e->ref >= 0) {
                int *f = realloc(a->funcs, (a->nfuncs + 1) * sizeof *f);
                if (!f)
                    return -1;
                a->funcs = f;
                a->funcs[a->nfuncs++] = e->ref;
            }
        } else if (e->type == LL_EV_MUTATE)
            rc = ll_names_add(&a->mutates, e->name);
        else if (e->type == LL_EV_DEL && !e->cond)
            rc = ll_names_add(&a->deletes, e->name);
        if (rc < 0)
            return -1;
    }
    for (size_t i = 0; i < a->nev; i++)
        if (a->ev[i].type == LL_EV_LOAD && ll_names_add(&a->loaded, a->ev[i].name) < 0)
            return -1;
    for (size_t i = 0; i < a->ngroups; i++) {
        ll_group_t *g = &a->groups[i];
        if (ll_names_union(&a->loaded, &g->globals) < 0)
            return -1;
        for (size_t k = 0; k < g->globals.count; k++)
            if (!ll_analysis_is_builtin(g->globals.items[k]) &&
                ll_names_add(&g->shown, g->globals.items[k]) < 0)
                return -1;
    }
    for (size_t i = 0; i < a->nimports; i++) {
        char buf[256];
        const char *pkg = ll_analysis_package_of(a->imports[i].module, buf, sizeof buf);
        if (pkg && ll_names_add(&a->packages, pkg) < 0)
            return -1;
    }
    return 0;
}

static void s_set_error(ll_analysis_t *a, const char *msg)
{
    free(a->error);
    a->error = strdup(msg);
}

ll_analysis_t *ll_analysis_new(const char *code, size_t len)
{
    if (!code && len)
        return NULL;
    if (!ll_ast.ready) {
        /* A caller that forgot ll_analysis_init still gets an analysis. */
        char err[256];
        if (ll_analysis_init(err, sizeof err) != 0) {
            ll_warn("analysis", "%s", err);
            return NULL;
        }
    }
    ll_analysis_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->forced = -1;
    if (len && memchr(code, '\0', len)) {
        s_set_error(a, "ValueError: source code string cannot contain null bytes");
        return a;
    }
    char *src = malloc(len + 1);
    if (!src) {
        free(a);
        return NULL;
    }
    if (len)
        memcpy(src, code, len);
    src[len] = '\0';

    /* %%gpu / %%cpu: ours, not IPython's; blank the line, keep numbering. */
    size_t first = strcspn(src, "\n");
    size_t n = first;
    while (n && isspace((unsigned char) src[n - 1]))
        n--;
    size_t lead = strspn(src, " \t");
    if (n > lead && (n - lead == 5) &&
        (strncmp(src + lead, "%%gpu", 5) == 0 || strncmp(src + lead, "%%cpu", 5) == 0)) {
        a->forced = src[lead + 2] == 'g' ? LL_ANALYSIS_GPU : LL_ANALYSIS_CPU;
        memmove(src, src + first, len - first + 1);
    }

    char *err = NULL;
    bool whole = false;
    ll_analysis_dedent(src);
    char *prepared = ll_analysis_prepare(src, &whole);
    if (prepared) {
        free(src);
        src = prepared;
    }
    bool syntax = false;
    PyObject *tree = s_parse(src, &err, &syntax);
    /* The line scan may miss IPython syntax (IPython's cleanup of prompts,
     * say): on a SyntaxError in a cell that has any escape character, let
     * IPython transform the whole cell after all, if it is small enough for
     * IPython's loop to be quick.  Plain syntax errors never load IPython. */
    if (!tree && !whole && syntax && strpbrk(src, "%!?") && strlen(src) < 16384) {
        char *t = ll_analysis_transform(src);
        if (t && strcmp(t, src) != 0) {
            PyObject *again = s_parse(t, &err, &syntax);
            if (again) {
                tree = again;
                free(err);
                err = NULL;
            }
        }
        free(t);
    }
    free(src);
    if (!tree) {
        a->error = err ? err : strdup("SyntaxError: cannot parse the cell");
        return a;
    }

    ll_scope_t module;
    ll_scope_init(&module, LL_SCOPE_MODULE, NULL, true);
    char base;
    s_walker_t w = {.a = a, .scope = &module, .group = -1, .class_group = -1, .stack_base = &base};
    w.stack_budget = s_stack_budget(&base);
    PyObject *body = ll_ast_get(tree, ll_ast.a_body);
    s_walk_body(&w, body);
    Py_XDECREF(body);
    Py_DECREF(tree);
    ll_scope_free(&module);
    PyErr_Clear();
    if (w.oom || (!w.too_deep && s_facts(a) != 0)) {
        ll_analysis_destroy(&a);
        return NULL;
    }
    if (w.too_deep) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "RecursionError: the cell nests too deeply to analyse "
                 "(more than %d levels, or this thread's stack)",
                 LL_ANALYSIS_MAX_DEPTH);
        /* Facts from a partial walk would be wrong: drop them. */
        ll_analysis_t *fresh = calloc(1, sizeof *fresh);
        if (!fresh) {
            ll_analysis_destroy(&a);
            return NULL;
        }
        fresh->forced = a->forced;
        ll_analysis_destroy(&a);
        s_set_error(fresh, msg);
        return fresh;
    }
    return a;
}

void ll_analysis_destroy(ll_analysis_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_analysis_t *a = *self_p;
    free(a->error);
    ll_names_clear(&a->pool);
    free(a->ev);
    for (size_t i = 0; i < a->ngroups; i++) {
        ll_names_clear(&a->groups[i].globals);
        ll_names_clear(&a->groups[i].gwrites);
        ll_names_clear(&a->groups[i].paths);
        ll_names_clear(&a->groups[i].shown);
    }
    free(a->groups);
    for (size_t i = 0; i < a->nimports; i++) {
        free(a->imports[i].module);
        free(a->imports[i].attr);
        free(a->imports[i].path);
        free(a->imports[i].stmt);
    }
    free(a->imports);
    ll_names_clear(&a->defs);
    ll_names_clear(&a->reads);
    ll_names_clear(&a->mutates);
    ll_names_clear(&a->deletes);
    ll_names_clear(&a->packages);
    ll_names_clear(&a->loaded);
    free(a->funcs);
    ll_blocks_free(&a->blocks);
    free(a);
    *self_p = NULL;
}

/* ---- accessors -------------------------------------------------------- */

static ll_analysis_strs_t s_strs(const ll_names_t *n)
{
    return (ll_analysis_strs_t){(const char *const *) n->items, n->count};
}

const char *ll_analysis_error(const ll_analysis_t *self)
{
    return self->error;
}
ll_analysis_strs_t ll_analysis_defs(const ll_analysis_t *self)
{
    return s_strs(&self->defs);
}
ll_analysis_strs_t ll_analysis_reads(const ll_analysis_t *self)
{
    /* Callers that only want closures never pay for this replay.  The
     * object is logically const: reads are a function of the events. */
    ll_analysis_t *a = (ll_analysis_t *) self;
    if (!a->reads_done && !a->error) {
        if (ll_analysis_compute_reads(a, &a->reads) != 0)
            ll_names_clear(&a->reads);
        a->reads_done = true;
    }
    return s_strs(&a->reads);
}
ll_analysis_strs_t ll_analysis_mutates(const ll_analysis_t *self)
{
    return s_strs(&self->mutates);
}
ll_analysis_strs_t ll_analysis_imports(const ll_analysis_t *self)
{
    return s_strs(&self->packages);
}
size_t ll_analysis_function_count(const ll_analysis_t *self)
{
    return self->nfuncs;
}
bool ll_analysis_is_opaque(const ll_analysis_t *self)
{
    return self->opaque;
}
bool ll_analysis_opaque_flag(const ll_analysis_t *self)
{
    return self->opaque;
}
bool ll_analysis_kernel_bound_flag(const ll_analysis_t *self)
{
    return self->kernel_bound;
}
bool ll_analysis_may_load(const ll_analysis_t *self, const char *name)
{
    return ll_names_has(&self->loaded, name);
}
int ll_analysis_forced_label(const ll_analysis_t *self)
{
    return self->forced;
}

const char *ll_analysis_function_name(const ll_analysis_t *self, size_t i)
{
    return i < self->nfuncs ? self->groups[self->funcs[i]].name : NULL;
}

bool ll_analysis_function_is_class(const ll_analysis_t *self, size_t i)
{
    return i < self->nfuncs && self->groups[self->funcs[i]].kind == LL_BK_CLASS;
}

ll_analysis_strs_t ll_analysis_function_globals(const ll_analysis_t *self, size_t i)
{
    if (i >= self->nfuncs)
        return (ll_analysis_strs_t){NULL, 0};
    return s_strs(&self->groups[self->funcs[i]].shown);
}

const ll_ev_t *ll_analysis_events(const ll_analysis_t *self, size_t *count)
{
    *count = self->nev;
    return self->ev;
}

const ll_group_t *ll_analysis_group(const ll_analysis_t *self, int index)
{
    return index >= 0 && (size_t) index < self->ngroups ? &self->groups[index] : NULL;
}

const ll_import_t *ll_analysis_import(const ll_analysis_t *self, int index)
{
    return index >= 0 && (size_t) index < self->nimports ? &self->imports[index] : NULL;
}

static json_t *s_json_list(const ll_names_t *n)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n->count; i++)
        json_array_append_new(arr, json_string(n->items[i]));
    return arr;
}

json_t *ll_analysis_json(const ll_analysis_t *self)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "error", self->error ? json_string(self->error) : json_null());
    json_object_set_new(o, "forced_label",
                        self->forced < 0
                            ? json_null()
                            : json_string(self->forced == LL_ANALYSIS_GPU ? "gpu" : "cpu"));
    if (self->error)
        return o;
    json_object_set_new(o, "defs", s_json_list(&self->defs));
    ll_analysis_reads(self);
    json_object_set_new(o, "reads", s_json_list(&self->reads));
    json_object_set_new(o, "mutates", s_json_list(&self->mutates));
    json_object_set_new(o, "deletes", s_json_list(&self->deletes));
    json_object_set_new(o, "packages", s_json_list(&self->packages));
    json_t *imports = json_array();
    for (size_t i = 0; imports && i < self->nimports; i++) {
        const ll_import_t *im = &self->imports[i];
        json_array_append_new(imports,
                              json_pack("{s:s, s:s, s:s?, s:s}", "name", im->bound, "module",
                                        im->module, "attr", im->attr, "stmt", im->stmt));
    }
    json_object_set_new(o, "imports", imports);
    json_t *funcs = json_array();
    for (size_t i = 0; funcs && i < self->nfuncs; i++) {
        const ll_group_t *g = &self->groups[self->funcs[i]];
        json_array_append_new(funcs,
                              json_pack("{s:s, s:s, s:o, s:b}", "name", g->name, "kind",
                                        g->kind == LL_BK_CLASS ? "class" : "function", "globals",
                                        s_json_list(&g->shown), "opaque", g->opaque));
    }
    json_object_set_new(o, "functions", funcs);
    json_object_set_new(o, "opaque", json_boolean(self->opaque));
    return o;
}
