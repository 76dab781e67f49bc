/* ll_sim_cli: `looseleaf simulate [--json] TRACE [--hosts N --gpus-per-host 8
 * ...]`, the fleet simulator's command line (sim/API.md).  Runs
 * in its own short-lived process, single-threaded: reads the trace, runs
 * every design over it (ll_sim.h), prints a table (or one JSON object keyed
 * by design) and, with --out DIR, writes CSV files and the plots. */
#include "sim/ll_sim_cli.h"
#include "base/ll_clock.h"
#include "sim/ll_sim.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Latency points of the CDF in reports: 1 ms to 1000 s, 4 per decade. */
static const double s_cdf_t[] = {
    0.001, 0.00178, 0.00316, 0.00562, 0.01, 0.0178, 0.0316, 0.0562, 0.1, 0.178, 0.316, 0.562, 1.0,
    1.78,  3.16,    5.62,    10,      17.8, 31.6,   56.2,   100,    178, 316,   562,   1000};
#define S_NCDF (sizeof s_cdf_t / sizeof s_cdf_t[0])

static int s_usage(FILE *out)
{
    fprintf(out,
            "usage: looseleaf simulate [--json] [--out DIR] [--no-plots] [--hosts N]\n"
            "                          [--gpus-per-host G] [--gpu a100|none] [--designs LIST]\n"
            "                          [--costs FILE] [--set NAME=VALUE]... [--sample S]\n"
            "                          [--head PKG,...] [--threads 1|2] [--ablations] TRACE|-\n"
            "Replays the sessions of TRACE (JSON lines from `looseleaf trace`, or your own:\n"
            "sim/API.md) on a fleet of GPU hosts for every design at once, and prints per\n"
            "design: GPU-hours at whole-host granularity, peak and busy GPUs, the share of\n"
            "GPU cells that start within 1 s of Run, start-latency percentiles, warm hits.\n"
            "  --json          one JSON object keyed by design instead of the table\n"
            "  --out DIR       also write summary.csv, cdf.csv, timeline.csv and PNG plots\n"
            "  --hosts N       the fleet has at most N hosts (default: unbounded)\n"
            "  --gpus-per-host G   GPU slots per host (default 8)\n"
            "  --gpu none      hosts without GPUs, as this project's machines (default a100)\n"
            "  --designs LIST  of pinned,pinned_packed,keepalive,notebookos,naive,\n"
            "                  looseleaf_noprefetch,looseleaf_noclosure,looseleaf_fullsave,\n"
            "                  looseleaf_noimportcache,looseleaf_nowarm,looseleaf (default:\n"
            "                  the comparison: all but the four ablations)\n"
            "  --ablations     LooseLeaf with each mechanism off, and naive serverless\n"
            "  --costs FILE    the cost table (default: the tree's sim/costs.json)\n"
            "  --set NAME=V    change one cost (names: sim/costs.json)\n"
            "  --sample S      timeline step, seconds (default 60)\n"
            "  --head PKGS     the zygote head (default numpy,torch,IPython)\n"
            "  --threads N     1, or 2 (default) simulators reading a trace file at once\n");
    return 2;
}

typedef struct {
    bool json, plots, ablations;
    const char *out, *trace, *costs, *gpu, *designs, *head;
    const char *sets[64];
    int nsets;
    int hosts, gpus, threads;
    double sample;
} s_args_t;

static int s_int_arg(const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi)
        return -1;
    *out = (int) x;
    return 0;
}

