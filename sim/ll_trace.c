/* ll_trace: the trace reader (see ll_trace.h; the format: sim/API.md).
 * Runs in the `looseleaf simulate` process, single-threaded.  Lines are
 * parsed with jansson one at a time; notebooks (cell templates) and the
 * header's import times are kept for the whole trace, sessions are handed
 * out and forgotten. */
#include "sim/ll_trace.h"
#include "base/ll_check.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A notebook line's cell, digested. */
typedef struct {
    bool has_label, gpu;
    double exec_s; /* < 0: not given */
    double closure_bytes, written_bytes, namespace_bytes;
    double import_all_s, import_tail_s;
} s_tmpl_t;

typedef struct {
    char *id;
    int ncells;
    s_tmpl_t *cells;
} s_notebook_t;

struct ll_trace_reader_t {
    FILE *f;               /* the trace */
    bool own;              /* we opened it (not stdin) */
    const ll_cost_t *cost; /* borrowed */
    char **head;           /* the zygote head's packages */
    int nhead;
    json_t *import_s;  /* package -> import seconds (the header's), owned */
    s_notebook_t *nbs; /* notebook lines so far */
    int nnb, capnb;
    char *line; /* getline's buffer */
    size_t linecap;
    long lineno;         /* lines read */
    long sessions;       /* sessions handed out */
    double last_arrival; /* the order check */
};

static void s_notebook_free(s_notebook_t *nb)
{
    free(nb->id);
    free(nb->cells);
}

ll_trace_reader_t *ll_trace_reader_new(const char *path, const ll_cost_t *costs, const char *head,
                                       char *err, size_t errlen)
{
    ll_trace_reader_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->cost = costs;
    self->last_arrival = -INFINITY;
    if (strcmp(path, "-") == 0) {
        self->f = stdin;
    } else {
        self->f = fopen(path, "r");
        self->own = true;
        if (!self->f) {
            snprintf(err, errlen, "%s: cannot open", path);
            free(self);
            return NULL;
        }
    }
    char *list = strdup(head ? head : "numpy,torch,IPython");
    for (char *save = NULL, *tok = list ? strtok_r(list, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save)) {
        char **nh = realloc(self->head, (size_t) (self->nhead + 1) * sizeof *nh);
        if (!nh)
            break;
        self->head = nh;
        self->head[self->nhead++] = strdup(tok);
    }
    free(list);
    return self;
}

void ll_trace_reader_destroy(ll_trace_reader_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_trace_reader_t *self = *self_p;
    if (self->own && self->f)
        fclose(self->f);
    for (int i = 0; i < self->nhead; i++)
        free(self->head[i]);
    free(self->head);
    json_decref(self->import_s);
    for (int i = 0; i < self->nnb; i++)
        s_notebook_free(&self->nbs[i]);
    free(self->nbs);
    free(self->line);
    free(self);
    *self_p = NULL;
}

void ll_trace_session_destroy(ll_trace_session_t **s_p)
{
    if (!s_p || !*s_p)
        return;
    free((*s_p)->id);
    free((*s_p)->cells);
    free(*s_p);
    *s_p = NULL;
}

void ll_trace_hint_prefetches(const double *hints, int n, double edit_s, double debounce_s,
                              double max_wait_s, float pf[2])
{
    int k = 0;
    pf[0] = pf[1] = -1;
    if (n <= 0)
        return;
    double first = hints[0], last = hints[0];
    for (int i = 1; i <= n && k < 2; i++) {
        double due = fmin(last + debounce_s, first + max_wait_s);
        if (i < n && hints[i] < due) {
            last = hints[i]; /* the burst goes on */
            continue;
        }
        if (due < edit_s)
            pf[k++] = (float) due;
        if (i < n)
            first = last = hints[i];
    }
}

static bool s_in_head(const ll_trace_reader_t *self, const char *pkg)
{
    for (int i = 0; i < self->nhead; i++)
        if (strcmp(self->head[i], pkg) == 0)
            return true;
    return false;
}

/* The import times of import closure IMPORTS (a JSON list of package
 * names): all of it, and what the zygote head lacks. */
static void s_imports(const ll_trace_reader_t *self, const json_t *imports, double *all,
                      double *tail)
{
    size_t i;
    json_t *v;
    *all = *tail = 0;
    json_array_foreach(imports, i, v) {
        if (!json_is_string(v))
            continue;
        json_t *t = json_object_get(self->import_s, json_string_value(v));
        double s = json_is_number(t) ? json_number_value(t) : self->cost->import_default_s;
        *all += s;
        if (!s_in_head(self, json_string_value(v)))
            *tail += s;
    }
}

