/* ll_hostpool_schedule: one pass of the schedule (ll_sched.h), its
 * decisions applied to processes and sockets: a worker forked for a job
 * (on a slot, or staged without one), a warm worker handed a job, a warm
 * worker evicted for another session (and its session prepared again,
 * staged), a prefetch skipped, a cell told it waits.  Every decision of a
 * pass is applied before the next is asked for, and nothing here starts a
 * pass while one runs.  Above the entries (ll_hostpool_runs.c), the
 * broker's link (ll_hostpool_hostd.c: told what a pass changed) and the
 * record of homes that went; below what clients ask and workers say
 * (ll_hostpool_jobs.c), which asks for a pass.  Run by the pool's one
 * thread. */
#include "zygote/ll_hostpool_internal.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "base/ll_check.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Where JOB's worker computes: on a slot leased from hostd, the device the
 * broker's map gives it; else on a CUDA host, SLOT's device (its index,
 * the CUDA_VISIBLE_DEVICES entry that shows it alone, the worker's memory
 * cap); without a slot (staged) or without CUDA, no device at all
 * (CUDA_VISIBLE_DEVICES=""), so no GPU work ever runs without a slot. */
static void s_job_device(ll_hostpool_t *pool, json_t *job, int slot)
{
    int bdev;
    const char *bvis;
    double bfrac;
    if (ll_hostpool_hostd_device(pool, slot, &bdev, &bvis, &bfrac)) {
        /* A slot leased from hostd: where the broker's map puts it. */
        json_object_set_new(job, "device", json_integer(bdev));
        json_object_set_new(job, "cuda_visible", json_string(bvis));
        json_object_set_new(job, "mem_fraction", bfrac > 0 ? json_real(bfrac) : json_null());
        return;
    }
    if (!pool->cuda || slot < 0) {
        json_object_set_new(job, "device", json_null());
        json_object_set_new(job, "cuda_visible", json_string(""));
        return;
    }
    int dev = pool->plan.slot_dev[slot];
    char vis[128];
    ll_gpu_visible_entry(pool->visible, dev, vis, sizeof vis);
    json_object_set_new(job, "device", json_integer(dev));
    json_object_set_new(job, "cuda_visible", json_string(vis));
    double f = pool->plan.mem_fraction[slot];
    json_object_set_new(job, "mem_fraction", f > 0 ? json_real(f) : json_null());
}

/* The job frame for R's worker: the request plus where it runs, and the
 * session's home workers that went (a cell reading what they held names
 * why: zyg.py). */
static json_t *s_job_frame(ll_hostpool_t *pool, int r, int slot)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    run->oom_kills = ll_hostpool_oom_kills();
    run->began = false;
    json_t *job = json_deep_copy(run->req);
    s_job_device(pool, job, slot);
    json_t *gone = ll_hostpool_gone_of(pool, r);
    if (gone)
        json_object_set_new(job, "gone_workers", gone);
    json_object_set_new(job, "slot", json_integer(slot));
    json_object_set_new(job, "client", json_integer(ll_hostpool_job(pool, r)->client));
    json_object_set_new(job, "wait_ms", json_real(run->wait_ms));
    json_object_set_new(job, "keep_warm", json_boolean(pool->cfg.warm_idle_s > 0));
    return job;
}

