/* ll_hostpool_runs: the host pool's job entries (ll_hostpool_internal.h)
 * and how their workers end: an entry made, answered with an error, dropped;
 * a worker let go, released, evicted or killed, and the timers that see to
 * it that one does leave (--warm-idle, the exit and save graces, the rest
 * of a dead worker's process group).  Below the schedule's decisions
 * (ll_hostpool_schedule.c) and what clients and workers say
 * (ll_hostpool_jobs.c), which both end workers through these; nothing here
 * starts a pass of the schedule.  Run by the pool's one thread.
 *
 * What must stay true (see ll_hostpool_jobs.c for the rest):
 * - a slot is held from the fork of a worker until its death, or its reply
 *   when it does not stay warm: a worker that leaves keeps its slot (its
 *   job EVICTING) until it and its whole process group are gone;
 * - a warm worker leaves under slot pressure (killed at once: its save
 *   committed), after --warm-idle seconds unused, or when its client goes
 *   (asked to exit, killed after S_EXIT_GRACE_MS). */
#include "zygote/ll_hostpool_internal.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_EXIT_GRACE_MS 5000.0  /* an evicted worker that does not leave by then is killed */
#define S_SAVE_GRACE_MS 30000.0 /* a worker saving when its client left may finish that long */
#define S_GROUP_POLL_MS 20      /* a dead worker's group is looked at this often until it is gone */
#define S_GROUP_WAIT_MS \
    10000.0 /* ... and its slot given back after this long regardless (logged) */

/* ------------------------------------------------------------------ */
/* Entries: the pool's side of the schedule's jobs                    */

/* Forget the pool's side of entry R (the schedule's is the caller's). */
void ll_hostpool_run_free(ll_hostpool_t *pool, int r)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (run->worker.fd >= 0)
        close(run->worker.fd);
    ll_zreader_destroy(&run->worker.rd);
    free(run->id);
    json_decref(run->req);
    memset(run, 0, sizeof *run);
    run->worker.fd = -1;
    run->worker.node = -1;
}

/* Forget job R: its slot is free, its worker (if any) unknown. */
void ll_hostpool_drop_run(ll_hostpool_t *pool, int r)
{
    ll_sched_drop(pool->sched, r, ll_clock_ms());
    ll_hostpool_run_free(pool, r);
}

/* Job R's worker is gone (reaped, its socket closed): the rest of its
 * process group is killed, and a slot it held stays held (R EVICTING) until
 * that group is gone too (ll_hostpool_worker_timers looks), so the next
 * worker on the slot never meets the device memory of the last one's
 * children.  Then R is dropped. */
void ll_hostpool_drop_worker(ll_hostpool_t *pool, int r)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    pid_t pid = run->worker.pid;
    if (ll_hostpool_group_alive(pid)) {
        kill(-pid, SIGKILL);
        if (ll_hostpool_job(pool, r)->slot >= 0) {
            if (ll_hostpool_job(pool, r)->state != LL_SCHED_EVICTING)
                ll_sched_release(pool->sched, r, NULL);
            run->group_wait = true;
            run->evict_t = ll_clock_ms();
            ll_info("pool", "worker %d is gone; slot %d waits for the rest of its process group",
                    (int) pid, ll_hostpool_job(pool, r)->slot);
            return;
        }
    }
    ll_hostpool_drop_run(pool, r);
}

/* Job R's worker will not stay warm: one that said it may stay (MAY_STAY)
 * waits for its next cell, so it is told to exit (killed when that cannot
 * be sent); any other exits by itself.  One holding a slot keeps it (R
 * EVICTING) until it and its group are gone (ll_hostpool_drop_worker), and is killed
 * if it has not left after S_EXIT_GRACE_MS, as an evicted one. */
