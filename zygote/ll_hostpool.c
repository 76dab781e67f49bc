/* ll_hostpool: the host pool (`looseleaf pool`), one process per runtime dir
 * (per uid), shared by every kernel on the host.
 *
 * Runs single-threaded: one poll loop over the listening socket, the clients,
 * the zygote nodes, the workers, the CUDA-safety probes and a signalfd for
 * SIGCHLD.  It never forks a Python process: zygotes are started by exec,
 * workers and child nodes are forked by zygotes.  It is a child subreaper,
 * so a worker whose zygote died is reaped here and its fate still reported.
 * What it decides is ll_sched.h's (which job gets a slot or a warm worker,
 * whom to evict); the zygote tree is ll_ztree.h's; this file applies the
 * decisions to processes and sockets.
 *
 * What must stay true:
 * - a slot is held from the fork of a worker until its death, or its reply
 *   (sent by the worker only after its save committed) when it does not stay
 *   warm; a cell arriving when every slot is held evicts an idle warm worker
 *   (GreedyDual, ll_gdsf.h) or waits, and its client is told so;
 * - a warm worker (idle, its save committed) serves only its own client's
 *   session: the next cell of that session runs on it (a hit); it is never
 *   evicted while it prepares, runs or saves; it leaves under slot pressure,
 *   after --warm-idle seconds unused, or when its client goes;
 * - a prefetch that finds no slot it may take prepares a staged worker that
 *   holds none: it takes one when its session's cell runs, as a cell would;
 * - a client that goes away takes only its own cells with it;
 * - the base node is respawned when it dies; at most max_nodes nodes exist,
 *   least-recently-used leaves are evicted, the base is kept;
 * - a child node holds only modules that passed the CUDA-safety probe. */
#include "zygote/ll_hostpool.h"
#include "zygote/ll_hostpool_config.h"
#include "zygote/ll_zclient.h"
#include "zygote/ll_sched.h"
#include "zygote/ll_ztree.h"
#include "zygote/ll_zframe.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_MAX_CLIENTS   128
#define S_EXIT_GRACE_MS 5000.0  /* an evicted worker that does not leave by then is killed */
#define S_SAVE_GRACE_MS 30000.0 /* a worker saving when its client left may finish that long */

/* Frames to a client are queued and written as its socket takes them, so a
 * client that stops reading stalls only itself; past S_CLIENT_QUEUE_MAX it
 * is dropped (its cells are cancelled) instead of growing without bound. */
#define S_CLIENT_QUEUE_MAX (512u << 20)

typedef struct {
    int fd;            /* -1: free entry */
    ll_zreader_t *rd;  /* frames from the client */
    char *out;         /* bytes queued for it */
    size_t olen, ocap; /* queued, allocated */
    bool dead;         /* to be dropped at the end of this loop turn */
    double connected;  /* ms, when it connected (a pinned session's GPU time starts here) */
} s_client_t;

/* How a job got its worker (what its reports say). */
typedef enum {
    S_ORIGIN_NONE,   /* none yet: queued */
    S_ORIGIN_FORKED, /* forked for this job */
    S_ORIGIN_WARM,   /* its session's warm worker took it (a hit) */
    S_ORIGIN_STAGED, /* ... one a prefetch prepared without a slot, promoted into one for this cell */
} s_origin_t;

/* The pool's side of job R: the request, its worker's process and socket,
 * what the reports say.  Its state, slot, client and session are the
 * schedule's (ll_sched_job(P.sched, R)): entry R here is job R there, and
 * is in use exactly while that one is.  A warm worker keeps its entry after
 * its job and hands it, worker and all, to the next job of its session. */
typedef struct {
    char *id;    /* the client's id for the job */
    json_t *req; /* the request */
    struct {
        int fd;           /* socket to the worker, -1 before it is forked */
        ll_zreader_t *rd; /* frames from it */
        pid_t pid;        /* 0 until known (the zygote's "forked" or the worker's "ready") */
        int node;         /* tree entry of the node it was forked from, -1 none */
        int node_id;      /* that node's id (for the reports) */
        bool eof;         /* its socket closed */
        bool exited;      /* its exit status is known (both: it is gone, s_finish_dead) */
        int status;       /* its waitpid status */
    } worker;
    struct {
        bool handover; /* handed to a warm worker that has not said ready: signals wait */
        int pending;   /* a signal asked for before the worker could take it */
    } sig;
    bool cancelled;    /* killed on request (cancel, its client left, a save overdue) */
    s_origin_t origin; /* how it got its worker */
    double wait_ms;    /* time it waited for its worker */
    double evict_t;    /* ms, when it was told to exit (or its client left while it saved) */
} s_run_t;

/* The pool's one process-wide state (one pool per process). */
static struct {
    ll_hostpool_config_t cfg; /* what the pool was told (read once at its start) */
    char sock[PATH_MAX + 16]; /* listening socket path */
    char exe[PATH_MAX]; /* our binary (/proc/self/exe: it survives a rebuild), exec'd as `zygote` */
    char exe_name[PATH_MAX]; /* its name, for the zygotes' argv[0] */
    int listen_fd;           /* the listening socket */
    int sig_fd;              /* SIGCHLD, SIGTERM, SIGINT */
    bool cuda;               /* slots are CUDA devices */
    bool staged_defer; /* staged workers leave the state's restore to the cell's run (CUDA hosts) */
    ll_sched_t *sched; /* jobs, slots, sessions: the scheduling decisions */
    ll_ztree_t *tree;  /* the zygote nodes and the CUDA-safety probes */
    s_client_t clients[S_MAX_CLIENTS];
    s_run_t runs[LL_SCHED_MAX_JOBS];
    double idle_since; /* ms, 0 while busy */
    bool stop;         /* SIGTERM or SIGINT came */
} P;

/* ------------------------------------------------------------------ */
/* Slots: CUDA devices counted through the runtime loaded with dlopen  */
/* (never linked), else virtual ones.                                 */

static int s_count_cuda(void)
{
    static const char *names[] = {"libcudart.so", "libcudart.so.12", "libcudart.so.11.0", NULL};
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h)
            continue;
        int (*count)(int *) = (int (*)(int *)) dlsym(h, "cudaGetDeviceCount");
        int n = 0;
        if (count && count(&n) == 0 && n > 0) {
            /* Keep the library loaded: unloading after cuInit is not safe. */
            return n;
        }
        dlclose(h);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                            */

static void s_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Write what the socket takes now. */
static void s_client_flush(int c)
{
    s_client_t *cl = &P.clients[c];
    size_t done = 0;
    while (done < cl->olen) {
        ssize_t w = send(cl->fd, cl->out + done, cl->olen - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            done += (size_t) w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN) {
            ll_debug("pool", "client %d: send failed: %s", c, strerror(errno));
            cl->dead = true;
        }
        break;
    }
    memmove(cl->out, cl->out + done, cl->olen - done);
    cl->olen -= done;
}

