/* ll_analysis_walk: the AST walker of the cell analysis, node by node:
 * turns a cell's ast.Module into the events, groups and imports
 * the session replays (ll_analysis_internal.h).  GIL held, on the thread
 * that analyses.  Python objects are only read: node types are compared by
 * pointer and fields read through interned names (ll_analysis_ast.h), so a
 * typical cell costs tens of microseconds on top of the parse.
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
 * Calls, IPython's magics among them, are walked at the end of this file
 * (a call's arguments are expressions, and a magic's code is walked as
 * cell code: the two recurse into each other, so they are one file); what
 * the walk records, and the pre-scan of a scope, are in
 * ll_analysis_walk_state.c, below it.  The walk refuses trees deeper than
 * LL_ANALYSIS_MAX_DEPTH, or deeper than the C stack left on the calling
 * thread allows, rather than overflow it. */
#include "analysis/ll_analysis_walk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the walk ---------------------------------------------------------- */

static void s_walk_list(ll_walker_t *w, PyObject *list)
{
    if (!list || !PyList_Check(list))
        return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list) && !w->oom; i++)
        ll_walk(w, PyList_GET_ITEM(list, i));
}

void ll_walk_field(ll_walker_t *w, PyObject *node, PyObject *attr)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return;
    if (PyList_Check(v))
        s_walk_list(w, v);
    else if (ll_ast_node(v))
        ll_walk(w, v);
    Py_DECREF(v);
}

void ll_walk_generic(ll_walker_t *w, PyObject *node)
{
    PyObject *fields = ll_ast_fields(node);
    for (Py_ssize_t i = 0; fields && i < PyTuple_GET_SIZE(fields); i++)
        ll_walk_field(w, node, PyTuple_GET_ITEM(fields, i));
}

/* A statement list; at module level each statement starts a unit. */
void ll_walk_body(ll_walker_t *w, PyObject *list)
{
    if (!list || !PyList_Check(list))
        return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list) && !w->oom; i++) {
        if (w->scope->kind == LL_SCOPE_MODULE && !w->one_unit)
            ll_walk_emit(w, LL_EV_UNIT, 0, NULL, -1, false);
        ll_walk(w, PyList_GET_ITEM(list, i));
    }
}

static void s_walk_body_field(ll_walker_t *w, PyObject *node, PyObject *attr, bool cond)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return;
    int saved = cond ? ll_walk_enter_block(w) : 0;
    ll_walk_body(w, v);
    if (cond)
        ll_walk_leave_block(w, saved);
    Py_DECREF(v);
}

static void s_walk_name(ll_walker_t *w, PyObject *node)
{
    const char *id = ll_ast_str(node, ll_ast.a_id);
    PyObject *ctx = ll_ast_get(node, ll_ast.a_ctx);
    if (id && ctx) {
        if (ll_ast_is(ctx, ll_ast.t_Load))
            ll_walk_load(w, id);
        else if (ll_ast_is(ctx, ll_ast.t_Store))
            ll_walk_store(w, id, LL_BK_VALUE, -1);
        else
            ll_walk_delete(w, id, true);
    }
    Py_XDECREF(ctx);
}

/* Parameter names of an `arguments` node into SC's locals. */
static void s_params(ll_walker_t *w, PyObject *args, ll_scope_t *sc)
{
    if (!args)
        return;
    PyObject *lists[] = {ll_ast.a_posonlyargs, ll_ast.a_args, ll_ast.a_kwonlyargs};
    for (size_t k = 0; k < 3; k++) {
        PyObject *l = ll_ast_get(args, lists[k]);
        for (Py_ssize_t i = 0; l && PyList_Check(l) && i < PyList_GET_SIZE(l); i++) {
            const char *id = ll_ast_str(PyList_GET_ITEM(l, i), ll_ast.a_arg);
            if (id)
                ll_walk_add(w, &sc->locals, id);
        }
        Py_XDECREF(l);
    }
    PyObject *singles[] = {ll_ast.a_vararg, ll_ast.a_kwarg};
    for (size_t k = 0; k < 2; k++) {
        PyObject *a = ll_ast_get(args, singles[k]);
        const char *id = ll_ast_node(a) ? ll_ast_str(a, ll_ast.a_arg) : NULL;
        if (id)
            ll_walk_add(w, &sc->locals, id);
        Py_XDECREF(a);
    }
}