void ll_hostpool_let_go(ll_hostpool_t *pool, int r, bool may_stay)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (may_stay && run->worker.pid > 0) {
        json_t *m = json_pack("{s:s}", "type", "exit");
        if (run->worker.fd < 0 || ll_zframe_send(run->worker.fd, m, -1) != 0)
            ll_hostpool_signal_worker(run->worker.pid, SIGKILL);
        json_decref(m);
    }
    if (ll_hostpool_job(pool, r)->slot < 0 || pool->runs[r].worker.pid <= 0) {
        ll_hostpool_drop_run(pool, r);
        return;
    }
    ll_sched_release(pool->sched, r, NULL);
    pool->runs[r].evict_t = ll_clock_ms();
}

/* A new queued job of client C (ID, SESSION; REQ: the request, the entry
 * takes its own reference), or -1 when the table is full (or memory). */
int ll_hostpool_new_run(ll_hostpool_t *pool, int c, const char *id, const char *session,
                        json_t *req, ll_sched_kind_t kind)
{
    int r = ll_sched_add(pool->sched, c, session, kind,
                         json_number_value(json_object_get(req, "closure_bytes")), ll_clock_ms());
    if (r < 0)
        return -1;
    ll_hostpool_run_t *run = &pool->runs[r];
    run->id = strdup(id);
    run->req = json_incref(req);
    if (!run->id) {
        ll_hostpool_drop_run(pool, r);
        return -1;
    }
    return r;
}

/* Answer M ("prefetched") to the client of prefetch R; a restaged one
 * (s_restage) was asked by nobody. */
void ll_hostpool_answer_prefetch(ll_hostpool_t *pool, int r, json_t *m)
{
    if (ll_hostpool_job(pool, r)->kind == LL_SCHED_RESTAGE || pool->runs[r].silent)
        json_decref(m);
    else
        ll_hostpool_send(pool, ll_hostpool_job(pool, r)->client, m);
}

/* Prefetch R will not be prepared (WHY): answer so and drop it. */
void ll_hostpool_skip_prefetch(ll_hostpool_t *pool, int r, const char *why)
{
    ll_hostpool_answer_prefetch(pool, r,
                                json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id",
                                          pool->runs[r].id, "ok", 0, "skipped", why));
    ll_hostpool_drop_run(pool, r);
}

/* The reply of a cell whose worker never replied. */
void ll_hostpool_reply_error(ll_hostpool_t *pool, int r, const char *ename, const char *evalue)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (ll_hostpool_is_prefetch(pool, r)) {
        /* A prefetch is answered by "prefetched", whatever went wrong. */
        ll_hostpool_answer_prefetch(pool, r,
                                    json_pack("{s:s, s:s, s:b, s:s, s:s}", "type", "prefetched",
                                              "id", run->id, "ok", 0, "ename", ename, "error",
                                              evalue));
        return;
    }
    json_t *tb = json_pack("[s]", evalue);
    json_t *content = json_pack("{s:s, s:s, s:s, s:o, s:O, s:{}, s:[]}", "status", "error", "ename",
                                ename, "evalue", evalue, "traceback", tb, "execution_count",
                                json_object_get(run->req, "execution_count")
                                    ? json_object_get(run->req, "execution_count")
                                    : json_null(),
                                "user_expressions", "payload");
    json_t *ll =
        json_pack("{s:s, s:i, s:i, s:f}", "route", "gpu", "worker_pid", (int) run->worker.pid,
                  "zygote_node", run->worker.node_id, "wait_ms", run->wait_ms);
    if (strcmp(ename, "ZygoteUnavailable") == 0) /* nothing ran: its kernel runs it */
        json_object_set_new(ll, "unavailable", json_true());
    json_t *md = json_pack("{s:s, s:o}", "status", "error", "looseleaf", ll);
    ll_hostpool_send(pool, ll_hostpool_job(pool, r)->client,
                     json_pack("{s:s, s:s, s:o, s:o}", "type", "reply", "id", run->id, "content",
                               content, "metadata", md));
}

/* Every queued cell gets an error reply (no zygote will fork it now): its
 * kernel runs it itself (gateway/ll_route.c) while the tree tries the base
 * again (ll_ztree_timeout). */