static void s_send_client(int c, json_t *msg)
{
    size_t n = 0;
    char *bytes =
        c >= 0 && P.clients[c].fd >= 0 && !P.clients[c].dead ? ll_zframe_encode(msg, &n) : NULL;
    json_decref(msg);
    if (!bytes)
        return;
    s_client_t *cl = &P.clients[c];
    if (cl->olen + n > S_CLIENT_QUEUE_MAX) {
        ll_warn("pool", "client %d does not read its events (%zu bytes queued): dropping it", c,
                cl->olen);
        cl->dead = true;
        free(bytes);
        return;
    }
    if (cl->olen + n > cl->ocap) {
        size_t cap = (cl->olen + n) * 2;
        char *nb = realloc(cl->out, cap);
        if (!nb) {
            cl->dead = true;
            free(bytes);
            return;
        }
        cl->out = nb;
        cl->ocap = cap;
    }
    memcpy(cl->out + cl->olen, bytes, n);
    cl->olen += n;
    free(bytes);
    s_client_flush(c);
}

static const char *s_signame(int sig)
{
    const char *d = sigabbrev_np(sig);
    return d ? d : "?";
}

/* ------------------------------------------------------------------ */
/* Jobs: the pool's side of the schedule's entries                    */

static const ll_sched_job_t *s_job(int r)
{
    return ll_sched_job(P.sched, r);
}

static bool s_used(int r)
{
    return s_job(r)->state != LL_SCHED_FREE;
}

static bool s_is_prefetch(int r)
{
    return s_job(r)->kind != LL_SCHED_CELL;
}

/* A warm worker, or one leaving: it has nothing to say and runs no job. */
static bool s_idle_worker(int r)
{
    return s_job(r)->state == LL_SCHED_WARM || s_job(r)->state == LL_SCHED_EVICTING;
}

/* Forget the pool's side of entry R (the schedule's is the caller's). */
static void s_run_free(int r)
{
    s_run_t *run = &P.runs[r];
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
static void s_drop_run(int r)
{
    ll_sched_drop(P.sched, r, ll_clock_ms());
    s_run_free(r);
}

/* A new queued job of client C (ID, SESSION; REQ: the request, the entry
 * takes its own reference), or -1 when the table is full (or memory). */
static int s_new_run(int c, const char *id, const char *session, json_t *req, ll_sched_kind_t kind)
{
    int r = ll_sched_add(P.sched, c, session, kind,
                         json_number_value(json_object_get(req, "closure_bytes")), ll_clock_ms());
    if (r < 0)
        return -1;
    s_run_t *run = &P.runs[r];
    run->id = strdup(id);
    run->req = json_incref(req);
    if (!run->id) {
        s_drop_run(r);
        return -1;
    }
    return r;
}

/* Answer M ("prefetched") to the client of prefetch R; a restaged one
 * (s_restage) was asked by nobody. */
static void s_answer_prefetch(int r, json_t *m)
{
    if (s_job(r)->kind == LL_SCHED_RESTAGE)
        json_decref(m);
    else
        s_send_client(s_job(r)->client, m);
}

/* Prefetch R will not be prepared (WHY): answer so and drop it. */
static void s_skip_prefetch(int r, const char *why)
{
    s_answer_prefetch(r, json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", P.runs[r].id,
                                   "ok", 0, "skipped", why));
    s_drop_run(r);
}

/* The reply of a cell whose worker never replied. */
static void s_reply_error(int r, const char *ename, const char *evalue)
{
    s_run_t *run = &P.runs[r];
    if (s_is_prefetch(r)) {
        /* A prefetch is answered by "prefetched", whatever went wrong. */
        s_answer_prefetch(r, json_pack("{s:s, s:s, s:b, s:s, s:s}", "type", "prefetched", "id",
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
    json_t *md = json_pack("{s:s, s:o}", "status", "error", "looseleaf", ll);
    s_send_client(s_job(r)->client, json_pack("{s:s, s:s, s:o, s:o}", "type", "reply", "id",
                                              run->id, "content", content, "metadata", md));
}

/* Every queued cell gets an error reply (no zygote will fork it). */
static void s_fail_queued(void)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (s_job(r)->state == LL_SCHED_QUEUED) {
            s_reply_error(
                r, "ZygoteUnavailable",
                "the pool cannot start its base zygote (see pool.log in the pool's runtime dir)");
            s_drop_run(r);
        }
}

/* ll_ztree_gone_fn: node N is going; cells being forked there never got a
 * worker. */
static void s_node_lost(void *arg, int n)
{
    (void) arg;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        s_run_t *run = &P.runs[r];
        if (s_job(r)->state == LL_SCHED_FORKING && run->worker.node == n && run->worker.pid == 0) {
            s_reply_error(r, "ZygoteDied",
                          "the zygote died before the worker started; run the cell again");
            s_drop_run(r);
        }
    }
}

/* The client of session I left: one line on the pool log, then forget it. */
static void s_session_end(int i)
{
    const ll_sched_session_t *se = ll_sched_session(P.sched, i);
    double now = ll_clock_ms();
    double held = ll_sched_session_held(P.sched, i, now) / 1000.0;
    double conn = se->client >= 0 && P.clients[se->client].fd >= 0
                      ? (now - P.clients[se->client].connected) / 1000.0
                      : held;
    /* Written whatever the log level (kernels start the pool at warn):
     * this line is the session's GPU bill, read by people and benches. */
    int level = ll_log_level;
    if (ll_log_level < LL_LOG_INFO)
        ll_log_level = LL_LOG_INFO;
    ll_info("pool", "session %s: GPU held %.1f s of %.1f s connected (%.0f%%)", se->name, held,
            conn, conn > 0 ? 100.0 * held / conn : 0.0);
    ll_log_level = level;
    ll_sched_session_close(P.sched, i);
}

static void s_schedule(void);

/* A worker whose socket closed and whose exit status is known, without a
 * reply: tell the client how it died. */
static void s_finish_dead(int r)
{
    s_run_t *run = &P.runs[r];
    const ll_sched_job_t *j = s_job(r);
    char why[512];
    if (run->sig.handover && !run->cancelled) {
        /* A warm worker that died before it took this job (it says ready
         * before anything runs): nothing ran, so the job is queued again
         * and gets a fresh worker, as if the pool had seen the death first. */
        ll_warn("pool", "%s %s: warm worker %d was gone before it took the job: forking anew",
                s_is_prefetch(r) ? "prefetch" : "cell", run->id, (int) run->worker.pid);
        ll_sched_requeue(P.sched, r, ll_clock_ms());
        close(run->worker.fd);
        run->worker.fd = -1;
        ll_zreader_destroy(&run->worker.rd);
        run->worker.pid = 0;
        run->worker.eof = run->worker.exited = false;
        run->worker.status = 0;
        run->sig.handover = false;
        run->origin = S_ORIGIN_NONE;
        s_schedule();
        return;
    }
    if (s_idle_worker(r)) {
        /* A warm worker gone: its last save committed, nothing is lost. */
        if (j->state == LL_SCHED_WARM)
            ll_warn(
                "pool",
                "warm worker %d of session %s died (status %d): the session's next cell forks anew",
                (int) run->worker.pid, j->session ? j->session : "?", run->worker.status);
        s_drop_run(r);
        s_schedule();
        return;
    }
    int st = run->worker.status;
    if (s_is_prefetch(r)) {
        snprintf(why, sizeof why, "the worker (pid %d) preparing the prefetch %s ended (%s %d)",
                 (int) run->worker.pid, run->cancelled ? "was cancelled" : "died",
                 WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        ll_info("pool", "%s", why);
        s_answer_prefetch(r, json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", run->id,
                                       "ok", 0, "error", why));
        s_drop_run(r);
        s_schedule();
        return;
    }
    if (run->cancelled)
        snprintf(why, sizeof why, "the cell was cancelled (worker pid %d killed)",
                 (int) run->worker.pid);
    else if (WIFSIGNALED(st))
        snprintf(why, sizeof why,
                 "the worker (pid %d) running this cell was killed by signal SIG%s (%d); the "
                 "session continues "
                 "from the last committed versions of its variables",
                 (int) run->worker.pid, s_signame(WTERMSIG(st)), WTERMSIG(st));
    else
        snprintf(why, sizeof why,
                 "the worker (pid %d) running this cell exited with status %d before replying; the "
                 "session "
                 "continues from the last committed versions of its variables",
                 (int) run->worker.pid, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    ll_warn("pool", "cell %s: %s", run->id, why);
    s_reply_error(r, run->cancelled ? "Cancelled" : "WorkerDied", why);
    s_drop_run(r);
    s_schedule();
}

static void s_worker_exited(pid_t pid, int status)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        s_run_t *run = &P.runs[r];
        if (s_used(r) && run->worker.pid == pid && !run->worker.exited) {
            run->worker.exited = true;
            run->worker.status = status;
            ll_sched_lost(P.sched, r);
            if (run->worker.eof)
                s_finish_dead(r);
            return;
        }
    }
}