/* Number FIELD of OBJ, or DEF when absent; -1 (and *BAD) when present but
 * not a non-negative number. */
static double s_num(const json_t *obj, const char *field, double def, bool *bad)
{
    json_t *v = json_object_get(obj, field);
    if (!v)
        return def;
    if (!json_is_number(v) || json_number_value(v) < 0 || !isfinite(json_number_value(v))) {
        *bad = true;
        return -1;
    }
    return json_number_value(v);
}

/* A cell's label field: 1 GPU, 0 CPU, -1 absent, -2 bad. */
static int s_label(const json_t *obj)
{
    json_t *v = json_object_get(obj, "label");
    if (!v)
        return -1;
    const char *s = json_string_value(v);
    if (s && strcasecmp(s, "gpu") == 0)
        return 1;
    if (s && strcasecmp(s, "cpu") == 0)
        return 0;
    return -2;
}

static int s_header(ll_trace_reader_t *self, json_t *line, char *err, size_t errlen)
{
    json_t *imp = json_object_get(line, "import_s");
    if (imp && !json_is_object(imp)) {
        snprintf(err, errlen, "line %ld: \"import_s\" must be an object", self->lineno);
        return -1;
    }
    json_decref(self->import_s);
    self->import_s = imp ? json_incref(imp) : NULL;
    return 0;
}

static int s_notebook(ll_trace_reader_t *self, json_t *line, char *err, size_t errlen)
{
    json_t *id = json_object_get(line, "notebook"), *cells = json_object_get(line, "cells");
    if (!json_is_string(id) || !json_is_array(cells)) {
        snprintf(err, errlen,
                 "line %ld: a notebook line needs \"notebook\" (a string) and \"cells\"",
                 self->lineno);
        return -1;
    }
    if (self->nnb == self->capnb) {
        int cap = self->capnb ? 2 * self->capnb : 8;
        s_notebook_t *n = realloc(self->nbs, (size_t) cap * sizeof *n);
        if (!n)
            goto out_of_memory;
        self->nbs = n;
        self->capnb = cap;
    }
    s_notebook_t nb = {.id = strdup(json_string_value(id)),
                       .ncells = (int) json_array_size(cells),
                       .cells = calloc(json_array_size(cells) + 1, sizeof(s_tmpl_t))};
    if (!nb.id || !nb.cells) {
        s_notebook_free(&nb);
        goto out_of_memory;
    }
    size_t i;
    json_t *c;
    bool bad = false;
    json_array_foreach(cells, i, c) {
        s_tmpl_t *t = &nb.cells[i];
        int label = s_label(c);
        t->has_label = label >= 0;
        t->gpu = label == 1;
        t->exec_s = s_num(c, "exec_s", -1, &bad);
        t->closure_bytes = s_num(c, "closure_bytes", 0, &bad);
        t->written_bytes = s_num(c, "written_bytes", 0, &bad);
        t->namespace_bytes = s_num(c, "namespace_bytes", 0, &bad);
        s_imports(self, json_object_get(c, "imports"), &t->import_all_s, &t->import_tail_s);
        if (!json_is_object(c) || label == -2 || bad) {
            snprintf(err, errlen, "line %ld: notebook cell %zu: bad label or number", self->lineno,
                     i);
            s_notebook_free(&nb);
            return -1;
        }
    }
    self->nbs[self->nnb++] = nb;
    return 0;
out_of_memory:
    snprintf(err, errlen, "out of memory");
    return -1;
}

static const s_notebook_t *s_find_notebook(const ll_trace_reader_t *self, const char *id)
{
    for (int i = self->nnb - 1; id && i >= 0; i--)
        if (strcmp(self->nbs[i].id, id) == 0)
            return &self->nbs[i];
    return NULL;
}

