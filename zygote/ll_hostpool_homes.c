/* ll_hostpool_homes: the host pool's record of home workers that went
 * (zygote/API.md "Homes").  Nothing a cell made may be lost.  A worker holding values no
 * store can hold is its session's home for them; when it goes, its client
 * is told once, and the session's later jobs carry {pid: why} so the
 * worker that meets a HomeRef of a gone home names why the value is lost.
 * Run by the pool's one thread (ll_hostpool_jobs.c calls it). */
#include "zygote/ll_hostpool_internal.h"
#include "base/ll_log.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* R's worker, the home of values of its session no store holds (zyg.py),
 * goes (HOW: "evicted for another session", ...): its client hears it, with
 * the time, so the kernel can name each lost variable and why.  Once. */
void ll_hostpool_tell_gone(ll_hostpool_t *pool, int r, const char *how)
{
    const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
    if (j->worker.home <= 0 || j->client < 0 || pool->runs[r].worker.pid <= 0)
        return;
    char at[16], why[300];
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(at, sizeof at, "%H:%M:%S", &tm))
        snprintf(at, sizeof at, "?");
    snprintf(why, sizeof why, "%s at %s", how, at);
    ll_info("pool", "worker %d, home of session %s: %s", (int) pool->runs[r].worker.pid,
            j->session ? j->session : "?", why);
    ll_hostpool_gone_t *g = &pool->gone[pool->gone_next++ % LL_HOSTPOOL_GONE];
    g->client = j->client;
    snprintf(g->session, sizeof g->session, "%s", j->session ? j->session : "");
    g->pid = (int) pool->runs[r].worker.pid;
    snprintf(g->why, sizeof g->why, "%s", why);
    ll_hostpool_send(pool, j->client,
                     json_pack("{s:s, s:i, s:s, s:s}", "type", "worker_gone", "pid",
                               (int) pool->runs[r].worker.pid, "session",
                               j->session ? j->session : "", "why", why));
    ll_sched_set_home(pool->sched, r, 0);
}

/* The home workers of R's session that went, as {pid: why} (NULL: none). */
json_t *ll_hostpool_gone_of(ll_hostpool_t *pool, int r)
{
    const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
    json_t *out = NULL;
    for (int i = 0; i < LL_HOSTPOOL_GONE && i < pool->gone_next; i++) {
        const ll_hostpool_gone_t *g = &pool->gone[i];
        if (g->client != j->client || !j->session || strcmp(g->session, j->session) != 0)
            continue;
        char pid[16];
        snprintf(pid, sizeof pid, "%d", g->pid);
        if (!out)
            out = json_object();
        json_object_set_new(out, pid, json_string(g->why));
    }
    return out;
}