/* The job frame for R's worker: the request plus where it runs. */
static json_t *s_job_frame(int r, int slot)
{
    s_run_t *run = &P.runs[r];
    json_t *job = json_deep_copy(run->req);
    json_object_set_new(job, "device", P.cuda && slot >= 0 ? json_integer(slot) : json_null());
    json_object_set_new(job, "slot", json_integer(slot));
    json_object_set_new(job, "client", json_integer(s_job(r)->client));
    json_object_set_new(job, "wait_ms", json_real(run->wait_ms));
    json_object_set_new(job, "keep_warm", json_boolean(P.cfg.warm_idle_s > 0));
    return job;
}

/* LL_SCHED_FORK: fork a worker for R on SLOT (-1: staged, without one). */
static void s_fork(int r, int slot)
{
    s_run_t *run = &P.runs[r];
    int n = ll_ztree_best(P.tree, json_object_get(run->req, "import_closure"));
    int sv[2];
    if (n < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        ll_sched_fork_failed(P.sched, r);
        return;
    }
    run->wait_ms = ll_clock_ms() - s_job(r)->t_queued;
    json_t *job = s_job_frame(r, slot);
    /* Staged without a GPU: where variables may live on the device, their
     * restore waits for the slot (the cell's run restores them). */
    json_object_set_new(job, "defer_restore", json_boolean(slot < 0 && P.staged_defer));
    json_object_set_new(job, "prefetch", json_boolean(s_is_prefetch(r)));
    int rc = ll_ztree_fork(P.tree, n, job, sv[1]);
    json_decref(job);
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        ll_sched_fork_failed(P.sched, r);
        return;
    }
    s_nonblock(sv[0]);
    run->worker.fd = sv[0];
    run->worker.rd = ll_zreader_new(sv[0]);
    run->worker.node = n;
    run->worker.node_id = ll_ztree_node_id(P.tree, n);
    run->origin = S_ORIGIN_FORKED;
    if (slot >= 0)
        ll_info("pool", "cell %s: fork from node %d on slot %d", run->id, run->worker.node_id,
                slot);
    else
        ll_info("pool", "prefetch %s: fork from node %d, staged (no slot)", run->id,
                run->worker.node_id);
    ll_ztree_consider_growth(P.tree, n, json_object_get(run->req, "import_closure"));
}

/* LL_SCHED_HAND: queued R runs on warm worker W, whose worker (socket, pid;
 * its slot, in the schedule) moved to R; W's entry goes.  Interrupts for R
 * are held until the worker says ready (it drops any stale one first). */
static void s_hand(const ll_sched_decision_t *d)
{
    s_run_t *run = &P.runs[d->r], *wk = &P.runs[d->w];
    run->worker = wk->worker;
    wk->worker.fd = -1;
    wk->worker.rd = NULL;
    s_run_free(d->w);
    run->wait_ms = ll_clock_ms() - s_job(d->r)->t_queued;
    run->sig.handover = true;
    run->origin = d->staged_hit ? S_ORIGIN_STAGED : S_ORIGIN_WARM;
    bool prefetch = s_is_prefetch(d->r);
    json_t *job = s_job_frame(d->r, d->slot);
    json_object_set_new(job, "node", json_integer(run->worker.node_id));
    json_t *m = json_pack("{s:s, s:o}", "type", prefetch ? "prefetch" : "run", "job", job);
    if (ll_zframe_send(run->worker.fd, m, -1) < 0) {
        /* It is dying: its exit reports the cell as lost (WorkerDied). */
        ll_warn("pool", "cell %s: warm worker %d unreachable: %s", run->id, (int) run->worker.pid,
                strerror(errno));
        kill(run->worker.pid, SIGKILL);
    }
    json_decref(m);
    ll_info("pool", "%s %s: warm worker %d on slot %d", prefetch ? "prefetch" : "cell", run->id,
            (int) run->worker.pid, d->slot);
}

static void s_restage(int v);

/* Warm worker W leaves (WHY; L its GreedyDual value): it keeps its slot
 * until it is gone.  PRESSURE: evicted for a slot, so killed at once (a
 * cell or a prefetch waits for the slot; its save committed: nothing is
 * lost, the store drops a dead reader's leases); else asked to exit. */
static void s_worker_leaves(int w, const char *why, double l, bool pressure)
{
    s_run_t *run = &P.runs[w];
    const ll_sched_job_t *j = s_job(w);
    ll_info(
        "pool",
        "warm worker %d of session %s leaves (%s; L %.0f, %.0f bytes held, %d cells, clock %.0f)",
        (int) run->worker.pid, j->session ? j->session : "?", why, l, j->worker.held_bytes,
        j->worker.cells, ll_gdsf_clock(ll_sched_gdsf(P.sched)));
    bool asked = false;
    if (!pressure && run->worker.fd >= 0) {
        json_t *m = json_pack("{s:s}", "type", "exit");
        asked = ll_zframe_send(run->worker.fd, m, -1) == 0;
        json_decref(m);
    }
    if (!asked)
        kill(run->worker.pid, SIGKILL);
    run->evict_t = ll_clock_ms();
}

