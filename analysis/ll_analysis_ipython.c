/* ll_analysis_ipython: IPython's input transformation for the cell
 * analysis: %magics, !shell, x?, `x = !cmd`, leading indentation.
 * Runs with the GIL held, on the thread that analyses (see ll_analysis.h).
 *
 * IPython's TransformerManager is the authority on what a magic line means,
 * but its whole-cell loop re-tokenizes the cell once per escaped line
 * (1000 line magics: minutes).  So only a cell magic (first line %%) is
 * handed to it whole; otherwise a small C lexer finds the logical lines
 * (outside strings, brackets and backslash continuations) that may hold an
 * escape, and each such line alone goes through IPython and is spliced back
 * with its indentation, keeping line numbers.  Cells without any candidate
 * line never touch Python here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "analysis/ll_analysis_internal.h"
#include "base/ll_log.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static PyObject *s_transformer;   /* IPython TransformerManager, on demand */
static bool s_transformer_failed; /* IPython could not be imported */

void ll_analysis_ipython_shutdown(void)
{
    Py_CLEAR(s_transformer);
    s_transformer_failed = false;
}

/* Whether one line (LINE..END, no newline) may hold IPython syntax: it
 * starts with % ! ? (or the autocall escapes / ; ,), ends in ?, or is
 * `x = !cmd` / `x = %magic`.  Cheap and generous: a false positive costs one
 * transform call on that line, which returns it unchanged. */
/* Where a comment starts on the line (outside quotes), or END. */
static const char *s_comment(const char *p, const char *end)
{
    char quote = 0;
    for (; p < end; p++) {
        if (quote) {
            if (*p == '\\')
                p++;
            else if (*p == quote)
                quote = 0;
        } else if (*p == '\'' || *p == '"')
            quote = *p;
        else if (*p == '#')
            return p;
    }
    return end;
}

static bool s_line_needs(const char *line, const char *end)
{
    while (line < end && (*line == ' ' || *line == '\t'))
        line++;
    if (line < end && strchr("%!?/;,", *line))
        return true;
    /* `obj?` asks for help; a question in a comment does not. */
    const char *last = s_comment(line, end);
    while (last > line && isspace((unsigned char) last[-1]))
        last--;
    if (last > line && last[-1] == '?')
        return true;
    for (const char *q = line; q < end; q++) {
        if (*q != '=' || (q > line && strchr("=!<>+-*/%&|^@:~", q[-1])))
            continue;
        const char *r = q + 1;
        if (r < end && *r == '=')
            continue;
        while (r < end && (*r == ' ' || *r == '\t'))
            r++;
        if (r < end && (*r == '!' || *r == '%'))
            return true;
    }
    return false;
}

static bool s_needs_transform(const char *src)
{
    for (const char *p = src; *p;) {
        const char *end = strchr(p, '\n');
        if (!end)
            end = p + strlen(p);
        if (s_line_needs(p, end))
            return true;
        p = *end ? end + 1 : end;
    }
    return false;
}

/* Where a line starts, as far as Python's tokenizer is concerned: inside a
 * string, inside brackets, or after a backslash continuation, a line is not
 * a logical line and IPython's escapes do not apply there. */
typedef struct {
    char quote;  /* open string's quote character, or 0 */
    bool triple; /* the open string is triple-quoted */
    int depth;   /* open brackets */
    bool cont;   /* the previous line ended with a backslash */
} s_lex_t;

static void s_lex_line(s_lex_t *lx, const char *p, const char *end)
{
    bool backslash_end = false;
    for (; p < end; p++) {
        char c = *p;
        if (lx->quote) {
            if (c == '\\') {
                if (p + 1 == end)
                    backslash_end = true;
                p++;
            } else if (lx->triple && c == lx->quote && end - p >= 3 && p[1] == c && p[2] == c) {
                lx->quote = 0;
                p += 2;
            } else if (!lx->triple && c == lx->quote)
                lx->quote = 0;
            continue;
        }
        if (c == '#')
            break;
        if (c == '\'' || c == '"') {
            lx->quote = c;
            lx->triple = end - p >= 3 && p[1] == c && p[2] == c;
            if (lx->triple)
                p += 2;
        } else if (c == '(' || c == '[' || c == '{')
            lx->depth++;
        else if ((c == ')' || c == ']' || c == '}') && lx->depth > 0)
            lx->depth--;
        else if (c == '\\' && p + 1 == end)
            backslash_end = true;
    }
    if (lx->quote && !lx->triple && !backslash_end)
        lx->quote = 0; /* unterminated: a syntax error, let Python say so */
    lx->cont = backslash_end && !lx->quote;
}

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
} s_buf_t;

