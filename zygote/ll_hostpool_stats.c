/* ll_hostpool_stats: the host pool's answer to a client's `stats` (zygote/API.md): its zygote nodes,
 * slots and GPUs, jobs, workers and sessions.  Run by the pool's one thread; reads only. */
#include "zygote/ll_hostpool_internal.h"
#include "base/ll_clock.h"

#include <unistd.h>

/* A job that is no idle worker (one queued, forking, running, saving, preparing). */
static bool s_busy_job(ll_hostpool_t *pool, int r)
{
    ll_sched_state_t st = ll_sched_job(pool->sched, r)->state;
    return st != LL_SCHED_FREE && st != LL_SCHED_WARM && st != LL_SCHED_EVICTING;
}

/* Stats: every worker (warm ones, staged ones holding no slot, busy ones). */
static json_t *s_stats_workers(ll_hostpool_t *pool, double now)
{
    static const char *const state_names[] = {"",       "queued",    "forking", "running",
                                              "saving", "preparing", "warm",    "evicting"};
    const ll_gd_t *gd = ll_sched_gd(pool->sched);
    json_t *workers = json_array();
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        const ll_hostpool_run_t *run = &pool->runs[r];
        const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
        if (!j->state || run->worker.pid <= 0 || j->state == LL_SCHED_QUEUED)
            continue;
        int key = (int) run->worker.pid;
        const char *st = j->state == LL_SCHED_WARM && j->slot < 0 ? "staged"
                         : j->state == LL_SCHED_WARM && ll_gd_speculative(gd, key, now)
                             ? "speculative"
                             : state_names[j->state];
        double l = 0;
        bool known = ll_gd_value(gd, key, &l);
        json_array_append_new(
            workers,
            json_pack("{s:s, s:i, s:i, s:s, s:o, s:f, s:i, s:b, s:i, s:f, s:i}", "session",
                      j->session ? j->session : "", "client", j->client, "pid", key, "state", st,
                      "L", known ? json_real(l) : json_null(), "bytes", j->worker.held_bytes,
                      "cells", j->worker.cells, "spec", j->worker.spec, "slot", j->slot, "idle_s",
                      j->state == LL_SCHED_WARM ? (now - j->worker.idle_since) / 1000.0 : 0.0,
                      "home", j->worker.home));
    }
    return workers;
}

/* Stats: per session, its GPU-seconds against its time connected. */
static json_t *s_stats_sessions(ll_hostpool_t *pool, double now)
{
    json_t *sessions = json_array();
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++) {
        const ll_sched_session_t *se = ll_sched_session(pool->sched, i);
        if (!se->used)
            continue;
        double held = ll_sched_session_held(pool->sched, i, now) / 1000.0;
        double conn = se->client >= 0 && pool->clients[se->client].fd >= 0
                          ? (now - pool->clients[se->client].connected) / 1000.0
                          : held;
        json_array_append_new(sessions,
                              json_pack("{s:s, s:i, s:f, s:f, s:f}", "session", se->name, "client",
                                        se->client, "gpu_held_s", held, "connected_s", conn,
                                        "held_share", conn > 0 ? held / conn : 0.0));
    }
    return sessions;
}

/* Stats: what the GPU detection found, and the slots over the devices. */
static json_t *s_stats_gpus(ll_hostpool_t *pool)
{
    const ll_gpu_info_t *g = &pool->gpus;
    json_t *devs = json_array(), *slot_dev = json_array(), *caps = json_array();
    for (int d = 0; d < g->count; d++)
        json_array_append_new(devs, json_pack("{s:s, s:f, s:i}", "name", g->dev[d].name,
                                              "mem_bytes", (double) g->dev[d].mem_bytes, "workers",
                                              pool->cuda ? pool->plan.per_dev[d] : 0));
    /* Per slot: where its worker runs now (a slot leased from hostd: where
     * the broker's map puts it; else the pool's own plan), and the
     * broker's slot it holds (null: none). */
    json_t *hslots = json_array();
    bool any = pool->cuda;
    for (int s = 0; s < ll_sched_nslots(pool->sched); s++) {
        int dev, b = ll_hostpool_hostd_slot(pool, s);
        const char *vis;
        double frac;
        bool mapped = ll_hostpool_hostd_device(pool, s, &dev, &vis, &frac);
        any = any || mapped;
        json_array_append_new(hslots, b >= 0 ? json_integer(b) : json_null());
        json_array_append_new(slot_dev, mapped       ? json_integer(dev)
                                        : pool->cuda ? json_integer(pool->plan.slot_dev[s])
                                                     : json_null());
        json_array_append_new(caps, json_real(mapped       ? frac
                                              : pool->cuda ? pool->plan.mem_fraction[s]
                                                           : 0.0));
    }
    if (!any) { /* no device anywhere: empty, as before */
        json_array_clear(slot_dev);
        json_array_clear(caps);
    }
    return json_pack("{s:i, s:s, s:i, s:s, s:f, s:o, s:o, s:o, s:o}", "count", g->count, "via",
                     g->via, "driver_version", g->driver_version, "why", g->why, "detect_ms", g->ms,
                     "devices", devs, "slot_device", slot_dev, "mem_fraction", caps, "hostd_slot",
                     hslots);
}

json_t *ll_hostpool_stats(ll_hostpool_t *pool)
{
    json_t *nodes = ll_ztree_nodes_json(pool->tree), *slots = json_array(), *runs = json_array();
    for (int s = 0; s < ll_sched_nslots(pool->sched); s++) {
        int r = ll_sched_slot_job(pool->sched, s);
        json_array_append_new(slots, r >= 0 ? json_string(pool->runs[r].id) : json_null());
    }
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (s_busy_job(pool, r))
            json_array_append_new(runs,
                                  json_pack("{s:s, s:i, s:i}", "id", pool->runs[r].id, "state",
                                            (int) ll_sched_job(pool->sched, r)->state, "pid",
                                            (int) pool->runs[r].worker.pid));
    double now = ll_clock_ms();
    json_t *workers = s_stats_workers(pool, now), *sessions = s_stats_sessions(pool, now);
    return json_pack("{s:s, s:i, s:o, s:o, s:o, s:b, s:o, s:i, s:O, s:i, s:b, s:o, s:o, s:f, s:i}",
                     "type", "stats", "pid", (int) getpid(), "nodes", nodes, "slots", slots, "runs",
                     runs, "cuda", pool->cuda, "gpus", s_stats_gpus(pool), "max_nodes",
                     pool->cfg.max_nodes, "safety", (json_t *) ll_ztree_safety(pool->tree),
                     "base_respawns", ll_ztree_base_respawns(pool->tree), "base_broken",
                     ll_ztree_broken(pool->tree), "workers", workers, "sessions", sessions, "clock",
                     ll_gd_clock(ll_sched_gd(pool->sched)), "warm_idle_s", pool->cfg.warm_idle_s);
}
