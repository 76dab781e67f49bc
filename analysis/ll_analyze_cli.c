/* ll_analyze_cli: `looseleaf analyze [--json] NOTEBOOK.ipynb|-`, the
 * command-line front end of the cell analysis.  Runs in its own
 * short-lived process (log role A), single-threaded, with CPython started
 * the way the kernel starts it (ll_interp_start_python).
 *
 * The notebook's code cells are taken as executed once each, in notebook
 * order: each cell's closures are computed against the cells before it,
 * then the cell is recorded.  At the end come the figures the paper
 * reports: the share of GPU cells, and for each GPU cell |state closure| /
 * |live variables| with their median.  A cell that does not parse is
 * reported as such; the others are still analysed. */
#include "analysis/ll_analysis.h"
#include "base/ll_log.h"
#include "kernel/ll_interp.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ll_analysis_cell_source(const json_t *cell, size_t *len)
{
    json_t *src = json_object_get(cell, "source");
    size_t at = 0;
    char *out;
    if (json_is_string(src)) {
        at = json_string_length(src);
        out = malloc(at + 1);
        if (!out)
            return NULL;
        memcpy(out, json_string_value(src), at);
    } else {
        size_t total = 0, i;
        json_t *part;
        json_array_foreach(src, i, part)
            total += json_string_length(part);
        out = malloc(total + 1);
        if (!out)
            return NULL;
        json_array_foreach(src, i, part) {
            if (!json_is_string(part))
                continue;
            memcpy(out + at, json_string_value(part), json_string_length(part));
            at += json_string_length(part);
        }
    }
    out[at] = '\0';
    if (len)
        *len = at;
    return out;
}

static void s_print_list(const char *label, ll_analysis_strs_t l)
{
    printf("  %-15s", label);
    if (l.count == 0)
        printf(" -");
    for (size_t i = 0; i < l.count; i++)
        printf("%s%s", i ? ", " : " ", l.items[i]);
    printf("\n");
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static int s_usage(FILE *out)
{
    fprintf(out, "usage: looseleaf analyze [--json] NOTEBOOK.ipynb|-\n"
                 "Static analysis of every code cell (run in notebook order): defs,\n"
                 "reads, functions' globals, state closure, import closure, CPU/GPU\n"
                 "label, opaque flag; then the share of GPU cells and |state closure|\n"
                 "/ |live variables| per GPU cell.  `-` reads the notebook from stdin.\n"
                 "LOOSELEAF_GPU_PACKAGES=a,b.c adds GPU packages.  Exit status 1 when\n"
                 "a cell does not parse, 2 on bad usage or an unreadable notebook.\n");
    return 2;
}

/* One run over a notebook: the session the cells are recorded in, the JSON
 * entries and the counts the summary reports. */
typedef struct {
    bool as_json;                   /* print JSON, not text */
    ll_analysis_session_t *session; /* the cells so far */
    json_t *out_cells;              /* one entry per code cell */
    size_t ncode, nerr, ngpu;       /* code cells, cells that did not parse, GPU cells */
    double *ratios;                 /* |state closure| / |live| per GPU cell */
    size_t nratio;
} s_run_t;

/* The options.  -1 to go on with *AS_JSON and *PATH set, else the exit
 * status (help printed, or bad usage). */
static int s_parse_args(int argc, char **argv, bool *as_json, const char **path)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            *as_json = true;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            s_usage(stdout);
            return 0;
        } else if (!*path)
            *path = argv[i];
        else
            return s_usage(stderr);
    }
    return *path ? -1 : s_usage(stderr);
}

/* The notebook at PATH ("-": stdin) as JSON with its cell list in *CELLS
 * (borrowed), or NULL after saying why.  The caller owns the result. */
