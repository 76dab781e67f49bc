/* ll_analysis_walk_call: how the AST walker reads a call:
 * IPython's magics and shell escapes (get_ipython().run_line_magic(...) and
 * friends, after IPython's input transformation), calls that defeat static
 * analysis (exec, eval, globals(), ...), and the arguments a call may keep
 * (register(f), reg.add(f): ARG/PASS events).  GIL held, on the thread that
 * analyses.  What a magic means is ll_analysis_magic.c's table; this file
 * does the Python part (parsing the code or expression a magic runs).
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
#include "analysis/ll_analysis_walk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
