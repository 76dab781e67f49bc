/* ll_hostpool_jobs: the host pool's jobs (ll_hostpool_internal.h): what
 * clients ask (cells, prefetches, signals, stats) and what zygotes and
 * workers say, applied to processes and sockets as the schedule
 * (ll_sched.h) decides.  Run by the pool's one thread.
 *
 * A job's entry R here is the schedule's job R: the schedule keeps its
 * state, slot, client and session; here are its request and its worker's
 * process.  Every decision of a pass is applied before the next is asked
 * for (ll_hostpool_schedule), and nothing here starts a pass while one runs.
 *
 * What must stay true:
 * - a slot is held from the fork of a worker until its death, or its reply
 *   (sent by the worker only after its save committed) when it does not stay
 *   warm; a cell arriving when every slot is held evicts an idle warm worker
 *   or waits, and its client is told so;
 * - a warm worker (idle, its save committed) serves only its own client's
 *   session; it is never evicted while it prepares, runs or saves; it
 *   leaves under slot pressure, after --warm-idle seconds unused, or when
 *   its client goes;
 * - a client that goes away takes only its own cells with it;
 * - a worker's death is reported once both its socket closed and its exit
 *   status is known (from its zygote, or reaped here as their subreaper);
 * - a worker is the leader of its own process group (ll_zygote.c), and is
 *   killed with it: children of its cells (DataLoader workers, a
 *   multiprocessing pool) hold the device too, so the slot stays held
 *   until the whole group is gone, and they are reaped here.
 *
 * Beside it: the stats (ll_hostpool_stats.c), the record of homes that
 * went (ll_hostpool_homes.c), workers as processes (ll_hostpool_procs.c),
 * the slot broker's link (ll_hostpool_hostd.c) and every decision
 * (ll_sched.c). */
#include "zygote/ll_hostpool_internal.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define S_EXIT_GRACE_MS 5000.0  /* an evicted worker that does not leave by then is killed */
#define S_SAVE_GRACE_MS 30000.0 /* a worker saving when its client left may finish that long */
#define S_GROUP_POLL_MS 20      /* a dead worker's group is looked at this often until it is gone */
#define S_GROUP_WAIT_MS \
    10000.0 /* ... and its slot given back after this long regardless (logged) */

/* ------------------------------------------------------------------ */
/* Jobs: the pool's side of the schedule's entries                    */

static const ll_sched_job_t *s_job(ll_hostpool_t *pool, int r)
{
    return ll_sched_job(pool->sched, r);
}

static bool s_used(ll_hostpool_t *pool, int r)
{
    return s_job(pool, r)->state != LL_SCHED_FREE;
}

static bool s_is_prefetch(ll_hostpool_t *pool, int r)
{
    return s_job(pool, r)->kind != LL_SCHED_CELL;
}

/* A warm worker, or one leaving: it has nothing to say and runs no job. */
static bool s_idle_worker(ll_hostpool_t *pool, int r)
{
    return s_job(pool, r)->state == LL_SCHED_WARM || s_job(pool, r)->state == LL_SCHED_EVICTING;
}

/* Forget the pool's side of entry R (the schedule's is the caller's). */
static void s_run_free(ll_hostpool_t *pool, int r)
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
static void s_drop_run(ll_hostpool_t *pool, int r)
{
    ll_sched_drop(pool->sched, r, ll_clock_ms());
    s_run_free(pool, r);
}

/* Job R's worker is gone (reaped, its socket closed): the rest of its
 * process group is killed, and a slot it held stays held (R EVICTING) until
 * that group is gone too (ll_hostpool_worker_timers looks), so the next
 * worker on the slot never meets the device memory of the last one's
 * children.  Then R is dropped. */
static void s_drop_worker(ll_hostpool_t *pool, int r)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    pid_t pid = run->worker.pid;
    if (ll_hostpool_group_alive(pid)) {
        kill(-pid, SIGKILL);
        if (s_job(pool, r)->slot >= 0) {
            if (s_job(pool, r)->state != LL_SCHED_EVICTING)
                ll_sched_release(pool->sched, r, NULL);
            run->group_wait = true;
            run->evict_t = ll_clock_ms();
            ll_info("pool", "worker %d is gone; slot %d waits for the rest of its process group",
                    (int) pid, s_job(pool, r)->slot);
            return;
        }
    }
    s_drop_run(pool, r);
}

/* Job R's worker will not stay warm: one that said it may stay (MAY_STAY)
 * waits for its next cell, so it is told to exit (killed when that cannot
 * be sent); any other exits by itself.  One holding a slot keeps it (R
 * EVICTING) until it and its group are gone (s_drop_worker), and is killed
 * if it has not left after S_EXIT_GRACE_MS, as an evicted one. */