/* Let warm worker W go, not under pressure (idle timeout, its client left,
 * its prefetch was cancelled). */
static void s_release_worker(int w, const char *why)
{
    double l = 0;
    ll_sched_release(P.sched, w, &l);
    s_worker_leaves(w, why, l, false);
}

/* LL_SCHED_EVICT: warm worker D->W leaves under slot pressure, for D->R;
 * its session is prepared again, staged, when the schedule says so. */
static void s_evict_for(const ll_sched_decision_t *d)
{
    const ll_sched_job_t *j = s_job(d->r);
    char why[200];
    if (j->kind == LL_SCHED_CELL)
        snprintf(why, sizeof why, "slot pressure: cell %.80s of session %.40s needs a slot",
                 P.runs[d->r].id, j->session);
    else
        snprintf(why, sizeof why, "slot pressure: prefetch %.80s of session %.40s%s",
                 P.runs[d->r].id, j->session, d->credit ? " (its credit)" : "");
    s_worker_leaves(d->w, why, d->l, true);
    if (d->restage)
        s_restage(d->w); /* its session keeps a prepared worker, without a slot */
}

/* Whether JSON array ARR holds a value equal to V (NULL ARR: no). */
static bool s_json_has(const json_t *arr, const json_t *v)
{
    for (size_t j = 0; j < json_array_size(arr); j++)
        if (json_equal(json_array_get(arr, j), v))
            return true;
    return false;
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
static void s_restage(int v)
{
    s_run_t *old = &P.runs[v];
    json_t *req = json_deep_copy(old->req);
    if (!req)
        return;
    if (!s_is_prefetch(v)) {
        if (!json_is_array(json_object_get(req, "state_closure")))
            json_object_set_new(req, "state_closure", json_array());
        json_t *closure = json_object_get(req, "state_closure"),
               *deleted = json_object_get(req, "deletes");
        size_t i;
        json_t *name;
        json_array_foreach(json_object_get(req, "defines"), i, name)
            if (!s_json_has(closure, name) && !s_json_has(deleted, name))
                json_array_append(closure, name);
        json_object_del(req, "code");
    }
    int r = s_new_run(s_job(v)->client, old->id, s_job(v)->session, req, LL_SCHED_RESTAGE);
    json_decref(req);
    if (r < 0)
        return;
    ll_info("pool", "session %s: prepared again, staged (its worker was evicted)",
            s_job(r)->session);
}

/* LL_SCHED_WAIT: tell cell R that it waits. */
static void s_tell_wait(const ll_sched_decision_t *d)
{
    s_run_t *run = &P.runs[d->r];
    int nslots = ll_sched_nslots(P.sched);
    ll_info("pool", "cell %s waits: all %d slots are held", run->id, nslots);
    s_send_client(s_job(d->r)->client, json_pack("{s:s, s:s, s:i, s:i}", "type", "wait", "id",
                                                 run->id, "slots", nslots, "queued", d->queued));
}

/* One pass of the schedule (ll_sched.h): its decisions, applied. */
static void s_schedule(void)
{
    ll_sched_decision_t d;
    ll_sched_begin(P.sched, ll_clock_ms(), ll_ztree_any_ready(P.tree));
    while (ll_sched_next(P.sched, &d)) {
        switch (d.op) {
        case LL_SCHED_FORK: s_fork(d.r, d.slot); break;
        case LL_SCHED_HAND: s_hand(&d); break;
        case LL_SCHED_EVICT: s_evict_for(&d); break;
        case LL_SCHED_SKIP: s_skip_prefetch(d.r, d.why); break;
        case LL_SCHED_DROP: s_drop_run(d.r); break;
        case LL_SCHED_WAIT: s_tell_wait(&d); break;
        }
    }
}

static int s_find_run(int c, const char *id)
{
    if (!id)
        return -1;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (s_used(r) && !s_idle_worker(r) && s_job(r)->client == c &&
            strcmp(P.runs[r].id, id) == 0)
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

static void s_client_error(int c, const char *id, const char *why)
{
    s_send_client(c, json_pack("{s:s, s:s?, s:s}", "type", "error", "id", id, "error", why));
}

static void s_kill_run(int r, int sig)
{
    s_run_t *run = &P.runs[r];
    if (run->worker.pid > 0 && (!run->sig.handover || sig == SIGKILL))
        kill(run->worker.pid, sig);
    else if (sig == SIGKILL || !run->sig.pending)
        run->sig.pending = sig; /* sent when the zygote reports the fork */
}

/* The worker's pid became known. */
static void s_run_pid(int r, pid_t pid)
{
    s_run_t *run = &P.runs[r];
    if (run->worker.pid)
        return;
    run->worker.pid = pid;
    ll_sched_set_worker(P.sched, r, (int) pid);
    if (run->sig.pending) {
        ll_debug("pool", "cell %s: signal %d, asked before the fork, sent to worker %d", run->id,
                 run->sig.pending, (int) pid);
        kill(pid, run->sig.pending);
    }
}

/* Stats: every worker (warm ones, staged ones holding no slot, busy ones). */
static json_t *s_stats_workers(double now)
{
    static const char *const state_names[] = {"",       "queued",    "forking", "running",
                                              "saving", "preparing", "warm",    "evicting"};
    const ll_gdsf_t *gdsf = ll_sched_gdsf(P.sched);
    json_t *workers = json_array();
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        const s_run_t *run = &P.runs[r];
        const ll_sched_job_t *j = s_job(r);
        if (!j->state || run->worker.pid <= 0 || j->state == LL_SCHED_QUEUED)
            continue;
        int key = (int) run->worker.pid;
        const char *st = j->state == LL_SCHED_WARM && j->slot < 0 ? "staged"
                         : j->state == LL_SCHED_WARM && ll_gdsf_speculative(gdsf, key, now)
                             ? "speculative"
                             : state_names[j->state];
        double l = 0;
        bool known = ll_gdsf_value(gdsf, key, &l);
        json_array_append_new(
            workers,
            json_pack("{s:s, s:i, s:i, s:s, s:o, s:f, s:i, s:b, s:i, s:f}", "session",
                      j->session ? j->session : "", "client", j->client, "pid", key, "state", st,
                      "L", known ? json_real(l) : json_null(), "bytes", j->worker.held_bytes,
                      "cells", j->worker.cells, "spec", j->worker.spec, "slot", j->slot, "idle_s",
                      j->state == LL_SCHED_WARM ? (now - j->worker.idle_since) / 1000.0 : 0.0));
    }
    return workers;
}

/* Stats: per session, its GPU-seconds against its time connected. */
static json_t *s_stats_sessions(double now)
{
    json_t *sessions = json_array();
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++) {
        const ll_sched_session_t *se = ll_sched_session(P.sched, i);
        if (!se->used)
            continue;
        double held = ll_sched_session_held(P.sched, i, now) / 1000.0;
        double conn = se->client >= 0 && P.clients[se->client].fd >= 0
                          ? (now - P.clients[se->client].connected) / 1000.0
                          : held;
        json_array_append_new(sessions,
                              json_pack("{s:s, s:i, s:f, s:f, s:f}", "session", se->name, "client",
                                        se->client, "gpu_held_s", held, "connected_s", conn,
                                        "held_share", conn > 0 ? held / conn : 0.0));
    }
    return sessions;
}