/* -1: go on; else the exit status. */
static int s_parse(int argc, char **argv, s_args_t *a)
{
    *a = (s_args_t){.plots = true, .gpus = 8, .threads = 2, .sample = 60, .gpu = "a100"};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool more = i + 1 < argc;
        if (strcmp(o, "--json") == 0)
            a->json = true;
        else if (strcmp(o, "--ablations") == 0)
            a->ablations = true;
        else if (strcmp(o, "--no-plots") == 0)
            a->plots = false;
        else if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
            s_usage(stdout);
            return 0;
        } else if (strcmp(o, "--out") == 0 && more)
            a->out = argv[++i];
        else if (strcmp(o, "--hosts") == 0 && more) {
            if (s_int_arg(argv[++i], 0, 1000000, &a->hosts) < 0)
                return s_usage(stderr);
        } else if (strcmp(o, "--gpus-per-host") == 0 && more) {
            if (s_int_arg(argv[++i], 1, 64, &a->gpus) < 0)
                return s_usage(stderr);
        } else if (strcmp(o, "--threads") == 0 && more) {
            if (s_int_arg(argv[++i], 1, 2, &a->threads) < 0)
                return s_usage(stderr);
        } else if (strcmp(o, "--gpu") == 0 && more)
            a->gpu = argv[++i];
        else if (strcmp(o, "--designs") == 0 && more)
            a->designs = argv[++i];
        else if (strcmp(o, "--costs") == 0 && more)
            a->costs = argv[++i];
        else if (strcmp(o, "--head") == 0 && more)
            a->head = argv[++i];
        else if (strcmp(o, "--set") == 0 && more && a->nsets < 64)
            a->sets[a->nsets++] = argv[++i];
        else if (strcmp(o, "--sample") == 0 && more) {
            a->sample = atof(argv[++i]);
            if (!(a->sample > 0))
                return s_usage(stderr);
        } else if ((o[0] != '-' || strcmp(o, "-") == 0) && !a->trace)
            a->trace = o;
        else {
            fprintf(stderr, "looseleaf simulate: bad or incomplete argument '%s'\n", o);
            return s_usage(stderr);
        }
    }
    if (!a->trace)
        return s_usage(stderr);
    if (a->ablations && a->designs) {
        fprintf(stderr, "looseleaf simulate: --ablations or --designs, not both\n");
        return 2;
    }
    if (strcmp(a->gpu, "a100") != 0 && strcmp(a->gpu, "none") != 0) {
        fprintf(stderr, "looseleaf simulate: --gpu is a100 or none\n");
        return 2;
    }
    return -1;
}

static int s_designs(const char *list, bool ablations, unsigned *mask)
{
    if (!list) {
        *mask = ablations ? LL_SIM_ABLATION_DESIGNS : LL_SIM_DEFAULT_DESIGNS;
        return 0;
    }
    *mask = 0;
    char *copy = strdup(list);
    int rc = copy ? 0 : -1;
    for (char *save = NULL, *t = copy ? strtok_r(copy, ",", &save) : NULL; t;
         t = strtok_r(NULL, ",", &save)) {
        int d = ll_sim_design_find(t);
        if (d < 0) {
            fprintf(stderr, "looseleaf simulate: unknown design '%s'\n", t);
            rc = -1;
            break;
        }
        *mask |= 1u << d;
    }
    free(copy);
    return rc;
}

/* ---- the runs: the designs split over one or two simulators (threads) ---- */

typedef struct {
    ll_sim_t *sim[2];         /* each runs some of the designs */
    ll_trace_reader_t *rd[2]; /* each reads the trace itself */
    int n;                    /* simulators */
    int rc[2];                /* what their runs returned */
    char err[2][512];
} s_runs_t;

/* The simulator that ran design D (NULL: none). */
static const ll_sim_t *s_owner(const s_runs_t *runs, int d)
{
    for (int k = 0; k < runs->n; k++)
        if (ll_sim_config(runs->sim[k])->designs & (1u << d))
            return runs->sim[k];
    return NULL;
}

static bool s_ran(const s_runs_t *runs, int d)
{
    return s_owner(runs, d) != NULL;
}

static double s_hours(const s_runs_t *runs, int d)
{
    const ll_sim_t *sim = s_owner(runs, d);
    return sim ? ll_sim_gpu_hours(sim, d) : 0;
}

/* ---- figures ---- */

