/* ll_analysis_internal: what the parts of the cell analysis share and nobody
 * else should see: an insertion-ordered set of owned strings (names, module
 * paths), the pure pieces (module lists, scope rules, the magic table), the
 * per-cell event stream the AST walker produces and the cell object that
 * holds it, and the entry points of the files that touch Python.  Runs
 * wherever the analysis runs (the gateway's shell thread, or the
 * `looseleaf analyze` CLI); nothing declared here needs Python types (the
 * AST-reading files have ll_analysis_ast.h and ll_analysis_walk.h).
 *
 * The event stream is the heart of the design.  The walker
 * (ll_analysis_walk*.c) turns a cell's AST into an ordered list of
 * module-level events: LOAD of a global name, BIND of a top-level name
 * (with its kind: value, import, function, class), MUTATE, DEL, UNIT (a new
 * top-level simple statement).
 * Function and class bodies are not executed at definition, so their global
 * reads are not events but a "group" attached to the BIND.  The replay
 * (ll_analysis_replay.c) runs the events against the recorded cells of a
 * session (ll_analysis_session.c): the same replay computes a draft cell's
 * closures, records an executed cell and gives a cell's own reads, so
 * there is one notion of what a cell reads. */
#ifndef LL_ANALYSIS_INTERNAL_H
#define LL_ANALYSIS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- ll_names_t: insertion-ordered set of owned strings ---------------- */
typedef struct {
    char **items;    /* owned copies, in insertion order */
    size_t count;    /* number of items */
    size_t cap;      /* allocated slots in items */
    uint32_t *index; /* open-addressing table of item index + 1 (0 = empty) */
    size_t icap;     /* slots in index, a power of two (0 = no table yet) */
    bool borrow;     /* items are borrowed, not copied: the caller keeps the
                         strings alive as long as the set (replay scratch) */
} ll_names_t;

/* Add NAME (copied) unless present.  Returns 1 if added, 0 if present, -1 on
 * allocation failure. */
int ll_names_add(ll_names_t *self, const char *name);
bool ll_names_has(const ll_names_t *self, const char *name);
/* Add every item of OTHER.  0 or -1. */
int ll_names_union(ll_names_t *self, const ll_names_t *other);
void ll_names_clear(ll_names_t *self);
/* Empty the set but keep its memory for reuse. */
void ll_names_reset(ll_names_t *self);
/* Index of NAME or -1. */
long ll_names_find(const ll_names_t *self, const char *name);
/* Remove NAME if present (keeps the order of the others). */
void ll_names_remove(ll_names_t *self, const char *name);
/* A newly allocated array of the items sorted by strcmp, which the caller
 * frees (the strings stay SELF's, valid while SELF is unchanged); NULL when
 * empty or out of memory. */
const char **ll_names_sorted(const ll_names_t *self);

/* ---- module lists (ll_analysis_modules.c) ------------------------------ */

/* Top-level package of a module path ("a" of "a.b.c"); NULL for relative
 * imports, __future__, and a package name that does not fit BUFLEN.  Writes
 * into BUF and returns it. */
const char *ll_analysis_package_of(const char *path, char *buf, size_t buflen);
/* ll_analysis_gpu_add for each entry of LIST, separated by commas,
 * semicolons, colons or blanks (LOOSELEAF_GPU_PACKAGES).  0, or -1 when out
 * of memory. */
int ll_analysis_gpu_add_list(const char *list);

/* ---- scopes and conditional blocks (ll_analysis_scope.c; pure) --------- */

typedef enum {
    LL_SCOPE_MODULE = 0, /* the cell's top level */
    LL_SCOPE_FUNC,       /* a function, lambda or %timeit body */
    LL_SCOPE_CLASS,      /* a class body */
    LL_SCOPE_COMP,       /* a comprehension or generator expression */
} ll_scope_kind_t;

typedef struct ll_scope_t {
    ll_scope_kind_t kind;
    struct ll_scope_t *parent; /* enclosing scope, NULL for the module */
    bool immediate;            /* runs now: its global reads are LOAD events */
    ll_names_t locals;         /* names bound in the scope */
    ll_names_t globals;        /* declared global */
    ll_names_t nonlocals;      /* declared nonlocal */
} ll_scope_t;