static json_t *s_stats(void)
{
    json_t *nodes = ll_ztree_nodes_json(P.tree), *slots = json_array(), *runs = json_array();
    for (int s = 0; s < ll_sched_nslots(P.sched); s++) {
        int r = ll_sched_slot_job(P.sched, s);
        json_array_append_new(slots, r >= 0 ? json_string(P.runs[r].id) : json_null());
    }
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (s_used(r) && !s_idle_worker(r))
            json_array_append_new(runs, json_pack("{s:s, s:i, s:i}", "id", P.runs[r].id, "state",
                                                  (int) s_job(r)->state, "pid",
                                                  (int) P.runs[r].worker.pid));
    double now = ll_clock_ms();
    json_t *workers = s_stats_workers(now), *sessions = s_stats_sessions(now);
    return json_pack("{s:s, s:i, s:o, s:o, s:o, s:b, s:i, s:O, s:i, s:b, s:o, s:o, s:f, s:i}",
                     "type", "stats", "pid", (int) getpid(), "nodes", nodes, "slots", slots, "runs",
                     runs, "cuda", P.cuda, "max_nodes", P.cfg.max_nodes, "safety",
                     (json_t *) ll_ztree_safety(P.tree), "base_respawns",
                     ll_ztree_base_respawns(P.tree), "base_broken", ll_ztree_broken(P.tree),
                     "workers", workers, "sessions", sessions, "clock",
                     ll_gdsf_clock(ll_sched_gdsf(P.sched)), "warm_idle_s", P.cfg.warm_idle_s);
}

/* A run or prefetch request M from client C: checked, queued. */
static void s_client_request(int c, json_t *m, const char *id, bool prefetch)
{
    const char *bad = NULL;
    if (!id || !*id)
        bad = "run: 'id' must be a non-empty string";
    else if (s_find_run(c, id) >= 0)
        bad = "run: a cell with this id is already running";
    else if (!json_is_string(json_object_get(m, "session")))
        bad = "run: 'session' must be a string";
    else if (prefetch && P.cfg.warm_idle_s <= 0)
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
        s_client_error(c, id, bad);
        return;
    }
    const char *session = json_string_value(json_object_get(m, "session"));
    int r = s_new_run(c, id, session, m, prefetch ? LL_SCHED_PREFETCH : LL_SCHED_CELL);
    if (r < 0) {
        s_client_error(c, id, "run: too many cells in flight");
        return;
    }
    ll_sched_session_open(P.sched, c, session);
    if (!json_is_array(json_object_get(m, "import_closure")))
        json_object_set_new(m, "import_closure", json_array());
    if (ll_ztree_broken(P.tree))
        s_fail_queued();
    else
        s_schedule();
}

/* Client C interrupts (or, CANCEL, cancels) its job R. */
static void s_client_interrupt(int c, int r, bool cancel)
{
    s_run_t *run = &P.runs[r];
    bool queued = s_job(r)->state == LL_SCHED_QUEUED;
    if (s_is_prefetch(r)) {
        /* Speculative work dropped: a worker forked for it goes (it
         * committed nothing); a warm one finishes restoring and stays. */
        if (queued) {
            s_send_client(c, json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", run->id,
                                       "ok", 0, "skipped", "cancelled"));
            s_drop_run(r);
        } else if (run->origin == S_ORIGIN_FORKED) {
            run->cancelled = true;
            s_kill_run(r, SIGKILL);
        }
        return;
    }
    if (queued) {
        s_reply_error(r, cancel ? "Cancelled" : "KeyboardInterrupt",
                      cancel ? "the cell was cancelled before it started"
                             : "interrupted before the cell started");
        s_drop_run(r);
    } else if (cancel) {
        run->cancelled = true;
        s_kill_run(r, SIGKILL);
    } else {
        s_kill_run(r, SIGINT);
    }
}

static void s_client_frame(int c, json_t *m)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    const char *id = json_string_value(json_object_get(m, "id"));
    if (!type) {
        s_client_error(c, id, "frame without a type");
        return;
    }
    bool prefetch = strcmp(type, "prefetch") == 0;
    if (strcmp(type, "run") == 0 || prefetch) {
        s_client_request(c, m, id, prefetch);
        return;
    }
    int r = s_find_run(c, id);
    if (r < 0 && id && strcmp(type, "cancel") == 0) {
        /* A prefetch that finished: its speculative worker (never ran a
         * cell) leaves; a worker that ran cells stays. */
        for (int w = 0; w < LL_SCHED_MAX_JOBS; w++)
            if (s_job(w)->state == LL_SCHED_WARM && s_job(w)->client == c &&
                s_job(w)->worker.spec && P.runs[w].id && strcmp(P.runs[w].id, id) == 0)
                s_release_worker(w, "its prefetch was cancelled");
        return;
    }
    if (strcmp(type, "stats") == 0) {
        s_send_client(c, s_stats());
    } else if (strcmp(type, "input_reply") == 0) {
        if (r < 0 || P.runs[r].worker.fd < 0)
            return;
        json_t *f =
            json_pack("{s:s, s:O}", "type", "input_reply", "value",
                      json_object_get(m, "value") ? json_object_get(m, "value") : json_string(""));
        ll_zframe_send(P.runs[r].worker.fd, f, -1);
        json_decref(f);
    } else if (strcmp(type, "interrupt") == 0 || strcmp(type, "cancel") == 0) {
        if (r >= 0)
            s_client_interrupt(c, r, type[0] == 'c');
    } else {
        s_client_error(c, id, "unknown frame type");
    }
}

static void s_client_gone(int c)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        const ll_sched_job_t *j = s_job(r);
        if (!j->state || j->client != c)
            continue;
        if (j->state == LL_SCHED_QUEUED) {
            s_drop_run(r);
            continue;
        }
        if (j->state == LL_SCHED_WARM) {
            s_release_worker(r, "its client left");
        } else if (j->state == LL_SCHED_SAVING) {
            /* Its save commits (a cell that ran is kept, as if the client
             * had waited), then it leaves: nobody takes it warm. */
            P.runs[r].evict_t = ll_clock_ms();
        } else if (j->state != LL_SCHED_EVICTING) {
            P.runs[r].cancelled = true;
            s_kill_run(r, SIGKILL);
        }
    }
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++)
        if (ll_sched_session(P.sched, i)->used && ll_sched_session(P.sched, i)->client == c)
            s_session_end(i);
    ll_sched_client_gone(P.sched, c);
    close(P.clients[c].fd);
    ll_zreader_destroy(&P.clients[c].rd);
    free(P.clients[c].out);
    memset(&P.clients[c], 0, sizeof P.clients[c]);
    P.clients[c].fd = -1;
    ll_info("pool", "client %d left", c);
}