typedef struct {
    double gpu_hours, peak_gpus, mean_gpus, busy_gpus, held_gpus, within, within50, p50, p95, p99;
    double warm, prefetched, staged, held_share;
} s_fig_t;

static s_fig_t s_figures(const s_runs_t *runs, ll_sim_design_t d)
{
    const ll_sim_t *sim = s_owner(runs, d);
    const ll_sim_result_t *r = ll_sim_result(sim, d);
    int G = ll_sim_config(sim)->gpus_per_host;
    double span = r->span_s > 0 ? r->span_s : 1;
    double cells = r->gpu_cells > 0 ? (double) r->gpu_cells : 1;
    return (s_fig_t){
        .gpu_hours = ll_sim_gpu_hours(sim, d),
        .peak_gpus = (double) r->peak_hosts * G,
        .mean_gpus = r->host_s * G / span,
        .busy_gpus = r->exec_gpu_s / span,
        .held_gpus = r->held_gpu_s / span,
        .within = ll_sim_latency_share(r, 1.0),
        .within50 = ll_sim_latency_share(r, 0.05),
        .p50 = ll_sim_latency_quantile(r, 0.50),
        .p95 = ll_sim_latency_quantile(r, 0.95),
        .p99 = ll_sim_latency_quantile(r, 0.99),
        .warm = r->warm_hits / cells,
        .prefetched = r->prefetched / cells,
        .staged = r->staged / cells,
        .held_share = r->pool_connected_s > 0 ? r->session_held_s / r->pool_connected_s : 0,
    };
}