static void s_let_go(ll_hostpool_t *pool, int r, bool may_stay)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (may_stay && run->worker.pid > 0) {
        json_t *m = json_pack("{s:s}", "type", "exit");
        if (run->worker.fd < 0 || ll_zframe_send(run->worker.fd, m, -1) != 0)
            ll_hostpool_signal_worker(run->worker.pid, SIGKILL);
        json_decref(m);
    }
    if (s_job(pool, r)->slot < 0 || pool->runs[r].worker.pid <= 0) {
        s_drop_run(pool, r);
        return;
    }
    ll_sched_release(pool->sched, r, NULL);
    pool->runs[r].evict_t = ll_clock_ms();
}

/* A new queued job of client C (ID, SESSION; REQ: the request, the entry
 * takes its own reference), or -1 when the table is full (or memory). */
static int s_new_run(ll_hostpool_t *pool, int c, const char *id, const char *session, json_t *req,
                     ll_sched_kind_t kind)
{
    int r = ll_sched_add(pool->sched, c, session, kind,
                         json_number_value(json_object_get(req, "closure_bytes")), ll_clock_ms());
    if (r < 0)
        return -1;
    ll_hostpool_run_t *run = &pool->runs[r];
    run->id = strdup(id);
    run->req = json_incref(req);
    if (!run->id) {
        s_drop_run(pool, r);
        return -1;
    }
    return r;
}

/* Answer M ("prefetched") to the client of prefetch R; a restaged one
 * (s_restage) was asked by nobody. */
static void s_answer_prefetch(ll_hostpool_t *pool, int r, json_t *m)
{
    if (s_job(pool, r)->kind == LL_SCHED_RESTAGE || pool->runs[r].silent)
        json_decref(m);
    else
        ll_hostpool_send(pool, s_job(pool, r)->client, m);
}

/* Prefetch R will not be prepared (WHY): answer so and drop it. */
static void s_skip_prefetch(ll_hostpool_t *pool, int r, const char *why)
{
    s_answer_prefetch(pool, r,
                      json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id",
                                pool->runs[r].id, "ok", 0, "skipped", why));
    s_drop_run(pool, r);
}

/* The reply of a cell whose worker never replied. */
static void s_reply_error(ll_hostpool_t *pool, int r, const char *ename, const char *evalue)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (s_is_prefetch(pool, r)) {
        /* A prefetch is answered by "prefetched", whatever went wrong. */
        s_answer_prefetch(pool, r,
                          json_pack("{s:s, s:s, s:b, s:s, s:s}", "type", "prefetched", "id",
                                    run->id, "ok", 0, "ename", ename, "error", evalue));
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
    ll_hostpool_send(pool, s_job(pool, r)->client,
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
        if (s_job(pool, r)->state == LL_SCHED_QUEUED) {
            s_reply_error(pool, r, "ZygoteUnavailable", why);
            s_drop_run(pool, r);
        }
}

void ll_hostpool_node_lost(void *arg, int n)
{
    ll_hostpool_t *pool = arg;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        ll_hostpool_run_t *run = &pool->runs[r];
        if (s_job(pool, r)->state == LL_SCHED_FORKING && run->worker.node == n &&
            run->worker.pid == 0) {
            s_reply_error(pool, r, "ZygoteDied",
                          "the zygote died before the worker started; run the cell again");
            s_drop_run(pool, r);
        }
    }
}

/* The client of session I left: one line on the pool log, then forget it. */
static void s_session_end(ll_hostpool_t *pool, int i)
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

/* Queue job R again for a fresh worker (its worker died before anything
 * of the job ran). */
static void s_requeue(ll_hostpool_t *pool, int r)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    ll_hostpool_signal_worker(run->worker.pid, SIGKILL); /* the rest of its group */
    ll_sched_requeue(pool->sched, r, ll_clock_ms());
    close(run->worker.fd);
    run->worker.fd = -1;
    ll_zreader_destroy(&run->worker.rd);
    run->worker.pid = 0;
    run->worker.eof = run->worker.exited = false;
    run->worker.status = 0;
    run->sig.handover = false;
    run->origin = LL_HOSTPOOL_ORIGIN_NONE;
    ll_hostpool_schedule(pool);
}

/* A worker whose socket closed and whose exit status is known, without a
 * reply: tell the client how it died; one that died preparing a cell (no
 * output yet) is given once more a fresh worker. */