/* ------------------------------------------------------------------ */
/* Frames from zygotes and workers                                    */

static void s_node_frame(int n, json_t *m)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type)
        return;
    if (strcmp(type, "ready") == 0) {
        ll_ztree_node_ready(P.tree, n, m);
        s_schedule();
    } else if (strcmp(type, "forked") == 0 || strcmp(type, "refused") == 0) {
        ll_ztree_fork_answered(P.tree, n);
        const char *rid = json_string_value(json_object_get(m, "run"));
        int client = (int) json_integer_value(json_object_get(m, "client"));
        int r = s_find_run(client, rid);
        if (r < 0)
            return;
        if (type[0] == 'f') {
            s_run_pid(r, (pid_t) json_integer_value(json_object_get(m, "pid")));
            return;
        }
        const char *why = json_string_value(json_object_get(m, "why"));
        char msg[600];
        snprintf(msg, sizeof msg, "the zygote refused to fork a worker: %s", why ? why : "?");
        ll_error("pool", "cell %s: %s", P.runs[r].id, msg);
        s_reply_error(r, "ZygoteRefused", msg);
        s_drop_run(r);
        s_schedule();
    } else if (strcmp(type, "exited") == 0) {
        s_worker_exited((pid_t) json_integer_value(json_object_get(m, "pid")),
                        (int) json_integer_value(json_object_get(m, "status")));
    }
}

/* Worker R stays warm for its session (the schedule said so): signals for
 * its last job are moot. */
static void s_warm(int r)
{
    s_run_t *run = &P.runs[r];
    run->sig.handover = false;
    run->sig.pending = 0;
    if (s_job(r)->slot >= 0)
        ll_debug("pool", "worker %d warm for session %s (%.0f bytes)", (int) run->worker.pid,
                 s_job(r)->session, s_job(r)->worker.held_bytes);
}

/* "ready" from R's worker: its job starts. */
static void s_worker_ready(int r, json_t *m)
{
    s_run_t *run = &P.runs[r];
    s_run_pid(r, (pid_t) json_integer_value(json_object_get(m, "pid")));
    if (run->sig.handover) {
        /* The warm worker dropped stale interrupts: forward new ones. */
        run->sig.handover = false;
        if (run->sig.pending && run->worker.pid > 0)
            kill(run->worker.pid, run->sig.pending);
        run->sig.pending = 0;
    }
    ll_sched_ready(P.sched, r);
    if (s_is_prefetch(r))
        return;
    json_object_set_new(m, "type", json_string("started"));
    json_object_set_new(m, "node", json_integer(run->worker.node_id));
    json_object_set_new(m, "wait_ms", json_real(run->wait_ms));
    json_object_set_new(m, "warm_hit", json_boolean(run->origin >= S_ORIGIN_WARM));
    json_object_set_new(m, "id", json_string(run->id));
    s_send_client(s_job(r)->client, json_incref(m));
}

/* "prepared" from prefetch R's worker: answered; the worker stays warm for
 * the session's coming cell, or goes. */
static void s_worker_prepared(int r, json_t *m)
{
    s_run_t *run = &P.runs[r];
    json_t *rep = json_object_get(m, "report");
    json_t *ev = json_is_object(rep) ? json_deep_copy(rep) : json_object();
    bool ok = !json_object_get(ev, "fatal");
    bool may_stay = ok && json_is_true(json_object_get(ev, "stays_warm"));
    json_t *restored = json_object_get(ev, "restored");
    bool changed = run->origin == S_ORIGIN_FORKED ||
                   (json_is_array(restored) && json_array_size(restored) > 0) ||
                   json_array_size(json_object_get(ev, "dropped_stale")) > 0;
    json_t *held = json_object_get(ev, "held_bytes");
    json_object_set_new(ev, "type", json_string("prefetched"));
    json_object_set_new(ev, "id", json_string(run->id));
    json_object_set_new(ev, "ok", json_boolean(ok));
    json_object_set_new(ev, "warm_hit", json_boolean(run->origin >= S_ORIGIN_WARM));
    json_object_set_new(ev, "staged", json_boolean(s_job(r)->slot < 0));
    json_object_set_new(ev, "zygote_node", json_integer(run->worker.node_id));
    json_object_set_new(ev, "wait_ms", json_real(run->wait_ms));
    double held_bytes = json_is_number(held) ? json_number_value(held) : -1;
    s_answer_prefetch(r, ev);
    if (ll_sched_prepared(P.sched, r, may_stay, changed, held_bytes, ll_clock_ms()))
        s_warm(r);
    else
        s_drop_run(r); /* the worker leaves by itself */
    s_schedule();
}

/* "reply" from R's worker, sent only after its save committed: the slot is
 * free, or the worker stays warm for the session's next cell. */
static void s_worker_reply(int r, json_t *m)
{
    s_run_t *run = &P.runs[r];
    json_t *md = json_object_get(m, "metadata");
    json_t *ll = md ? json_object_get(md, "looseleaf") : NULL;
    double held_bytes = -1;
    if (ll) {
        json_object_set_new(ll, "zygote_node", json_integer(run->worker.node_id));
        json_object_set_new(ll, "wait_ms", json_real(run->wait_ms));
        json_object_set_new(ll, "warm_hit", json_boolean(run->origin >= S_ORIGIN_WARM));
        json_object_set_new(ll, "staged", json_boolean(run->origin == S_ORIGIN_STAGED));
        if (json_is_number(json_object_get(ll, "held_bytes")))
            held_bytes = json_number_value(json_object_get(ll, "held_bytes"));
    }
    json_object_set_new(m, "id", json_string(run->id));
    s_send_client(s_job(r)->client, json_incref(m));
    bool may_stay = ll && json_is_true(json_object_get(ll, "stays_warm")) && !run->cancelled;
    if (ll_sched_replied(P.sched, r, may_stay, held_bytes, ll_clock_ms()))
        s_warm(r);
    else
        s_drop_run(r); /* the worker exits by itself; its zygote reaps it */
    s_schedule();
}

static void s_worker_frame(int r, json_t *m)
{
    s_run_t *run = &P.runs[r];
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type || s_idle_worker(r))
        return; /* an idle worker has nothing to say */
    if (strcmp(type, "ready") == 0) {
        s_worker_ready(r, m);
    } else if (strcmp(type, "saving") == 0) {
        ll_sched_saving(P.sched, r);
    } else if (strcmp(type, "prepared") == 0 && s_is_prefetch(r)) {
        s_worker_prepared(r, m);
    } else if (strcmp(type, "reply") == 0) {
        s_worker_reply(r, m);
    } else {
        json_object_set_new(m, "id", json_string(run->id));
        s_send_client(s_job(r)->client, json_incref(m));
    }
}

/* ------------------------------------------------------------------ */
/* Start-up and the loop                                              */

/* Warm workers unused for --warm-idle leave; an evicted one that does not
 * leave in time is killed (its save committed), and so is one still saving
 * S_SAVE_GRACE_MS after its client left.  Returns TIMEOUT, or the ms until
 * the next of these deadlines when sooner. */
