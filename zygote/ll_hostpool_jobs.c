/* ll_hostpool_jobs: what the host pool's clients ask (cells, prefetches,
 * signals, stats) and what its zygotes and workers say (a fork, ready,
 * output, a reply, a death), applied to the job entries
 * (ll_hostpool_runs.c); each that changes what may run asks for a pass of
 * the schedule (ll_hostpool_schedule.c).  The top of the pool's parts
 * below its loop (ll_hostpool.c).  Run by the pool's one thread.
 *
 * A job's entry R here is the schedule's job R: the schedule keeps its
 * state, slot, client and session; here are its request and its worker's
 * process.
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
 * Below it: the schedule's decisions applied (ll_hostpool_schedule.c), the
 * stats (ll_hostpool_stats.c), the slot broker's link
 * (ll_hostpool_hostd.c), the entries (ll_hostpool_runs.c), the record of
 * homes that went (ll_hostpool_homes.c), the clients' queues
 * (ll_hostpool_clients.c), workers as processes (ll_hostpool_procs.c) and
 * every decision (ll_sched.c). */
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
    const ll_sched_job_t *j = ll_hostpool_job(pool, r);
    char why[512];
    if (run->sig.handover && !run->cancelled) {
        /* A warm worker that died before it took this job (it says ready
         * before anything runs): nothing ran, so the job is queued again
         * and gets a fresh worker, as if the pool had seen the death first. */
        ll_warn("pool", "%s %s: warm worker %d was gone before it took the job: forking anew",
                ll_hostpool_is_prefetch(pool, r) ? "prefetch" : "cell", run->id,
                (int) run->worker.pid);
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
    if (!run->cancelled && !run->began && run->retries == 0 && !ll_hostpool_is_prefetch(pool, r) &&
        !ll_hostpool_idle_worker(pool, r)) {
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
    if (ll_hostpool_idle_worker(pool, r)) {
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
        ll_hostpool_drop_worker(pool, r);
        ll_hostpool_schedule(pool);
        return;
    }
    if (ll_hostpool_is_prefetch(pool, r)) {
        snprintf(why, sizeof why, "the worker (pid %d) preparing the prefetch %s ended (%s %d)",
                 (int) run->worker.pid, run->cancelled ? "was cancelled" : "died",
                 WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        ll_info("pool", "%s", why);
        ll_hostpool_answer_prefetch(pool, r,
                                    json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id",
                                              run->id, "ok", 0, "error", why));
        ll_hostpool_drop_worker(pool, r);
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
    ll_hostpool_reply_error(pool, r, run->cancelled ? "Cancelled" : "WorkerDied", why);
    ll_hostpool_drop_worker(pool, r);
    ll_hostpool_schedule(pool);
}

void ll_hostpool_worker_exited(ll_hostpool_t *pool, pid_t pid, int status)
{
    pool->sweep = true; /* what it left out of its group is ours now */
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        ll_hostpool_run_t *run = &pool->runs[r];
        if (ll_hostpool_used(pool, r) && run->worker.pid == pid && !run->worker.exited) {
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

static int s_find_run(ll_hostpool_t *pool, int c, const char *id)
{
    if (!id)
        return -1;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (ll_hostpool_used(pool, r) && !ll_hostpool_idle_worker(pool, r) &&
            ll_hostpool_job(pool, r)->client == c && strcmp(pool->runs[r].id, id) == 0)
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
    int r =
        ll_hostpool_new_run(pool, c, id, session, m, prefetch ? LL_SCHED_PREFETCH : LL_SCHED_CELL);
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
    bool queued = ll_hostpool_job(pool, r)->state == LL_SCHED_QUEUED;
    if (ll_hostpool_is_prefetch(pool, r)) {
        /* Speculative work dropped: a worker forked for it goes (it
         * committed nothing); a warm one finishes restoring and stays. */
        if (queued) {
            ll_hostpool_send(pool, c,
                             json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", run->id,
                                       "ok", 0, "skipped", "cancelled"));
            ll_hostpool_drop_run(pool, r);
        } else if (run->origin == LL_HOSTPOOL_ORIGIN_FORKED) {
            run->cancelled = true;
            ll_hostpool_kill_run(pool, r, SIGKILL);
        }
        return;
    }
    if (queued) {
        ll_hostpool_reply_error(pool, r, cancel ? "Cancelled" : "KeyboardInterrupt",
                                cancel ? "the cell was cancelled before it started"
                                       : "interrupted before the cell started");
        ll_hostpool_drop_run(pool, r);
    } else if (cancel) {
        run->cancelled = true;
        ll_hostpool_kill_run(pool, r, SIGKILL);
    } else {
        ll_hostpool_kill_run(pool, r, SIGINT);
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
            if (ll_hostpool_job(pool, w)->state == LL_SCHED_WARM &&
                ll_hostpool_job(pool, w)->client == c && ll_hostpool_job(pool, w)->worker.spec &&
                pool->runs[w].id && strcmp(pool->runs[w].id, id) == 0)
                ll_hostpool_release_worker(pool, w, "its prefetch was cancelled");
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
        const ll_sched_job_t *j = ll_hostpool_job(pool, r);
        if (!j->state || j->client != c)
            continue;
        if (j->state == LL_SCHED_QUEUED) {
            ll_hostpool_drop_run(pool, r);
            continue;
        }
        if (j->state == LL_SCHED_WARM) {
            ll_hostpool_release_worker(pool, r, "its client left");
        } else if (j->state == LL_SCHED_SAVING) {
            /* Its save commits (a cell that ran is kept, as if the client
             * had waited), then it leaves: nobody takes it warm. */
            pool->runs[r].evict_t = ll_clock_ms();
        } else if (j->state != LL_SCHED_EVICTING) {
            pool->runs[r].cancelled = true;
            ll_hostpool_kill_run(pool, r, SIGKILL);
        }
    }
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++)
        if (ll_sched_session(pool->sched, i)->used && ll_sched_session(pool->sched, i)->client == c)
            ll_hostpool_session_end(pool, i);
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
        ll_hostpool_reply_error(pool, r, "ZygoteRefused", msg);
        ll_hostpool_drop_run(pool, r);
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
    if (ll_hostpool_job(pool, r)->slot >= 0)
        ll_debug("pool", "worker %d warm for session %s (%.0f bytes)", (int) run->worker.pid,
                 ll_hostpool_job(pool, r)->session, ll_hostpool_job(pool, r)->worker.held_bytes);
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
    if (ll_hostpool_is_prefetch(pool, r))
        return;
    json_object_set_new(m, "type", json_string("started"));
    json_object_set_new(m, "node", json_integer(run->worker.node_id));
    json_object_set_new(m, "wait_ms", json_real(run->wait_ms));
    json_object_set_new(m, "warm_hit", json_boolean(run->origin >= LL_HOSTPOOL_ORIGIN_WARM));
    json_object_set_new(m, "id", json_string(run->id));
    ll_hostpool_send(pool, ll_hostpool_job(pool, r)->client, json_incref(m));
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
    json_object_set_new(ev, "staged", json_boolean(ll_hostpool_job(pool, r)->slot < 0));
    json_object_set_new(ev, "zygote_node", json_integer(run->worker.node_id));
    json_object_set_new(ev, "wait_ms", json_real(run->wait_ms));
    double held_bytes = json_is_number(held) ? json_number_value(held) : -1;
    ll_sched_set_home(pool->sched, r, (int) json_object_size(json_object_get(ev, "home")));
    ll_hostpool_answer_prefetch(pool, r, ev);
    if (ll_sched_prepared(pool->sched, r, may_stay, changed, held_bytes, ll_clock_ms())) {
        s_warm(pool, r);
    } else {
        ll_hostpool_tell_gone(pool, r, "which could not stay");
        ll_hostpool_let_go(pool, r, may_stay);
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
    ll_hostpool_send(pool, ll_hostpool_job(pool, r)->client, json_incref(m));
    bool may_stay = ll && json_is_true(json_object_get(ll, "stays_warm")) && !run->cancelled;
    ll_sched_set_home(pool->sched, r, (int) json_object_size(json_object_get(ll, "home")));
    if (ll_sched_replied(pool->sched, r, may_stay, held_bytes, ll_clock_ms())) {
        s_warm(pool, r);
    } else {
        ll_hostpool_tell_gone(pool, r, "which could not stay after its cell");
        ll_hostpool_let_go(pool, r, may_stay); /* its zygote reaps it */
    }
    ll_hostpool_schedule(pool);
}

static void s_worker_frame(ll_hostpool_t *pool, int r, json_t *m)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type || ll_hostpool_idle_worker(pool, r))
        return; /* an idle worker has nothing to say */
    if (strcmp(type, "ready") == 0) {
        s_worker_ready(pool, r, m);
    } else if (strcmp(type, "saving") == 0) {
        ll_sched_saving(pool->sched, r);
    } else if (strcmp(type, "prepared") == 0 && ll_hostpool_is_prefetch(pool, r)) {
        s_worker_prepared(pool, r, m);
    } else if (strcmp(type, "reply") == 0) {
        s_worker_reply(pool, r, m);
    } else {
        run->began = true; /* output of the cell (or its input prompt): its code runs */
        json_object_set_new(m, "id", json_string(run->id));
        ll_hostpool_send(pool, ll_hostpool_job(pool, r)->client, json_incref(m));
    }
}

/* ------------------------------------------------------------------ */
/* The loop's questions                                               */

void ll_hostpool_worker_input(ll_hostpool_t *pool, int r, int fd)
{
    /* A frame may end the entry, or hand its worker to another job (then
     * the fd moved): stop reading it here. */
    ll_hostpool_run_t *run = &pool->runs[r];
    if (!ll_hostpool_used(pool, r) || run->worker.fd != fd)
        return;
    int fr = ll_zreader_fill(run->worker.rd);
    json_t *m;
    bool bad = false;
    while (ll_hostpool_used(pool, r) && run->worker.fd == fd &&
           (m = ll_zreader_pop(run->worker.rd, &bad))) {
        s_worker_frame(pool, r, m);
        json_decref(m);
    }
    if (ll_hostpool_used(pool, r) && run->worker.fd == fd && (fr < 0 || bad)) {
        run->worker.eof = true;
        ll_sched_lost(pool->sched, r);
        if (run->worker.exited)
            s_finish_dead(pool, r);
    }
}
