/* ll_analysis: static analysis of notebook cells (DESIGN.md
 * mechanism 1).  For a cell's source it finds the names the cell binds and
 * reads, what it imports, and for each function or class it defines the
 * global names its body reads; a session of executed cells then yields a
 * candidate cell's state closure (the live variables it needs), its import
 * closure (the packages it needs) and its CPU/GPU label.
 *
 * Runs on the gateway's shell thread (or in the `looseleaf analyze` CLI).
 * Every call that takes source text (ll_analysis_init, ll_analysis_new) needs
 * Python initialised and the GIL held by the caller: cells are parsed by
 * CPython's own parser (ast, via Py_CompileStringExFlags) after IPython's
 * input transformation, so the whole 3.11 grammar and IPython's magics are
 * understood.  Sessions and closures never touch Python.  Not thread-safe:
 * use one thread, or a lock around all calls.
 *
 * Semantics, in short (the long version is at the top of ll_analysis_walk.c
 * and ll_analysis_replay.c; analysis/API.md maps the files):
 * - reads: global names the cell's top-level code may read before binding
 *   them itself, including what comprehensions, lambdas, class bodies,
 *   decorators and default arguments read, and the globals of the cell's own
 *   functions that it calls or passes on.
 * - state closure: the live variables (bound by executed cells, excluding
 *   import-bound names) the cell may read when it runs in a fresh namespace:
 *   its reads, plus transitively the globals read by the functions and
 *   classes it references, plus the globals of functions a referenced value
 *   was built with (a Trainer holding compute_metrics=f needs f's globals).
 * - import closure: top-level packages of the import-bound names it reaches
 *   and of the modules the variables in its state closure were built with,
 *   plus the cell's own imports.  effective imports: the same without the
 *   cell's own import statements that it never uses; GPU label when those
 *   contain a GPU framework (ll_analysis_gpu_add, LOOSELEAF_GPU_PACKAGES).
 * - opaque: exec/eval/globals()/locals()/vars()/dir(), star imports, %run,
 *   unknown magics, get_ipython() used beyond its magic calls: the closure
 *   is then every live variable and every live import (and the label GPU
 *   when any of those modules is a GPU one).
 * A function or lambda passed to a call may be kept by it: `register(f)`
 * marks the variables register's body reads as holding f, `reg.add(f)`
 * marks reg.
 * Known limits (static analysis cannot see them): a function kept by a call
 * that received it indirectly (`register(wrap(f))`, or inside a value
 * passed along) or stored into a module attribute (`np.helper = f`) does
 * not pass its globals on; IPython's output history (_, _N, Out, In) is not
 * a variable of any closure. */
#ifndef LL_ANALYSIS_H
#define LL_ANALYSIS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ll_analysis_t ll_analysis_t;
typedef struct ll_analysis_session_t ll_analysis_session_t;
typedef struct ll_analysis_closure_t ll_analysis_closure_t;

/* A read-only list of strings owned by the object it came from, valid until
 * that object is destroyed (or, for a session, changed). */
typedef struct {
    const char *const *items;
    size_t count;
} ll_analysis_strs_t;

typedef enum {
    LL_ANALYSIS_CPU = 0,
    LL_ANALYSIS_GPU = 1,
} ll_analysis_label_t;

/* Cache the AST node types and the builtins; read LOOSELEAF_GPU_PACKAGES
 * (comma- or space-separated package names or dotted module paths) into the
 * GPU list.  GIL held.  Idempotent.  0, or -1 with a reason in ERR. */
int ll_analysis_init(char *err, size_t errlen);

/* Drop the cached Python objects (GIL held; before Py_Finalize). */
void ll_analysis_shutdown(void);

/* Add a package ("mylib") or module path ("mylib.cuda") to the GPU list. */
int ll_analysis_gpu_add(const char *package);

/* Whether a module path ("torch.nn", "numba.cuda.random") is a GPU one. */
bool ll_analysis_is_gpu_module(const char *path);