/* Where binding a name in a scope lands. */
typedef enum {
    LL_SCOPE_BIND_LOCAL = 0, /* a local of the function, class or comprehension */
    LL_SCOPE_BIND_MODULE,    /* a top-level binding of the cell */
    LL_SCOPE_BIND_GLOBAL,    /* a module name bound through a `global` declaration */
} ll_scope_bind_t;

/* An empty scope of KIND inside PARENT; ll_scope_free frees its sets. */
void ll_scope_init(ll_scope_t *sc, ll_scope_kind_t kind, ll_scope_t *parent, bool immediate);
void ll_scope_free(ll_scope_t *sc);
/* Whether NAME read in SC refers to the module namespace. */
bool ll_scope_resolves_global(const ll_scope_t *sc, const char *name);
/* Where binding NAME in SC lands. */
ll_scope_bind_t ll_scope_binding(const ll_scope_t *sc, const char *name);
/* The scope a walrus in SC binds in: the nearest that is not a
 * comprehension. */
ll_scope_t *ll_scope_walrus_target(ll_scope_t *sc);

/* The tree of a cell's conditional blocks (branch, loop body, try body,
 * handler, case): block 0 is the cell itself, every other block has a
 * parent.  A binding made in a block is certainly done for code in any
 * block it encloses. */
typedef struct {
    int *parent;  /* parent[b]: the block enclosing b (-1 for block 0) */
    size_t count; /* blocks made, block 0 included */
    size_t cap;   /* allocated slots in parent */
} ll_blocks_t;

/* A new block inside PARENT (the first call also makes block 0): its
 * number, or -1 when out of memory. */
int ll_blocks_add(ll_blocks_t *self, int parent);
/* Whether block OUTER is INNER or encloses it.  Block -1 encloses nothing
 * and is enclosed by nothing. */
bool ll_blocks_encloses(const ll_blocks_t *self, int outer, int inner);
void ll_blocks_free(ll_blocks_t *self);

/* ---- IPython magics (ll_analysis_magic.c; pure) ------------------------ */

typedef enum {
    LL_MAGIC_HARMLESS = 0, /* no effect on the namespace; $name/{expr} in its line are read */
    LL_MAGIC_CODE,         /* runs its line (after options) or body as cell code: %time, %prun */
    LL_MAGIC_TIMEIT,       /* the same as a function body (assignments stay local): %timeit */
    LL_MAGIC_EXPR,         /* reads the object its line names: x? (pinfo) */
    LL_MAGIC_CAPTURE,      /* %%capture: its body is one unit; its first word is bound */
    LL_MAGIC_SCRIPT,       /* %%bash & co: the names after --out/--err/--proc are bound */
    LL_MAGIC_OPAQUE,       /* effect unknown (%run, %reset, %who, an unknown magic) */
    LL_MAGIC_SHELL,        /* !cmd (system/getoutput): $name/{expr} in the command are read */
} ll_magic_kind_t;

typedef struct {
    const char *name;     /* without % */
    ll_magic_kind_t kind; /* never LL_MAGIC_SHELL */
    const char *argopts;  /* single-letter options that take a value ("nrp") */
} ll_magic_t;

/* The table's entry for magic NAME, or NULL when it is not known. */
const ll_magic_t *ll_magic_find(const char *name);
/* Whether get_ipython().METHOD(...) is a magic or shell call the analysis
 * reads (run_line_magic, run_cell_magic, system, getoutput); any other use
 * of get_ipython() makes the cell opaque. */
bool ll_magic_is_call(const char *method);
/* What get_ipython().METHOD(NAME, ...) with ARGC constant string arguments
 * does: LL_MAGIC_SHELL for system/getoutput; LL_MAGIC_OPAQUE for too few
 * arguments, an unknown magic or one of unknown effect; else the magic's
 * kind, with *MAGIC set to its entry (NULL otherwise). */
ll_magic_kind_t ll_magic_classify(const char *method, int argc, const char *name,
                                  const ll_magic_t **magic);
/* LINE after its leading options (-n 10 -r3 ...); ARGOPTS lists the options
 * that take a value.  Points into LINE. */
