/* ll_sim_selftest: the simulator's self-test: one scripted session through
 * the designs, each start latency checked against the cost table's
 * formula.  A file of its own because it drives the engine (ll_sim.c)
 * through every design, which sit between the two. */
#include "sim/ll_sim_internal.h"
#include "base/ll_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Self-test: one scripted session through four designs, each start   */
/* latency checked against the cost table's formula.                  */

/* Run the designs MASK over TRACE (text) with COST; the simulator, or NULL. */
static ll_sim_t *s_test_run(const char *trace, const ll_cost_t *cost, unsigned mask, int max_hosts)
{
    char path[] = "/tmp/ll_sim_selftest_XXXXXX", err[256];
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f)
        return NULL;
    fputs(trace, f);
    fclose(f);
    ll_sim_config_t cfg = {.cost = *cost,
                           .gpus_per_host = 8,
                           .max_hosts = max_hosts,
                           .gpu = true,
                           .designs = mask,
                           .sample_s = 60};
    ll_trace_reader_t *r = ll_trace_reader_new(path, &cfg.cost, NULL, err, sizeof err);
    ll_sim_t *sim = r ? ll_sim_new(&cfg, err, sizeof err) : NULL;
    if (sim && ll_sim_run(sim, r, err, sizeof err) < 0)
        ll_sim_destroy(&sim);
    ll_trace_reader_destroy(&r);
    remove(path);
    return sim;
}