/* Whether a module path belongs to the kernel's comm machinery (comm,
 * ipykernel, ipywidgets): a cell using it runs in the kernel. */
bool ll_analysis_is_kernel_module(const char *path);

/* Analyse cell source CODE of LEN bytes (need not be NUL-terminated; the
 * caller keeps it).  A first line `%%gpu` or `%%cpu` forces the label and
 * is stripped.  Returns a new analysis the caller destroys
 * (ll_analysis_destroy); when the cell cannot be parsed the analysis
 * carries the error (ll_analysis_error) and no facts.  Calls ll_analysis_init if nobody
 * did.  NULL only when out of memory or Python is not initialised.  GIL
 * held. */
ll_analysis_t *ll_analysis_new(const char *code, size_t len);

/* Destroy and NULL *SELF_P; safe on NULL. */
void ll_analysis_destroy(ll_analysis_t **self_p);

/* NULL when the cell parsed; else why not ("SyntaxError: ... (line 3)"). */
const char *ll_analysis_error(const ll_analysis_t *self);

/* Top-level names the cell binds (possibly, e.g. in a branch), in order. */
ll_analysis_strs_t ll_analysis_defs(const ll_analysis_t *self);
/* Names read before the cell binds them (builtins left out), in order. */
ll_analysis_strs_t ll_analysis_reads(const ll_analysis_t *self);
/* Top-level names whose objects the cell may change in place (x.a = 1,
 * x[0] = 1, del x[0], x += 1, x.method(...) as a statement). */
ll_analysis_strs_t ll_analysis_mutates(const ll_analysis_t *self);
/* Top-level packages of the cell's own import statements. */
ll_analysis_strs_t ll_analysis_imports(const ll_analysis_t *self);

/* Functions and classes the cell defines at top level. */
size_t ll_analysis_function_count(const ll_analysis_t *self);
const char *ll_analysis_function_name(const ll_analysis_t *self, size_t i);
bool ll_analysis_function_is_class(const ll_analysis_t *self, size_t i);
ll_analysis_strs_t ll_analysis_function_globals(const ll_analysis_t *self, size_t i);

/* Whether the cell defeats static analysis (see above). */
bool ll_analysis_is_opaque(const ll_analysis_t *self);

/* -1 no `%%gpu`/`%%cpu` line, else the forced ll_analysis_label_t. */
int ll_analysis_forced_label(const ll_analysis_t *self);

/* The per-cell facts as a new JSON object (caller owns the reference):
 * error, forced_label, and for a cell that parsed defs, reads, mutates,
 * deletes (names it certainly deletes), packages, imports, functions,
 * opaque. */
json_t *ll_analysis_json(const ll_analysis_t *self);

/* ---- session ----------------------------------------------------------- */

/* An empty session (no cell executed yet), which the caller destroys;
 * NULL when out of memory. */
ll_analysis_session_t *ll_analysis_session_new(void);
/* Destroy and NULL *SELF_P; safe on NULL. */
void ll_analysis_session_destroy(ll_analysis_session_t **self_p);

/* Record that CELL has just executed (whether or not it raised): its
 * bindings replace earlier ones, its deletions end them.  CELL stays the
 * caller's; the session copies what it keeps.  A cell that did
 * not parse changed nothing and is skipped.  0, or -1 when out of memory. */
int ll_analysis_session_record(ll_analysis_session_t *self, const ll_analysis_t *cell);

/* What the namespace showed the last recorded cell did beyond what its
 * analysis saw (exec, %run, globals()[k] = v, setattr on __main__): NAME
 * is now bound.  With STMT (and PATH), to a module, which STMT ("import
 * numpy as np2") re-creates; otherwise to an object built with module PATH
 * (NULL: none known) that looks up DEPS when used (a function's globals),
 * OPAQUE when using it defeats the analysis.  Replaces NAME's binding.  0,
 * or -1 (bad name, out of memory: the session is unchanged). */
int ll_analysis_session_bind(ll_analysis_session_t *self, const char *name, const char *path,
                             const char *stmt, ll_analysis_strs_t deps, bool opaque);