/* A decorator receives the function or class: it may call it right away
 * (so its body's globals are read now) and may keep it (`@app.route`,
 * `@registry.register` store it in app / registry, which then need its
 * globals whenever they are used). */
static void s_decorated(ll_walker_t *w, PyObject *node, const char *name)
{
    if (w->scope->kind != LL_SCOPE_MODULE)
        return;
    PyObject *decs = ll_ast_get(node, ll_ast.a_decorator_list);
    for (Py_ssize_t i = 0; decs && PyList_Check(decs) && i < PyList_GET_SIZE(decs); i++) {
        PyObject *d = PyList_GET_ITEM(decs, i);
        if (!ll_ast_is(d, ll_ast.t_Name))
            ll_walk_mutate(w, d);
    }
    if (decs && PyList_Check(decs) && PyList_GET_SIZE(decs) > 0)
        ll_walk_emit(w, LL_EV_LOAD, 0, name, -1, false);
    Py_XDECREF(decs);
}

/* def / async def: decorators, defaults and annotations now, body later. */
static void s_walk_def(ll_walker_t *w, PyObject *node)
{
    const char *name = ll_ast_str(node, ll_ast.a_name);
    if (!name)
        return;
    ll_walk_field(w, node, ll_ast.a_decorator_list);
    PyObject *args = ll_ast_get(node, ll_ast.a_args);
    if (args)
        ll_walk_generic(w, args); /* defaults, kw_defaults, annotations */
    ll_walk_field(w, node, ll_ast.a_returns);

    bool own = w->group < 0 && w->class_group < 0;
    int g = w->group >= 0         ? w->group
            : w->class_group >= 0 ? w->class_group
                                  : ll_walk_new_group(w, name, LL_BK_FUNC);
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_FUNC, w->scope, false);
    s_params(w, args, &sc);
    Py_XDECREF(args);
    PyObject *body = ll_ast_get(node, ll_ast.a_body);
    ll_walk_scan_list(w, body, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    int saved_group = w->group;
    w->scope = &sc;
    w->group = g;
    ll_walk_body(w, body);
    w->scope = saved_scope;
    w->group = saved_group;
    Py_XDECREF(body);
    ll_scope_free(&sc);

    ll_walk_store(w, name, LL_BK_FUNC, own ? g : -1);
    s_decorated(w, node, name);
}

static void s_walk_class(ll_walker_t *w, PyObject *node)
{
    const char *name = ll_ast_str(node, ll_ast.a_name);
    if (!name)
        return;
    ll_walk_field(w, node, ll_ast.a_decorator_list);
    ll_walk_field(w, node, ll_ast.a_bases);
    ll_walk_field(w, node, ll_ast.a_keywords);

    bool own = w->group < 0 && w->class_group < 0;
    int cg = own ? ll_walk_new_group(w, name, LL_BK_CLASS) : -1;
    int saved_cg = w->class_group;
    if (own)
        w->class_group = cg;
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_CLASS, w->scope, w->scope->immediate && w->group < 0);
    PyObject *body = ll_ast_get(node, ll_ast.a_body);
    ll_walk_scan_list(w, body, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    w->scope = &sc;
    ll_walk_body(w, body);
    w->scope = saved_scope;
    w->class_group = saved_cg;
    Py_XDECREF(body);
    ll_scope_free(&sc);

    ll_walk_store(w, name, LL_BK_CLASS, own ? cg : -1);
    s_decorated(w, node, name);
}

/* A lambda may run now (sorted(key=...)) or later (kept in a value): its
 * globals are read now when it stands in code that runs now, and they are
 * deps of the statement's bindings. */