int ll_sim_selftest(bool verbose)
{
    int fails = 0;
#define S_NEAR(a, b) (fabs((double) (a) - (double) (b)) < 1e-6 * (1 + fabs((double) (b))))
    ll_cost_t c;
    char err[256];
    S_CHECK(ll_cost_load(&c, NULL, err, sizeof err) == 0);
    S_CHECK(ll_sim_design_find("looseleaf-noprefetch") == LL_SIM_LOOSELEAF_NOPF);
    S_CHECK(ll_sim_design_find("nope") == -1 &&
            strcmp(ll_sim_design_name(LL_SIM_PINNED), "pinned") == 0);
    /* One session: two GPU cells of 10 s, 5 s edits, 100 s between them,
     * no state (so no restore beyond its fixed part), no hints. */
    const char *one = "{\"session\": \"a\", \"arrival_s\": 0, \"cells\": ["
                      "{\"label\": \"gpu\", \"exec_s\": 10, \"edit_s\": 5, \"hints_s\": []},"
                      "{\"label\": \"gpu\", \"exec_s\": 10, \"edit_s\": 5, \"gap_s\": 100, "
                      "\"hints_s\": []}]}\n";
    unsigned mask = 1u << LL_SIM_PINNED | 1u << LL_SIM_KEEPALIVE | 1u << LL_SIM_NAIVE |
                    1u << LL_SIM_LOOSELEAF_NOPF;
    ll_sim_t *sim = s_test_run(one, &c, mask, 0);
    S_CHECK(sim != NULL);
    if (!sim)
        return 1;
    const ll_sim_result_t *pin = ll_sim_result(sim, LL_SIM_PINNED),
                          *ka = ll_sim_result(sim, LL_SIM_KEEPALIVE),
                          *nv = ll_sim_result(sim, LL_SIM_NAIVE),
                          *ll = ll_sim_result(sim, LL_SIM_LOOSELEAF_NOPF);
    /* pinned: the first GPU cell starts CUDA, the second nothing; one host
     * for the whole session. */
    double span = 5 + c.cuda_init_s + 10 + 100 + 5 + 10;
    S_CHECK(pin->gpu_cells == 2 && pin->sessions == 1 && pin->warm_hits == 2);
    S_CHECK(S_NEAR(pin->lat_max_s, c.cuda_init_s) && S_NEAR(pin->lat_sum_s, c.cuda_init_s));
    S_CHECK(S_NEAR(pin->span_s, span) &&
            S_NEAR(ll_sim_gpu_hours(sim, LL_SIM_PINNED), span * 8 / 3600));
    S_CHECK(pin->peak_hosts == 1 && S_NEAR(pin->exec_gpu_s, 20) && S_NEAR(pin->held_gpu_s, span));
    /* keep-alive: a cold container, then (100 s < the idle timeout) a warm one. */
    double cold = c.python_start_s + c.cuda_init_s;
    S_CHECK(ka->warm_hits == 1 && S_NEAR(ka->lat_max_s, cold) && S_NEAR(ka->lat_sum_s, cold));
    /* naive: a fresh process each time. */
    S_CHECK(nv->warm_hits == 0 && S_NEAR(nv->lat_sum_s, 2 * cold));
    /* LooseLeaf without prefetch: the first cell opens the store and forks
     * a worker that starts CUDA; the second is a warm hit. */
    double ll_cold =
        c.first_commit_s + c.kernel_route_s + c.fork_s + c.cuda_init_s + c.restore_fixed_s;
    double ll_warm = c.kernel_route_s + c.warm_prep_s;
    S_CHECK(ll->gpu_cells == 2 && ll->warm_hits == 1 && ll->prefetched == 0);
    S_CHECK(S_NEAR(ll->lat_max_s, ll_cold) && S_NEAR(ll->lat_sum_s, ll_cold + ll_warm));
    S_CHECK(ll->peak_hosts == (int) c.min_hosts && ll->within_1s == 2);
    /* The worker held its slot from the fork to the session's end, billed. */
    S_CHECK(ll->session_held_s > 20 && ll->session_held_s <= ll->pool_connected_s + 1e-9);
    S_CHECK(ll_sim_latency_quantile(ll, 1.0) <= ll_cold * 1.0001);
    S_CHECK(ll_sim_latency_share(ll, 1.0) == 1.0 && ll_sim_latency_share(ll, 1e-4) == 0.0);
    ll_sim_destroy(&sim);
    S_CHECK(sim == NULL);
    ll_sim_destroy(&sim);

    /* With a hint early in a long edit window, LooseLeaf prepares the
     * worker while the user edits: the first cell is a warm hit too. */
    const char *hinted =
        "{\"session\": \"a\", \"arrival_s\": 0, \"cells\": ["
        "{\"label\": \"gpu\", \"exec_s\": 10, \"edit_s\": 5, \"hints_s\": [0]},"
        "{\"label\": \"cpu\", \"exec_s\": 1, \"edit_s\": 1, \"written_bytes\": 1e9},"
        "{\"label\": \"gpu\", \"exec_s\": 10, \"edit_s\": 5, \"closure_bytes\": 2e9, "
        "\"hints_s\": []}]}\n";
    sim = s_test_run(hinted, &c, 1u << LL_SIM_LOOSELEAF, 0);
    ll = sim ? ll_sim_result(sim, LL_SIM_LOOSELEAF) : NULL;
    S_CHECK(ll && ll->gpu_cells == 2 && ll->warm_hits == 2 && ll->prefetched == 1);
    /* ... the second restores what the CPU cell wrote (1 GB) at Run. */
    double moved = c.kernel_route_s + c.warm_prep_s + c.restore_fixed_s + 1e9 / c.h2d_bw;
    S_CHECK(ll && S_NEAR(ll->lat_max_s, moved));
    ll_sim_destroy(&sim);

    /* Sessions beyond a full fleet (one host): pinned's ninth session waits
     * for a GPU and gets the first session's when it leaves (before the
     * ninth's Run: no cell waited). */
    char many[4096] = "";
    for (int k = 0; k < 9; k++)
        snprintf(many + strlen(many), sizeof many - strlen(many),
                 "{\"session\": \"s%d\", \"arrival_s\": %d, \"cells\": [{\"label\": \"gpu\", "
                 "\"exec_s\": 1, \"edit_s\": %d}]}\n",
                 k, k, k == 0 ? 50 : 100);
    sim = s_test_run(many, &c, 1u << LL_SIM_PINNED, 1);
    pin = sim ? ll_sim_result(sim, LL_SIM_PINNED) : NULL;
    S_CHECK(pin && pin->sessions == 9 && pin->peak_hosts == 1);
    /* s0 leaves at 50 + CUDA + 1, s8 runs at 108. */
    S_CHECK(pin && S_NEAR(pin->lat_max_s, c.cuda_init_s) && pin->gpu_cells == 9);
    ll_sim_destroy(&sim);
#undef S_NEAR
    if (verbose)
        fprintf(stderr, "ll_sim: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