/* LL_SCHED_FORK: fork a worker for R on SLOT (-1: staged, without one). */
static void s_fork(ll_hostpool_t *pool, int r, int slot)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    int n = ll_ztree_best(pool->tree, json_object_get(run->req, "import_closure"));
    int sv[2];
    if (n < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        ll_sched_fork_failed(pool->sched, r);
        return;
    }
    run->wait_ms = ll_clock_ms() - ll_hostpool_job(pool, r)->t_queued;
    json_t *job = s_job_frame(pool, r, slot);
    /* Staged without a GPU: where variables may live on the device, their
     * restore waits for the slot (the cell's run restores them). */
    json_object_set_new(job, "defer_restore", json_boolean(slot < 0 && pool->staged_defer));
    json_object_set_new(job, "prefetch", json_boolean(ll_hostpool_is_prefetch(pool, r)));
    int rc = ll_ztree_fork(pool->tree, n, job, sv[1]);
    json_decref(job);
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        ll_sched_fork_failed(pool->sched, r);
        return;
    }
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    run->worker.fd = sv[0];
    run->worker.rd = ll_zreader_new(sv[0]);
    run->worker.node = n;
    run->worker.node_id = ll_ztree_node_id(pool->tree, n);
    run->origin = LL_HOSTPOOL_ORIGIN_FORKED;
    if (slot >= 0)
        ll_info("pool", "cell %s: fork from node %d on slot %d", run->id, run->worker.node_id,
                slot);
    else
        ll_info("pool", "prefetch %s: fork from node %d, staged (no slot)", run->id,
                run->worker.node_id);
    ll_ztree_consider_growth(pool->tree, n, json_object_get(run->req, "import_closure"));
}

/* LL_SCHED_HAND: queued R runs on warm worker W, whose worker (socket, pid;
 * its slot, in the schedule) moved to R; W's entry goes.  Interrupts for R
 * are held until the worker says ready (it drops any stale one first). */
static void s_hand(ll_hostpool_t *pool, const ll_sched_decision_t *d)
{
    ll_hostpool_run_t *run = &pool->runs[d->r], *wk = &pool->runs[d->w];
    run->worker = wk->worker;
    wk->worker.fd = -1;
    wk->worker.rd = NULL;
    ll_hostpool_run_free(pool, d->w);
    run->wait_ms = ll_clock_ms() - ll_hostpool_job(pool, d->r)->t_queued;
    run->sig.handover = true;
    run->origin = d->staged_hit ? LL_HOSTPOOL_ORIGIN_STAGED : LL_HOSTPOOL_ORIGIN_WARM;
    bool prefetch = ll_hostpool_is_prefetch(pool, d->r);
    json_t *job = s_job_frame(pool, d->r, d->slot);
    json_object_set_new(job, "node", json_integer(run->worker.node_id));
    json_t *m = json_pack("{s:s, s:o}", "type", prefetch ? "prefetch" : "run", "job", job);
    if (ll_zframe_send(run->worker.fd, m, -1) < 0) {
        /* It is dying: its exit reports the cell as lost (WorkerDied). */
        ll_warn("pool", "cell %s: warm worker %d unreachable: %s", run->id, (int) run->worker.pid,
                strerror(errno));
        ll_hostpool_signal_worker(run->worker.pid, SIGKILL);
    }
    json_decref(m);
    ll_info("pool", "%s %s: warm worker %d on slot %d", prefetch ? "prefetch" : "cell", run->id,
            (int) run->worker.pid, d->slot);
}

static void s_restage(ll_hostpool_t *pool, int v);

/* LL_SCHED_EVICT: warm worker D->W leaves under slot pressure, for D->R;
 * its session is prepared again, staged, when the schedule says so. */
static void s_evict_for(ll_hostpool_t *pool, const ll_sched_decision_t *d)
{
    const ll_sched_job_t *j = ll_hostpool_job(pool, d->r);
    char why[200];
    if (j->kind == LL_SCHED_CELL)
        snprintf(why, sizeof why, "slot pressure: cell %.80s of session %.40s needs a slot",
                 pool->runs[d->r].id, j->session);
    else
        snprintf(why, sizeof why, "slot pressure: prefetch %.80s of session %.40s%s",
                 pool->runs[d->r].id, j->session, d->credit ? " (its credit)" : "");
    ll_hostpool_tell_gone(pool, d->w, "evicted for another session");
    ll_hostpool_worker_leaves(pool, d->w, why, d->l, true);
    if (d->restage)
        s_restage(pool, d->w); /* its session keeps a prepared worker, without a slot */
}