static void s_walk_lambda(ll_walker_t *w, PyObject *node)
{
    PyObject *args = ll_ast_get(node, ll_ast.a_args);
    if (args)
        ll_walk_generic(w, args);
    bool own = w->group < 0 && w->class_group < 0;
    int g = w->group >= 0         ? w->group
            : w->class_group >= 0 ? w->class_group
                                  : ll_walk_new_group(w, NULL, LL_BK_VALUE);
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_FUNC, w->scope, w->scope->immediate);
    s_params(w, args, &sc);
    Py_XDECREF(args);
    PyObject *body = ll_ast_get(node, ll_ast.a_body);
    if (body)
        ll_walk_scan(w, body, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    int saved_group = w->group;
    w->scope = &sc;
    w->group = g;
    if (body)
        ll_walk(w, body);
    w->scope = saved_scope;
    w->group = saved_group;
    Py_XDECREF(body);
    ll_scope_free(&sc);
    if (own && g >= 0)
        ll_walk_emit(w, LL_EV_DEFER, 0, NULL, g, false);
}

static void s_walk_comp(ll_walker_t *w, PyObject *node)
{
    PyObject *gens = ll_ast_get(node, ll_ast.a_generators);
    if (!gens || !PyList_Check(gens) || PyList_GET_SIZE(gens) == 0) {
        Py_XDECREF(gens);
        ll_walk_generic(w, node);
        return;
    }
    /* The first iterable is evaluated in the enclosing scope. */
    ll_walk_field(w, PyList_GET_ITEM(gens, 0), ll_ast.a_iter);
    /* A generator expression runs when it is iterated, maybe in a later
     * cell: like a lambda, its globals are read now and are deps of what the
     * statement binds. */
    bool lazy = ll_ast_is(node, ll_ast.t_GeneratorExp) && w->group < 0 && w->class_group < 0;
    int saved_group = w->group;
    int g = lazy ? ll_walk_new_group(w, NULL, LL_BK_VALUE) : -1;
    if (g >= 0)
        w->group = g;
    ll_scope_t sc;
    ll_scope_init(&sc, LL_SCOPE_COMP, w->scope, w->scope->immediate);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(gens); i++)
        ll_walk_scan_field(w, PyList_GET_ITEM(gens, i), ll_ast.a_target, &sc, false);
    ll_scope_t *saved_scope = w->scope;
    w->scope = &sc;
    /* A walrus in it binds only if the loop runs. */
    int saved_block = ll_walk_enter_block(w);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(gens); i++) {
        PyObject *gen = PyList_GET_ITEM(gens, i);
        if (i > 0)
            ll_walk_field(w, gen, ll_ast.a_iter);
        ll_walk_field(w, gen, ll_ast.a_target);
        ll_walk_field(w, gen, ll_ast.a_ifs);
    }
    if (ll_ast_is(node, ll_ast.t_DictComp)) {
        ll_walk_field(w, node, ll_ast.a_key);
        ll_walk_field(w, node, ll_ast.a_value);
    } else
        ll_walk_field(w, node, ll_ast.a_elt);
    ll_walk_leave_block(w, saved_block);
    w->scope = saved_scope;
    ll_scope_free(&sc);
    Py_DECREF(gens);
    w->group = saved_group;
    if (g >= 0)
        ll_walk_emit(w, LL_EV_DEFER, 0, NULL, g, false);
}

static void s_walk_namedexpr(ll_walker_t *w, PyObject *node)
{
    ll_walk_field(w, node, ll_ast.a_value);
    PyObject *target = ll_ast_get(node, ll_ast.a_target);
    const char *id = target ? ll_ast_str(target, ll_ast.a_id) : NULL;
    if (id) {
        ll_walk_store_in(w, ll_scope_walrus_target(w->scope), id, LL_BK_VALUE, -1);
    }
    Py_XDECREF(target);
}