void ll_hostpool_fail_queued(ll_hostpool_t *pool)
{
    char why[PATH_MAX + 128];
    snprintf(why, sizeof why,
             "the pool cannot start its base zygote and tries again (see %s/pool.log)",
             pool->cfg.dir);
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (ll_hostpool_job(pool, r)->state == LL_SCHED_QUEUED) {
            ll_hostpool_reply_error(pool, r, "ZygoteUnavailable", why);
            ll_hostpool_drop_run(pool, r);
        }
}

void ll_hostpool_node_lost(void *arg, int n)
{
    ll_hostpool_t *pool = arg;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        ll_hostpool_run_t *run = &pool->runs[r];
        if (ll_hostpool_job(pool, r)->state == LL_SCHED_FORKING && run->worker.node == n &&
            run->worker.pid == 0) {
            ll_hostpool_reply_error(
                pool, r, "ZygoteDied",
                "the zygote died before the worker started; run the cell again");
            ll_hostpool_drop_run(pool, r);
        }
    }
}

/* The client of session I left: one line on the pool log, then forget it. */
void ll_hostpool_session_end(ll_hostpool_t *pool, int i)
{
    const ll_sched_session_t *se = ll_sched_session(pool->sched, i);
    double now = ll_clock_ms();
    double held = ll_sched_session_held(pool->sched, i, now) / 1000.0;
    double conn = se->client >= 0 && pool->clients[se->client].fd >= 0
                      ? (now - pool->clients[se->client].connected) / 1000.0
                      : held;
    /* Written whatever the log level (kernels start the pool at warn):
     * this line is the session's GPU bill, read by people and benches. */
    int level = ll_log_level;
    if (ll_log_level < LL_LOG_INFO)
        ll_log_level = LL_LOG_INFO;
    ll_info("pool", "session %s: GPU held %.1f s of %.1f s connected (%.0f%%)", se->name, held,
            conn, conn > 0 ? 100.0 * held / conn : 0.0);
    ll_log_level = level;
    ll_sched_session_close(pool->sched, i);
}

/* Warm worker W leaves (WHY; L its GreedyDual value): it keeps its slot
 * until it is gone.  PRESSURE: evicted for a slot, so killed at once (a
 * cell or a prefetch waits for the slot; its save committed: nothing is
 * lost, the store drops a dead reader's leases); else asked to exit. */
void ll_hostpool_worker_leaves(ll_hostpool_t *pool, int w, const char *why, double l, bool pressure)
{
    ll_hostpool_run_t *run = &pool->runs[w];
    const ll_sched_job_t *j = ll_hostpool_job(pool, w);
    ll_info(
        "pool",
        "warm worker %d of session %s leaves (%s; L %.0f, %.0f bytes held, %d cells, clock %.0f)",
        (int) run->worker.pid, j->session ? j->session : "?", why, l, j->worker.held_bytes,
        j->worker.cells, ll_gd_clock(ll_sched_gd(pool->sched)));
    bool asked = false;
    if (!pressure && run->worker.fd >= 0) {
        json_t *m = json_pack("{s:s}", "type", "exit");
        asked = ll_zframe_send(run->worker.fd, m, -1) == 0;
        json_decref(m);
    }
    if (!asked)
        ll_hostpool_signal_worker(run->worker.pid, SIGKILL);
    run->evict_t = ll_clock_ms();
}

/* Let warm worker W go, not under pressure (idle timeout, its client left,
 * its prefetch was cancelled). */
void ll_hostpool_release_worker(ll_hostpool_t *pool, int w, const char *why)
{
    double l = 0;
    ll_sched_release(pool->sched, w, &l);
    ll_hostpool_worker_leaves(pool, w, why, l, false);
}

/* hostd (ll_hostpool_hostd.c) takes W's slot back. */
void ll_hostpool_evict_warm(ll_hostpool_t *pool, int w, const char *why)
{
    double l = 0;
    ll_sched_release(pool->sched, w, &l);
    ll_hostpool_worker_leaves(pool, w, why, l, true);
}

