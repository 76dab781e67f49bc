/* ll_cost: the cost file and --set (see ll_cost.h).  Runs in the
 * `looseleaf simulate` process. */
#include "sim/ll_cost.h"
#include "base/ll_check.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_COST(name)                     \
    {                                    \
#name, offsetof(ll_cost_t, name) \
    }

static const struct {
    const char *name;
    size_t off;
} s_table[] = {
    S_COST(kernel_route_s),
    S_COST(first_commit_s),
    S_COST(debounce_s),
    S_COST(max_wait_s),
    S_COST(rehint_s),
    S_COST(fork_s),
    S_COST(warm_prep_s),
    S_COST(restore_fixed_s),
    S_COST(restore_bw),
    S_COST(save_fixed_s),
    S_COST(save_bw),
    S_COST(worker_exit_s),
    S_COST(import_default_s),
    S_COST(zygote_start_s),
    S_COST(warm_idle_s),
    S_COST(spec_window_s),
    S_COST(staged_per_slot),
    S_COST(cuda_init_s),
    S_COST(h2d_bw),
    S_COST(d2h_bw),
    S_COST(net_bw),
    S_COST(host_boot_s),
    S_COST(host_mem_bytes),
    S_COST(python_start_s),
    S_COST(pickle_load_bw),
    S_COST(pickle_dump_bw),
    S_COST(keepalive_idle_s),
    S_COST(nbos_replicas),
    S_COST(nbos_subscription),
    S_COST(target_util),
    S_COST(p_wait),
    S_COST(load_window_s),
    S_COST(down_hold_s),
    S_COST(control_s),
    S_COST(min_hosts),
    S_COST(fleet_shared),
};
#define S_NCOSTS (sizeof s_table / sizeof s_table[0])

const char *const *ll_cost_names(void)
{
    static const char *names[S_NCOSTS + 1];
    for (size_t i = 0; i < S_NCOSTS; i++)
        names[i] = s_table[i].name;
    return names;
}

const char *ll_cost_default_path(void)
{
    return LL_SRCDIR "/sim/costs.json";
}

static double *s_field(ll_cost_t *c, const char *name, size_t len)
{
    for (size_t i = 0; i < S_NCOSTS; i++)
        if (strlen(s_table[i].name) == len && strncmp(s_table[i].name, name, len) == 0)
            return (double *) ((char *) c + s_table[i].off);
    return NULL;
}

/* Costs are non-negative; a bandwidth, a fraction or a count that the
 * simulator divides by must be positive. */
static bool s_valid(const char *name, double v)
{
    if (!isfinite(v) || v < 0)
        return false;
    bool positive = strstr(name, "_bw") || strcmp(name, "target_util") == 0 ||
                    strcmp(name, "p_wait") == 0 || strcmp(name, "load_window_s") == 0 ||
                    strcmp(name, "control_s") == 0 || strcmp(name, "nbos_replicas") == 0 ||
                    strcmp(name, "nbos_subscription") == 0 || strcmp(name, "host_mem_bytes") == 0;
    if (positive && v <= 0)
        return false;
    if (strcmp(name, "fleet_shared") == 0 && v != 0 && v != 1)
        return false;
    if ((strcmp(name, "target_util") == 0 && v > 1) || (strcmp(name, "p_wait") == 0 && v >= 1))
        return false;
    return true;
}

int ll_cost_load(ll_cost_t *costs, const char *path, char *err, size_t errlen)
{
    if (!path)
        path = ll_cost_default_path();
    memset(costs, 0, sizeof *costs);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc) {
        snprintf(err, errlen, "%s: %s (line %d)", path, jerr.text, jerr.line);
        return -1;
    }
    json_t *table = json_object_get(doc, "costs");
    int rc = 0;
    if (!json_is_object(table)) {
        snprintf(err, errlen, "%s: no \"costs\" object", path);
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < S_NCOSTS; i++) {
        json_t *e = json_object_get(table, s_table[i].name);
        json_t *v = json_is_object(e) ? json_object_get(e, "value") : NULL;
        if (!json_is_number(v) || !json_is_string(json_object_get(e, "source"))) {
            snprintf(err, errlen, "%s: \"%s\" needs a numeric \"value\" and a \"source\"", path,
                     s_table[i].name);
            rc = -1;
        } else if (!s_valid(s_table[i].name, json_number_value(v))) {
            snprintf(err, errlen, "%s: \"%s\" is out of range", path, s_table[i].name);
            rc = -1;
        } else {
            *(double *) ((char *) costs + s_table[i].off) = json_number_value(v);
        }
    }
    const char *key;
    json_t *e;
    json_object_foreach(rc == 0 ? table : NULL, key, e) {
        if (!s_field(costs, key, strlen(key))) {
            snprintf(err, errlen, "%s: unknown cost \"%s\"", path, key);
            rc = -1;
            break;
        }
    }
    json_decref(doc);
    return rc;
}

int ll_cost_set(ll_cost_t *costs, const char *assignment, char *err, size_t errlen)
{
    const char *eq = strchr(assignment, '=');
    double *f = eq ? s_field(costs, assignment, (size_t) (eq - assignment)) : NULL;
    if (!f) {
        snprintf(err, errlen, "--set %s: expected NAME=VALUE with a cost's NAME", assignment);
        return -1;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(eq + 1, &end);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int) (eq - assignment), assignment);
    if (errno || end == eq + 1 || *end || !s_valid(name, v)) {
        snprintf(err, errlen, "--set %s: not a valid value for %s", assignment, name);
        return -1;
    }
    *f = v;
    return 0;
}

void ll_cost_no_gpu(ll_cost_t *costs)
{
    costs->cuda_init_s = 0;
    costs->h2d_bw = costs->restore_bw;
    costs->d2h_bw = costs->save_bw;
}

/* ------------------------------------------------------------------ */
/* Self-test: the tree's cost file loads; --set and its errors.       */

int ll_cost_selftest(bool verbose)
{
    int fails = 0;
    ll_cost_t c;
    char err[256] = "";
    S_CHECK(ll_cost_load(&c, NULL, err, sizeof err) == 0);
    if (verbose && err[0])
        fprintf(stderr, "ll_cost: %s\n", err);
    S_CHECK(c.fork_s > 0 && c.h2d_bw > 0 && c.target_util > 0 && c.target_util <= 1);
    S_CHECK(ll_cost_set(&c, "fork_s=0.5", err, sizeof err) == 0 && c.fork_s == 0.5);
    S_CHECK(ll_cost_set(&c, "no_such=1", err, sizeof err) == -1 && strstr(err, "no_such"));
    S_CHECK(ll_cost_set(&c, "fork_s", err, sizeof err) == -1);
    S_CHECK(ll_cost_set(&c, "fork_s=abc", err, sizeof err) == -1);
    S_CHECK(ll_cost_set(&c, "fork_s=-1", err, sizeof err) == -1);
    S_CHECK(ll_cost_set(&c, "net_bw=0", err, sizeof err) == -1);
    S_CHECK(ll_cost_set(&c, "target_util=1.5", err, sizeof err) == -1);
    ll_cost_no_gpu(&c);
    S_CHECK(c.cuda_init_s == 0 && c.h2d_bw == c.restore_bw && c.d2h_bw == c.save_bw);
    S_CHECK(ll_cost_load(&c, "/nonexistent/costs.json", err, sizeof err) == -1);
    const char *const *names = ll_cost_names();
    size_t n = 0;
    while (names[n])
        n++;
    S_CHECK(n == S_NCOSTS && strcmp(names[0], "kernel_route_s") == 0);
    if (verbose)
        fprintf(stderr, "ll_cost: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
