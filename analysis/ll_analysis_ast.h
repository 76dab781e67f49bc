/* ll_analysis_ast: the Python objects the cell analysis caches once (issue
 * 3): the AST node types it compares by pointer, the field names it reads
 * as interned strings, each node type's _fields tuple, the builtin names.
 * Private to analysis/: the files that read the AST include it, first (it
 * includes Python.h).
 *
 * Everything here runs with the GIL held, on the thread that analyses (the
 * gateway's shell thread, or the `looseleaf analyze` CLI).  ll_analysis_init
 * fills the cache (idempotent) and ll_analysis_shutdown empties it before
 * Py_Finalize.  The accessors below are inline: reading a node's field is
 * the walk's hottest operation. */
#ifndef LL_ANALYSIS_AST_H
#define LL_ANALYSIS_AST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>

/* Node types we treat specially; all others are walked field by field. */
/* clang-format off */
#define LL_AST_TYPES(X)                                                        \
    X(AST) X(Module) X(FunctionDef) X(AsyncFunctionDef) X(ClassDef) X(Lambda)  \
    X(ListComp) X(SetComp) X(DictComp) X(GeneratorExp) X(Name) X(Load)         \
    X(Store) X(Del) X(Assign) X(AnnAssign) X(AugAssign) X(NamedExpr) X(For)    \
    X(AsyncFor) X(While) X(If) X(With) X(AsyncWith) X(Try) X(TryStar)          \
    X(ExceptHandler) X(Match) X(MatchAs) X(MatchStar) X(MatchMapping)          \
    X(Import) X(ImportFrom) X(Global) X(Nonlocal) X(Delete) X(Expr) X(Call)    \
    X(Attribute) X(Subscript) X(Starred) X(Constant) X(arguments)

#define LL_AST_ATTRS(X)                                                        \
    X(body) X(orelse) X(finalbody) X(handlers) X(name) X(names) X(asname)      \
    X(module) X(level) X(id) X(ctx) X(targets) X(target) X(value) X(iter)      \
    X(ifs) X(generators) X(elt) X(key) X(test) X(items) X(context_expr)        \
    X(optional_vars) X(type) X(args) X(posonlyargs) X(vararg) X(kwonlyargs)    \
    X(kwarg) X(arg) X(annotation) X(returns) X(decorator_list) X(bases)        \
    X(keywords) X(func) X(attr) X(slice) X(cases) X(pattern) X(guard)          \
    X(subject) X(rest) X(lineno) X(msg) X(_fields)
/* clang-format on */

/* The cache: t_X is the type ast.X, a_x the interned attribute name "x". */
typedef struct {
#define X(n) PyObject *t_##n;
    LL_AST_TYPES(X)
#undef X
#define X(n) PyObject *a_##n;
    LL_AST_ATTRS(X)
#undef X
    bool ready; /* set by ll_analysis_init, cleared by ll_analysis_shutdown */
} ll_ast_t;

extern ll_ast_t ll_ast;

/* NODE's type's _fields (a tuple of str, borrowed from the cache), or NULL. */
PyObject *ll_ast_fields(PyObject *node);

/* A new reference to NODE.ATTR, or NULL (no exception left set).  AST
 * nodes keep their fields in their instance dict, and ATTR is an interned
 * string with its hash cached, so one dict lookup replaces the generic
 * attribute protocol (type MRO walk first): the walk's hottest call. */
static inline PyObject *ll_ast_get(PyObject *node, PyObject *attr)
{
    PyObject **dictp = _PyObject_GetDictPtr(node);
    if (dictp && *dictp) {
        PyObject *v = PyDict_GetItemWithError(*dictp, attr);
        if (v) {
            Py_INCREF(v);
            return v;
        }
        PyErr_Clear();
    }
    PyObject *v = PyObject_GetAttr(node, attr);
    if (!v)
        PyErr_Clear();
    return v;
}

static inline bool ll_ast_is(PyObject *node, PyObject *type)
{
    return node && (PyObject *) Py_TYPE(node) == type;
}

static inline bool ll_ast_node(PyObject *obj)
{
    return obj && PyObject_TypeCheck(obj, (PyTypeObject *) ll_ast.t_AST);
}

/* NODE.ATTR as a UTF-8 string owned by the AST, or NULL. */
static inline const char *ll_ast_str(PyObject *node, PyObject *attr)
{
    PyObject *v = ll_ast_get(node, attr);
    if (!v)
        return NULL;
    const char *s = NULL;
    if (PyUnicode_Check(v)) {
        s = PyUnicode_AsUTF8(v);
        if (!s)
            PyErr_Clear();
    }
    /* The AST keeps the str alive while the walk runs. */
    Py_DECREF(v);
    return s;
}

/* Whether NODE.ATTR is a non-empty list. */
static inline bool ll_ast_has_items(PyObject *node, PyObject *attr)
{
    PyObject *v = ll_ast_get(node, attr);
    bool yes = v && PyList_Check(v) && PyList_GET_SIZE(v) > 0;
    Py_XDECREF(v);
    return yes;
}

#endif