void ll_hostpool_kill_run(ll_hostpool_t *pool, int r, int sig)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (run->worker.pid > 0 && (!run->sig.handover || sig == SIGKILL))
        ll_hostpool_signal_worker(run->worker.pid, sig);
    else if (sig == SIGKILL || !run->sig.pending)
        run->sig.pending = sig; /* sent when the zygote reports the fork */
}

/* Warm workers unused for --warm-idle leave; an evicted one that does not
 * leave in time is killed (its save committed), and so is one still saving
 * S_SAVE_GRACE_MS after its client left.  Returns TIMEOUT, or the ms until
 * the next of these deadlines when sooner. */
int ll_hostpool_worker_timers(ll_hostpool_t *pool, double now, int timeout)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        ll_hostpool_run_t *run = &pool->runs[r];
        const ll_sched_job_t *j = ll_hostpool_job(pool, r);
        double left = -1;
        if (run->group_wait) {
            /* Its worker is gone; the rest of its group holds the slot. */
            bool alive = ll_hostpool_group_alive(run->worker.pid);
            if (!alive || now - run->evict_t >= S_GROUP_WAIT_MS) {
                if (alive)
                    ll_warn("pool",
                            "process group of worker %d still alive %.0f s after it: slot %d "
                            "is used again",
                            (int) run->worker.pid, S_GROUP_WAIT_MS / 1000, j->slot);
                ll_hostpool_drop_run(pool, r);
                timeout = 0; /* the slot is free: schedule now */
                continue;
            }
            kill(-run->worker.pid, SIGKILL);
            left = S_GROUP_POLL_MS;
        } else if (j->state == LL_SCHED_WARM && j->worker.home == 0) {
            /* (A home stays while its client is there: it holds what no
             * store can.) */
            left = j->worker.idle_since + pool->cfg.warm_idle_s * 1000.0 - now;
            if (left <= 0) {
                ll_hostpool_release_worker(pool, r, "idle timeout");
                left = S_EXIT_GRACE_MS;
            }
        } else if (j->state == LL_SCHED_SAVING && j->client < 0) {
            left = run->evict_t + S_SAVE_GRACE_MS - now;
            if (left <= 0) {
                ll_warn("pool", "worker %d still saving %.0f s after its client left: killed",
                        (int) run->worker.pid, S_SAVE_GRACE_MS / 1000);
                run->cancelled = true;
                ll_hostpool_signal_worker(run->worker.pid, SIGKILL);
                run->evict_t = now; /* its exit ends the entry; until then, once per grace */
                left = S_SAVE_GRACE_MS;
            }
        } else if (j->state == LL_SCHED_EVICTING) {
            left = run->evict_t + S_EXIT_GRACE_MS - now;
            if (left <= 0 && run->worker.pid > 0 && !run->worker.exited) {
                ll_warn("pool", "warm worker %d did not exit: killed", (int) run->worker.pid);
                ll_hostpool_signal_worker(run->worker.pid, SIGKILL);
                run->evict_t = now;
                left = S_EXIT_GRACE_MS;
            }
        }
        if (left >= 0 && (timeout < 0 || (int) left + 1 < timeout))
            timeout = (int) left + 1;
    }
    return timeout;
}

bool ll_hostpool_busy(const ll_hostpool_t *pool)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (ll_sched_job(pool->sched, r)->state != LL_SCHED_FREE)
            return true;
    return false;
}

void ll_hostpool_runs_stop(ll_hostpool_t *pool)
{
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++)
        if (ll_sched_session(pool->sched, i)->used)
            ll_hostpool_session_end(pool, i);
    ll_ztree_stop(pool->tree);
    ll_hostpool_kill_strays(pool, true); /* what the workers' cells started goes too */
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (ll_hostpool_used(pool, r))
            ll_hostpool_kill_run(pool, r, SIGKILL);
}