static void s_finish_dead(ll_hostpool_t *pool, int r)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    const ll_sched_job_t *j = s_job(pool, r);
    char why[512];
    if (run->sig.handover && !run->cancelled) {
        /* A warm worker that died before it took this job (it says ready
         * before anything runs): nothing ran, so the job is queued again
         * and gets a fresh worker, as if the pool had seen the death first. */
        ll_warn("pool", "%s %s: warm worker %d was gone before it took the job: forking anew",
                s_is_prefetch(pool, r) ? "prefetch" : "cell", run->id, (int) run->worker.pid);
        int hst = run->worker.status;
        snprintf(why, sizeof why, "which died (%s %d)",
                 WIFSIGNALED(hst) ? "killed by signal" : "exit status",
                 WIFSIGNALED(hst) ? WTERMSIG(hst) : WEXITSTATUS(hst));
        ll_hostpool_tell_gone(pool, r, why);
        s_requeue(pool, r);
        return;
    }
    int st = run->worker.status;
    bool oom =
        WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && ll_hostpool_oom_kills() > run->oom_kills;
    if (!run->cancelled && !run->began && run->retries == 0 && !s_is_prefetch(pool, r) &&
        !s_idle_worker(pool, r)) {
        /* It died preparing the cell (fork, imports, restore), before any
         * of the cell's code ran: a restore changes nothing, so the cell
         * gets one fresh worker more before it fails (what it was the home
         * of is gone, though). */
        ll_warn("pool",
                "cell %s: worker %d died (%s %d%s) before the cell ran: once more on a "
                "fresh worker",
                run->id, (int) run->worker.pid, WIFSIGNALED(st) ? "signal" : "status",
                WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), oom ? ", out of memory" : "");
        ll_hostpool_tell_gone(pool, r, "which died preparing a cell");
        run->retries++;
        s_requeue(pool, r);
        return;
    }
    if (s_idle_worker(pool, r)) {
        /* A warm worker gone: its last save committed, nothing is lost but
         * what it was the home of. */
        if (j->state == LL_SCHED_WARM) {
            ll_warn(
                "pool",
                "warm worker %d of session %s died (status %d): the session's next cell forks anew",
                (int) run->worker.pid, j->session ? j->session : "?", run->worker.status);
            snprintf(why, sizeof why, "which died (%s %d)",
                     WIFSIGNALED(st) ? "killed by signal" : "exit status",
                     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
            ll_hostpool_tell_gone(pool, r, why);
        }
        s_drop_worker(pool, r);
        ll_hostpool_schedule(pool);
        return;
    }
    if (s_is_prefetch(pool, r)) {
        snprintf(why, sizeof why, "the worker (pid %d) preparing the prefetch %s ended (%s %d)",
                 (int) run->worker.pid, run->cancelled ? "was cancelled" : "died",
                 WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        ll_info("pool", "%s", why);
        s_answer_prefetch(pool, r,
                          json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", run->id,
                                    "ok", 0, "error", why));
        s_drop_worker(pool, r);
        ll_hostpool_schedule(pool);
        return;
    }
    if (run->cancelled)
        snprintf(why, sizeof why, "the cell was cancelled (worker pid %d killed)",
                 (int) run->worker.pid);
    else if (WIFSIGNALED(st))
        snprintf(why, sizeof why,
                 "the worker (pid %d) running this cell was killed by signal SIG%s (%d)%s%s; the "
                 "session continues "
                 "from the last committed versions of its variables",
                 (int) run->worker.pid, ll_hostpool_signame(WTERMSIG(st)), WTERMSIG(st),
                 oom ? " (out of memory: the host's OOM killer ended it)" : "",
                 run->retries ? " twice, the second time on a fresh worker" : "");
    else
        snprintf(why, sizeof why,
                 "the worker (pid %d) running this cell exited with status %d before replying; the "
                 "session "
                 "continues from the last committed versions of its variables",
                 (int) run->worker.pid, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    ll_warn("pool", "cell %s: %s", run->id, why);
    ll_hostpool_tell_gone(pool, r, "which died running a cell");
    s_reply_error(pool, r, run->cancelled ? "Cancelled" : "WorkerDied", why);
    s_drop_worker(pool, r);
    ll_hostpool_schedule(pool);
}

void ll_hostpool_worker_exited(ll_hostpool_t *pool, pid_t pid, int status)
{
    pool->sweep = true; /* what it left out of its group is ours now */
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        ll_hostpool_run_t *run = &pool->runs[r];
        if (s_used(pool, r) && run->worker.pid == pid && !run->worker.exited) {
            run->worker.exited = true;
            run->worker.status = status;
            ll_sched_lost(pool->sched, r);
            if (run->worker.eof)
                s_finish_dead(pool, r);
            else
                kill(-pid, SIGKILL); /* what it forked holds its socket open: the EOF follows */
            return;
        }
    }
}

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
    json_object_set_new(job, "client", json_integer(s_job(pool, r)->client));
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
    run->wait_ms = ll_clock_ms() - s_job(pool, r)->t_queued;
    json_t *job = s_job_frame(pool, r, slot);
    /* Staged without a GPU: where variables may live on the device, their
     * restore waits for the slot (the cell's run restores them). */
    json_object_set_new(job, "defer_restore", json_boolean(slot < 0 && pool->staged_defer));
    json_object_set_new(job, "prefetch", json_boolean(s_is_prefetch(pool, r)));
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
    s_run_free(pool, d->w);
    run->wait_ms = ll_clock_ms() - s_job(pool, d->r)->t_queued;
    run->sig.handover = true;
    run->origin = d->staged_hit ? LL_HOSTPOOL_ORIGIN_STAGED : LL_HOSTPOOL_ORIGIN_WARM;
    bool prefetch = s_is_prefetch(pool, d->r);
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

