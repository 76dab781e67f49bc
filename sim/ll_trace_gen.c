/* ll_trace_gen: `looseleaf trace [--sessions N] [--seed S] NOTEBOOK...`,
 * notebooks turned into a trace of concurrent sessions for `looseleaf
 * simulate` (JSON lines on stdout; the format and the distributions are in
 * sim/API.md).  Runs in its own short-lived process (log role A),
 * single-threaded, with CPython started the way the kernel starts it, for
 * the cell analysis.
 *
 * Per notebook: every code cell analysed in order (analysis/: label, state
 * closure, import closure, what it writes), then the notebook run once by
 * sim/measure_notebook.py in a fresh interpreter (each cell's time, each
 * variable's payload bytes after each cell, each imported package's import
 * time), its answer cached by the notebook's content
 * ($XDG_CACHE_HOME/looseleaf/trace, else ~/.cache/looseleaf/trace).  A cell's
 * closure bytes are its state closure's variables as the previous cell
 * left them; its written bytes, what it binds or changes as it leaves
 * them; its namespace bytes, every variable before it.
 *
 * Per session (a seeded generator per seat, so a trace depends only on its
 * options): a notebook drawn at random, its code cells in order, each run
 * once more with probability --rerun (again and again, geometrically), a
 * gap and an edit window drawn before each, and a tail after the last. */
#include "analysis/ll_analysis.h"
#include "base/ll_log.h"
#include "kernel/ll_interp.h"
#include "sim/ll_sim_cli.h"
#include "base/ll_check.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define S_MEASURE_VERSION "2" /* bump when measure_notebook.py's answer changes meaning */

/* ---- a seeded generator: xoshiro256** seeded by splitmix64 ---- */

typedef struct {
    uint64_t s[4];
} s_rng_t;

static uint64_t s_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void s_rng_seed(s_rng_t *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed * 0x2545f4914f6cdd1dULL ^ (stream + 1) * 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 4; i++)
        r->s[i] = s_splitmix(&x);
}

static uint64_t s_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t s_next(s_rng_t *r)
{
    uint64_t *s = r->s, out = s_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return out;
}