static void s_walk_import(ll_walker_t *w, PyObject *node)
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
            ll_walk_opaque(w); /* the user namespace itself */
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
            ll_walk_opaque(w); /* the names it binds are unknown */
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
            ll_walk_add(w, &w->a->groups[w->group].paths, path);
        int idx = -1;
        if (w->scope->kind == LL_SCOPE_MODULE || ll_names_has(&w->scope->globals, bound))
            idx = ll_walk_add_import(w, bound, module, attr, path, stmt);
        ll_walk_store(w, bound, kind, idx);
    }
    Py_XDECREF(names);
}

/* for / while.  Zero iterations bind nothing, so the body is a block.  A
 * later iteration may call a function an earlier one defined, before the
 * def is reached again: the body's functions and classes are looked up
 * once more at its end, so what they read is in the closure. */
static void s_walk_loop(ll_walker_t *w, PyObject *node, bool is_while)
{
    ll_walk_field(w, node, is_while ? ll_ast.a_test : ll_ast.a_iter);
    ll_names_t defs = {0};
    ll_names_t *saved_defs = w->loopdefs;
    w->loopdefs = &defs;
    int saved = ll_walk_enter_block(w);
    if (!is_while)
        ll_walk_field(w, node, ll_ast.a_target);
    s_walk_body_field(w, node, ll_ast.a_body, false);
    if (defs.count && w->scope->kind == LL_SCOPE_MODULE) {
        ll_walk_emit(w, LL_EV_UNIT, 0, NULL, -1, false);
        for (size_t i = 0; i < defs.count; i++)
            ll_walk_emit(w, LL_EV_LOAD, 0, defs.items[i], -1, false);
    }
    ll_walk_leave_block(w, saved);
    w->loopdefs = saved_defs;
    if (saved_defs)
        ll_walk_add_all(w, saved_defs, &defs);
    ll_names_clear(&defs);
    s_walk_body_field(w, node, ll_ast.a_orelse, true);
}

/* One branch of an if/else; INTO collects the names it certainly binds.
 * Returns the branch's block. */
static int s_walk_branch(ll_walker_t *w, PyObject *node, PyObject *attr, ll_names_t *into)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return w->block;
    int saved = ll_walk_enter_block(w);
    int block = w->block;
    ll_names_t *saved_set = w->defset;
    int saved_block = w->defblock;
    w->defset = into;
    w->defblock = w->block;
    ll_walk_body(w, v);
    w->defset = saved_set;
    w->defblock = saved_block;
    ll_walk_leave_block(w, saved);
    Py_DECREF(v);
    return block;
}

/* if/elif/else: each branch may not run, but when every branch binds x,
 * x is certainly (re)bound afterwards and its older value is gone. */
static void s_walk_if(ll_walker_t *w, PyObject *node)
{
    ll_walk_field(w, node, ll_ast.a_test);
    ll_names_t then = {0}, other = {0};
    s_walk_branch(w, node, ll_ast.a_body, &then);
    bool has_else = ll_ast_has_items(node, ll_ast.a_orelse);
    s_walk_branch(w, node, ll_ast.a_orelse, &other);
    for (size_t i = 0; has_else && w->scope->kind == LL_SCOPE_MODULE && i < then.count; i++) {
        const char *name = then.items[i];
        if (!ll_names_has(&other, name))
            continue;
        ll_walk_emit(w, LL_EV_SETTLE, 0, name, -1, false);
        if (w->defset && w->block == w->defblock)
            ll_walk_add(w, w->defset, name);
    }
    ll_names_clear(&then);
    ll_names_clear(&other);
}

/* try/except/else/finally.  Anything in the body may be skipped by an
 * exception, so it is conditional; but when the body (or else) and every
 * handler all bind x, x is certainly rebound once the statement is done. */