/* Warm worker W leaves (WHY; L its GreedyDual value): it keeps its slot
 * until it is gone.  PRESSURE: evicted for a slot, so killed at once (a
 * cell or a prefetch waits for the slot; its save committed: nothing is
 * lost, the store drops a dead reader's leases); else asked to exit. */
static void s_worker_leaves(ll_hostpool_t *pool, int w, const char *why, double l, bool pressure)
{
    ll_hostpool_run_t *run = &pool->runs[w];
    const ll_sched_job_t *j = s_job(pool, w);
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
static void s_release_worker(ll_hostpool_t *pool, int w, const char *why)
{
    double l = 0;
    ll_sched_release(pool->sched, w, &l);
    s_worker_leaves(pool, w, why, l, false);
}

/* hostd (ll_hostpool_hostd.c) takes W's slot back. */
void ll_hostpool_evict_warm(ll_hostpool_t *pool, int w, const char *why)
{
    double l = 0;
    ll_sched_release(pool->sched, w, &l);
    s_worker_leaves(pool, w, why, l, true);
}

/* LL_SCHED_EVICT: warm worker D->W leaves under slot pressure, for D->R;
 * its session is prepared again, staged, when the schedule says so. */
static void s_evict_for(ll_hostpool_t *pool, const ll_sched_decision_t *d)
{
    const ll_sched_job_t *j = s_job(pool, d->r);
    char why[200];
    if (j->kind == LL_SCHED_CELL)
        snprintf(why, sizeof why, "slot pressure: cell %.80s of session %.40s needs a slot",
                 pool->runs[d->r].id, j->session);
    else
        snprintf(why, sizeof why, "slot pressure: prefetch %.80s of session %.40s%s",
                 pool->runs[d->r].id, j->session, d->credit ? " (its credit)" : "");
    ll_hostpool_tell_gone(pool, d->w, "evicted for another session");
    s_worker_leaves(pool, d->w, why, d->l, true);
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
    json_t *req = s_restage_request(old->req, s_is_prefetch(pool, v));
    if (!req)
        return;
    int r = s_new_run(pool, s_job(pool, v)->client, old->id, s_job(pool, v)->session, req,
                      LL_SCHED_RESTAGE);
    json_decref(req);
    if (r < 0)
        return;
    ll_info("pool", "session %s: prepared again, staged (its worker was evicted)",
            s_job(pool, r)->session);
}

/* LL_SCHED_WAIT: tell cell R that it waits. */
static void s_tell_wait(ll_hostpool_t *pool, const ll_sched_decision_t *d)
{
    ll_hostpool_run_t *run = &pool->runs[d->r];
    int nslots = ll_sched_nslots(pool->sched);
    ll_info("pool", "cell %s waits: all %d slots are held", run->id, nslots);
    ll_hostpool_send(pool, s_job(pool, d->r)->client,
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
        if (s_job(pool, r)->state == LL_SCHED_QUEUED)
            return false;
    for (int w = 0; w < LL_SCHED_MAX_JOBS && free_slot; w++) {
        const ll_sched_job_t *j = s_job(pool, w);
        ll_hostpool_run_t *run = &pool->runs[w];
        if (j->state != LL_SCHED_WARM || j->slot >= 0 || j->client < 0 || run->promote_tried ||
            !run->req || !run->id)
            continue;
        run->promote_tried = true;
        json_t *req = s_restage_request(run->req, s_is_prefetch(pool, w));
        int r = req ? s_new_run(pool, j->client, run->id, j->session, req, LL_SCHED_PREFETCH) : -1;
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
            case LL_SCHED_SKIP: s_skip_prefetch(pool, d.r, d.why); break;
            case LL_SCHED_DROP: s_drop_run(pool, d.r); break;
            case LL_SCHED_WAIT: s_tell_wait(pool, &d); break;
            }
        }
        if (!s_promote_staged(pool))
            break;
    }
    ll_hostpool_hostd_sync(pool); /* hostd: what the pass changed, to the broker */
}