/* Uniform in (0, 1). */
static double s_unif(s_rng_t *r)
{
    return ((double) (s_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double s_normal(s_rng_t *r)
{
    return sqrt(-2.0 * log(s_unif(r))) * cos(2.0 * M_PI * s_unif(r));
}

/* A distribution: lognormal with a median and a sigma. */
typedef struct {
    double median, sigma;
} s_dist_t;

static double s_draw(s_rng_t *r, s_dist_t d)
{
    return d.median * exp(d.sigma * s_normal(r));
}

/* ---- options ---- */

typedef struct {
    long sessions; /* seats (concurrent sessions) */
    uint64_t seed;
    double duration;      /* > 0: seats run sessions back to back until then */
    double spread;        /* the first sessions arrive over this long */
    s_dist_t edit, gap;   /* edit windows; gaps before an edit and after the last cell */
    double rerun;         /* probability a cell runs once more */
    double gpu_busy;      /* > 0: GPU cells' times scaled to this busy share per session */
    bool run;             /* run the notebooks (else sizes and times 0) */
    bool timing;          /* one session per notebook, replaying its recorded timing */
    bool cache;           /* use the cache */
    double cell_timeout;  /* per cell, when measuring */
    const char *nbs[256]; /* notebooks */
    int nnb;
} s_opts_t;

static int s_usage(FILE *out)
{
    fprintf(out,
            "usage: looseleaf trace [--sessions N] [--seed S] [--duration S] [--spread S]\n"
            "                       [--edit MEDIAN:SIGMA] [--gap MEDIAN:SIGMA] [--rerun P]\n"
            "                       [--gpu-busy SHARE] [--no-run] [--no-cache] [--timing]\n"
            "                       [--cell-timeout S] NOTEBOOK.ipynb...\n"
            "       looseleaf trace --workload paper [--sessions N] [--seed S] [--duration S]\n"
            "                       [--set PATH=VALUE]... [--no-measure]\n"
            "Writes a trace of N concurrent notebook sessions (JSON lines) for\n"
            "`looseleaf simulate`.  Cells are analysed (labels, closures) and each\n"
            "notebook run once to measure cell times and variable sizes (cached).\n"
            "  --sessions N     concurrent sessions (default 1)\n"
            "  --seed S         the generator's seed (default 1)\n"
            "  --duration S     seats start a new session when one ends, until S\n"
            "                   seconds (default 0: one session per seat)\n"
            "  --spread S       first sessions arrive uniformly over S s (default 600)\n"
            "  --edit M:SIGMA   edit windows, lognormal (default 10:1.0)\n"
            "  --gap M:SIGMA    think time before each edit, lognormal (default 30:1.5)\n"
            "  --rerun P        a cell runs once more with probability P (default 0.25)\n"
            "  --gpu-busy F     scale GPU cells' measured times so that a session's GPU\n"
            "                   would be busy F of its time (default: measured times)\n"
            "  --no-run         do not run notebooks: sizes and times are 0\n"
            "  --no-cache       measure again even when a notebook is cached\n"
            "  --cell-timeout S a measured cell stops after S s (default 60)\n"
            "  --timing         one session per notebook, replaying the execution times\n"
            "                   JupyterLab recorded in it (its Record Timing setting)\n"
            "  --workload paper sessions drawn after the paper's description from\n"
            "                   sim/workload.json (sim/workload.py) instead of notebooks;\n"
            "                   --workload tree (the default) is the above\n");
    return 2;
}

static int s_dist_arg(const char *v, s_dist_t *d)
{
    char *end;
    d->median = strtod(v, &end);
    if (*end != ':' || !(d->median >= 0))
        return -1;
    d->sigma = strtod(end + 1, &end);
    return *end || !(d->sigma >= 0) ? -1 : 0;
}

static int s_parse(int argc, char **argv, s_opts_t *o)
{
    *o = (s_opts_t){.sessions = 1,
                    .seed = 1,
                    .spread = 600,
                    .edit = {10, 1.0},
                    .gap = {30, 1.5},
                    .rerun = 0.25,
                    .run = true,
                    .cache = true,
                    .cell_timeout = 60};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        bool bad = false;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            s_usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-run") == 0) {
            o->run = false;
        } else if (strcmp(a, "--no-cache") == 0) {
            o->cache = false;
        } else if (strcmp(a, "--timing") == 0) {
            o->timing = true;
        } else if (a[0] == '-' && a[1] == '-' && !v) {
            bad = true;
        } else if (strcmp(a, "--sessions") == 0) {
            o->sessions = strtol(v, &end, 10);
            bad = *end || o->sessions < 1;
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            o->seed = strtoull(v, &end, 10);
            bad = *end;
            i++;
        } else if (strcmp(a, "--duration") == 0 || strcmp(a, "--spread") == 0 ||
                   strcmp(a, "--rerun") == 0 || strcmp(a, "--gpu-busy") == 0 ||
                   strcmp(a, "--cell-timeout") == 0) {
            double x = strtod(v, &end);
            bad = *end || !(x >= 0);
            if (a[2] == 'd')
                o->duration = x;
            else if (a[2] == 's')
                o->spread = x;
            else if (a[2] == 'r')
                o->rerun = x, bad = bad || x >= 1;
            else if (a[2] == 'g')
                o->gpu_busy = x, bad = bad || x >= 1;
            else
                o->cell_timeout = x;
            i++;
        } else if (strcmp(a, "--edit") == 0 || strcmp(a, "--gap") == 0) {
            bad = s_dist_arg(v, a[2] == 'e' ? &o->edit : &o->gap) < 0;
            i++;
        } else if (a[0] != '-' && o->nnb < 256) {
            o->nbs[o->nnb++] = a;
        } else {
            bad = true;
        }
        if (bad) {
            fprintf(stderr, "looseleaf trace: bad or incomplete argument '%s'\n", a);
            return s_usage(stderr);
        }
    }
    return o->nnb ? -1 : s_usage(stderr);
}

/* ---- a notebook, analysed and measured ---- */

typedef struct {
    bool gpu;
    double exec_s, closure_bytes, written_bytes, namespace_bytes;
    double t_input, t_reply; /* JupyterLab's recorded timing (epoch s), < 0: none */
    json_t *imports;         /* [str] */
    json_t *state;           /* [str]: the state closure */
} s_cell_t;

typedef struct {
    const char *path;
    char id[16];
    int ncells;
    s_cell_t *cells;
} s_nb_t;

static json_t *s_strs(ll_analysis_strs_t l)
{
    json_t *a = json_array();
    for (size_t i = 0; i < l.count; i++)
        json_array_append_new(a, json_string(l.items[i]));
    return a;
}

/* Seconds since the epoch of a JupyterLab timestamp ("2021-03-05T10:45:18.870469Z"),
 * or -1. */
static double s_iso_time(const json_t *v)
{
    const char *txt = json_string_value(v);
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = txt ? strptime(txt, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (!rest)
        return -1;
    double frac = 0;
    if (*rest == '.')
        frac = strtod(rest, NULL);
    return (double) timegm(&tm) + frac;
}

/* Each code cell of NB (its JSON) analysed in order into OUT; the writes
 * of each into WRITES (a list per cell, the caller owns it). */
static int s_analyse(json_t *nbjson, s_nb_t *out, json_t *writes)
{
    json_t *cells = json_object_get(nbjson, "cells");
    ll_analysis_session_t *session = ll_analysis_session_new();
    out->cells = calloc(json_array_size(cells) + 1, sizeof *out->cells);
    if (!session || !out->cells) {
        ll_analysis_session_destroy(&session);
        return -1;
    }
    size_t i;
    json_t *cell;
    json_array_foreach(cells, i, cell) {
        const char *type = json_string_value(json_object_get(cell, "cell_type"));
        if (!type || strcmp(type, "code") != 0)
            continue;
        s_cell_t *c = &out->cells[out->ncells++];
        json_t *timing = json_object_get(json_object_get(cell, "metadata"), "execution");
        c->t_input = s_iso_time(json_object_get(timing, "iopub.execute_input"));
        c->t_reply = s_iso_time(json_object_get(timing, "shell.execute_reply"));
        char *src = ll_analysis_cell_source(cell, NULL);
        ll_analysis_t *a = src ? ll_analysis_new(src, strlen(src)) : NULL;
        free(src);
        ll_analysis_closure_t *cl =
            a && !ll_analysis_error(a) ? ll_analysis_session_closure(session, a) : NULL;
        if (cl) {
            c->gpu = ll_analysis_closure_label(cl) == LL_ANALYSIS_GPU;
            c->imports = s_strs(ll_analysis_closure_imports(cl));
            c->state = s_strs(ll_analysis_closure_state(cl));
            json_array_append_new(writes, s_strs(ll_analysis_closure_writes(cl)));
            ll_analysis_closure_destroy(&cl);
            ll_analysis_session_record(session, a);
        } else {
            /* A cell that does not parse: it raises, on a CPU. */
            c->imports = json_array();
            c->state = json_array();
            json_array_append_new(writes, json_array());
        }
        ll_analysis_destroy(&a);
    }
    ll_analysis_session_destroy(&session);
    return 0;
}

/* ---- measuring, cached ---- */

static void s_sha256_hex(const char *data, size_t len, char out[65])
{
    unsigned char md[32];
    unsigned int n = 0;
    EVP_Digest(data, len, md, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* The cache file of KEY, its directories made (mkdir -p). */
static void s_cache_path(const char *key, char *out, size_t n)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[2048];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/looseleaf/trace", xdg);
    else
        snprintf(dir, sizeof dir, "%s/.cache/looseleaf/trace", home ? home : "/tmp");
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0700);
            *p = '/';
        }
    mkdir(dir, 0700);
    snprintf(out, n, "%s/%s.json", dir, key);
}

/* Run measure_notebook.py on PATH (IMPORTS: packages to time); its JSON
 * answer, or NULL after saying why.  The caller owns the result. */
static json_t *s_run_measure(const char *path, const char *imports, double timeout)
{
    int fd[2];
    if (pipe(fd) < 0)
        return NULL;
    char tmo[32];
    snprintf(tmo, sizeof tmo, "%g", timeout);
    char *argv[] = {(char *) LL_PYTHON_EXE,
                    (char *) LL_SRCDIR "/sim/measure_notebook.py",
                    (char *) "--imports",
                    (char *) imports,
                    (char *) "--cell-timeout",
                    tmo,
                    (char *) path,
                    NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, LL_PYTHON_EXE, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        fprintf(stderr, "looseleaf trace: cannot start %s: %s\n", LL_PYTHON_EXE, strerror(rc));
        return NULL;
    }
    FILE *f = fdopen(fd[0], "r");
    json_error_t jerr;
    json_t *out = f ? json_loadf(f, 0, &jerr) : NULL;
    if (f)
        fclose(f);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!out || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "looseleaf trace: %s: measuring failed (status %d)\n", path,
                WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        json_decref(out);
        return NULL;
    }
    return out;
}