const char *ll_magic_skip_options(const char *line, const char *argopts);
/* Call BIND(CTX, name) for each name a magic's LINE binds: the word after
 * --out, --err or --proc (script magics), or the first word that is not an
 * option (%%capture, CAPTURE true).  Stops when BIND returns non-zero: -1,
 * else 0.  The names live only during the call. */
int ll_magic_bound_names(const char *line, bool capture, int (*bind)(void *ctx, const char *name),
                         void *ctx);
/* Scan TEXT the way IPython expands a shell command or magic line: NAME_CB
 * for each $name ($$ is a literal $), EXPR_CB for the text inside each
 * {expr} (balanced braces; {{ is literal; an unclosed brace ends the scan).
 * Stops when a callback returns non-zero: -1, else 0. */
int ll_magic_expand(const char *text, int (*name_cb)(void *ctx, const char *name),
                    int (*expr_cb)(void *ctx, const char *expr, size_t len), void *ctx);
/* The object a help line names ("np.zeros??  " -> "np.zeros"), into BUF. */
void ll_magic_object(const char *line, char *buf, size_t buflen);

/* ---- events ------------------------------------------------------------ */
typedef enum {
    LL_EV_UNIT = 0, /* start of a top-level statement (or compound header) */
    LL_EV_LOAD,     /* a global name is read at module level, now */
    LL_EV_BIND,     /* a top-level name is bound */
    LL_EV_MUTATE,   /* a top-level name's object may be changed in place */
    LL_EV_DEL,      /* a top-level name is deleted */
    LL_EV_DEFER,    /* a lambda's body globals become deps of this unit */
    LL_EV_ARG,      /* a call's argument: a name (kind 0) or a lambda (1) */
    LL_EV_PASS,     /* the call those ARGs went to: a function's name
                         (kind 0) or a method's receiver (kind 1) */
    LL_EV_SETTLE,   /* every branch of an if/else bound the name: the
                         binding from before the statement is gone */
} ll_ev_type_t;

typedef enum {
    LL_BK_VALUE = 0, /* any object built by running code */
    LL_BK_IMPORT,    /* a module or a name taken from one by an import */
    LL_BK_FUNC,      /* def */
    LL_BK_CLASS,     /* class */
    LL_BK_STAR,      /* from m import * (name is "*m") */
} ll_bind_kind_t;

typedef struct {
    uint8_t type;     /* ll_ev_type_t */
    uint8_t kind;     /* ll_bind_kind_t, for BIND */
    bool cond;        /* inside a branch, loop, try or handler: may not run */
    bool direct;      /* LOAD written in the cell (not added by the walker) */
    int block;        /* innermost conditional block (0: the cell itself) */
    const char *name; /* interned in the analysis's name pool */
    int ref;          /* BIND FUNC/CLASS, DEFER: group index; BIND IMPORT/STAR:
                         import index; else -1 */
} ll_ev_t;

/* The deferred body of a function, class (its methods) or lambda. */
typedef struct {
    const char *name;   /* bound name, NULL for a lambda */
    int kind;           /* LL_BK_FUNC, LL_BK_CLASS, or LL_BK_VALUE (lambda) */
    ll_names_t globals; /* global names read by the body (any depth) */
    ll_names_t gwrites; /* names the body assigns after `global` */
    ll_names_t paths;   /* module paths the body imports itself */
    ll_names_t shown;   /* globals without builtins, for callers */
    bool opaque;        /* the body uses exec/eval/globals()/... */
    bool kernel_bound;  /* the body uses get_ipython().kernel */
} ll_group_t;

/* One name bound by an import statement. */
typedef struct {
    const char *bound; /* name bound in the namespace ("*m" for a star) */
    char *module;      /* module imported ("a.b.c"), relative: ".x" */
    char *attr;        /* from-import: the name taken, else NULL */
    char *path;        /* dotted path of the bound object: module[.attr] */
    char *stmt;        /* the statement that re-creates the binding */
} ll_import_t;

/* ---- the cell object (ll_analysis.c builds it, the walker fills it) ---- */