static void s_walk_try(ll_walker_t *w, PyObject *node)
{
    ll_names_t ok = {0}, common = {0};
    int body_block = s_walk_branch(w, node, ll_ast.a_body, &ok);
    PyObject *handlers = ll_ast_get(node, ll_ast.a_handlers);
    Py_ssize_t nh = handlers && PyList_Check(handlers) ? PyList_GET_SIZE(handlers) : 0;
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *h = PyList_GET_ITEM(handlers, i);
        ll_names_t mine = {0};
        int saved = ll_walk_enter_block(w);
        ll_names_t *saved_set = w->defset;
        int saved_block = w->defblock;
        w->defset = &mine;
        w->defblock = w->block;
        if (w->scope->kind == LL_SCOPE_MODULE)
            ll_walk_emit(w, LL_EV_UNIT, 0, NULL, -1, false);
        ll_walk_field(w, h, ll_ast.a_type);
        const char *name = ll_ast_str(h, ll_ast.a_name);
        if (name)
            ll_walk_store(w, name, LL_BK_VALUE, -1);
        s_walk_body_field(w, h, ll_ast.a_body, false);
        /* `except E as e` unbinds e when the handler ends. */
        if (name)
            ll_walk_delete(w, name, false);
        w->defset = saved_set;
        w->defblock = saved_block;
        ll_walk_leave_block(w, saved);
        if (i == 0)
            ll_walk_add_all(w, &common, &mine);
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
        ll_walk_emit(w, LL_EV_SETTLE, 0, ok.items[i], -1, false);
        if (w->defset && w->block == w->defblock)
            ll_walk_add(w, w->defset, ok.items[i]);
    }
    ll_names_clear(&ok);
    ll_names_clear(&common);
}

static void s_walk_match(ll_walker_t *w, PyObject *node)
{
    ll_walk_field(w, node, ll_ast.a_subject);
    PyObject *cases = ll_ast_get(node, ll_ast.a_cases);
    for (Py_ssize_t i = 0; cases && PyList_Check(cases) && i < PyList_GET_SIZE(cases); i++) {
        PyObject *c = PyList_GET_ITEM(cases, i);
        int saved = ll_walk_enter_block(w);
        ll_walk_field(w, c, ll_ast.a_pattern);
        ll_walk_field(w, c, ll_ast.a_guard);
        s_walk_body_field(w, c, ll_ast.a_body, false);
        ll_walk_leave_block(w, saved);
    }
    Py_XDECREF(cases);
}

/* ---- assignments and expression statements ----------------------------- */

/* x.a / x[k]: a store or del through it may change x in place; reaching
 * the user namespace or the kernel object through get_ipython() matters. */
static void s_walk_attribute(ll_walker_t *w, PyObject *node, bool is_attribute)
{
    ll_walk_generic(w, node);
    PyObject *ctx = ll_ast_get(node, ll_ast.a_ctx);
    if (ctx && !ll_ast_is(ctx, ll_ast.t_Load))
        ll_walk_mutate(w, node);
    Py_XDECREF(ctx);
    if (is_attribute) {
        const char *attr = ll_ast_str(node, ll_ast.a_attr);
        if (attr && (strcmp(attr, "user_ns") == 0 || strcmp(attr, "user_global_ns") == 0))
            ll_walk_opaque(w);
        if (attr && strcmp(attr, "kernel") == 0 && ll_walk_is_get_ipython(node))
            ll_walk_kernel_bound(w);
    }
}

/* x += v reads x, then rebinds it (and may change its object in place). */
static void s_walk_augassign(ll_walker_t *w, PyObject *node)
{
    PyObject *target = ll_ast_get(node, ll_ast.a_target);
    if (ll_ast_is(target, ll_ast.t_Name)) {
        const char *id = ll_ast_str(target, ll_ast.a_id);
        if (id)
            ll_walk_load(w, id);
        ll_walk_field(w, node, ll_ast.a_value);
        if (id) {
            ll_walk_store(w, id, LL_BK_VALUE, -1);
            if (w->scope->kind == LL_SCOPE_MODULE)
                ll_walk_emit(w, LL_EV_MUTATE, 0, id, -1, false);
        }
    } else {
        ll_walk_field(w, node, ll_ast.a_target);
        ll_walk_field(w, node, ll_ast.a_value);
    }
    Py_XDECREF(target);
}