static int s_find_run(ll_hostpool_t *pool, int c, const char *id)
{
    if (!id)
        return -1;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (s_used(pool, r) && !s_idle_worker(pool, r) && s_job(pool, r)->client == c &&
            strcmp(pool->runs[r].id, id) == 0)
            return r;
    return -1;
}

static bool s_str_array(const json_t *a)
{
    if (!a)
        return true;
    if (!json_is_array(a))
        return false;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v)
        if (!json_is_string(v))
            return false;
    return true;
}

static void s_client_error(ll_hostpool_t *pool, int c, const char *id, const char *why)
{
    ll_hostpool_send(pool, c,
                     json_pack("{s:s, s:s?, s:s}", "type", "error", "id", id, "error", why));
}

static void s_kill_run(ll_hostpool_t *pool, int r, int sig)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (run->worker.pid > 0 && (!run->sig.handover || sig == SIGKILL))
        ll_hostpool_signal_worker(run->worker.pid, sig);
    else if (sig == SIGKILL || !run->sig.pending)
        run->sig.pending = sig; /* sent when the zygote reports the fork */
}

/* The worker's pid became known. */
static void s_run_pid(ll_hostpool_t *pool, int r, pid_t pid)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (run->worker.pid)
        return;
    run->worker.pid = pid;
    ll_sched_set_worker(pool->sched, r, (int) pid);
    if (run->sig.pending) {
        ll_debug("pool", "cell %s: signal %d, asked before the fork, sent to worker %d", run->id,
                 run->sig.pending, (int) pid);
        ll_hostpool_signal_worker(pid, run->sig.pending);
    }
}

/* A run or prefetch request M from client C: checked, queued. */
static void s_client_request(ll_hostpool_t *pool, int c, json_t *m, const char *id, bool prefetch)
{
    const char *bad = NULL;
    if (!id || !*id)
        bad = "run: 'id' must be a non-empty string";
    else if (s_find_run(pool, c, id) >= 0)
        bad = "run: a cell with this id is already running";
    else if (!json_is_string(json_object_get(m, "session")))
        bad = "run: 'session' must be a string";
    else if (prefetch && pool->cfg.warm_idle_s <= 0)
        bad = "prefetch: warm workers are off in this pool (--warm-idle 0)";
    else if (!prefetch && !json_is_string(json_object_get(m, "code")))
        bad = "run: 'code' must be a string";
    else if (!json_is_string(json_object_get(m, "store_dir")))
        bad = "run: 'store_dir' must be a string";
    else if (!s_str_array(json_object_get(m, "state_closure")) ||
             !s_str_array(json_object_get(m, "import_closure")) ||
             !s_str_array(json_object_get(m, "defines")) ||
             !s_str_array(json_object_get(m, "deletes")))
        bad = "run: state_closure, import_closure, defines and deletes must be arrays of strings";
    if (bad) {
        s_client_error(pool, c, id, bad);
        return;
    }
    const char *session = json_string_value(json_object_get(m, "session"));
    int r = s_new_run(pool, c, id, session, m, prefetch ? LL_SCHED_PREFETCH : LL_SCHED_CELL);
    if (r < 0) {
        s_client_error(pool, c, id, "run: too many cells in flight");
        return;
    }
    ll_sched_session_open(pool->sched, c, session);
    if (!json_is_array(json_object_get(m, "import_closure")))
        json_object_set_new(m, "import_closure", json_array());
    if (ll_ztree_broken(pool->tree))
        ll_hostpool_fail_queued(pool);
    else
        ll_hostpool_schedule(pool);
}

/* Client C interrupts (or, CANCEL, cancels) its job R. */
static void s_client_interrupt(ll_hostpool_t *pool, int c, int r, bool cancel)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    bool queued = s_job(pool, r)->state == LL_SCHED_QUEUED;
    if (s_is_prefetch(pool, r)) {
        /* Speculative work dropped: a worker forked for it goes (it
         * committed nothing); a warm one finishes restoring and stays. */
        if (queued) {
            ll_hostpool_send(pool, c,
                             json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", run->id,
                                       "ok", 0, "skipped", "cancelled"));
            s_drop_run(pool, r);
        } else if (run->origin == LL_HOSTPOOL_ORIGIN_FORKED) {
            run->cancelled = true;
            s_kill_run(pool, r, SIGKILL);
        }
        return;
    }
    if (queued) {
        s_reply_error(pool, r, cancel ? "Cancelled" : "KeyboardInterrupt",
                      cancel ? "the cell was cancelled before it started"
                             : "interrupted before the cell started");
        s_drop_run(pool, r);
    } else if (cancel) {
        run->cancelled = true;
        s_kill_run(pool, r, SIGKILL);
    } else {
        s_kill_run(pool, r, SIGINT);
    }
}