/* The measurement of notebook PATH (its content TEXT), from the cache or a
 * run.  NULL on failure (said). */
static json_t *s_measure(const s_opts_t *o, const char *path, const char *text, const char *imports)
{
    char key[65], cpath[4096];
    size_t tl = strlen(text), il = strlen(imports);
    char *buf = malloc(tl + il + 8);
    if (!buf)
        return NULL;
    snprintf(buf, tl + il + 8, "%s%s\n%s", S_MEASURE_VERSION, imports, text);
    s_sha256_hex(buf, strlen(buf), key);
    free(buf);
    s_cache_path(key, cpath, sizeof cpath);
    if (o->cache) {
        json_t *cached = json_load_file(cpath, 0, NULL);
        if (cached)
            return cached;
    }
    fprintf(stderr, "looseleaf trace: running %s to measure it (cached after)\n", path);
    json_t *m = s_run_measure(path, imports, o->cell_timeout);
    if (m) {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.%d", cpath, (int) getpid());
        if (json_dump_file(m, tmp, JSON_COMPACT) == 0)
            rename(tmp, cpath);
    }
    return m;
}

static double s_sum_vars(json_t *vars, json_t *names)
{
    double total = 0;
    if (!names) {
        const char *k;
        json_t *v;
        json_object_foreach(vars, k, v)
            total += json_number_value(v);
        return total;
    }
    size_t i;
    json_t *n;
    json_array_foreach(names, i, n)
        total += json_number_value(json_object_get(vars, json_string_value(n)));
    return total;
}

