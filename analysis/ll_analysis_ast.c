/* ll_analysis_ast: the Python objects the cell analysis caches once, and
 * the set-up and tear-down of that cache (ll_analysis_init,
 * ll_analysis_shutdown); see ll_analysis_ast.h.  Runs with the GIL held on
 * the thread that analyses.  The builtin names are copied into a C set, so
 * sessions and closures answer ll_analysis_is_builtin without Python. */
#include "analysis/ll_analysis_ast.h"
#include "analysis/ll_analysis.h"
#include "analysis/ll_analysis_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ll_ast_t ll_ast;

/* Per-type field tuples for the generic walk, keyed by type pointer. */
#define LL_FIELD_SLOTS 512
static struct {
    PyTypeObject *type;
    PyObject *fields; /* tuple of str */
} s_fields[LL_FIELD_SLOTS];

PyObject *ll_ast_fields(PyObject *node)
{
    PyTypeObject *t = Py_TYPE(node);
    size_t slot = ((uintptr_t) t >> 4) & (LL_FIELD_SLOTS - 1);
    for (size_t n = 0; n < LL_FIELD_SLOTS; n++) {
        size_t i = (slot + n) & (LL_FIELD_SLOTS - 1);
        if (s_fields[i].type == t)
            return s_fields[i].fields;
        if (!s_fields[i].type) {
            PyObject *f = PyObject_GetAttr((PyObject *) t, ll_ast.a__fields);
            if (!f || !PyTuple_Check(f)) {
                PyErr_Clear();
                Py_XDECREF(f);
                return NULL;
            }
            Py_INCREF(t);
            s_fields[i].type = t;
            s_fields[i].fields = f;
            return f;
        }
    }
    return NULL;
}

static ll_names_t s_builtins; /* builtin names, so sessions need no GIL */

bool ll_analysis_is_builtin(const char *name)
{
    if (ll_names_has(&s_builtins, name))
        return true;
    /* IPython's own names: __name__ & co, _, __, ___, _N, _iN, _ih, ... */
    size_t n = strlen(name);
    if (n > 4 && name[0] == '_' && name[1] == '_' && name[n - 1] == '_' && name[n - 2] == '_')
        return true;
    if (strcmp(name, "_") == 0 || strcmp(name, "__") == 0 || strcmp(name, "___") == 0)
        return true;
    const char *p = name[0] == '_' ? name + 1 : NULL;
    if (p && (*p == 'i'))
        p++;
    if (p && *p) {
        while (isdigit((unsigned char) *p))
            p++;
        if (*p == '\0')
            return true;
    }
    return false;
}

int ll_analysis_init(char *err, size_t errlen)
{
    if (ll_ast.ready)
        return 0;
    if (!Py_IsInitialized()) {
        snprintf(err, errlen, "Python is not initialised");
        return -1;
    }
    PyObject *ast = PyImport_ImportModule("_ast");
    if (!ast)
        goto fail_python;
#define X(n)                                               \
    if (!(ll_ast.t_##n = PyObject_GetAttrString(ast, #n))) \
        goto fail_python;
    LL_AST_TYPES(X)
#undef X
    Py_DECREF(ast);
    ast = NULL;
#define X(n)                                              \
    if (!(ll_ast.a_##n = PyUnicode_InternFromString(#n))) \
        goto fail_python;
    LL_AST_ATTRS(X)
#undef X
    PyObject *bmod = PyImport_ImportModule("builtins");
    if (!bmod)
        goto fail_python;
    PyObject *bdict = PyModule_GetDict(bmod);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(bdict, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (k && ll_names_add(&s_builtins, k) < 0) {
            Py_DECREF(bmod);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    Py_DECREF(bmod);
    /* Names IPython puts in every namespace or in builtins while a cell runs. */
    const char *ipy[] = {"get_ipython", "display", "exit", "quit", "In",   "Out", "_ih",
                         "_oh",         "_dh",     "_i",   "_ii",  "_iii", NULL};
    for (const char **p = ipy; *p; p++)
        ll_names_add(&s_builtins, *p);
    const char *env = getenv("LOOSELEAF_GPU_PACKAGES");
    if (env && ll_analysis_gpu_add_list(env) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ll_ast.ready = true;
    return 0;

fail_python:
    Py_XDECREF(ast);
    {
        PyObject *type, *val, *tb;
        PyErr_Fetch(&type, &val, &tb);
        PyObject *str = val ? PyObject_Str(val) : NULL;
        const char *msg = str ? PyUnicode_AsUTF8(str) : NULL;
        snprintf(err, errlen, "cannot load the ast module: %s", msg ? msg : "unknown error");
        Py_XDECREF(str);
        Py_XDECREF(type);
        Py_XDECREF(val);
        Py_XDECREF(tb);
        PyErr_Clear();
    }
    return -1;
}

void ll_analysis_shutdown(void)
{
    if (!Py_IsInitialized())
        return;
#define X(n) Py_CLEAR(ll_ast.t_##n);
    LL_AST_TYPES(X)
#undef X
#define X(n) Py_CLEAR(ll_ast.a_##n);
    LL_AST_ATTRS(X)
#undef X
    ll_analysis_ipython_shutdown();
    for (size_t i = 0; i < LL_FIELD_SLOTS; i++) {
        if (s_fields[i].type) {
            Py_DECREF((PyObject *) s_fields[i].type);
            Py_CLEAR(s_fields[i].fields);
            s_fields[i].type = NULL;
        }
    }
    ll_names_clear(&s_builtins);
    ll_ast.ready = false;
}