/* Whether JSON array ARR holds a value equal to V (NULL ARR: no). */
static bool s_json_has(const json_t *arr, const json_t *v)
{
    for (size_t j = 0; j < json_array_size(arr); j++)
        if (json_equal(json_array_get(arr, j), v))
            return true;
    return false;
}

/* The request that prepares again the session of a job whose request was
 * REQ (PREFETCH: a prefetch's): a prefetch's as it was; a cell's becomes
 * the closure of that cell with what it defined (but deleted), without its
 * code.  The caller owns the result; NULL when out of memory. */
static json_t *s_restage_request(const json_t *req, bool prefetch)
{
    json_t *out = json_deep_copy(req);
    if (!out || prefetch)
        return out;
    if (!json_is_array(json_object_get(out, "state_closure")))
        json_object_set_new(out, "state_closure", json_array());
    json_t *closure = json_object_get(out, "state_closure"),
           *deleted = json_object_get(out, "deletes");
    size_t i;
    json_t *name;
    json_array_foreach(json_object_get(out, "defines"), i, name)
        if (!s_json_has(closure, name) && !s_json_has(deleted, name))
            json_array_append(closure, name);
    json_object_del(out, "code");
    return out;
}

/* Warm worker V is being evicted under slot pressure while its client is
 * still there: prepare its session again, staged (without a slot), so the
 * session's next cell still starts on a prepared worker.  The GPU slot is
 * what is scarce; a process that restored the state (on a CUDA host: that
 * imported the closure) is cheap.  What it restores: the closure of the
 * prefetch that prepared V, or of V's last cell with what that cell
 * defined (a notebook's next GPU cell mostly reads what the last one did);
 * the cell's run re-checks versions and restores the rest.  A prefetch
 * keeps its id (the kernel's cancel still reaches it); it answers nobody. */
static void s_restage(ll_hostpool_t *pool, int v)
{
    ll_hostpool_run_t *old = &pool->runs[v];
    json_t *req = s_restage_request(old->req, ll_hostpool_is_prefetch(pool, v));
    if (!req)
        return;
    int r = ll_hostpool_new_run(pool, ll_hostpool_job(pool, v)->client, old->id,
                                ll_hostpool_job(pool, v)->session, req, LL_SCHED_RESTAGE);
    json_decref(req);
    if (r < 0)
        return;
    ll_info("pool", "session %s: prepared again, staged (its worker was evicted)",
            ll_hostpool_job(pool, r)->session);
}

/* LL_SCHED_WAIT: tell cell R that it waits. */
static void s_tell_wait(ll_hostpool_t *pool, const ll_sched_decision_t *d)
{
    ll_hostpool_run_t *run = &pool->runs[d->r];
    int nslots = ll_sched_nslots(pool->sched);
    ll_info("pool", "cell %s waits: all %d slots are held", run->id, nslots);
    ll_hostpool_send(pool, ll_hostpool_job(pool, d->r)->client,
                     json_pack("{s:s, s:s, s:i, s:i}", "type", "wait", "id", run->id, "slots",
                               nslots, "queued", d->queued));
}

/* Where variables may live on a device (CUDA hosts), a staged worker only
 * imported: it had no device to restore them to.  Once a slot is free and
 * nothing is queued, the pool prepares one for real in the edit window: a
 * prefetch of its own (its closure, answered to nobody) hands it the slot,
 * and it initialises CUDA on that device, warms cuBLAS and restores, all
 * before the session's Run (zygote/py/looseleaf_zygote/gpu.py).  Once per
 * staged worker (a skipped try is not repeated).  Returns whether a job
 * was added. */