/* What ll_analysis_new finds in one cell.  The walker (ll_analysis_walk*.c)
 * appends events, groups, imports and blocks; ll_analysis.c derives the
 * facts; the replay reads the events.  Private: outside analysis/ the
 * object is opaque. */
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

typedef struct ll_analysis_t ll_analysis_t;

/* Derive the facts callers see (defs, mutates, deletes, functions,
 * packages, and the names the cell may look up) from the events; what
 * ll_analysis_new does after the walk (and a self-test after scripting
 * events by hand).  0, or -1 when out of memory.  In ll_analysis.c. */
int ll_analysis_facts(ll_analysis_t *self);

/* Accessors for the replay: the cell's event stream.  Inline, so the
 * replay reads the cell without depending on ll_analysis.c. */
static inline const ll_ev_t *ll_analysis_events(const ll_analysis_t *self, size_t *count)
{
    *count = self->nev;
    return self->ev;
}
static inline const ll_group_t *ll_analysis_group(const ll_analysis_t *self, int index)
{
    return index >= 0 && (size_t) index < self->ngroups ? &self->groups[index] : NULL;
}
static inline const ll_import_t *ll_analysis_import(const ll_analysis_t *self, int index)
{
    return index >= 0 && (size_t) index < self->nimports ? &self->imports[index] : NULL;
}
/* Whether the cell's own top-level code is opaque / uses get_ipython().kernel. */
static inline bool ll_analysis_opaque_flag(const ll_analysis_t *self)
{
    return self->opaque;
}
static inline bool ll_analysis_kernel_bound_flag(const ll_analysis_t *self)
{
    return self->kernel_bound;
}
/* Whether the cell may look NAME up after binding it: a LOAD event or a
 * body global of one of its functions or lambdas. */
static inline bool ll_analysis_may_load(const ll_analysis_t *self, const char *name)
{
    return ll_names_has(&self->loaded, name);
}
/* Whether conditional block OUTER is INNER or encloses it: a binding made in
 * OUTER earlier in the cell is certainly done when code in INNER runs.
 * Block -1 encloses nothing. */
static inline bool ll_analysis_block_encloses(const ll_analysis_t *self, int outer, int inner)
{
    return ll_blocks_encloses(&self->blocks, outer, inner);
}

/* ---- the replay -------------------------------------------------------- */

/* Replay the cell against an empty session: add to READS the names it
 * reads from outside (ll_analysis_reads).  0 or -1 (out of memory).  In
 * ll_analysis_replay.c. */
int ll_analysis_compute_reads(const ll_analysis_t *cell, ll_names_t *reads);

/* ---- IPython input transformation (ll_analysis_ipython.c; GIL held) ---- */

/* IPython's leading_indent, in place: strip the first line's indentation
 * from every line that starts with it. */
void ll_analysis_dedent(char *src);
/* SRC with IPython syntax turned into Python, as a malloc'd string the
 * caller frees, or NULL when nothing needed changing (or IPython is
 * unavailable).  *WHOLE is set
 * when the whole cell went through IPython (a cell magic). */
char *ll_analysis_prepare(const char *src, bool *whole);
/* IPython's TransformerManager().transform_cell(SRC), malloc'd (the caller
 * frees it), or NULL. */
char *ll_analysis_transform(const char *src);
/* Drop the cached transformer (before Py_Finalize). */
void ll_analysis_ipython_shutdown(void);

/* ---- the AST cache (ll_analysis_ast.c) --------------------------------- */

/* Whether NAME is a Python builtin (the set is filled by ll_analysis_init)
 * or one of the names IPython puts in every namespace (_, _N, _iN, __x__,
 * In, Out, get_ipython, ...). */
bool ll_analysis_is_builtin(const char *name);

/* ---- self-tests of the pure parts (run by build/ll_selftest) ----------- */

int ll_analysis_modules_selftest(bool verbose); /* ll_analysis_modules.c */
int ll_analysis_magic_selftest(bool verbose);   /* ll_analysis_magic.c */
int ll_analysis_scope_selftest(bool verbose);   /* ll_analysis_scope.c */
int ll_analysis_session_selftest(bool verbose); /* ll_analysis_session.c: scripted cells */

#endif