static const char *s_dur(double s, char *buf, size_t n)
{
    if (s < 1e-3)
        snprintf(buf, n, "%.0f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, n, "%.1f ms", s * 1e3);
    else if (s < 120)
        snprintf(buf, n, "%.2f s", s);
    else
        snprintf(buf, n, "%.1f min", s / 60);
    return buf;
}

static void s_table(const s_runs_t *runs, long sessions, double wall)
{
    double pin_h = s_hours(runs, LL_SIM_PINNED);
    uint64_t events = 0;
    printf("%-23s %9s %8s %6s %7s %7s %8s %7s %7s %9s %9s %9s %6s\n", "design", "GPU-h",
           "vs pinned", "peak", "busy", "held", "cells", "<=50ms", "<=1 s", "p50", "p95", "p99",
           "warm");
    for (int d = 0; d < LL_SIM_NDESIGNS; d++) {
        if (!s_ran(runs, d))
            continue;
        const ll_sim_result_t *r = ll_sim_result(s_owner(runs, d), d);
        s_fig_t f = s_figures(runs, d);
        char vs[16] = "-", b1[24], b2[24], b3[24];
        if (pin_h > 0)
            snprintf(vs, sizeof vs, "%+.0f%%", 100.0 * (f.gpu_hours / pin_h - 1));
        printf("%-23s %9.1f %8s %6.0f %7.1f %7.1f %8ld %6.1f%% %6.1f%% %9s %9s %9s %5.1f%%\n",
               ll_sim_design_name(d), f.gpu_hours, vs, f.peak_gpus, f.busy_gpus, f.held_gpus,
               r->gpu_cells, 100 * f.within50, 100 * f.within, s_dur(f.p50, b1, sizeof b1),
               s_dur(f.p95, b2, sizeof b2), s_dur(f.p99, b3, sizeof b3), 100 * f.warm);
    }
    printf("(GPU-h: powered hosts x %d GPUs; peak: GPUs powered at most; busy / held: mean GPUs "
           "running a cell / held by a job, warm worker or container; <=50ms, <=1 s: GPU cells "
           "starting within 50 ms, 1 s of Run; warm: cells on a process holding the session's "
           "state)\n",
           ll_sim_config(runs->sim[0])->gpus_per_host);
    for (int k = 0; k < runs->n; k++)
        events += ll_sim_events(runs->sim[k]);
    printf("%ld sessions, %llu events, simulated in %.1f s on %d thread%s\n", sessions,
           (unsigned long long) events, wall, runs->n, runs->n > 1 ? "s" : "");
}

static json_t *s_json_design(const s_runs_t *runs, ll_sim_design_t d)
{
    const ll_sim_result_t *r = ll_sim_result(s_owner(runs, d), d);
    s_fig_t f = s_figures(runs, d);
    json_t *o = json_object();
    double pin = s_hours(runs, LL_SIM_PINNED), nbos = s_hours(runs, LL_SIM_NOTEBOOKOS);
    json_object_set_new(o, "gpu_hours", json_real(f.gpu_hours));
    if (pin > 0)
        json_object_set_new(o, "savings_vs_pinned", json_real(1 - f.gpu_hours / pin));
    if (nbos > 0)
        json_object_set_new(o, "savings_vs_notebookos", json_real(1 - f.gpu_hours / nbos));
    json_object_set_new(o, "peak_gpus", json_real(f.peak_gpus));
    json_object_set_new(o, "mean_provisioned_gpus", json_real(f.mean_gpus));
    json_object_set_new(o, "mean_busy_gpus", json_real(f.busy_gpus));
    json_object_set_new(o, "mean_held_gpus", json_real(f.held_gpus));
    json_object_set_new(o, "busy_gpu_hours", json_real(r->exec_gpu_s / 3600));
    json_object_set_new(o, "working_gpu_hours", json_real(r->busy_gpu_s / 3600));
    json_object_set_new(o, "held_gpu_hours", json_real(r->held_gpu_s / 3600));
    json_object_set_new(o, "sessions", json_integer(r->sessions));
    json_object_set_new(o, "span_s", json_real(r->span_s));
    json_object_set_new(o, "gpu_cells", json_integer(r->gpu_cells));
    json_object_set_new(o, "share_within_1s", json_real(f.within));
    json_object_set_new(o, "share_missing_1s", json_real(1 - f.within));
    json_object_set_new(o, "share_within_50ms", json_real(f.within50));
    json_object_set_new(o, "latency_p50_s", json_real(f.p50));
    json_object_set_new(o, "latency_p95_s", json_real(f.p95));
    json_object_set_new(o, "latency_p99_s", json_real(f.p99));
    json_object_set_new(o, "latency_max_s", json_real(r->lat_max_s));
    json_object_set_new(o, "latency_mean_s",
                        json_real(r->gpu_cells ? r->lat_sum_s / r->gpu_cells : 0));
    json_object_set_new(o, "warm_hit_rate", json_real(f.warm));
    json_object_set_new(o, "prefetched_share", json_real(f.prefetched));
    json_object_set_new(o, "staged_share", json_real(f.staged));
    if (LL_SIM_IS_LOOSELEAF(d))
        json_object_set_new(o, "session_held_share", json_real(f.held_share));
    json_t *cdf = json_array();
    for (size_t k = 0; k < S_NCDF; k++)
        json_array_append_new(cdf,
                              json_pack("[f, f]", s_cdf_t[k], ll_sim_latency_share(r, s_cdf_t[k])));
    json_object_set_new(o, "latency_cdf", cdf);
    return o;
}

static int s_print_json(const s_runs_t *runs)
{
    json_t *doc = json_object();
    for (int d = 0; d < LL_SIM_NDESIGNS; d++)
        if (s_ran(runs, d))
            json_object_set_new(doc, ll_sim_design_name(d), s_json_design(runs, d));
    char *text = json_dumps(doc, JSON_INDENT(1) | JSON_REAL_PRECISION(8));
    json_decref(doc);
    if (!text)
        return -1;
    printf("%s\n", text);
    free(text);
    return 0;
}

/* ---- files ---- */

static FILE *s_open(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "looseleaf simulate: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

static int s_write_csv(const s_runs_t *runs, const char *dir)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) {
        fprintf(stderr, "looseleaf simulate: cannot make %s: %s\n", dir, strerror(errno));
        return -1;
    }
    FILE *sum = s_open(dir, "summary.csv"), *cdf = s_open(dir, "cdf.csv"),
         *tl = s_open(dir, "timeline.csv");
    int rc = sum && cdf && tl ? 0 : -1;
    if (rc == 0) {
        fprintf(sum, "design,gpu_hours,peak_gpus,mean_provisioned_gpus,mean_busy_gpus,"
                     "mean_held_gpus,sessions,gpu_cells,share_within_1s,latency_p50_s,"
                     "latency_p95_s,latency_p99_s,warm_hit_rate,prefetched_share,span_s,"
                     "share_within_50ms\n");
        fprintf(cdf, "design,latency_s,share\n");
        fprintf(tl, "design,t_s,provisioned_gpus,busy_gpus\n");
    }
    for (int d = 0; rc == 0 && d < LL_SIM_NDESIGNS; d++) {
        if (!s_ran(runs, d))
            continue;
        const ll_sim_result_t *r = ll_sim_result(s_owner(runs, d), d);
        s_fig_t f = s_figures(runs, d);
        const char *n = ll_sim_design_name(d);
        fprintf(sum,
                "%s,%.6g,%.0f,%.6g,%.6g,%.6g,%ld,%ld,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n", n,
                f.gpu_hours, f.peak_gpus, f.mean_gpus, f.busy_gpus, f.held_gpus, r->sessions,
                r->gpu_cells, f.within, f.p50, f.p95, f.p99, f.warm, f.prefetched, r->span_s,
                f.within50);
        for (int b = 0; b < LL_SIM_LAT_BINS; b += 5)
            fprintf(cdf, "%s,%.6g,%.6g\n", n, ll_sim_latency_bin_edge(b),
                    ll_sim_latency_share(r, ll_sim_latency_bin_edge(b)));
        for (int k = 0; k < r->nsamples; k++)
            fprintf(tl, "%s,%.0f,%.6g,%.6g\n", n, r->t_s[k], r->powered_gpus[k], r->busy_gpus[k]);
    }
    if (sum)
        fclose(sum);
    if (cdf)
        fclose(cdf);
    if (tl)
        fclose(tl);
    return rc;
}

