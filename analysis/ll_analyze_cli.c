/* ll_analyze_cli: `looseleaf analyze [--json] NOTEBOOK.ipynb|-`, the
 * command-line front end of the cell analysis (issue 3).  Runs in its own
 * short-lived process (log role A), single-threaded, with CPython started
 * the way the kernel starts it (ll_interp_start_python).
 *
 * The notebook's code cells are taken as executed once each, in notebook
 * order: each cell's closures are computed against the cells before it,
 * then the cell is recorded.  At the end come the figures the paper
 * reports: the share of GPU cells, and for each GPU cell |state closure| /
 * |live variables| with their median.  A cell that does not parse is
 * reported as such; the others are still analysed. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "analysis/ll_analysis.h"
#include "base/ll_log.h"
#include "kernel/ll_interp.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cell's source: a string or a list of strings.  Malloc'd. */
static char *s_source(json_t *cell, size_t *len)
{
    json_t *src = json_object_get(cell, "source");
    if (json_is_string(src)) {
        *len = json_string_length(src);
        char *out = malloc(*len + 1);
        if (out) {
            memcpy(out, json_string_value(src), *len);
            out[*len] = '\0';
        }
        return out;
    }
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(src, i, part)
        total += json_string_length(part);
    char *out = malloc(total + 1);
    if (!out)
        return NULL;
    size_t at = 0;
    json_array_foreach(src, i, part) {
        if (!json_is_string(part))
            continue;
        memcpy(out + at, json_string_value(part), json_string_length(part));
        at += json_string_length(part);
    }
    out[at] = '\0';
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

int ll_analyze_main(int argc, char **argv)
{
    ll_log_init('A');
    bool as_json = false;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            as_json = true;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            s_usage(stdout);
            return 0;
        } else if (!path)
            path = argv[i];
        else
            return s_usage(stderr);
    }
    if (!path)
        return s_usage(stderr);

    json_error_t jerr;
    /* Cells may hold NUL characters (\u0000): analysis rejects those per
     * cell, the notebook as a whole is still read. */
    json_t *nb = strcmp(path, "-") == 0 ? json_loadf(stdin, JSON_ALLOW_NUL, &jerr)
                                        : json_load_file(path, JSON_ALLOW_NUL, &jerr);
    if (!nb) {
        fprintf(stderr, "looseleaf analyze: %s: not a JSON notebook: %s (line %d)\n", path,
                jerr.text, jerr.line);
        return 2;
    }
    json_t *cells = json_object_get(nb, "cells");
    if (!json_is_array(cells)) {
        fprintf(stderr, "looseleaf analyze: %s: no \"cells\" list (nbformat 4 expected)\n", path);
        json_decref(nb);
        return 2;
    }
    char err[512];
    if (ll_interp_start_python("looseleaf", err, sizeof err) != 0 ||
        ll_analysis_init(err, sizeof err) != 0) {
        fprintf(stderr, "looseleaf analyze: %s\n", err);
        json_decref(nb);
        return 2;
    }

    ll_analysis_session_t *session = ll_analysis_session_new();
    json_t *out_cells = json_array();
    size_t ncode = 0, nerr = 0, ngpu = 0, nratio = 0;
    double *ratios = calloc(json_array_size(cells) + 1, sizeof *ratios);
    int rc = session && out_cells && ratios ? 0 : 2;
    size_t index;
    json_t *cell;
    json_array_foreach(cells, index, cell) {
        if (rc == 2)
            break;
        if (!json_is_object(cell) || !json_is_string(json_object_get(cell, "cell_type")) ||
            strcmp(json_string_value(json_object_get(cell, "cell_type")), "code") != 0)
            continue;
        ncode++;
        size_t len = 0;
        char *src = s_source(cell, &len);
        ll_analysis_t *a = src ? ll_analysis_new(src, len) : NULL;
        free(src);
        if (!a) {
            fprintf(stderr, "looseleaf analyze: out of memory\n");
            rc = 2;
            break;
        }
        json_t *entry = json_pack("{s:I, s:I, s:o}", "cell", (json_int_t) index, "code_cell",
                                  (json_int_t) ncode, "facts", ll_analysis_json(a));
        if (ll_analysis_error(a)) {
            nerr++;
            if (!as_json)
                printf("cell %zu (code cell %zu): error: %s\n", index, ncode, ll_analysis_error(a));
        } else {
            ll_analysis_closure_t *c = ll_analysis_session_closure(session, a);
            if (!c) {
                fprintf(stderr, "looseleaf analyze: out of memory\n");
                rc = 2;
            } else {
                bool gpu = ll_analysis_closure_label(c) == LL_ANALYSIS_GPU;
                size_t live = ll_analysis_closure_live_count(c);
                size_t state = ll_analysis_closure_state(c).count;
                if (gpu) {
                    ngpu++;
                    if (live)
                        ratios[nratio++] = (double) state / (double) live;
                }
                json_object_set_new(entry, "closure", ll_analysis_closure_json(c));
                if (!as_json) {
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
                    snprintf(label, sizeof label, "state (%zu/%zu):", state, live);
                    s_print_list(label, ll_analysis_closure_state(c));
                    s_print_list("imports:", ll_analysis_closure_imports(c));
                }
                ll_analysis_closure_destroy(&c);
            }
            if (rc != 2 && ll_analysis_session_record(session, a) != 0) {
                fprintf(stderr, "looseleaf analyze: out of memory\n");
                rc = 2;
            }
        }
        json_array_append_new(out_cells, entry);
        ll_analysis_destroy(&a);
    }

    qsort(ratios, nratio, sizeof *ratios, s_cmp_double);
    double median = 0;
    if (nratio)
        median =
            nratio % 2 ? ratios[nratio / 2] : (ratios[nratio / 2 - 1] + ratios[nratio / 2]) / 2;
    size_t analysed = ncode - nerr;
    double share = analysed ? (double) ngpu / (double) analysed : 0;
    if (rc != 2) {
        if (as_json) {
            json_t *r = json_array();
            for (size_t i = 0; i < nratio; i++)
                json_array_append_new(r, json_real(ratios[i]));
            json_t *summary = json_pack(
                "{s:I, s:I, s:I, s:I, s:f, s:o, s:f}", "code_cells", (json_int_t) ncode, "analysed",
                (json_int_t) analysed, "errors", (json_int_t) nerr, "gpu_cells", (json_int_t) ngpu,
                "gpu_share", share, "gpu_closure_ratios", r, "median_gpu_closure_ratio", median);
            json_t *doc = json_pack("{s:O, s:o}", "cells", out_cells, "summary", summary);
            char *text = doc ? json_dumps(doc, JSON_INDENT(1)) : NULL;
            if (text)
                printf("%s\n", text);
            free(text);
            json_decref(doc);
        } else {
            printf("summary: %zu code cells, %zu analysed, %zu with errors\n", ncode, analysed,
                   nerr);
            printf("  GPU cells: %zu (%.1f%% of analysed cells)\n", ngpu, 100 * share);
            if (nratio)
                printf("  |state closure| / |live variables| per GPU cell: "
                       "median %.3f (min %.3f, max %.3f, n=%zu)\n",
                       median, ratios[0], ratios[nratio - 1], nratio);
            else
                printf("  |state closure| / |live variables|: no GPU cell with "
                       "live variables\n");
        }
        rc = nerr ? 1 : 0;
    }
    free(ratios);
    json_decref(out_cells);
    ll_analysis_session_destroy(&session);
    json_decref(nb);
    fflush(stdout);
    return rc;
}