static int s_worker_timers(double now, int timeout)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        s_run_t *run = &P.runs[r];
        const ll_sched_job_t *j = s_job(r);
        double left = -1;
        if (j->state == LL_SCHED_WARM) {
            left = j->worker.idle_since + P.cfg.warm_idle_s * 1000.0 - now;
            if (left <= 0) {
                s_release_worker(r, "idle timeout");
                left = S_EXIT_GRACE_MS;
            }
        } else if (j->state == LL_SCHED_SAVING && j->client < 0) {
            left = run->evict_t + S_SAVE_GRACE_MS - now;
            if (left <= 0) {
                ll_warn("pool", "worker %d still saving %.0f s after its client left: killed",
                        (int) run->worker.pid, S_SAVE_GRACE_MS / 1000);
                run->cancelled = true;
                kill(run->worker.pid, SIGKILL);
                run->evict_t = now; /* its exit ends the entry; until then, once per grace */
                left = S_SAVE_GRACE_MS;
            }
        } else if (j->state == LL_SCHED_EVICTING) {
            left = run->evict_t + S_EXIT_GRACE_MS - now;
            if (left <= 0 && run->worker.pid > 0 && !run->worker.exited) {
                ll_warn("pool", "warm worker %d did not exit: killed", (int) run->worker.pid);
                kill(run->worker.pid, SIGKILL);
                run->evict_t = now;
                left = S_EXIT_GRACE_MS;
            }
        }
        if (left >= 0 && (timeout < 0 || (int) left + 1 < timeout))
            timeout = (int) left + 1;
    }
    return timeout;
}