/* The plots of DIR by sim/plot_sim.py (matplotlib); a missing matplotlib
 * is said, not fatal. */
static void s_plots(const char *dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = dup(2);
        if (fd >= 0)
            dup2(fd, 1); /* its messages on stderr: stdout may be JSON */
        execl(LL_PYTHON_EXE, LL_PYTHON_EXE, LL_SRCDIR "/sim/plot_sim.py", dir, (char *) NULL);
        _exit(127);
    }
    int st = 0;
    if (pid > 0)
        waitpid(pid, &st, 0);
    if (pid < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr,
                "looseleaf simulate: no plots (%s/sim/plot_sim.py failed; the CSV files "
                "are there)\n",
                LL_SRCDIR);
}

static void s_run_one(s_runs_t *runs, int k)
{
    runs->rc[k] = ll_sim_run(runs->sim[k], runs->rd[k], runs->err[k], sizeof runs->err[k]);
}

static void *s_thread(void *arg)
{
    s_run_one(arg, 1);
    return NULL;
}

static void s_runs_free(s_runs_t *runs)
{
    for (int k = 0; k < 2; k++) {
        ll_sim_destroy(&runs->sim[k]);
        ll_trace_reader_destroy(&runs->rd[k]);
    }
}

/* One simulator, or two (a thread each, each reading the trace: a file,
 * not stdin) with the designs split so that the two take about as long:
 * LooseLeaf and its ablations are the slowest (weight 3 against 1), the
 * heaviest first to the lighter side. */
