/* ll_analysis: the analysis of one cell: ll_analysis_new turns a
 * cell's source into its facts, and the object answers for them
 * (accessors, JSON).  Runs on whichever thread calls it, with the GIL held
 * (the gateway's shell thread, or the CLI's main thread); the accessors do
 * not need the GIL.
 *
 * Python is only used to parse.  %%gpu / %%cpu on the first line force the
 * label and are removed before anything else sees the cell; then the cell
 * goes through IPython's input transformation (ll_analysis_ipython.c: only
 * the lines that need it, cheaply), is compiled with PyCF_ONLY_AST, and the
 * ast.Module is walked in C (ll_analysis_walk*.c) into events; the facts
 * callers see (defs, mutates, deletes, imports, functions) are derived from
 * those, and reads by replaying them against an empty session
 * (ll_analysis_replay.c), on first use.
 *
 * Bad input never crashes: NUL bytes and undecodable text are errors, so is
 * a parse failure (CPython bounds nesting: 200 brackets, 100 indents,
 * RecursionError for absurdly deep expressions), and a tree too deep for
 * the walker is an error with no facts. */
#include "analysis/ll_analysis_walk.h"
#include "analysis/ll_analysis.h"
#include "base/ll_log.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building an analysis ---------------------------------------------- */

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
int ll_analysis_facts(ll_analysis_t *a)
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

    int walked = ll_walk_cell(a, tree);
    Py_DECREF(tree);
    if (walked < 0 || (walked == 0 && ll_analysis_facts(a) != 0)) {
        ll_analysis_destroy(&a);
        return NULL;
    }
    if (walked > 0) {
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

/* ---- accessors --------------------------------------------------------- */

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