/* Notebook NB: analysed, measured, its cells' numbers set.  0 or -1. */
static int s_load_notebook(const s_opts_t *o, s_nb_t *nb, json_t *all_imports)
{
    FILE *f = fopen(nb->path, "r");
    if (!f) {
        fprintf(stderr, "looseleaf trace: %s: cannot open\n", nb->path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = len >= 0 ? malloc((size_t) len + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t) len, f) : 0;
    fclose(f);
    if (!text)
        return -1;
    text[got] = '\0';
    json_error_t jerr;
    json_t *j = json_loadb(text, got, JSON_ALLOW_NUL, &jerr);
    json_t *writes = json_array();
    if (!j || !json_is_array(json_object_get(j, "cells")) || s_analyse(j, nb, writes) < 0) {
        fprintf(stderr, "looseleaf trace: %s: not an nbformat-4 notebook\n", nb->path);
        json_decref(j);
        json_decref(writes);
        free(text);
        return -1;
    }
    /* The packages it imports, for their import times. */
    json_t *pk = json_object();
    for (int k = 0; k < nb->ncells; k++) {
        size_t i;
        json_t *p;
        json_array_foreach(nb->cells[k].imports, i, p)
            json_object_set(pk, json_string_value(p), json_true());
    }
    char imports[4096] = "";
    const char *name;
    json_t *v;
    json_object_foreach(pk, name, v) {
        if (strlen(imports) + strlen(name) + 2 < sizeof imports) {
            if (imports[0])
                strcat(imports, ",");
            strcat(imports, name);
        }
    }
    json_decref(pk);
    json_t *m = o->run ? s_measure(o, nb->path, text, imports) : NULL;
    free(text);
    json_decref(j);
    if (o->run && !m) {
        json_decref(writes);
        return -1;
    }
    json_t *mcells = json_object_get(m, "cells"), *empty = json_object();
    if (m && (int) json_array_size(mcells) != nb->ncells)
        fprintf(stderr, "looseleaf trace: %s: %zu cells measured of %d\n", nb->path,
                json_array_size(mcells), nb->ncells);
    json_object_foreach(json_object_get(m, "import_s"), name, v)
        json_object_set(all_imports, name, v);
    for (int k = 0; k < nb->ncells; k++) {
        s_cell_t *c = &nb->cells[k];
        json_t *mc = json_array_get(mcells, (size_t) k);
        json_t *before =
            k > 0 ? json_object_get(json_array_get(mcells, (size_t) k - 1), "vars") : empty;
        json_t *after = json_object_get(mc, "vars");
        c->exec_s = json_number_value(json_object_get(mc, "exec_s"));
        c->closure_bytes = before ? s_sum_vars(before, c->state) : 0;
        c->namespace_bytes = before ? s_sum_vars(before, NULL) : 0;
        c->written_bytes = after ? s_sum_vars(after, json_array_get(writes, (size_t) k)) : 0;
    }
    json_decref(empty);
    json_decref(m);
    json_decref(writes);
    return 0;
}

/* ---- writing ---- */

static void s_print_notebook(const s_nb_t *nb)
{
    json_t *cells = json_array();
    for (int k = 0; k < nb->ncells; k++) {
        const s_cell_t *c = &nb->cells[k];
        json_array_append_new(
            cells, json_pack("{s:s, s:f, s:f, s:f, s:f, s:O, s:O}", "label", c->gpu ? "gpu" : "cpu",
                             "exec_s", c->exec_s, "closure_bytes", c->closure_bytes,
                             "written_bytes", c->written_bytes, "namespace_bytes",
                             c->namespace_bytes, "imports", c->imports, "state", c->state));
    }
    json_t *line =
        json_pack("{s:s, s:s, s:o}", "notebook", nb->id, "source", nb->path, "cells", cells);
    char *text = json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(line);
}

/* A seat: its generator and its next session's arrival. */
typedef struct {
    s_rng_t rng;
    double next;
    long index;
} s_seat_t;

/* One session of SEAT arriving at its next time: written; returns the time
 * its user would be done (cells at their measured times, no waits). */
static double s_session(const s_opts_t *o, s_nb_t *nbs, int nnb, s_seat_t *seat, long id)
{
    s_rng_t *r = &seat->rng;
    s_nb_t *nb = &nbs[s_next(r) % (uint64_t) nnb];
    /* Draw first: the cells to run (reruns), their gaps and edits. */
    int cap = nb->ncells * 4 + 4, n = 0;
    int *cell = malloc((size_t) cap * sizeof *cell);
    double *gap = malloc((size_t) cap * sizeof *gap), *edit = malloc((size_t) cap * sizeof *edit);
    if (!cell || !gap || !edit) {
        free(cell);
        free(gap);
        free(edit);
        return seat->next + 1;
    }
    double busy = 0, total = 0;
    for (int k = 0; k < nb->ncells; k++) {
        do {
            if (n == cap)
                break;
            cell[n] = k;
            gap[n] = s_draw(r, o->gap);
            edit[n] = s_draw(r, o->edit);
            total += gap[n] + edit[n] + nb->cells[k].exec_s;
            busy += nb->cells[k].gpu ? nb->cells[k].exec_s : 0;
            n++;
        } while (s_unif(r) < o->rerun);
    }
    double tail = s_draw(r, o->gap);
    total += tail;
    double scale = 1;
    if (o->gpu_busy > 0 && busy > 0)
        scale = o->gpu_busy * (total - busy) / (busy * (1 - o->gpu_busy));
    printf(
        "{\"session\":\"s%ld\",\"seat\":%ld,\"arrival_s\":%.3f,\"notebook\":\"%s\",\"tail_s\":%.3f,"
        "\"cells\":[",
        id, seat->index, seat->next, nb->id, tail);
    double end = seat->next + tail;
    for (int k = 0; k < n; k++) {
        const s_cell_t *c = &nb->cells[cell[k]];
        printf("%s{\"cell\":%d,\"gap_s\":%.3f,\"edit_s\":%.3f", k ? "," : "", cell[k], gap[k],
               edit[k]);
        double exec = c->exec_s;
        if (c->gpu && scale != 1) {
            exec *= scale;
            printf(",\"exec_s\":%.4f", exec);
        }
        printf("}");
        end += gap[k] + edit[k] + exec;
    }
    printf("]}\n");
    free(cell);
    free(gap);
    free(edit);
    return end;
}

/* --timing: notebook NB's recorded executions as one session (T0: the
 * earliest first execution of any notebook; R: for edit windows).  The
 * time between an output and the next execution is split into a gap and an
 * edit window drawn as usual (at most the whole time); the first cell's
 * edit is not known (0).  False when NB has no recorded timing. */
static bool s_timing_session(const s_opts_t *o, const s_nb_t *nb, double t0, s_rng_t *r, long id)
{
    int order[4096], n = 0;
    for (int k = 0; k < nb->ncells && n < 4096; k++)
        if (nb->cells[k].t_input >= 0 && nb->cells[k].t_reply >= nb->cells[k].t_input)
            order[n++] = k;
    if (n == 0)
        return false;
    for (int i = 1; i < n; i++) /* in the order they ran */
        for (int k = i; k > 0 && nb->cells[order[k]].t_input < nb->cells[order[k - 1]].t_input;
             k--) {
            int t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    printf("{\"session\":\"s%ld\",\"arrival_s\":%.3f,\"notebook\":\"%s\",\"tail_s\":0,\"cells\":[",
           id, nb->cells[order[0]].t_input - t0, nb->id);
    for (int i = 0; i < n; i++) {
        const s_cell_t *c = &nb->cells[order[i]];
        double gap = 0, edit = 0;
        if (i > 0) {
            double between = c->t_input - nb->cells[order[i - 1]].t_reply;
            between = between > 0 ? between : 0;
            edit = fmin(s_draw(r, o->edit), between);
            gap = between - edit;
        }
        printf("%s{\"cell\":%d,\"gap_s\":%.3f,\"edit_s\":%.3f,\"exec_s\":%.4f}", i ? "," : "",
               order[i], gap, edit, c->t_reply - c->t_input);
    }
    printf("]}\n");
    return true;
}

/* --timing: every notebook with recorded timing, in the order they began. */
static void s_timing_sessions(const s_opts_t *o, s_nb_t *nbs, int nnb)
{
    double first[256], t0 = -1;
    for (int i = 0; i < nnb; i++) {
        first[i] = -1;
        for (int k = 0; k < nbs[i].ncells; k++) {
            double t = nbs[i].cells[k].t_input;
            if (t >= 0 && (first[i] < 0 || t < first[i]))
                first[i] = t;
        }
        if (first[i] >= 0 && (t0 < 0 || first[i] < t0))
            t0 = first[i];
    }
    s_rng_t r;
    s_rng_seed(&r, o->seed, 0);
    long id = 0;
    bool done[256] = {false};
    for (;;) {
        int next = -1;
        for (int i = 0; i < nnb; i++)
            if (!done[i] && first[i] >= 0 && (next < 0 || first[i] < first[next]))
                next = i;
        if (next < 0)
            break;
        done[next] = true;
        if (s_timing_session(o, &nbs[next], t0, &r, id))
            id++;
    }
    for (int i = 0; i < nnb; i++)
        if (first[i] < 0)
            fprintf(stderr,
                    "looseleaf trace: %s: no recorded timing (JupyterLab's Record Timing "
                    "setting): left out\n",
                    nbs[i].path);
}

static void s_header(const s_opts_t *o, json_t *imports)
{
    json_t *nbs = json_array();
    for (int i = 0; i < o->nnb; i++)
        json_array_append_new(nbs, json_string(o->nbs[i]));
    json_t *h = json_pack(
        "{s:s, s:i, s:s, s:I, s:I, s:f, s:f, s:{s:{s:f, s:f}, s:{s:f, s:f}, s:f, s:f}, s:O, s:o}",
        "trace", "looseleaf-fleet", "version", 1, "generator", "looseleaf trace", "seed",
        (json_int_t) o->seed, "sessions", (json_int_t) o->sessions, "duration_s", o->duration,
        "spread_s", o->spread, "distributions", "edit_s_lognormal", "median", o->edit.median,
        "sigma", o->edit.sigma, "gap_s_lognormal", "median", o->gap.median, "sigma", o->gap.sigma,
        "rerun", o->rerun, "gpu_busy", o->gpu_busy, "import_s", imports, "notebooks", nbs);
    char *text = json_dumps(h, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(h);
}

/* `--workload paper`: the other trace source, sim/workload.py, run in this
 * process's place with the other arguments (it draws sessions from a
 * parameter file, not from notebooks it analyses here; it calls this
 * command back for the tree's CPU cells).  Returns only on failure; 0
 * when ARGV names no workload or the default one (removed from ARGV). */
static int s_workload(int *argc, char **argv)
{
    int at = -1;
    for (int i = 1; i < *argc; i++)
        if (strcmp(argv[i], "--workload") == 0)
            at = i;
    if (at < 0)
        return 0;
    const char *w = at + 1 < *argc ? argv[at + 1] : "";
    if (strcmp(w, "tree") != 0 && strcmp(w, "paper") != 0) {
        fprintf(stderr, "looseleaf trace: --workload wants tree or paper, not '%s'\n", w);
        return 2;
    }
    for (int i = at; i + 2 <= *argc; i++)
        argv[i] = argv[i + 2];
    *argc -= 2;
    if (strcmp(w, "tree") == 0)
        return 0;
    char **args = calloc((size_t) *argc + 2, sizeof *args);
    if (!args)
        return 1;
    args[0] = (char *) LL_PYTHON_EXE;
    args[1] = (char *) LL_SRCDIR "/sim/workload.py";
    for (int i = 1; i < *argc; i++)
        args[i + 1] = argv[i];
    fflush(stdout);
    execv(LL_PYTHON_EXE, args);
    fprintf(stderr, "looseleaf trace: cannot start %s: %s\n", LL_PYTHON_EXE, strerror(errno));
    free(args);
    return 2;
}

int ll_trace_main(int argc, char **argv)
{
    ll_log_init('A');
    int wrc = s_workload(&argc, argv);
    if (wrc != 0)
        return wrc;
    s_opts_t o;
    int rc = s_parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    char err[512];
    if (ll_interp_start_python("looseleaf", err, sizeof err) != 0 ||
        ll_analysis_init(err, sizeof err) != 0) {
        fprintf(stderr, "looseleaf trace: %s\n", err);
        return 2;
    }
    s_nb_t *nbs = calloc((size_t) o.nnb, sizeof *nbs);
    json_t *imports = json_object();
    rc = nbs ? 0 : 1;
    for (int i = 0; rc == 0 && i < o.nnb; i++) {
        nbs[i].path = o.nbs[i];
        snprintf(nbs[i].id, sizeof nbs[i].id, "nb%d", i);
        if (s_load_notebook(&o, &nbs[i], imports) < 0)
            rc = 1;
    }
    if (rc == 0) {
        s_header(&o, imports);
        for (int i = 0; i < o.nnb; i++)
            s_print_notebook(&nbs[i]);
        if (o.timing)
            s_timing_sessions(&o, nbs, o.nnb);
        /* Seats, each with its own generator; sessions in arrival order. */
        s_seat_t *seats = o.timing ? NULL : calloc((size_t) o.sessions, sizeof *seats);
        if (!seats && !o.timing)
            rc = 1;
        for (long k = 0; seats && k < o.sessions; k++) {
            s_rng_seed(&seats[k].rng, o.seed, (uint64_t) k);
            seats[k].next = o.spread * s_unif(&seats[k].rng);
            seats[k].index = k;
        }
        /* A binary heap of seats by their next arrival. */
        long n = seats ? o.sessions : 0, id = 0;
        s_seat_t **heap = calloc((size_t) n + 1, sizeof *heap);
        for (long k = 0; heap && k < n; k++) {
            long i = k;
            heap[i] = &seats[k];
            while (i > 0 && heap[(i - 1) / 2]->next > heap[i]->next) {
                s_seat_t *t = heap[i];
                heap[i] = heap[(i - 1) / 2];
                heap[(i - 1) / 2] = t;
                i = (i - 1) / 2;
            }
        }
        while (heap && n > 0) {
            s_seat_t *s = heap[0];
            double end = s_session(&o, nbs, o.nnb, s, id++);
            if (o.duration > 0 && end < o.duration) {
                s->next = end; /* the next user takes the seat */
            } else {
                heap[0] = heap[--n];
            }
            for (long i = 0;;) {
                long c = 2 * i + 1;
                if (c >= n)
                    break;
                if (c + 1 < n && heap[c + 1]->next < heap[c]->next)
                    c++;
                if (heap[i]->next <= heap[c]->next)
                    break;
                s_seat_t *t = heap[i];
                heap[i] = heap[c];
                heap[c] = t;
                i = c;
            }
        }
        free(heap);
        free(seats);
    }
    for (int i = 0; nbs && i < o.nnb; i++) {
        for (int k = 0; k < nbs[i].ncells; k++) {
            json_decref(nbs[i].cells[k].imports);
            json_decref(nbs[i].cells[k].state);
        }
        free(nbs[i].cells);
    }
    free(nbs);
    json_decref(imports);
    fflush(stdout);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Self-test: the generator is seeded and its draws have the stated   */
/* medians.                                                           */

int ll_trace_gen_selftest(bool verbose)
{
    int fails = 0;
    s_rng_t a, b;
    s_rng_seed(&a, 42, 7);
    s_rng_seed(&b, 42, 7);
    bool same = true;
    for (int i = 0; i < 100; i++)
        same = same && s_next(&a) == s_next(&b);
    S_CHECK(same);
    s_rng_seed(&b, 42, 8);
    S_CHECK(s_next(&a) != s_next(&b)); /* another seat, another stream */
    /* Lognormal draws: half below the median; sigma from the log's spread. */
    enum { N = 20000 };
    int below = 0;
    double sum = 0, sum2 = 0;
    s_dist_t d = {10, 1.0};
    for (int i = 0; i < N; i++) {
        double x = s_draw(&a, d);
        below += x < 10;
        sum += log(x);
        sum2 += log(x) * log(x);
    }
    double mean = sum / N, sd = sqrt(sum2 / N - mean * mean);
    S_CHECK(fabs((double) below / N - 0.5) < 0.02);
    S_CHECK(fabs(mean - log(10)) < 0.03 && fabs(sd - 1.0) < 0.03);
    double u = 0;
    for (int i = 0; i < N; i++) {
        double x = s_unif(&a);
        S_CHECK(x > 0 && x < 1);
        u += x;
    }
    S_CHECK(fabs(u / N - 0.5) < 0.01);
    s_dist_t dd;
    S_CHECK(s_dist_arg("30:1.5", &dd) == 0 && dd.median == 30 && dd.sigma == 1.5);
    S_CHECK(s_dist_arg("30", &dd) < 0 && s_dist_arg("30:x", &dd) < 0 &&
            s_dist_arg("-1:1", &dd) < 0);
    if (verbose)
        fprintf(stderr, "ll_trace_gen: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