/* Cell K of a session line (C, its JSON; NB its notebook or NULL) into *OUT. */
static int s_cell(ll_trace_reader_t *self, const s_notebook_t *nb, size_t k, const json_t *c,
                  ll_trace_cell_t *out, char *err, size_t errlen)
{
    bool bad = !json_is_object(c);
    const s_tmpl_t *t = NULL;
    json_t *ref = json_object_get(c, "cell");
    if (ref) {
        json_int_t i = json_is_integer(ref) ? json_integer_value(ref) : -1;
        if (!nb || i < 0 || i >= nb->ncells) {
            snprintf(err, errlen,
                     "line %ld: cell %zu names cell %lld of %s, which its notebook line lacks",
                     self->lineno, k, (long long) i, nb ? nb->id : "no notebook");
            return -1;
        }
        t = &nb->cells[i];
    }
    int label = s_label(c);
    if (label == -2 || (label == -1 && !(t && t->has_label))) {
        snprintf(err, errlen, "line %ld: cell %zu: \"label\" must be \"gpu\" or \"cpu\"",
                 self->lineno, k);
        return -1;
    }
    out->gpu = label >= 0 ? label == 1 : t->gpu;
    double exec = s_num(c, "exec_s", t ? t->exec_s : -1, &bad);
    out->edit_s = (float) s_num(c, "edit_s", 0, &bad);
    out->gap_s = (float) s_num(c, "gap_s", 0, &bad);
    out->closure_bytes = s_num(c, "closure_bytes", t ? t->closure_bytes : 0, &bad);
    out->written_bytes = s_num(c, "written_bytes", t ? t->written_bytes : 0, &bad);
    out->namespace_bytes = s_num(c, "namespace_bytes", t ? t->namespace_bytes : 0, &bad);
    if (bad || exec < 0) {
        snprintf(err, errlen, "line %ld: cell %zu: needs \"exec_s\"; numbers must be >= 0",
                 self->lineno, k);
        return -1;
    }
    out->exec_s = (float) exec;
    json_t *imports = json_object_get(c, "imports");
    if (imports || !t) {
        double all, tail;
        s_imports(self, imports, &all, &tail);
        out->import_all_s = (float) all;
        out->import_tail_s = (float) tail;
    } else {
        out->import_all_s = (float) t->import_all_s;
        out->import_tail_s = (float) t->import_tail_s;
    }
    json_t *hints = json_object_get(c, "hints_s");
    if (json_is_array(hints)) {
        double h[64];
        int n = 0;
        size_t i;
        json_t *v;
        json_array_foreach(hints, i, v)
            if (json_is_number(v) && n < 64)
                h[n++] = json_number_value(v);
        ll_trace_hint_prefetches(h, n, out->edit_s, self->cost->debounce_s, self->cost->max_wait_s,
                                 out->pf_at);
        out->pf_every = 0;
    } else {
        /* A user typing: a burst of hints from the edit's start prefetches
         * max_wait_s in, then again at each pause. */
        out->pf_at[0] = (float) self->cost->max_wait_s;
        out->pf_at[1] = -1;
        out->pf_every = (float) self->cost->rehint_s;
    }
    return 0;
}