void ll_hostpool_client_frame(ll_hostpool_t *pool, int c, json_t *m)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    const char *id = json_string_value(json_object_get(m, "id"));
    if (!type) {
        s_client_error(pool, c, id, "frame without a type");
        return;
    }
    bool prefetch = strcmp(type, "prefetch") == 0;
    if (strcmp(type, "run") == 0 || prefetch) {
        s_client_request(pool, c, m, id, prefetch);
        return;
    }
    int r = s_find_run(pool, c, id);
    if (r < 0 && id && strcmp(type, "cancel") == 0) {
        /* A prefetch that finished: its speculative worker (never ran a
         * cell) leaves; a worker that ran cells stays. */
        for (int w = 0; w < LL_SCHED_MAX_JOBS; w++)
            if (s_job(pool, w)->state == LL_SCHED_WARM && s_job(pool, w)->client == c &&
                s_job(pool, w)->worker.spec && pool->runs[w].id &&
                strcmp(pool->runs[w].id, id) == 0)
                s_release_worker(pool, w, "its prefetch was cancelled");
        return;
    }
    if (strcmp(type, "stats") == 0) {
        ll_hostpool_send(pool, c, ll_hostpool_stats(pool));
    } else if (strcmp(type, "input_reply") == 0) {
        if (r < 0 || pool->runs[r].worker.fd < 0)
            return;
        json_t *f =
            json_pack("{s:s, s:O}", "type", "input_reply", "value",
                      json_object_get(m, "value") ? json_object_get(m, "value") : json_string(""));
        ll_zframe_send(pool->runs[r].worker.fd, f, -1);
        json_decref(f);
    } else if (strcmp(type, "interrupt") == 0 || strcmp(type, "cancel") == 0) {
        if (r >= 0)
            s_client_interrupt(pool, c, r, type[0] == 'c');
    } else {
        s_client_error(pool, c, id, "unknown frame type");
    }
}

void ll_hostpool_client_left(ll_hostpool_t *pool, int c)
{
    for (int i = 0; i < LL_HOSTPOOL_GONE; i++)
        if (pool->gone[i].client == c)
            pool->gone[i].client = -1; /* its slot may go to a new client */
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        const ll_sched_job_t *j = s_job(pool, r);
        if (!j->state || j->client != c)
            continue;
        if (j->state == LL_SCHED_QUEUED) {
            s_drop_run(pool, r);
            continue;
        }
        if (j->state == LL_SCHED_WARM) {
            s_release_worker(pool, r, "its client left");
        } else if (j->state == LL_SCHED_SAVING) {
            /* Its save commits (a cell that ran is kept, as if the client
             * had waited), then it leaves: nobody takes it warm. */
            pool->runs[r].evict_t = ll_clock_ms();
        } else if (j->state != LL_SCHED_EVICTING) {
            pool->runs[r].cancelled = true;
            s_kill_run(pool, r, SIGKILL);
        }
    }
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++)
        if (ll_sched_session(pool->sched, i)->used && ll_sched_session(pool->sched, i)->client == c)
            s_session_end(pool, i);
    ll_sched_client_gone(pool->sched, c);
}

/* ------------------------------------------------------------------ */
/* Frames from zygotes and workers                                    */

void ll_hostpool_node_frame(ll_hostpool_t *pool, int n, json_t *m)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type)
        return;
    if (strcmp(type, "ready") == 0) {
        ll_ztree_node_ready(pool->tree, n, m);
        ll_hostpool_schedule(pool);
    } else if (strcmp(type, "forked") == 0 || strcmp(type, "refused") == 0) {
        ll_ztree_fork_answered(pool->tree, n);
        const char *rid = json_string_value(json_object_get(m, "run"));
        int client = (int) json_integer_value(json_object_get(m, "client"));
        int r = s_find_run(pool, client, rid);
        if (r < 0)
            return;
        if (type[0] == 'f') {
            s_run_pid(pool, r, (pid_t) json_integer_value(json_object_get(m, "pid")));
            return;
        }
        const char *why = json_string_value(json_object_get(m, "why"));
        char msg[600];
        snprintf(msg, sizeof msg, "the zygote refused to fork a worker: %s", why ? why : "?");
        ll_error("pool", "cell %s: %s", pool->runs[r].id, msg);
        s_reply_error(pool, r, "ZygoteRefused", msg);
        s_drop_run(pool, r);
        ll_hostpool_schedule(pool);
    } else if (strcmp(type, "exited") == 0) {
        ll_hostpool_worker_exited(pool, (pid_t) json_integer_value(json_object_get(m, "pid")),
                                  (int) json_integer_value(json_object_get(m, "status")));
    }
}