/* x: T = v binds x; a bare `x: T` binds nothing (but `a.b: T` evaluates a). */
static void s_walk_annassign(ll_walker_t *w, PyObject *node)
{
    ll_walk_field(w, node, ll_ast.a_annotation);
    PyObject *value = ll_ast_get(node, ll_ast.a_value);
    bool has_value = value && value != Py_None;
    if (has_value)
        ll_walk(w, value);
    Py_XDECREF(value);
    PyObject *target = ll_ast_get(node, ll_ast.a_target);
    if (has_value || !ll_ast_is(target, ll_ast.t_Name))
        ll_walk(w, target);
    Py_XDECREF(target);
}

/* A match pattern's capture name (NODE.ATTR) is bound. */
static void s_walk_capture(ll_walker_t *w, PyObject *node, PyObject *attr)
{
    ll_walk_generic(w, node);
    const char *name = ll_ast_str(node, attr);
    if (name)
        ll_walk_store(w, name, LL_BK_VALUE, -1);
}

/* An expression statement; x.method(...) as a statement: x may change in
 * place. */
static void s_walk_expr_stmt(ll_walker_t *w, PyObject *node)
{
    PyObject *value = ll_ast_get(node, ll_ast.a_value);
    if (!value)
        return;
    ll_walk(w, value);
    PyObject *func = ll_ast_is(value, ll_ast.t_Call) ? ll_ast_get(value, ll_ast.a_func) : NULL;
    if (ll_ast_is(func, ll_ast.t_Attribute)) {
        PyObject *recv = ll_ast_get(func, ll_ast.a_value);
        if (recv && !ll_ast_is(recv, ll_ast.t_Call))
            ll_walk_mutate(w, recv);
        else if (recv) {
            /* get_ipython().x(...) is not a mutation of anything */
            const char *base = ll_walk_base_name(recv);
            if (base && strcmp(base, "get_ipython") != 0)
                ll_walk_mutate(w, recv);
        }
        Py_XDECREF(recv);
    }
    Py_XDECREF(func);
    Py_DECREF(value);
}

/* ---- dispatch ---------------------------------------------------------- */

void ll_walk(ll_walker_t *w, PyObject *node)
{
    if (!ll_ast_node(node) || w->oom)
        return;
    if (w->depth >= LL_ANALYSIS_MAX_DEPTH || ll_walk_stack_low(w)) {
        w->too_deep = true;
        return;
    }
    w->depth++;
    PyObject *t = (PyObject *) Py_TYPE(node);
    if (t == ll_ast.t_Name)
        s_walk_name(w, node);
    else if (t == ll_ast.t_Call)
        ll_walk_call(w, node);
    else if (t == ll_ast.t_Attribute || t == ll_ast.t_Subscript)
        s_walk_attribute(w, node, t == ll_ast.t_Attribute);
    else if (t == ll_ast.t_FunctionDef || t == ll_ast.t_AsyncFunctionDef)
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
        ll_walk_field(w, node, ll_ast.a_value);
        ll_walk_field(w, node, ll_ast.a_targets);
    } else if (t == ll_ast.t_AugAssign)
        s_walk_augassign(w, node);
    else if (t == ll_ast.t_AnnAssign)
        s_walk_annassign(w, node);
    else if (t == ll_ast.t_For || t == ll_ast.t_AsyncFor || t == ll_ast.t_While)
        s_walk_loop(w, node, t == ll_ast.t_While);
    else if (t == ll_ast.t_If)
        s_walk_if(w, node);
    else if (t == ll_ast.t_With || t == ll_ast.t_AsyncWith) {
        ll_walk_field(w, node, ll_ast.a_items);
        s_walk_body_field(w, node, ll_ast.a_body, false);
    } else if (t == ll_ast.t_Try || t == ll_ast.t_TryStar)
        s_walk_try(w, node);
    else if (t == ll_ast.t_Match)
        s_walk_match(w, node);
    else if (t == ll_ast.t_MatchAs || t == ll_ast.t_MatchStar)
        s_walk_capture(w, node, ll_ast.a_name);
    else if (t == ll_ast.t_MatchMapping)
        s_walk_capture(w, node, ll_ast.a_rest);
    else if (t == ll_ast.t_Import || t == ll_ast.t_ImportFrom)
        s_walk_import(w, node);
    else if (t == ll_ast.t_Global || t == ll_ast.t_Nonlocal) {
        /* declarations only; a global statement at top level is a no-op */
    } else if (t == ll_ast.t_Expr)
        s_walk_expr_stmt(w, node);
    else
        ll_walk_generic(w, node);
    w->depth--;
}