static json_t *s_load(const char *path, json_t **cells)
{
    json_error_t jerr;
    /* Cells may hold NUL characters (\u0000): analysis rejects those per
     * cell, the notebook as a whole is still read. */
    json_t *nb = strcmp(path, "-") == 0 ? json_loadf(stdin, JSON_ALLOW_NUL, &jerr)
                                        : json_load_file(path, JSON_ALLOW_NUL, &jerr);
    if (!nb) {
        fprintf(stderr, "looseleaf analyze: %s: not a JSON notebook: %s (line %d)\n", path,
                jerr.text, jerr.line);
        return NULL;
    }
    *cells = json_object_get(nb, "cells");
    if (!json_is_array(*cells)) {
        fprintf(stderr, "looseleaf analyze: %s: no \"cells\" list (nbformat 4 expected)\n", path);
        json_decref(nb);
        return NULL;
    }
    return nb;
}

/* The text report of one analysed cell. */
static void s_print_cell(size_t index, size_t ncode, const ll_analysis_t *a,
                         const ll_analysis_closure_t *c)
{
    bool gpu = ll_analysis_closure_label(c) == LL_ANALYSIS_GPU;
    printf("cell %zu (code cell %zu): %s%s\n", index, ncode, gpu ? "GPU" : "CPU",
           ll_analysis_closure_is_opaque(c) ? ", opaque" : "");
    s_print_list("defs:", ll_analysis_defs(a));
    s_print_list("reads:", ll_analysis_reads(a));
    for (size_t f = 0; f < ll_analysis_function_count(a); f++) {
        char label[300];
        snprintf(label, sizeof label,
                 "%s %s:", ll_analysis_function_is_class(a, f) ? "class" : "def",
                 ll_analysis_function_name(a, f));
        s_print_list(label, ll_analysis_function_globals(a, f));
    }
    char label[64];
    snprintf(label, sizeof label, "state (%zu/%zu):", ll_analysis_closure_state(c).count,
             ll_analysis_closure_live_count(c));
    s_print_list(label, ll_analysis_closure_state(c));
    s_print_list("imports:", ll_analysis_closure_imports(c));
}

/* Closures of parsed cell A against the cells before it, into ENTRY and
 * the counts; then A is recorded.  0, or 2 when out of memory. */
static int s_closure_and_record(s_run_t *run, size_t index, const ll_analysis_t *a, json_t *entry)
{
    ll_analysis_closure_t *c = ll_analysis_session_closure(run->session, a);
    if (!c) {
        fprintf(stderr, "looseleaf analyze: out of memory\n");
        return 2;
    }
    size_t live = ll_analysis_closure_live_count(c);
    if (ll_analysis_closure_label(c) == LL_ANALYSIS_GPU) {
        run->ngpu++;
        if (live)
            run->ratios[run->nratio++] =
                (double) ll_analysis_closure_state(c).count / (double) live;
    }
    json_object_set_new(entry, "closure", ll_analysis_closure_json(c));
    if (!run->as_json)
        s_print_cell(index, run->ncode, a, c);
    ll_analysis_closure_destroy(&c);
    if (ll_analysis_session_record(run->session, a) != 0) {
        fprintf(stderr, "looseleaf analyze: out of memory\n");
        return 2;
    }
    return 0;
}

/* Notebook cell INDEX: skipped unless a code cell; else analysed, its
 * entry appended.  0, or 2 when out of memory. */
static int s_cell(s_run_t *run, size_t index, json_t *cell)
{
    if (!json_is_object(cell) || !json_is_string(json_object_get(cell, "cell_type")) ||
        strcmp(json_string_value(json_object_get(cell, "cell_type")), "code") != 0)
        return 0;
    run->ncode++;
    size_t len = 0;
    char *src = ll_analysis_cell_source(cell, &len);
    ll_analysis_t *a = src ? ll_analysis_new(src, len) : NULL;
    free(src);
    if (!a) {
        fprintf(stderr, "looseleaf analyze: out of memory\n");
        return 2;
    }
    int rc = 0;
    json_t *entry = json_pack("{s:I, s:I, s:o}", "cell", (json_int_t) index, "code_cell",
                              (json_int_t) run->ncode, "facts", ll_analysis_json(a));
    if (ll_analysis_error(a)) {
        run->nerr++;
        if (!run->as_json)
            printf("cell %zu (code cell %zu): error: %s\n", index, run->ncode,
                   ll_analysis_error(a));
    } else
        rc = s_closure_and_record(run, index, a, entry);
    json_array_append_new(run->out_cells, entry);
    ll_analysis_destroy(&a);
    return rc;
}