/* Worker R stays warm for its session (the schedule said so): signals for
 * its last job are moot. */
static void s_warm(ll_hostpool_t *pool, int r)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    run->sig.handover = false;
    run->sig.pending = 0;
    if (s_job(pool, r)->slot >= 0)
        ll_debug("pool", "worker %d warm for session %s (%.0f bytes)", (int) run->worker.pid,
                 s_job(pool, r)->session, s_job(pool, r)->worker.held_bytes);
}

/* "ready" from R's worker: its job starts. */
static void s_worker_ready(ll_hostpool_t *pool, int r, json_t *m)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    s_run_pid(pool, r, (pid_t) json_integer_value(json_object_get(m, "pid")));
    if (run->sig.handover) {
        /* The warm worker dropped stale interrupts: forward new ones. */
        run->sig.handover = false;
        if (run->sig.pending && run->worker.pid > 0)
            ll_hostpool_signal_worker(run->worker.pid, run->sig.pending);
        run->sig.pending = 0;
    }
    ll_sched_ready(pool->sched, r);
    if (s_is_prefetch(pool, r))
        return;
    json_object_set_new(m, "type", json_string("started"));
    json_object_set_new(m, "node", json_integer(run->worker.node_id));
    json_object_set_new(m, "wait_ms", json_real(run->wait_ms));
    json_object_set_new(m, "warm_hit", json_boolean(run->origin >= LL_HOSTPOOL_ORIGIN_WARM));
    json_object_set_new(m, "id", json_string(run->id));
    ll_hostpool_send(pool, s_job(pool, r)->client, json_incref(m));
}

/* "prepared" from prefetch R's worker: answered; the worker stays warm for
 * the session's coming cell, or goes. */
static void s_worker_prepared(ll_hostpool_t *pool, int r, json_t *m)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    json_t *rep = json_object_get(m, "report");
    json_t *ev = json_is_object(rep) ? json_deep_copy(rep) : json_object();
    bool ok = !json_object_get(ev, "fatal");
    bool may_stay = ok && json_is_true(json_object_get(ev, "stays_warm"));
    json_t *restored = json_object_get(ev, "restored");
    bool changed = run->origin == LL_HOSTPOOL_ORIGIN_FORKED ||
                   (json_is_array(restored) && json_array_size(restored) > 0) ||
                   json_array_size(json_object_get(ev, "dropped_stale")) > 0;
    json_t *held = json_object_get(ev, "held_bytes");
    json_object_set_new(ev, "type", json_string("prefetched"));
    json_object_set_new(ev, "id", json_string(run->id));
    json_object_set_new(ev, "ok", json_boolean(ok));
    json_object_set_new(ev, "warm_hit", json_boolean(run->origin >= LL_HOSTPOOL_ORIGIN_WARM));
    json_object_set_new(ev, "staged", json_boolean(s_job(pool, r)->slot < 0));
    json_object_set_new(ev, "zygote_node", json_integer(run->worker.node_id));
    json_object_set_new(ev, "wait_ms", json_real(run->wait_ms));
    double held_bytes = json_is_number(held) ? json_number_value(held) : -1;
    ll_sched_set_home(pool->sched, r, (int) json_object_size(json_object_get(ev, "home")));
    s_answer_prefetch(pool, r, ev);
    if (ll_sched_prepared(pool->sched, r, may_stay, changed, held_bytes, ll_clock_ms())) {
        s_warm(pool, r);
    } else {
        ll_hostpool_tell_gone(pool, r, "which could not stay");
        s_let_go(pool, r, may_stay);
    }
    ll_hostpool_schedule(pool);
}

/* "reply" from R's worker, sent only after its save committed: the slot is
 * free, or the worker stays warm for the session's next cell. */