/* ---- entry ------------------------------------------------------------- */

int ll_walk_cell(ll_analysis_t *a, PyObject *tree)
{
    ll_scope_t module;
    ll_scope_init(&module, LL_SCOPE_MODULE, NULL, true);
    char base;
    ll_walker_t w = {.a = a, .scope = &module, .group = -1, .class_group = -1, .stack_base = &base};
    w.stack_budget = ll_walk_stack_budget(&base);
    PyObject *body = ll_ast_get(tree, ll_ast.a_body);
    ll_walk_body(&w, body);
    Py_XDECREF(body);
    ll_scope_free(&module);
    PyErr_Clear();
    return w.oom ? -1 : w.too_deep ? 1 : 0;
}

/* ---- calls --------------------------------------------------------------
 *
 * How the AST walker reads a call: IPython's magics and shell escapes
 * (get_ipython().run_line_magic(...) and friends, after IPython's input
 * transformation), calls that defeat static analysis (exec, eval,
 * globals(), ...), and the arguments a call may keep (register(f),
 * reg.add(f): ARG/PASS events).  What a magic means is
 * ll_analysis_magic.c's table; this part does the Python side (parsing the
 * code or expression a magic runs).
 *
 * IPython: the cell first goes through IPython's input transformation
 * (ll_analysis_ipython.c: only the lines that need it, cheaply), which turns
 * magics into get_ipython().run_line_magic(...) calls.  Those calls are
 * recognised here: %time/%%time/%prun/%%capture analyse their
 * code as if it stood in the cell, %timeit/%%timeit as a function body (its
 * assignments stay local), $name and {expr} in shell commands and magic lines
 * are reads, known harmless magics are facts-free, and %run, %reset, %who,
 * %pylab, unknown magics, or get_ipython() used any other way make the cell
 * opaque. */

/* ---- IPython magics ---------------------------------------------------- */

static int s_expand_name(void *ctx, const char *name)
{
    ll_walker_t *w = ctx;
    ll_walk_load(w, name);
    return w->oom ? -1 : 0;
}

/* {expr} in a shell command or magic line: IPython evaluates it here. */
static int s_expand_expr(void *ctx, const char *text, size_t n)
{
    ll_walker_t *w = ctx;
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
        ll_walk_field(w, tree, ll_ast.a_body);
        Py_DECREF(tree);
    } else
        PyErr_Clear(); /* IPython leaves it as text */
    return w->oom ? -1 : 0;
}

/* IPython expands $name and {expr} in shell commands and magic lines. */
static void s_expand(ll_walker_t *w, const char *text)
{
    ll_magic_expand(text, s_expand_name, s_expand_expr, w);
}

static int s_bind_name(void *ctx, const char *name)
{
    ll_walk_store(ctx, name, LL_BK_VALUE, -1);
    return 0;
}

/* `x?` -> pinfo 'x': the object named is read. */
static void s_walk_magic_object(ll_walker_t *w, const char *line)
{
    char buf[1024];
    ll_magic_object(line, buf, sizeof buf);
    PyCompilerFlags flags = _PyCompilerFlags_INIT;
    flags.cf_flags = PyCF_ONLY_AST;
    PyObject *tree = Py_CompileStringExFlags(buf, "<magic>", Py_eval_input, &flags, -1);
    if (tree) {
        ll_walk_field(w, tree, ll_ast.a_body);
        Py_DECREF(tree);
    } else
        PyErr_Clear(); /* a wildcard search: reads nothing we can name */
}

/* %%timeit: the setup on the magic's line, then the body, as one function
 * body (timeit runs its code in a function: assignments stay local). */