static bool s_promote_staged(ll_hostpool_t *pool)
{
    if (!pool->staged_defer)
        return false;
    bool free_slot = false;
    for (int s = 0; s < ll_sched_nslots(pool->sched) && !free_slot; s++)
        free_slot = ll_sched_slot_job(pool->sched, s) < 0;
    for (int r = 0; r < LL_SCHED_MAX_JOBS && free_slot; r++)
        if (ll_hostpool_job(pool, r)->state == LL_SCHED_QUEUED)
            return false;
    for (int w = 0; w < LL_SCHED_MAX_JOBS && free_slot; w++) {
        const ll_sched_job_t *j = ll_hostpool_job(pool, w);
        ll_hostpool_run_t *run = &pool->runs[w];
        if (j->state != LL_SCHED_WARM || j->slot >= 0 || j->client < 0 || run->promote_tried ||
            !run->req || !run->id)
            continue;
        run->promote_tried = true;
        json_t *req = s_restage_request(run->req, ll_hostpool_is_prefetch(pool, w));
        int r =
            req ? ll_hostpool_new_run(pool, j->client, run->id, j->session, req, LL_SCHED_PREFETCH)
                : -1;
        json_decref(req);
        if (r < 0)
            continue;
        pool->runs[r].silent = true;
        ll_info("pool", "session %s: staged worker %d is prepared on a free slot before its Run",
                j->session, (int) run->worker.pid);
        return true;
    }
    return false;
}

/* One pass of the schedule (ll_sched.h): its decisions, applied; again
 * when it left a slot free for a staged worker (s_promote_staged). */
void ll_hostpool_schedule(ll_hostpool_t *pool)
{
    ll_sched_decision_t d;
    for (int round = 0; round < 4; round++) {
        ll_sched_begin(pool->sched, ll_clock_ms(), ll_ztree_any_ready(pool->tree));
        while (ll_sched_next(pool->sched, &d)) {
            switch (d.op) {
            case LL_SCHED_FORK: s_fork(pool, d.r, d.slot); break;
            case LL_SCHED_HAND: s_hand(pool, &d); break;
            case LL_SCHED_EVICT: s_evict_for(pool, &d); break;
            case LL_SCHED_SKIP: ll_hostpool_skip_prefetch(pool, d.r, d.why); break;
            case LL_SCHED_DROP: ll_hostpool_drop_run(pool, d.r); break;
            case LL_SCHED_WAIT: s_tell_wait(pool, &d); break;
            }
        }
        if (!s_promote_staged(pool))
            break;
    }
    ll_hostpool_hostd_sync(pool); /* hostd: what the pass changed, to the broker */
}

/* ------------------------------------------------------------------ */
/* Self-test: what needs no process (the restaged request).            */

int ll_hostpool_schedule_selftest(bool verbose)
{
    int fails = 0;
    /* A cell's closure grows by what it defined, not what it deleted; its
     * code goes; the rest of the request stays. */
    json_t *cell = json_pack("{s:s, s:s, s:[s], s:[s, s, s], s:[s], s:[s]}", "id", "c1", "code",
                             "y = x + 1; del z", "state_closure", "x", "defines", "y", "x", "z",
                             "deletes", "z", "import_closure", "numpy");
    json_t *want =
        json_pack("{s:s, s:[s, s], s:[s, s, s], s:[s], s:[s]}", "id", "c1", "state_closure", "x",
                  "y", "defines", "y", "x", "z", "deletes", "z", "import_closure", "numpy");
    json_t *got = s_restage_request(cell, false);
    S_CHECK(got && json_equal(got, want) && json_object_get(cell, "code"));
    json_decref(got);
    /* Without a closure (or with a malformed one) the defines are it. */
    json_object_set_new(cell, "state_closure", json_string("bad"));
    got = s_restage_request(cell, false);
    S_CHECK(got && json_array_size(json_object_get(got, "state_closure")) == 2);
    json_decref(got);
    /* A prefetch's request is prepared again as it was. */
    json_t *pf =
        json_pack("{s:s, s:[s], s:i}", "id", "p1", "state_closure", "w", "closure_bytes", 4096);
    got = s_restage_request(pf, true);
    S_CHECK(got && got != pf && json_equal(got, pf));
    json_decref(got);
    json_decref(pf);
    json_decref(cell);
    json_decref(want);
    if (verbose)
        fprintf(stderr, "ll_hostpool_schedule: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