static void s_worker_reply(ll_hostpool_t *pool, int r, json_t *m)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    json_t *md = json_object_get(m, "metadata");
    json_t *ll = md ? json_object_get(md, "looseleaf") : NULL;
    double held_bytes = -1;
    if (ll) {
        json_object_set_new(ll, "zygote_node", json_integer(run->worker.node_id));
        json_object_set_new(ll, "wait_ms", json_real(run->wait_ms));
        json_object_set_new(ll, "warm_hit", json_boolean(run->origin >= LL_HOSTPOOL_ORIGIN_WARM));
        json_object_set_new(ll, "staged", json_boolean(run->origin == LL_HOSTPOOL_ORIGIN_STAGED));
        if (run->retries)
            json_object_set_new(ll, "worker_retries", json_integer(run->retries));
        if (json_is_number(json_object_get(ll, "held_bytes")))
            held_bytes = json_number_value(json_object_get(ll, "held_bytes"));
    }
    json_object_set_new(m, "id", json_string(run->id));
    ll_hostpool_send(pool, s_job(pool, r)->client, json_incref(m));
    bool may_stay = ll && json_is_true(json_object_get(ll, "stays_warm")) && !run->cancelled;
    ll_sched_set_home(pool->sched, r, (int) json_object_size(json_object_get(ll, "home")));
    if (ll_sched_replied(pool->sched, r, may_stay, held_bytes, ll_clock_ms())) {
        s_warm(pool, r);
    } else {
        ll_hostpool_tell_gone(pool, r, "which could not stay after its cell");
        s_let_go(pool, r, may_stay); /* its zygote reaps it */
    }
    ll_hostpool_schedule(pool);
}

static void s_worker_frame(ll_hostpool_t *pool, int r, json_t *m)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type || s_idle_worker(pool, r))
        return; /* an idle worker has nothing to say */
    if (strcmp(type, "ready") == 0) {
        s_worker_ready(pool, r, m);
    } else if (strcmp(type, "saving") == 0) {
        ll_sched_saving(pool->sched, r);
    } else if (strcmp(type, "prepared") == 0 && s_is_prefetch(pool, r)) {
        s_worker_prepared(pool, r, m);
    } else if (strcmp(type, "reply") == 0) {
        s_worker_reply(pool, r, m);
    } else {
        run->began = true; /* output of the cell (or its input prompt): its code runs */
        json_object_set_new(m, "id", json_string(run->id));
        ll_hostpool_send(pool, s_job(pool, r)->client, json_incref(m));
    }
}

/* Warm workers unused for --warm-idle leave; an evicted one that does not
 * leave in time is killed (its save committed), and so is one still saving
 * S_SAVE_GRACE_MS after its client left.  Returns TIMEOUT, or the ms until
 * the next of these deadlines when sooner. */
int ll_hostpool_worker_timers(ll_hostpool_t *pool, double now, int timeout)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        ll_hostpool_run_t *run = &pool->runs[r];
        const ll_sched_job_t *j = s_job(pool, r);
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
                s_drop_run(pool, r);
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
                s_release_worker(pool, r, "idle timeout");
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

/* ------------------------------------------------------------------ */
/* The loop's questions                                               */

void ll_hostpool_worker_input(ll_hostpool_t *pool, int r, int fd)
{
    /* A frame may end the entry, or hand its worker to another job (then
     * the fd moved): stop reading it here. */
    ll_hostpool_run_t *run = &pool->runs[r];
    if (!s_used(pool, r) || run->worker.fd != fd)
        return;
    int fr = ll_zreader_fill(run->worker.rd);
    json_t *m;
    bool bad = false;
    while (s_used(pool, r) && run->worker.fd == fd && (m = ll_zreader_pop(run->worker.rd, &bad))) {
        s_worker_frame(pool, r, m);
        json_decref(m);
    }
    if (s_used(pool, r) && run->worker.fd == fd && (fr < 0 || bad)) {
        run->worker.eof = true;
        ll_sched_lost(pool->sched, r);
        if (run->worker.exited)
            s_finish_dead(pool, r);
    }
}

bool ll_hostpool_busy(const ll_hostpool_t *pool)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (ll_sched_job(pool->sched, r)->state != LL_SCHED_FREE)
            return true;
    return false;
}

void ll_hostpool_jobs_stop(ll_hostpool_t *pool)
{
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++)
        if (ll_sched_session(pool->sched, i)->used)
            s_session_end(pool, i);
    ll_ztree_stop(pool->tree);
    ll_hostpool_kill_strays(pool, true); /* what the workers' cells started goes too */
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (s_used(pool, r))
            s_kill_run(pool, r, SIGKILL);
}

/* ------------------------------------------------------------------ */
/* Self-test: what needs no process (the restaged request).            */

int ll_hostpool_jobs_selftest(bool verbose)
{
    int fails = 0;
#define S_CHECK(cond)                                                                         \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fails++;                                                                          \
            if (verbose)                                                                      \
                fprintf(stderr, "ll_hostpool_jobs: failed: %s (line %d)\n", #cond, __LINE__); \
        }                                                                                     \
    } while (0)
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
#undef S_CHECK
    if (verbose)
        fprintf(stderr, "ll_hostpool_jobs: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