static void s_walk_timeit_cell(ll_walker_t *w, const char *setup, const char *body)
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
    ll_walk_code(w, both, true);
    free(both);
}

/* get_ipython().METHOD(ARGS...) with constant string arguments. */
static void s_walk_magic(ll_walker_t *w, const char *method, const char **argv, int argc)
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
    case LL_MAGIC_OPAQUE: ll_walk_opaque(w); break;
    case LL_MAGIC_HARMLESS: s_expand(w, line); break;
    case LL_MAGIC_EXPR: s_walk_magic_object(w, line); break;
    case LL_MAGIC_CODE:
        if (cell)
            ll_walk_code(w, argv[2], false);
        else
            ll_walk_code(w, ll_magic_skip_options(line, m->argopts), false);
        break;
    case LL_MAGIC_TIMEIT:
        if (cell)
            s_walk_timeit_cell(w, ll_magic_skip_options(line, m->argopts), argv[2]);
        else
            ll_walk_code(w, ll_magic_skip_options(line, m->argopts), true);
        break;
    case LL_MAGIC_CAPTURE: {
        /* The captured output holds whatever the body displayed: one unit,
         * so the variable's modules are all of the body's. */
        bool saved = w->one_unit;
        w->one_unit = true;
        if (cell)
            ll_walk_code(w, argv[2], false);
        ll_magic_bound_names(line, true, s_bind_name, w);
        w->one_unit = saved;
        break;
    }
    case LL_MAGIC_SCRIPT: ll_magic_bound_names(line, false, s_bind_name, w); break;
    }
}

/* Returns true when NODE was get_ipython().method('..', ...) and handled. */
static bool s_try_magic(ll_walker_t *w, PyObject *node, PyObject *func)
{
    if (!ll_ast_is(func, ll_ast.t_Attribute) || !ll_walk_is_get_ipython(func))
        return false;
    const char *method = ll_ast_str(func, ll_ast.a_attr);
    if (!method || !ll_magic_is_call(method)) {
        ll_walk_opaque(w);
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
        ll_walk_opaque(w);
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
static void s_call_args(ll_walker_t *w, PyObject *node, PyObject *func)
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
                    ll_walk_emit(w, LL_EV_ARG, 0, id, -1, false);
                    any = true;
                }
            } else if (ll_ast_is(v, ll_ast.t_Lambda)) {
                ll_walk_emit(w, LL_EV_ARG, 1, NULL, -1, false);
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
            ll_walk_emit(w, LL_EV_PASS, 0, id, -1, false);
        return;
    }
    PyObject *recv = ll_ast_is(func, ll_ast.t_Attribute) ? ll_ast_get(func, ll_ast.a_value) : NULL;
    const char *base = recv ? ll_walk_base_name(recv) : NULL;
    if (base && strcmp(base, "get_ipython") != 0)
        ll_walk_emit(w, LL_EV_PASS, 1, base, -1, false);
    Py_XDECREF(recv);
}

void ll_walk_call(ll_walker_t *w, PyObject *node)
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
            ll_walk_opaque(w);
    }
    ll_walk_generic(w, node);
    if (w->scope->immediate && w->group < 0 && w->class_group < 0)
        s_call_args(w, node, func);
    Py_XDECREF(func);
}

/* Parse CODE and walk its statements here, as cell code or (timeit) as the
 * body of a function that runs now.  Unparseable code makes it opaque. */
void ll_walk_code(ll_walker_t *w, const char *code, bool as_function)
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
        ll_walk_opaque(w);
        return;
    }
    PyObject *body = ll_ast_get(tree, ll_ast.a_body);
    if (as_function) {
        ll_scope_t sc;
        ll_scope_init(&sc, LL_SCOPE_FUNC, w->scope, w->scope->immediate);
        ll_walk_scan_list(w, body, &sc, false);
        ll_scope_t *saved = w->scope;
        w->scope = &sc;
        ll_walk_body(w, body);
        w->scope = saved;
        ll_scope_free(&sc);
    } else
        ll_walk_body(w, body);
    Py_XDECREF(body);
    Py_DECREF(tree);
}