/* The figures over the whole notebook (the ratios get sorted). */
static void s_summary(s_run_t *run)
{
    double *ratios = run->ratios;
    size_t nratio = run->nratio;
    qsort(ratios, nratio, sizeof *ratios, s_cmp_double);
    double median = 0;
    if (nratio)
        median =
            nratio % 2 ? ratios[nratio / 2] : (ratios[nratio / 2 - 1] + ratios[nratio / 2]) / 2;
    size_t analysed = run->ncode - run->nerr;
    double share = analysed ? (double) run->ngpu / (double) analysed : 0;
    if (run->as_json) {
        json_t *r = json_array();
        for (size_t i = 0; i < nratio; i++)
            json_array_append_new(r, json_real(ratios[i]));
        json_t *summary =
            json_pack("{s:I, s:I, s:I, s:I, s:f, s:o, s:f}", "code_cells", (json_int_t) run->ncode,
                      "analysed", (json_int_t) analysed, "errors", (json_int_t) run->nerr,
                      "gpu_cells", (json_int_t) run->ngpu, "gpu_share", share, "gpu_closure_ratios",
                      r, "median_gpu_closure_ratio", median);
        json_t *doc = json_pack("{s:O, s:o}", "cells", run->out_cells, "summary", summary);
        char *text = doc ? json_dumps(doc, JSON_INDENT(1)) : NULL;
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(doc);
        return;
    }
    printf("summary: %zu code cells, %zu analysed, %zu with errors\n", run->ncode, analysed,
           run->nerr);
    printf("  GPU cells: %zu (%.1f%% of analysed cells)\n", run->ngpu, 100 * share);
    if (nratio)
        printf("  |state closure| / |live variables| per GPU cell: "
               "median %.3f (min %.3f, max %.3f, n=%zu)\n",
               median, ratios[0], ratios[nratio - 1], nratio);
    else
        printf("  |state closure| / |live variables|: no GPU cell with "
               "live variables\n");
}

int ll_analyze_main(int argc, char **argv)
{
    ll_log_init('A');
    bool as_json = false;
    const char *path = NULL;
    int rc = s_parse_args(argc, argv, &as_json, &path);
    if (rc >= 0)
        return rc;
    json_t *cells = NULL;
    json_t *nb = s_load(path, &cells);
    if (!nb)
        return 2;
    char err[512];
    if (ll_interp_start_python("looseleaf", err, sizeof err) != 0 ||
        ll_analysis_init(err, sizeof err) != 0) {
        fprintf(stderr, "looseleaf analyze: %s\n", err);
        json_decref(nb);
        return 2;
    }

    s_run_t run = {.as_json = as_json,
                   .session = ll_analysis_session_new(),
                   .out_cells = json_array(),
                   .ratios = calloc(json_array_size(cells) + 1, sizeof(double))};
    rc = run.session && run.out_cells && run.ratios ? 0 : 2;
    size_t index;
    json_t *cell;
    json_array_foreach(cells, index, cell) {
        if (rc == 2 || (rc = s_cell(&run, index, cell)) == 2)
            break;
    }
    if (rc != 2) {
        s_summary(&run);
        rc = run.nerr ? 1 : 0;
    }
    free(run.ratios);
    json_decref(run.out_cells);
    ll_analysis_session_destroy(&run.session);
    json_decref(nb);
    fflush(stdout);
    return rc;
}