static int s_prepare_dir(void)
{
    if (mkdir(P.cfg.dir, 0700) < 0 && errno != EEXIST) {
        ll_error("pool", "cannot create %s: %s", P.cfg.dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(P.cfg.dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
        (st.st_mode & 077)) {
        ll_error("pool", "%s must be a directory owned by uid %d with mode 0700", P.cfg.dir,
                 (int) getuid());
        return -1;
    }
    return 0;
}

static int s_listen(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(P.sock) >= sizeof sa.sun_path) {
        ll_error("pool", "socket path too long: %s", P.sock);
        return -1;
    }
    strcpy(sa.sun_path, P.sock);
    unlink(P.sock); /* stale: we hold the lock, so no pool listens there */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(fd, 64) < 0) {
        ll_error("pool", "cannot listen on %s: %s", P.sock, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    chmod(P.sock, 0600);
    return fd;
}

int ll_hostpool_main(int argc, char **argv)
{
    ll_log_init('P');
    memset(&P, 0, sizeof P);
    ll_hostpool_config_defaults(&P.cfg);
    ll_zclient_default_dir(P.cfg.dir, sizeof P.cfg.dir);
    ll_hostpool_config_env(&P.cfg, getenv);
    char err[1024];
    if (ll_hostpool_config_args(&P.cfg, argc, argv, err, sizeof err) < 0) {
        fputs(err, stderr);
        return 2;
    }
    int nslots = P.cfg.nslots, max_staged = P.cfg.max_staged;
    bool foreground = P.cfg.foreground;
    const char *log = P.cfg.log[0] ? P.cfg.log : NULL;
    if (ll_zframe_self_exe(P.exe, sizeof P.exe, P.exe_name, sizeof P.exe_name) < 0) {
        fprintf(stderr, "looseleaf pool: cannot find its own binary: %s\n", strerror(errno));
        return 1;
    }
    if (s_prepare_dir() < 0)
        return 1;
    char lockpath[PATH_MAX + 16];
    snprintf(lockpath, sizeof lockpath, "%s/pool.lock", P.cfg.dir);
    snprintf(P.sock, sizeof P.sock, "%s/pool.sock", P.cfg.dir);
    if (!foreground) {
        /* Detach: the client that started us must not be our parent (it
         * would have to reap us) nor share our output pipes. */
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid > 0)
            return 0;
        setsid();
        /* Descriptors the starting process leaked (not close-on-exec) would
         * live on in every zygote and fail its pre-fork check. */
        close_range(3, ~0U, 0);
        char logpath[PATH_MAX + 16];
        snprintf(logpath, sizeof logpath, "%s/pool.log", P.cfg.dir);
        int lfd = open(log ? log : logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        int nfd = open("/dev/null", O_RDONLY);
        if (nfd >= 0) {
            dup2(nfd, 0);
            close(nfd);
        }
        if (lfd >= 0) {
            dup2(lfd, 1);
            dup2(lfd, 2);
            close(lfd);
        }
        ll_log_init('P');
    }
    int lock = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB) < 0) {
        ll_info("pool", "another pool already serves %s", P.cfg.dir);
        return 0;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    P.sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    P.listen_fd = s_listen();
    if (P.listen_fd < 0 || P.sig_fd < 0)
        return 1;
    int ncuda = P.cfg.no_cuda ? 0 : s_count_cuda();
    if (ncuda > 0) {
        P.cuda = true;
        nslots = ncuda < LL_SCHED_MAX_SLOTS ? ncuda : LL_SCHED_MAX_SLOTS;
    }
    /* Staged workers (a prefetch finding no slot prepares one without):
     * twice as many as slots unless set.  Without a GPU there is no device
     * memory, so they restore everything; on CUDA hosts (or when tests ask,
     * LL_POOL_STAGED_DEFER=1) only imports and the state's restore waits for
     * the slot: variables may hold device tensors. */
    if (max_staged < 0)
        max_staged = 2 * nslots;
    P.staged_defer = P.cuda || P.cfg.staged_defer;
    P.sched = ll_sched_new(nslots, max_staged, P.cfg.spec_s * 1000.0, P.cfg.warm_idle_s > 0);
    if (!P.sched)
        return 1;
    for (int c = 0; c < S_MAX_CLIENTS; c++)
        P.clients[c].fd = -1;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        P.runs[r].worker.fd = -1;
        P.runs[r].worker.node = -1;
    }
    ll_info("pool", "serving %s: %d %s slot(s), up to %d zygote nodes, idle exit %d s", P.cfg.dir,
            nslots, P.cuda ? "CUDA" : "virtual", P.cfg.max_nodes, P.cfg.idle_exit_s);
    P.tree =
        ll_ztree_new(P.exe, P.exe_name, P.cfg.head, P.cfg.max_nodes, P.cfg.grow, s_node_lost, NULL);
    if (!P.tree || ll_ztree_spawn_base(P.tree) < 0) {
        ll_error("pool", "cannot start the base zygote: %s", strerror(errno));
        return 1;
    }
    P.idle_since = ll_clock_ms();

    enum { K_LISTEN, K_SIG, K_CLIENT, K_NODE, K_WORKER, K_PROBE };
    struct pollfd
        pfd[2 + S_MAX_CLIENTS + LL_ZTREE_MAX_NODES + LL_SCHED_MAX_JOBS + LL_ZTREE_MAX_PROBES];
    int kind[sizeof pfd / sizeof pfd[0]], idx[sizeof pfd / sizeof pfd[0]];
    while (!P.stop) {
        int np = 0;
        pfd[np] = (struct pollfd){P.listen_fd, POLLIN, 0}, kind[np] = K_LISTEN, idx[np++] = 0;
        pfd[np] = (struct pollfd){P.sig_fd, POLLIN, 0}, kind[np] = K_SIG, idx[np++] = 0;
        int nclients = 0;
        for (int c = 0; c < S_MAX_CLIENTS; c++)
            if (P.clients[c].fd >= 0) {
                nclients++;
                pfd[np] = (struct pollfd){P.clients[c].fd,
                                          (short) (POLLIN | (P.clients[c].olen ? POLLOUT : 0)), 0},
                kind[np] = K_CLIENT, idx[np++] = c;
            }
        for (int n = 0; n < LL_ZTREE_MAX_NODES; n++)
            if (ll_ztree_node_fd(P.tree, n) >= 0)
                pfd[np] = (struct pollfd){ll_ztree_node_fd(P.tree, n), POLLIN, 0},
                kind[np] = K_NODE, idx[np++] = n;
        int nruns = 0;
        for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
            if (s_used(r)) {
                nruns++;
                if (P.runs[r].worker.fd >= 0 && !P.runs[r].worker.eof)
                    pfd[np] = (struct pollfd){P.runs[r].worker.fd, POLLIN, 0}, kind[np] = K_WORKER,
                    idx[np++] = r;
            }
        for (int i = 0; i < LL_ZTREE_MAX_PROBES; i++)
            if (ll_ztree_probe_fd(P.tree, i) >= 0)
                pfd[np] = (struct pollfd){ll_ztree_probe_fd(P.tree, i), POLLIN, 0},
                kind[np] = K_PROBE, idx[np++] = i;

        double now = ll_clock_ms();
        if (nclients || nruns)
            P.idle_since = 0;
        else if (!P.idle_since)
            P.idle_since = now;
        int timeout = ll_ztree_timeout(P.tree, now);
        timeout = s_worker_timers(now, timeout);
        if (P.idle_since) {
            double left = P.idle_since + P.cfg.idle_exit_s * 1000.0 - now;
            if (left <= 0) {
                ll_info("pool", "no client for %d s: exiting", P.cfg.idle_exit_s);
                break;
            }
            timeout = timeout < 0 || (int) left + 1 < timeout ? (int) left + 1 : timeout;
        }
        int rc = poll(pfd, (nfds_t) np, timeout);
        if (rc < 0 && errno != EINTR)
            break;
        for (int i = 0; i < np && rc > 0; i++) {
            if (!pfd[i].revents)
                continue;
            int k = idx[i];
            switch (kind[i]) {
            case K_LISTEN: {
                int fd;
                while ((fd = accept4(P.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
                    int c = -1;
                    for (int j = 0; j < S_MAX_CLIENTS; j++)
                        if (P.clients[j].fd < 0) {
                            c = j;
                            break;
                        }
                    if (c < 0) {
                        close(fd);
                        continue;
                    }
                    /* The dir is 0700; still, only our own uid may use the pool. */
                    struct ucred cred;
                    socklen_t cl = sizeof cred;
                    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0 ||
                        cred.uid != getuid()) {
                        ll_warn("pool", "refusing a client of another uid");
                        close(fd);
                        continue;
                    }
                    memset(&P.clients[c], 0, sizeof P.clients[c]);
                    P.clients[c].fd = fd;
                    P.clients[c].rd = ll_zreader_new(fd);
                    P.clients[c].connected = ll_clock_ms();
                    ll_info("pool", "client %d connected", c);
                }
                break;
            }
            case K_SIG: {
                struct signalfd_siginfo si;
                while (read(P.sig_fd, &si, sizeof si) == sizeof si)
                    if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
                        P.stop = true;
                int status;
                pid_t pid;
                while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
                    bool known = ll_ztree_reaped(P.tree, pid, status);
                    if (!known)
                        s_worker_exited(pid, status); /* orphaned worker, or a node (ignored) */
                }
                break;
            }
            case K_CLIENT: {
                if (P.clients[k].fd != pfd[i].fd)
                    break;
                if (pfd[i].revents & POLLOUT)
                    s_client_flush(k);
                if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                    break;
                int fr = ll_zreader_fill(P.clients[k].rd);
                json_t *m;
                bool bad = false;
                while ((m = ll_zreader_pop(P.clients[k].rd, &bad))) {
                    s_client_frame(k, m);
                    json_decref(m);
                }
                if (bad)
                    ll_warn("pool", "client %d sent a malformed frame: dropped", k);
                if (fr < 0 || bad)
                    s_client_gone(k);
                break;
            }
            case K_NODE: {
                if (ll_ztree_node_fd(P.tree, k) != pfd[i].fd)
                    break;
                int fr = ll_zreader_fill(ll_ztree_node_reader(P.tree, k));
                json_t *m;
                bool bad = false;
                while (ll_ztree_node_fd(P.tree, k) == pfd[i].fd &&
                       (m = ll_zreader_pop(ll_ztree_node_reader(P.tree, k), &bad))) {
                    s_node_frame(k, m);
                    json_decref(m);
                }
                if (ll_ztree_node_fd(P.tree, k) == pfd[i].fd && (fr < 0 || bad) &&
                    ll_ztree_node_gone(P.tree, k, bad ? "malformed frame" : "its socket closed",
                                       !P.stop) < 0)
                    s_fail_queued();
                break;
            }
            case K_WORKER: {
                /* A frame may end the entry, or hand its worker to another
                 * (then the fd moved): stop reading it here. */
                s_run_t *run = &P.runs[k];
                if (!s_used(k) || run->worker.fd != pfd[i].fd)
                    break;
                int fr = ll_zreader_fill(run->worker.rd);
                json_t *m;
                bool bad = false;
                while (s_used(k) && run->worker.fd == pfd[i].fd &&
                       (m = ll_zreader_pop(run->worker.rd, &bad))) {
                    s_worker_frame(k, m);
                    json_decref(m);
                }
                if (s_used(k) && run->worker.fd == pfd[i].fd && (fr < 0 || bad)) {
                    run->worker.eof = true;
                    ll_sched_lost(P.sched, k);
                    if (run->worker.exited)
                        s_finish_dead(k);
                }
                break;
            }
            case K_PROBE: {
                ll_ztree_probe_input(P.tree, k);
                break;
            }
            }
        }
        s_schedule();
        for (int c = 0; c < S_MAX_CLIENTS; c++)
            if (P.clients[c].fd >= 0 && P.clients[c].dead)
                s_client_gone(c);
    }
    ll_info("pool", "stopping");
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++)
        if (ll_sched_session(P.sched, i)->used)
            s_session_end(i);
    ll_ztree_stop(P.tree);
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (s_used(r))
            s_kill_run(r, SIGKILL);
    unlink(P.sock);
    return 0;
}