/* ... and NAME is no longer bound (`del globals()[k]`, `%reset`). */
void ll_analysis_session_unbind(ll_analysis_session_t *self, const char *name);

/* Number of cells recorded, and of live variables (bound by a recorded cell,
 * not deleted, not bound by an import). */
size_t ll_analysis_session_cells(const ll_analysis_session_t *self);
size_t ll_analysis_session_live_count(const ll_analysis_session_t *self);

/* The closures of CELL (analysed, not yet executed) if it ran now.  A new
 * object the caller destroys; NULL when out of memory or CELL did not
 * parse.  Does not change the session. */
ll_analysis_closure_t *ll_analysis_session_closure(ll_analysis_session_t *self,
                                                   const ll_analysis_t *cell);
/* Destroy and NULL *SELF_P; safe on NULL. */
void ll_analysis_closure_destroy(ll_analysis_closure_t **self_p);

/* The live variables the cell needs, sorted. */
ll_analysis_strs_t ll_analysis_closure_state(const ll_analysis_closure_t *self);
/* Top-level packages it needs, sorted. */
ll_analysis_strs_t ll_analysis_closure_imports(const ll_analysis_closure_t *self);
/* Import statements that re-create the import-bound names it reads, sorted
 * ("import numpy as np", "from transformers import Trainer"). */
ll_analysis_strs_t ll_analysis_closure_import_stmts(const ll_analysis_closure_t *self);
/* Names the cell may bind, rebind or change in place, sorted: its own
 * bindings, globals assigned by the functions it calls, the objects it
 * mutates (x.a = 1, x[0] = 1, x.append(...)); modules left out.  What a
 * worker must save afterwards (an opaque cell may change anything). */
ll_analysis_strs_t ll_analysis_closure_writes(const ll_analysis_closure_t *self);
/* Names the cell certainly deletes, sorted. */
ll_analysis_strs_t ll_analysis_closure_deletes(const ll_analysis_closure_t *self);
ll_analysis_label_t ll_analysis_closure_label(const ll_analysis_closure_t *self);
bool ll_analysis_closure_is_opaque(const ll_analysis_closure_t *self);
/* Whether the cell reaches comm machinery (ll_analysis_is_kernel_module, or
 * get_ipython().kernel), directly or through functions it may call: its
 * label is then CPU unless forced. */
bool ll_analysis_closure_is_kernel_bound(const ll_analysis_closure_t *self);
/* Live variables in the session at the time of the query. */
size_t ll_analysis_closure_live_count(const ll_analysis_closure_t *self);

/* The closures as a new JSON object (caller owns the reference):
 * state_closure, import_closure, effective_imports (packages reachable from
 * its statements), import_statements, writes, deletes, label, opaque,
 * kernel_bound, live. */
json_t *ll_analysis_closure_json(const ll_analysis_closure_t *self);

/* `looseleaf analyze [--json] NOTEBOOK.ipynb|-`: ARGV[0] is "analyze".
 * Sets the process's log role (A) and starts Python
 * (ll_interp_start_python).  Prints per code cell its facts and closures (cells taken as executed in
 * notebook order), then the corpus figures.  Exit status: 0, 1 when some
 * cell did not parse, 2 on bad usage or an unreadable notebook. */
int ll_analyze_main(int argc, char **argv);

/* The source of nbformat cell CELL ("source": a string or a list of
 * strings, joined; a part that is not a string is skipped), NUL-terminated,
 * its length in *LEN (when LEN is not NULL).  Caller frees; NULL when out of
 * memory.  For the notebook readers: `looseleaf analyze` and the trace
 * generator (sim/ll_trace_gen.c). */
char *ll_analysis_cell_source(const json_t *cell, size_t *len);

/* C self-test of this API (ll_analysis_selftest.c; starts and finalizes
 * Python when none runs).  The pure parts have their own, declared in
 * ll_analysis_internal.h. */
int ll_analysis_selftest(bool verbose);

#endif