static int s_setup(const s_args_t *a, const ll_sim_config_t *cfg, s_runs_t *runs)
{
    unsigned split[2] = {cfg->designs, 0};
    if (a->threads > 1 && strcmp(a->trace, "-") != 0 && (cfg->designs & (cfg->designs - 1)) != 0) {
        int w[2] = {0, 0};
        split[0] = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int d = LL_SIM_NDESIGNS - 1; d >= 0; d--) {
                int weight = LL_SIM_IS_LOOSELEAF(d) ? 3 : 1;
                if (!(cfg->designs & (1u << d)) || (weight == 3) != (pass == 0))
                    continue;
                int k = w[1] < w[0];
                split[k] |= 1u << d;
                w[k] += weight;
            }
    }
    json_object_seed(0); /* before any thread makes a JSON object */
    char err[512];
    for (int k = 0; k < 2 && split[k]; k++) {
        ll_sim_config_t c = *cfg;
        c.designs = split[k];
        runs->rd[k] = ll_trace_reader_new(a->trace, &c.cost, a->head, err, sizeof err);
        runs->sim[k] = runs->rd[k] ? ll_sim_new(&c, err, sizeof err) : NULL;
        if (!runs->sim[k]) {
            fprintf(stderr, "looseleaf simulate: %s\n", err);
            return -1;
        }
        runs->n++;
    }
    return 0;
}

int ll_simulate_main(int argc, char **argv)
{
    s_args_t a;
    int rc = s_parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    ll_sim_config_t cfg = {.gpus_per_host = a.gpus,
                           .max_hosts = a.hosts,
                           .gpu = strcmp(a.gpu, "none") != 0,
                           .sample_s = a.sample,
                           .head = a.head};
    char err[512];
    if (s_designs(a.designs, a.ablations, &cfg.designs) < 0)
        return 2;
    if (ll_cost_load(&cfg.cost, a.costs, err, sizeof err) < 0) {
        fprintf(stderr, "looseleaf simulate: costs: %s\n", err);
        return 2;
    }
    for (int k = 0; k < a.nsets; k++)
        if (ll_cost_set(&cfg.cost, a.sets[k], err, sizeof err) < 0) {
            fprintf(stderr, "looseleaf simulate: %s\n", err);
            return 2;
        }
    if (!cfg.gpu)
        ll_cost_no_gpu(&cfg.cost);
    s_runs_t runs;
    memset(&runs, 0, sizeof runs);
    if (s_setup(&a, &cfg, &runs) < 0) {
        s_runs_free(&runs);
        return 2;
    }
    double t0 = ll_clock_s();
    pthread_t th;
    bool threaded = runs.n == 2 && pthread_create(&th, NULL, s_thread, &runs) == 0;
    if (runs.n == 2 && !threaded)
        s_run_one(&runs, 1); /* no thread: one after the other */
    s_run_one(&runs, 0);
    if (threaded)
        pthread_join(th, NULL);
    double wall = ll_clock_s() - t0;
    for (int k = 0; k < runs.n; k++)
        if (runs.rc[k] < 0) {
            fprintf(stderr, "looseleaf simulate: %s: %s\n", a.trace, runs.err[k]);
            s_runs_free(&runs);
            return 1;
        }
    long sessions = 0;
    uint64_t events = 0;
    for (int d = 0; d < LL_SIM_NDESIGNS; d++)
        if (s_ran(&runs, d))
            sessions = ll_sim_result(s_owner(&runs, d), d)->sessions;
    for (int k = 0; k < runs.n; k++)
        events += ll_sim_events(runs.sim[k]);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    rc = 0;
    if (a.json)
        rc = s_print_json(&runs);
    else
        s_table(&runs, sessions, wall);
    fprintf(
        stderr,
        "looseleaf simulate: %ld sessions, %llu events in %.1f s on %d thread%s (%.0f events/s), "
        "peak memory %.0f MiB\n",
        sessions, (unsigned long long) events, wall, runs.n, runs.n > 1 ? "s" : "",
        wall > 0 ? events / wall : 0.0, ru.ru_maxrss / 1024.0);
    if (a.out && s_write_csv(&runs, a.out) == 0 && a.plots) {
        fflush(stdout);
        s_plots(a.out);
    }
    s_runs_free(&runs);
    return rc < 0 ? 1 : 0;
}