static void s_buf_add(s_buf_t *b, const char *p, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = true;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, p, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

/* IPython's input transformation, applied the cheap way: a cell magic (a
 * first line `%%name`) is one transformation of the whole cell; otherwise
 * only the logical lines that may hold escapes are handed to IPython, one
 * at a time, and spliced back with their indentation.  (IPython's own
 * whole-cell loop re-tokenizes the cell once per escaped line: 1000 line
 * magics take minutes.)  Line numbers are kept.  Returns a malloc'd cell,
 * or NULL when nothing needed changing; *WHOLE says IPython was used on
 * the whole cell. */
/* IPython's leading_indent: when the first line is indented, that prefix
 * is removed from every line that starts with it.  In place. */
void ll_analysis_dedent(char *src)
{
    const char *first = src;
    while (*first == '\n' || *first == '\r')
        first++;
    size_t n = strspn(first, " \t");
    if (n == 0 || first[n] == '\0' || first[n] == '\n')
        return;
    char prefix[256];
    if (n >= sizeof prefix)
        return;
    memcpy(prefix, first, n);
    char *out = src;
    for (char *p = src; *p;) {
        if (strncmp(p, prefix, n) == 0)
            p += n;
        while (*p && *p != '\n')
            *out++ = *p++;
        if (*p)
            *out++ = *p++;
    }
    *out = '\0';
}

char *ll_analysis_prepare(const char *src, bool *whole)
{
    *whole = false;
    const char *first = src;
    while (*first) {
        const char *e = strchr(first, '\n');
        size_t n = e ? (size_t) (e - first) : strlen(first);
        size_t ws = strspn(first, " \t\r");
        if (ws < n)
            break;
        first = e ? e + 1 : first + n;
    }
    first += strspn(first, " \t");
    if (first[0] == '%' && first[1] == '%') {
        *whole = true;
        return ll_analysis_transform(src);
    }
    if (!s_needs_transform(src))
        return NULL;
    s_buf_t out = {0};
    s_lex_t lx = {0};
    bool changed = false;
    for (const char *p = src; *p;) {
        const char *end = strchr(p, '\n');
        if (!end)
            end = p + strlen(p);
        bool logical = !lx.quote && lx.depth == 0 && !lx.cont;
        if (!logical || !s_line_needs(p, end)) {
            s_lex_line(&lx, p, end);
            s_buf_add(&out, p, (size_t) (end - p) + (*end ? 1 : 0));
            p = *end ? end + 1 : end;
            continue;
        }
        /* the escaped line and its backslash continuations */
        const char *chunk_end = end;
        int lines = 1;
        while (chunk_end > p && chunk_end[-1] == '\\' && *chunk_end) {
            const char *next = strchr(chunk_end + 1, '\n');
            chunk_end = next ? next : chunk_end + 1 + strlen(chunk_end + 1);
            lines++;
        }
        size_t indent = strspn(p, " \t");
        size_t n = (size_t) (chunk_end - p) - indent;
        char *chunk = malloc(n + 2);
        if (!chunk) {
            free(out.buf);
            return NULL;
        }
        memcpy(chunk, p + indent, n);
        chunk[n] = '\n';
        chunk[n + 1] = '\0';
        char *t = ll_analysis_transform(chunk);
        s_buf_add(&out, p, indent);
        if (t) {
            size_t tn = strlen(t);
            while (tn && t[tn - 1] == '\n')
                tn--;
            int tl = 1;
            for (size_t i = 0; i < tn; i++)
                tl += t[i] == '\n';
            s_buf_add(&out, t, tn);
            for (; tl < lines; tl++)
                s_buf_add(&out, "\n", 1);
            changed |= strcmp(t, chunk) != 0;
        } else
            s_buf_add(&out, chunk, n);
        free(t);
        free(chunk);
        if (*chunk_end)
            s_buf_add(&out, "\n", 1);
        p = *chunk_end ? chunk_end + 1 : chunk_end;
        lx.cont = false;
    }
    if (out.oom || !changed) {
        free(out.buf);
        return NULL;
    }
    return out.buf;
}

/* The running IPython shell's own transformer manager (in the kernel: the
 * one that will transform the cell for execution, with any transformer an
 * extension registered), as a new reference; NULL outside a shell. */
static PyObject *s_shell_manager(void)
{
    PyObject *name = PyUnicode_FromString("IPython");
    PyObject *ipy = name ? PyImport_GetModule(name) : NULL; /* never imports */
    Py_XDECREF(name);
    PyObject *shell = ipy ? PyObject_CallMethod(ipy, "get_ipython", NULL) : NULL;
    Py_XDECREF(ipy);
    PyObject *mgr = shell && shell != Py_None
                        ? PyObject_GetAttrString(shell, "input_transformer_manager")
                        : NULL;
    Py_XDECREF(shell);
    PyErr_Clear();
    return mgr;
}

char *ll_analysis_transform(const char *src)
{
    PyObject *shell_mgr = s_shell_manager();
    if (shell_mgr) {
        PyObject *res = PyObject_CallMethod(shell_mgr, "transform_cell", "s", src);
        Py_DECREF(shell_mgr);
        const char *out = res && PyUnicode_Check(res) ? PyUnicode_AsUTF8(res) : NULL;
        char *copy = out ? strdup(out) : NULL;
        Py_XDECREF(res);
        PyErr_Clear();
        if (copy)
            return copy;
    }
    if (!s_transformer && !s_transformer_failed) {
        PyObject *mod = PyImport_ImportModule("IPython.core.inputtransformer2");
        PyObject *cls = mod ? PyObject_GetAttrString(mod, "TransformerManager") : NULL;
        s_transformer = cls ? PyObject_CallNoArgs(cls) : NULL;
        Py_XDECREF(cls);
        Py_XDECREF(mod);
        if (!s_transformer) {
            PyErr_Clear();
            s_transformer_failed = true;
            ll_warn("analysis", "IPython's input transformer is unavailable: "
                                "magics are not understood");
        }
    }
    if (!s_transformer)
        return NULL;
    PyObject *res = PyObject_CallMethod(s_transformer, "transform_cell", "s", src);
    const char *out = res && PyUnicode_Check(res) ? PyUnicode_AsUTF8(res) : NULL;
    char *copy = out ? strdup(out) : NULL;
    Py_XDECREF(res);
    PyErr_Clear();
    return copy;
}