static int s_session(ll_trace_reader_t *self, json_t *line, ll_trace_session_t **out, char *err,
                     size_t errlen)
{
    json_t *id = json_object_get(line, "session"), *cells = json_object_get(line, "cells");
    bool bad = false;
    double arrival = s_num(line, "arrival_s", -1, &bad);
    double tail = s_num(line, "tail_s", 0, &bad);
    json_t *seat = json_object_get(line, "seat");
    bad = bad || (seat && (!json_is_integer(seat) || json_integer_value(seat) < 0 ||
                           json_integer_value(seat) > 1000000));
    if (!(json_is_string(id) || json_is_integer(id)) || !json_is_array(cells) || bad ||
        arrival < 0) {
        snprintf(err, errlen,
                 "line %ld: a session line needs \"session\", \"arrival_s\" >= 0 and \"cells\" "
                 "(and \"seat\", if given, an integer 0..1000000)",
                 self->lineno);
        return -1;
    }
    if (arrival < self->last_arrival) {
        snprintf(err, errlen,
                 "line %ld: session arrives at %.3f s, before the previous one (%.3f s): "
                 "sessions must be in arrival order",
                 self->lineno, arrival, self->last_arrival);
        return -1;
    }
    const char *nbid = json_string_value(json_object_get(line, "notebook"));
    const s_notebook_t *nb = s_find_notebook(self, nbid);
    if (nbid && !nb) {
        snprintf(err, errlen, "line %ld: notebook %s has no notebook line before it", self->lineno,
                 nbid);
        return -1;
    }
    ll_trace_session_t *s = calloc(1, sizeof *s);
    char idbuf[32];
    if (json_is_integer(id))
        snprintf(idbuf, sizeof idbuf, "%lld", (long long) json_integer_value(id));
    if (s) {
        s->id = strdup(json_is_string(id) ? json_string_value(id) : idbuf);
        s->ncells = (int) json_array_size(cells);
        s->cells = calloc((size_t) s->ncells + 1, sizeof *s->cells);
    }
    if (!s || !s->id || !s->cells) {
        ll_trace_session_destroy(&s);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->arrival_s = arrival;
    s->tail_s = tail;
    s->seat = seat ? (long) json_integer_value(seat) : -1;
    s->index = self->sessions;
    size_t k;
    json_t *c;
    json_array_foreach(cells, k, c) {
        if (s_cell(self, nb, k, c, &s->cells[k], err, errlen) < 0) {
            ll_trace_session_destroy(&s);
            return -1;
        }
    }
    self->last_arrival = arrival;
    self->sessions++;
    *out = s;
    return 1;
}

int ll_trace_reader_next(ll_trace_reader_t *self, ll_trace_session_t **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    for (;;) {
        ssize_t n = getline(&self->line, &self->linecap, self->f);
        if (n < 0)
            return 0;
        self->lineno++;
        const char *p = self->line;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
            p++;
        if (!*p || *p == '#')
            continue; /* blank lines and comments */
        json_error_t jerr;
        json_t *line = json_loadb(self->line, (size_t) n, 0, &jerr);
        if (!json_is_object(line)) {
            snprintf(err, errlen, "line %ld: not a JSON object: %s", self->lineno,
                     line ? "" : jerr.text);
            json_decref(line);
            return -1;
        }
        int rc = 0;
        if (json_object_get(line, "session"))
            rc = s_session(self, line, out, err, errlen);
        else if (json_object_get(line, "notebook"))
            rc = s_notebook(self, line, err, errlen);
        else if (json_object_get(line, "trace"))
            rc = s_header(self, line, err, errlen);
        else {
            snprintf(err, errlen,
                     "line %ld: neither a header (\"trace\"), a notebook nor a session line",
                     self->lineno);
            rc = -1;
        }
        json_decref(line);
        if (rc != 0)
            return rc;
    }
}

/* ------------------------------------------------------------------ */
/* Self-test: a small trace through a temporary file.                 */

int ll_trace_selftest(bool verbose)
{
    int fails = 0;
    ll_cost_t cost = {
        .debounce_s = 0.25, .max_wait_s = 1.0, .rehint_s = 2.0, .import_default_s = 0.15};
    char err[256];
    /* The kernel's debounce: a hint at 0.5 s prefetches at 0.75 s, one at
     * 0 and one at 0.5 s at 0.25 and 0.75 s; a steady stream every 0.1 s
     * prefetches 1 s after its first hint, then again; a prefetch due after
     * Run is not sent. */
    float pf[2];
    double h0[] = {0.5}, h1[] = {0, 0.5};
    ll_trace_hint_prefetches(h0, 1, 2.0, 0.25, 1.0, pf);
    S_CHECK(fabsf(pf[0] - 0.75f) < 1e-6 && pf[1] == -1);
    ll_trace_hint_prefetches(h0, 1, 0.6, 0.25, 1.0, pf);
    S_CHECK(pf[0] == -1 && pf[1] == -1);
    ll_trace_hint_prefetches(h1, 2, 2.0, 0.25, 1.0, pf);
    S_CHECK(fabsf(pf[0] - 0.25f) < 1e-6 && fabsf(pf[1] - 0.75f) < 1e-6);
    double h2[40];
    for (int i = 0; i < 40; i++)
        h2[i] = 0.1 * i;
    ll_trace_hint_prefetches(h2, 40, 10, 0.25, 1.0, pf);
    S_CHECK(fabsf(pf[0] - 1.0f) < 1e-6 && pf[1] > 1.9f && pf[1] < 2.2f);
    double h3[] = {0, 3};
    ll_trace_hint_prefetches(h3, 2, 10, 0.25, 1.0, pf);
    S_CHECK(fabsf(pf[0] - 0.25f) < 1e-6 && fabsf(pf[1] - 3.25f) < 1e-6);

    char path[] = "/tmp/ll_trace_selftest_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    S_CHECK(f != NULL);
    if (!f)
        return 1;
    fputs("{\"trace\": \"looseleaf-fleet\", \"version\": 1, \"import_s\": {\"torch\": 1.5, "
          "\"pandas\": 0.5}}\n"
          "# a comment\n\n"
          "{\"notebook\": \"nb\", \"cells\": [{\"label\": \"cpu\", \"exec_s\": 2}, "
          "{\"label\": \"gpu\", \"exec_s\": 0.5, \"closure_bytes\": 1000, \"imports\": "
          "[\"torch\", \"pandas\", \"scipy\"]}]}\n"
          "{\"session\": \"a\", \"arrival_s\": 1, \"notebook\": \"nb\", \"tail_s\": 5, "
          "\"cells\": [{\"cell\": 0, \"edit_s\": 3}, {\"cell\": 1, \"edit_s\": 4, \"gap_s\": 9, "
          "\"exec_s\": 7, \"hints_s\": [0.5]}]}\n"
          "{\"session\": 7, \"arrival_s\": 1, \"cells\": [{\"label\": \"GPU\", \"exec_s\": 1, "
          "\"written_bytes\": 5}]}\n"
          "{\"session\": \"late\", \"arrival_s\": 0.5, \"cells\": []}\n",
          f);
    fclose(f);
    ll_trace_reader_t *r = ll_trace_reader_new(path, &cost, NULL, err, sizeof err);
    S_CHECK(r != NULL);
    ll_trace_session_t *s = NULL;
    S_CHECK(r && ll_trace_reader_next(r, &s, err, sizeof err) == 1);
    S_CHECK(s && strcmp(s->id, "a") == 0 && s->arrival_s == 1 && s->tail_s == 5 && s->ncells == 2);
    if (s && s->ncells == 2) {
        ll_trace_cell_t *c0 = &s->cells[0], *c1 = &s->cells[1];
        S_CHECK(!c0->gpu && c0->exec_s == 2 && c0->edit_s == 3 && c0->gap_s == 0);
        S_CHECK(c0->pf_at[0] == 1.0f && c0->pf_every == 2.0f); /* a typing user */
        S_CHECK(c1->gpu && c1->exec_s == 7 && c1->gap_s == 9 && c1->closure_bytes == 1000);
        /* torch 1.5 (in the head) + pandas 0.5 + scipy (the default 0.15) */
        S_CHECK(fabsf(c1->import_all_s - 2.15f) < 1e-5 && fabsf(c1->import_tail_s - 0.65f) < 1e-5);
        S_CHECK(fabsf(c1->pf_at[0] - 0.75f) < 1e-6 && c1->pf_every == 0);
    }
    ll_trace_session_destroy(&s);
    S_CHECK(s == NULL);
    S_CHECK(r && ll_trace_reader_next(r, &s, err, sizeof err) == 1);
    S_CHECK(s && strcmp(s->id, "7") == 0 && s->index == 1 && s->cells[0].gpu &&
            s->cells[0].written_bytes == 5);
    ll_trace_session_destroy(&s);
    S_CHECK(r && ll_trace_reader_next(r, &s, err, sizeof err) == -1 && strstr(err, "order"));
    ll_trace_reader_destroy(&r);
    ll_trace_reader_destroy(&r);

    /* Bad lines say where. */
    static const char *bad[] = {
        "[1]\n",
        "{\"session\": \"x\", \"cells\": []}\n",
        "{\"session\": \"x\", \"arrival_s\": 0, \"cells\": [{\"exec_s\": 1}]}\n",
        "{\"session\": \"x\", \"arrival_s\": 0, \"cells\": [{\"label\": \"tpu\", \"exec_s\": "
        "1}]}\n",
        "{\"session\": \"x\", \"arrival_s\": 0, \"cells\": [{\"label\": \"gpu\"}]}\n",
        "{\"session\": \"x\", \"arrival_s\": 0, \"notebook\": \"zz\", \"cells\": []}\n",
        "{\"session\": \"x\", \"arrival_s\": 0, \"cells\": [{\"cell\": 0}]}\n",
        "{\"what\": 1}\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        r = ll_trace_reader_new(path, &cost, NULL, err, sizeof err);
        err[0] = 0;
        S_CHECK(r && ll_trace_reader_next(r, &s, err, sizeof err) == -1 && strstr(err, "line 1"));
        ll_trace_reader_destroy(&r);
    }
    remove(path);
    S_CHECK(ll_trace_reader_new("/nonexistent/trace", &cost, NULL, err, sizeof err) == NULL);
    if (verbose)
        fprintf(stderr, "ll_trace: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
