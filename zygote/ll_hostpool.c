/* ll_hostpool: the host pool (`looseleaf pool`), one process per runtime dir
 * (per uid), shared by every kernel on the host.
 *
 * Runs single-threaded: one poll loop over the listening socket, the clients,
 * the zygote nodes, the workers, the CUDA-safety probes and a signalfd for
 * SIGCHLD.  It never forks a Python process: zygotes are started by exec,
 * workers and child nodes are forked by zygotes.  It is a child subreaper,
 * so a worker whose zygote died is reaped here and its fate still reported.
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
#include "zygote/ll_gdsf.h"
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
#define S_MAX_RUNS      512
#define S_MAX_SLOTS     LL_HOSTPOOL_MAX_SLOTS
#define S_MAX_SESSIONS  512
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

/* A session of a client: its GPU-seconds (slot-held time) against the time
 * it was connected, for stats and the line logged when it ends. */
typedef struct {
    bool used;      /* entry in use */
    int client;     /* its client */
    char *name;     /* the run requests' "session" */
    double held_ms; /* slot-held time of holdings that ended */
    int pf_credit;  /* prefetch evictions it may make (0 or 1): s_prefetch_evicts */
} s_sess_t;

/* A run entry is a cell (or prefetch) and, once forked, its worker; a warm
 * worker keeps its entry after the cell (S_WARM) and hands it to the next
 * cell of its session.  Only S_WARM workers are evictable. */
enum {
    S_QUEUED = 1, /* waits for a slot (or a warm worker busy preparing) */
    S_FORKING,    /* forked (or handed to a warm worker), not yet ready */
    S_RUNNING,    /* the cell runs */
    S_SAVING,     /* the cell ran; its save has not committed */
    S_PREPARING,  /* a prefetch: restoring and importing, no cell */
    S_WARM,       /* idle, its save committed: waits for its session's next job */
    S_EVICTING    /* told to exit; holds its slot until it is gone */
};

typedef struct {
    bool used;         /* entry in use */
    int client;        /* index of the client that asked */
    char *id;          /* the client's id for the cell */
    json_t *req;       /* the run request */
    int state;         /* S_QUEUED / S_FORKING / S_RUNNING */
    int slot;          /* held slot, -1 while queued */
    int node;          /* node index it was forked from */
    int node_id;       /* that node's id (for the report) */
    int wfd;           /* socket to the worker */
    ll_zreader_t *wrd; /* frames from the worker */
    pid_t wpid;        /* worker pid, 0 until ready/forked */
    bool eof;          /* worker socket closed */
    bool exited;       /* exit status known */
    int status;        /* waitpid status */
    bool cancelled;    /* killed on request (cancel, client gone) */
    int pending_sig;   /* signal asked for before the worker's pid was known */
    bool waited;       /* a wait event was sent */
    double t_queued;   /* ms, when the request arrived */
    double wait_ms;    /* time spent waiting for a slot */
    char *session;     /* the request's session */
    bool prefetch;     /* a prefetch request: prepare, run nothing */
    bool handover;     /* handed to a warm worker that has not said ready: interrupts wait */
    bool warm_hit;     /* this job runs on a warm worker */
    bool staged_hit;   /* ... one a prefetch prepared without a slot (staged) */
    bool fresh;        /* its worker was forked for this job */
    bool evicted_for;  /* a prefetch that evicted a warm worker: waits for that slot */
    bool restage; /* a prefetch the pool made itself (s_restage): staged only, answered to nobody */
    bool spec;    /* the worker never ran a cell (a prefetch prepared it) */
    int cells;    /* cells the worker ran */
    double held_bytes; /* bytes of state the worker holds (its last report) */
    double slot_t0;    /* ms, when it took its slot */
    double idle_since; /* ms, when it became warm (idle timeout) */
    double evict_t;    /* ms, when it was told to exit */
} s_run_t;

static struct {
    ll_hostpool_config_t cfg; /* what the pool was told (read once at its start) */
    char sock[PATH_MAX + 16]; /* listening socket path */
    char exe[PATH_MAX]; /* our binary (/proc/self/exe: it survives a rebuild), exec'd as `zygote` */
    char exe_name[PATH_MAX]; /* its name, for the zygotes' argv[0] */
    int listen_fd;
    int sig_fd;
    int nslots;        /* slots: CUDA devices when found, else cfg.nslots virtual ones */
    bool cuda;         /* slots are CUDA devices */
    int max_staged;    /* workers a prefetch may prepare without a slot (staged), all sessions */
    bool staged_defer; /* staged workers leave the state's restore to the cell's run (CUDA hosts) */
    ll_gdsf_t *gdsf;   /* eviction order of warm workers, keyed by pid */
    s_sess_t sessions[S_MAX_SESSIONS];
    int slot_run[S_MAX_SLOTS]; /* run index holding each slot, -1 free */
    s_client_t clients[S_MAX_CLIENTS];
    ll_ztree_t *tree; /* the zygote nodes and the CUDA-safety probes */
    s_run_t runs[S_MAX_RUNS];
    double idle_since; /* ms, 0 while busy */
    bool stop;
} P;

static void s_drop_run(int r);
static void s_schedule(void);
static void s_release_slot(int r);
static void s_restage(int v);

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

/* Answer M ("prefetched") to the client of prefetch R; a restaged one
 * (s_restage) was asked by nobody. */
static void s_answer_prefetch(int r, json_t *m)
{
    if (P.runs[r].restage)
        json_decref(m);
    else
        s_send_client(P.runs[r].client, m);
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
    if (run->prefetch) {
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
    json_t *ll = json_pack("{s:s, s:i, s:i, s:f}", "route", "gpu", "worker_pid", (int) run->wpid,
                           "zygote_node", run->node_id, "wait_ms", run->wait_ms);
    json_t *md = json_pack("{s:s, s:o}", "status", "error", "looseleaf", ll);
    s_send_client(run->client, json_pack("{s:s, s:s, s:o, s:o}", "type", "reply", "id", run->id,
                                         "content", content, "metadata", md));
}

/* ------------------------------------------------------------------ */
/* Nodes                                                              */

/* Every queued cell gets an error reply (no zygote will fork it). */
static void s_fail_queued(void)
{
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && P.runs[r].state == S_QUEUED) {
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
    for (int r = 0; r < S_MAX_RUNS; r++) {
        s_run_t *run = &P.runs[r];
        if (run->used && run->state == S_FORKING && run->node == n && run->wpid == 0) {
            s_reply_error(r, "ZygoteDied",
                          "the zygote died before the worker started; run the cell again");
            s_drop_run(r);
        }
    }
}

/* ------------------------------------------------------------------ */
/* Runs                                                               */

/* ------------------------------------------------------------------ */
/* Sessions: GPU-seconds held against a pinned session                */

static int s_session(int c, const char *name, bool create)
{
    int free_i = -1;
    for (int i = 0; i < S_MAX_SESSIONS; i++) {
        s_sess_t *se = &P.sessions[i];
        if (se->used && se->client == c && name && strcmp(se->name, name) == 0)
            return i;
        if (!se->used && free_i < 0)
            free_i = i;
    }
    if (!create || free_i < 0 || c < 0 || !name)
        return -1;
    s_sess_t *se = &P.sessions[free_i];
    se->used = true;
    se->client = c;
    se->name = strdup(name);
    se->held_ms = 0;
    se->pf_credit = 1; /* its first prefetch may take a slot: the user is about to run it */
    if (!se->name) {
        se->used = false;
        return -1;
    }
    return free_i;
}

/* Slot-held ms of session I, the holdings still running included. */
static double s_session_held(int i, double now)
{
    s_sess_t *se = &P.sessions[i];
    double held = se->held_ms;
    for (int r = 0; r < S_MAX_RUNS; r++) {
        s_run_t *run = &P.runs[r];
        if (run->used && run->slot >= 0 && run->client == se->client && run->session &&
            strcmp(run->session, se->name) == 0)
            held += now - run->slot_t0;
    }
    return held;
}

static void s_take_slot(int r, int slot)
{
    P.slot_run[slot] = r;
    P.runs[r].slot = slot;
    P.runs[r].slot_t0 = ll_clock_ms();
}

static void s_release_slot(int r)
{
    s_run_t *run = &P.runs[r];
    if (run->slot < 0)
        return;
    int i = s_session(run->client, run->session, false);
    if (i >= 0)
        P.sessions[i].held_ms += ll_clock_ms() - run->slot_t0;
    P.slot_run[run->slot] = -1;
    run->slot = -1;
}

/* The client of session I left: one line on the pool log, then forget it. */
static void s_session_end(int i)
{
    s_sess_t *se = &P.sessions[i];
    double now = ll_clock_ms();
    double held = s_session_held(i, now) / 1000.0;
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
    free(se->name);
    memset(se, 0, sizeof *se);
}

static void s_drop_run(int r)
{
    s_run_t *run = &P.runs[r];
    s_release_slot(r);
    if (run->wpid > 0)
        ll_gdsf_remove(P.gdsf, (int) run->wpid);
    if (run->wfd >= 0)
        close(run->wfd);
    ll_zreader_destroy(&run->wrd);
    free(run->id);
    free(run->session);
    json_decref(run->req);
    memset(run, 0, sizeof *run);
    run->wfd = -1;
    run->slot = -1;
}

static bool s_idle_worker(const s_run_t *run)
{
    return run->used && (run->state == S_WARM || run->state == S_EVICTING);
}

/* A worker whose socket closed and whose exit status is known, without a
 * reply: tell the client how it died. */
static void s_finish_dead(int r)
{
    s_run_t *run = &P.runs[r];
    char why[512];
    if (run->handover && !run->cancelled) {
        /* A warm worker that died before it took this job (it says ready
         * before anything runs): nothing ran, so the job is queued again
         * and gets a fresh worker, as if the pool had seen the death first. */
        ll_warn("pool", "%s %s: warm worker %d was gone before it took the job: forking anew",
                run->prefetch ? "prefetch" : "cell", run->id, (int) run->wpid);
        s_release_slot(r);
        ll_gdsf_remove(P.gdsf, (int) run->wpid);
        close(run->wfd);
        run->wfd = -1;
        ll_zreader_destroy(&run->wrd);
        run->wpid = 0;
        run->eof = run->exited = false;
        run->status = 0;
        run->handover = run->warm_hit = false;
        run->cells = 0;
        run->held_bytes = 0;
        run->state = S_QUEUED;
        s_schedule();
        return;
    }
    if (s_idle_worker(run)) {
        /* A warm worker gone: its last save committed, nothing is lost. */
        if (run->state == S_WARM)
            ll_warn(
                "pool",
                "warm worker %d of session %s died (status %d): the session's next cell forks anew",
                (int) run->wpid, run->session ? run->session : "?", run->status);
        s_drop_run(r);
        s_schedule();
        return;
    }
    if (run->prefetch) {
        snprintf(why, sizeof why, "the worker (pid %d) preparing the prefetch %s ended (%s %d)",
                 (int) run->wpid, run->cancelled ? "was cancelled" : "died",
                 WIFSIGNALED(run->status) ? "signal" : "status",
                 WIFSIGNALED(run->status) ? WTERMSIG(run->status) : WEXITSTATUS(run->status));
        ll_info("pool", "%s", why);
        s_answer_prefetch(r, json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", run->id,
                                       "ok", 0, "error", why));
        s_drop_run(r);
        s_schedule();
        return;
    }
    if (run->cancelled)
        snprintf(why, sizeof why, "the cell was cancelled (worker pid %d killed)", (int) run->wpid);
    else if (WIFSIGNALED(run->status))
        snprintf(why, sizeof why,
                 "the worker (pid %d) running this cell was killed by signal SIG%s (%d); the "
                 "session continues "
                 "from the last committed versions of its variables",
                 (int) run->wpid, s_signame(WTERMSIG(run->status)), WTERMSIG(run->status));
    else
        snprintf(why, sizeof why,
                 "the worker (pid %d) running this cell exited with status %d before replying; the "
                 "session "
                 "continues from the last committed versions of its variables",
                 (int) run->wpid, WIFEXITED(run->status) ? WEXITSTATUS(run->status) : -1);
    ll_warn("pool", "cell %s: %s", run->id, why);
    s_reply_error(r, run->cancelled ? "Cancelled" : "WorkerDied", why);
    s_drop_run(r);
    s_schedule();
}

static void s_worker_exited(pid_t pid, int status)
{
    for (int r = 0; r < S_MAX_RUNS; r++) {
        s_run_t *run = &P.runs[r];
        if (run->used && run->wpid == pid && !run->exited) {
            run->exited = true;
            run->status = status;
            if (run->eof)
                s_finish_dead(r);
            return;
        }
    }
}

static void s_start_run(int r, int slot)
{
    s_run_t *run = &P.runs[r];
    int n = ll_ztree_best(P.tree, json_object_get(run->req, "import_closure"));
    if (n < 0)
        return; /* no node ready yet: stays queued */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return;
    run->wait_ms = ll_clock_ms() - run->t_queued;
    json_t *job = json_deep_copy(run->req);
    json_object_set_new(job, "device", P.cuda && slot >= 0 ? json_integer(slot) : json_null());
    json_object_set_new(job, "slot", json_integer(slot));
    json_object_set_new(job, "client", json_integer(run->client));
    json_object_set_new(job, "wait_ms", json_real(run->wait_ms));
    /* Staged without a GPU: where variables may live on the device, their
     * restore waits for the slot (the cell's run restores them). */
    json_object_set_new(job, "defer_restore", json_boolean(slot < 0 && P.staged_defer));
    json_object_set_new(job, "keep_warm", json_boolean(P.cfg.warm_idle_s > 0));
    json_object_set_new(job, "prefetch", json_boolean(run->prefetch));
    int rc = ll_ztree_fork(P.tree, n, job, sv[1]);
    json_decref(job);
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        return;
    }
    s_nonblock(sv[0]);
    run->wfd = sv[0];
    run->wrd = ll_zreader_new(sv[0]);
    run->state = S_FORKING;
    run->fresh = true;
    run->spec = true;
    run->node = n;
    run->node_id = ll_ztree_node_id(P.tree, n);
    if (slot >= 0)
        s_take_slot(r, slot);
    if (slot >= 0)
        ll_info("pool", "cell %s: fork from node %d on slot %d", run->id, run->node_id, slot);
    else
        ll_info("pool", "prefetch %s: fork from node %d, staged (no slot)", run->id, run->node_id);
    ll_ztree_consider_growth(P.tree, n, json_object_get(run->req, "import_closure"));
}

/* The session's warm worker for queued run R (idle, same client and session),
 * else -1.  *BUSY is set when the session has a worker preparing a prefetch
 * (the run waits for it rather than forking another), *RUNNING when one runs
 * or saves a cell. */
static int s_warm_for(int r, bool *busy, bool *running)
{
    s_run_t *run = &P.runs[r];
    int best = -1;
    *busy = *running = false;
    for (int w = 0; w < S_MAX_RUNS; w++) {
        s_run_t *wk = &P.runs[w];
        if (w == r || !wk->used || wk->client != run->client || !wk->session ||
            strcmp(wk->session, run->session) != 0)
            continue;
        if (wk->state == S_WARM && !wk->eof && !wk->exited) {
            /* Several (cells that overlapped): the one that changed last. */
            if (best < 0 || wk->idle_since > P.runs[best].idle_since)
                best = w;
        } else if (wk->state == S_PREPARING || (wk->prefetch && wk->state == S_FORKING)) {
            *busy = true;
        } else if (wk->state == S_FORKING || wk->state == S_RUNNING || wk->state == S_SAVING) {
            *running = true;
        }
    }
    return best;
}

/* Run queued R on warm worker W: the worker (socket, pid, slot) moves to R's
 * entry, W's entry goes.  Interrupts for R are held until the worker says
 * ready (it drops any stale one first). */
static void s_start_warm(int r, int w)
{
    s_run_t *run = &P.runs[r], *wk = &P.runs[w];
    run->wfd = wk->wfd;
    run->wrd = wk->wrd;
    run->wpid = wk->wpid;
    run->node = wk->node;
    run->node_id = wk->node_id;
    run->spec = wk->spec;
    run->cells = wk->cells;
    run->held_bytes = wk->held_bytes;
    run->slot = wk->slot;
    run->slot_t0 = wk->slot_t0;
    if (run->slot >= 0)
        P.slot_run[run->slot] = r;
    wk->wfd = -1;
    wk->wrd = NULL;
    wk->wpid = 0;
    wk->slot = -1;
    s_drop_run(w);
    run->wait_ms = ll_clock_ms() - run->t_queued;
    run->state = run->prefetch ? S_PREPARING : S_FORKING;
    run->handover = true;
    run->warm_hit = true;
    ll_gdsf_set_idle(P.gdsf, (int) run->wpid, false);
    json_t *job = json_deep_copy(run->req);
    json_object_set_new(job, "device",
                        P.cuda && run->slot >= 0 ? json_integer(run->slot) : json_null());
    json_object_set_new(job, "slot", json_integer(run->slot));
    json_object_set_new(job, "client", json_integer(run->client));
    json_object_set_new(job, "node", json_integer(run->node_id));
    json_object_set_new(job, "wait_ms", json_real(run->wait_ms));
    json_object_set_new(job, "keep_warm", json_boolean(P.cfg.warm_idle_s > 0));
    json_t *m = json_pack("{s:s, s:o}", "type", run->prefetch ? "prefetch" : "run", "job", job);
    if (ll_zframe_send(run->wfd, m, -1) < 0) {
        /* It is dying: its exit reports the cell as lost (WorkerDied). */
        ll_warn("pool", "cell %s: warm worker %d unreachable: %s", run->id, (int) run->wpid,
                strerror(errno));
        kill(run->wpid, SIGKILL);
    }
    json_decref(m);
    ll_info("pool", "%s %s: warm worker %d on slot %d", run->prefetch ? "prefetch" : "cell",
            run->id, (int) run->wpid, run->slot);
}

/* Let warm worker R go: it keeps its slot until it is gone.  PRESSURE:
 * evicted for a slot (GreedyDual's clock advances to its L; killed; its
 * session prepared again, staged: s_restage), else told to exit. */
static void s_evict_worker(int r, const char *why, bool pressure)
{
    s_run_t *run = &P.runs[r];
    double l = 0;
    ll_gdsf_value(P.gdsf, (int) run->wpid, &l);
    if (pressure)
        ll_gdsf_evict(P.gdsf, (int) run->wpid);
    else
        ll_gdsf_remove(P.gdsf, (int) run->wpid);
    ll_info(
        "pool",
        "warm worker %d of session %s leaves (%s; L %.0f, %.0f bytes held, %d cells, clock %.0f)",
        (int) run->wpid, run->session ? run->session : "?", why, l, run->held_bytes, run->cells,
        ll_gdsf_clock(P.gdsf));
    /* Its save committed: killing it loses nothing (the store drops a dead
     * reader's leases).  Under pressure a cell or a prefetch waits for the
     * slot, so it goes at once instead of unwinding Python; otherwise it is
     * asked to exit. */
    bool asked = false;
    if (!pressure && run->wfd >= 0) {
        json_t *m = json_pack("{s:s}", "type", "exit");
        asked = ll_zframe_send(run->wfd, m, -1) == 0;
        json_decref(m);
    }
    if (!asked)
        kill(run->wpid, SIGKILL);
    run->state = S_EVICTING;
    run->evict_t = ll_clock_ms();
    if (pressure)
        s_restage(r); /* its session keeps a prepared worker, without a slot */
}

/* Prefetch R finds every slot held: evict the GreedyDual victim among idle
 * warm workers (completed before speculative, smallest L), never one that
 * is speculative (prepared by a prefetch for its session's coming cell,
 * ll_gdsf.h: a cell may take it, a prefetch not), when either
 * - the victim's L is below the L the prefetched worker would get (the clock
 *   now plus the bytes of its closure, `closure_bytes` when the request
 *   gives them, else 0): state that went unused since the clock passed it;
 * - or the session holds a prefetch credit.  A session starts with one
 *   credit, spends it here and earns it back by running a cell: an honest
 *   user edits and then runs what was prefetched, so each of its prefetches
 *   may take a slot from state left idle, as its cell would at Run, but
 *   within the edit time.  A client that only prefetches gets one slot this
 *   way, then none until it runs a cell.
 * Repeated prefetches of an unchanged closure do not renew H either, so they
 * cannot keep evicting sessions whose state changed since.  Returns whether
 * it evicted. */
static bool s_prefetch_evicts(int r, double now)
{
    s_run_t *run = &P.runs[r];
    int victim = ll_gdsf_victim(P.gdsf, now);
    double l = 0, est = json_number_value(json_object_get(run->req, "closure_bytes"));
    if (victim < 0 || !ll_gdsf_value(P.gdsf, victim, &l) ||
        ll_gdsf_speculative(P.gdsf, victim, now))
        return false; /* every idle worker is prepared for its session's coming cell */
    bool older = l < ll_gdsf_clock(P.gdsf) + (est > 0 ? est : 0);
    int si = s_session(run->client, run->session, false);
    bool credit = si >= 0 && P.sessions[si].pf_credit > 0;
    if (!older && !credit)
        return false;
    for (int v = 0; v < S_MAX_RUNS; v++)
        if (P.runs[v].used && P.runs[v].state == S_WARM && P.runs[v].wpid == victim) {
            char why[200];
            snprintf(why, sizeof why, "slot pressure: prefetch %.80s of session %.40s%s", run->id,
                     run->session, older ? "" : " (its credit)");
            if (!older)
                P.sessions[si].pf_credit--;
            s_evict_worker(v, why, true);
            return true;
        }
    return false;
}

/* Queued R is a prefetch, or waits for a slot: whether it may take a free
 * slot now.  A prefetch never waits and never evicts: it takes a free slot
 * only when no cell is waiting for one. */
static bool s_cells_waiting(void)
{
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && P.runs[r].state == S_QUEUED && !P.runs[r].prefetch)
            return true;
    return false;
}

static int s_free_slot(void)
{
    for (int s2 = 0; s2 < P.nslots; s2++)
        if (P.slot_run[s2] < 0)
            return s2;
    return -1;
}

/* A new queued entry for client C's request REQ (ID, SESSION; the entry
 * takes its own reference), or -1 when the table is full (or memory). */
static int s_new_run(int c, const char *id, const char *session, json_t *req, bool prefetch)
{
    int r = -1;
    for (int i = 0; i < S_MAX_RUNS && r < 0; i++)
        if (!P.runs[i].used)
            r = i;
    if (r < 0)
        return -1;
    s_run_t *run = &P.runs[r];
    memset(run, 0, sizeof *run);
    run->used = true;
    run->client = c;
    run->id = strdup(id);
    run->session = strdup(session);
    run->prefetch = prefetch;
    run->req = json_incref(req);
    run->state = S_QUEUED;
    run->slot = -1;
    run->wfd = -1;
    run->node = -1;
    run->t_queued = ll_clock_ms();
    if (!run->id || !run->session) {
        s_drop_run(r);
        return -1;
    }
    return r;
}

/* Workers prepared, or being prepared, without a slot (staged). */
static int s_staged_count(void)
{
    int n = 0;
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && P.runs[r].wfd >= 0 && P.runs[r].slot < 0 &&
            (P.runs[r].state == S_FORKING || P.runs[r].state == S_PREPARING ||
             P.runs[r].state == S_WARM))
            n++;
    return n;
}

/* Whether a cell of R's client and session, sent before R, is queued (it
 * superseded R; a cell sent after R waits for R's preparation instead). */
static bool s_session_cell_queued(int r)
{
    for (int q = 0; q < S_MAX_RUNS; q++) {
        s_run_t *c = &P.runs[q];
        if (q != r && c->used && c->state == S_QUEUED && !c->prefetch &&
            c->client == P.runs[r].client && c->t_queued <= P.runs[r].t_queued && c->session &&
            strcmp(c->session, P.runs[r].session) == 0)
            return true;
    }
    return false;
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
    if (old->client < 0 || !old->req || !old->id || !old->session ||
        s_staged_count() >= P.max_staged)
        return;
    json_t *req = json_deep_copy(old->req);
    if (!req)
        return;
    if (!old->prefetch) {
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
    int r = s_new_run(old->client, old->id, old->session, req, true);
    json_decref(req);
    if (r < 0)
        return;
    P.runs[r].restage = true;
    ll_info("pool", "session %s: prepared again, staged (its worker was evicted)",
            P.runs[r].session);
}

/* Hand queued cells to their session's warm worker, or free slots, oldest
 * first; under pressure evict idle warm workers (GreedyDual); tell waiting
 * cells. */
static void s_schedule(void)
{
    int order[S_MAX_RUNS], nq = 0;
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && P.runs[r].state == S_QUEUED)
            order[nq++] = r;
    /* Oldest first (a handful at most: insertion sort). */
    for (int i = 1; i < nq; i++)
        for (int j = i; j > 0 && P.runs[order[j]].t_queued < P.runs[order[j - 1]].t_queued; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int evicting = 0;
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && P.runs[r].state == S_EVICTING &&
            P.runs[r].slot >= 0) /* a staged one frees none */
            evicting++;
    double now = ll_clock_ms();
    bool blocked = false; /* an older cell waits for a slot: younger ones may not take one first */
    for (int i = 0; i < nq; i++) {
        int r = order[i];
        s_run_t *run = &P.runs[r];
        if (!run->used || run->state != S_QUEUED)
            continue;
        if (run->prefetch && s_session_cell_queued(r)) {
            /* The session's cell waits for a slot (on its staged worker, or to fork). */
            s_skip_prefetch(r, "the session's cell waits for a GPU slot");
            continue;
        }
        bool busy = false, running = false;
        int w = s_warm_for(r, &busy, &running);
        if (w >= 0 && P.runs[w].slot < 0 && run->prefetch) {
            /* The session's worker is staged and its user edits a GPU cell:
             * give it a slot now if one is free, or may be freed by the
             * prefetch rules (the wait for it then falls in the edit time),
             * else re-check versions without one. */
            int slot = s_free_slot();
            bool cells = s_cells_waiting();
            if (slot >= 0 && !cells) {
                s_take_slot(w, slot);
                s_start_warm(r, w);
            } else if (slot < 0 && !cells && !run->evicted_for && !run->restage &&
                       s_prefetch_evicts(r, now)) {
                run->evicted_for = true; /* stays queued until that worker is gone */
            } else if (!run->evicted_for || cells) {
                s_start_warm(r, w);
            }
            continue;
        }
        if (w >= 0 && (P.runs[w].slot >= 0 || run->prefetch)) {
            s_start_warm(r, w);
            continue;
        }
        if (w >= 0) {
            /* The cell's worker was prepared without a slot (staged): it
             * takes a free one, or waits as a cold cell would, evicting. */
            if (blocked)
                continue;
            int slot = s_free_slot();
            if (slot >= 0) {
                s_take_slot(w, slot);
                s_start_warm(r, w);
                run->staged_hit = true;
                continue;
            }
            goto evict;
        }
        if (busy)
            continue; /* the session's prefetch is preparing its worker: wait for it */
        if (run->prefetch && running) {
            /* The session's cell runs: its worker stays warm after it. */
            s_skip_prefetch(r, "the session's worker is running a cell");
            continue;
        }
        if (run->prefetch) {
            int slot = s_free_slot();
            bool cells = s_cells_waiting();
            bool node = ll_ztree_best(P.tree, json_object_get(run->req, "import_closure")) >= 0;
            if (run->restage) {
                /* Staged or not at all: it takes nobody's slot. */
                if (node && s_staged_count() < P.max_staged)
                    s_start_run(r, -1);
                else
                    s_drop_run(r);
                continue;
            }
            if (slot >= 0 && !cells && node) {
                s_start_run(r, slot);
            } else if (slot < 0 && !cells && !run->evicted_for && s_prefetch_evicts(r, now)) {
                run->evicted_for = true; /* stays queued until that worker is gone */
            } else if (!run->evicted_for && node && s_staged_count() < P.max_staged) {
                s_start_run(r, -1); /* staged: prepared without a slot, it takes one at Run */
            } else if (!run->evicted_for) {
                s_skip_prefetch(r, cells ? "cells wait for a GPU slot" : "no free GPU slot");
            }
            continue;
        }
        if (blocked)
            continue;
        int slot = s_free_slot();
        if (slot >= 0) {
            if (ll_ztree_best(P.tree, json_object_get(run->req, "import_closure")) < 0) {
                blocked = true; /* no node ready yet */
                continue;
            }
            s_start_run(r, slot);
            if (run->state == S_QUEUED)
                blocked = true;
            continue;
        }
    evict:
        blocked = true;
        if (evicting > 0) {
            evicting--; /* a slot is on its way to this cell */
            continue;
        }
        int victim = P.gdsf ? ll_gdsf_victim(P.gdsf, now) : -1;
        for (int v = 0; v < S_MAX_RUNS && victim >= 0; v++)
            if (P.runs[v].used && P.runs[v].state == S_WARM && P.runs[v].wpid == victim) {
                char why[200];
                snprintf(why, sizeof why, "slot pressure: cell %.80s of session %.40s needs a slot",
                         run->id, run->session);
                s_evict_worker(v, why, true);
                victim = -1;
            }
    }
    int queued = 0;
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && P.runs[r].state == S_QUEUED && !P.runs[r].prefetch)
            queued++;
    bool all_held = true;
    for (int s2 = 0; s2 < P.nslots; s2++)
        if (P.slot_run[s2] < 0)
            all_held = false;
    for (int r = 0; r < S_MAX_RUNS; r++) {
        s_run_t *run = &P.runs[r];
        if (run->used && run->state == S_QUEUED && !run->prefetch && !run->waited && all_held) {
            run->waited = true;
            ll_info("pool", "cell %s waits: all %d slots are held", run->id, P.nslots);
            s_send_client(run->client, json_pack("{s:s, s:s, s:i, s:i}", "type", "wait", "id",
                                                 run->id, "slots", P.nslots, "queued", queued));
        }
    }
}

static int s_find_run(int c, const char *id)
{
    if (!id)
        return -1;
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && !s_idle_worker(&P.runs[r]) && P.runs[r].client == c &&
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
    if (run->wpid > 0 && (!run->handover || sig == SIGKILL))
        kill(run->wpid, sig);
    else if (sig == SIGKILL || !run->pending_sig)
        run->pending_sig = sig; /* sent when the zygote reports the fork */
}

/* The worker's pid became known. */
static void s_run_pid(int r, pid_t pid)
{
    s_run_t *run = &P.runs[r];
    if (run->wpid)
        return;
    run->wpid = pid;
    if (run->pending_sig) {
        ll_debug("pool", "cell %s: signal %d, asked before the fork, sent to worker %d", run->id,
                 run->pending_sig, (int) pid);
        kill(pid, run->pending_sig);
    }
}

static json_t *s_stats(void)
{
    json_t *nodes = ll_ztree_nodes_json(P.tree), *slots = json_array(), *runs = json_array();
    for (int s = 0; s < P.nslots; s++)
        json_array_append_new(slots, P.slot_run[s] >= 0 ? json_string(P.runs[P.slot_run[s]].id)
                                                        : json_null());
    static const char *const state_names[] = {"",       "queued",    "forking", "running",
                                              "saving", "preparing", "warm",    "evicting"};
    json_t *workers = json_array(), *sessions = json_array();
    double now = ll_clock_ms();
    for (int r = 0; r < S_MAX_RUNS; r++) {
        s_run_t *run = &P.runs[r];
        if (!run->used)
            continue;
        if (!s_idle_worker(run))
            json_array_append_new(runs, json_pack("{s:s, s:i, s:i}", "id", run->id, "state",
                                                  run->state, "pid", (int) run->wpid));
        if (run->wpid <= 0 || run->state == S_QUEUED)
            continue;
        /* Every worker: warm ones (staged ones hold no slot), and busy ones. */
        const char *st = run->state == S_WARM && run->slot < 0 ? "staged"
                         : run->state == S_WARM && ll_gdsf_speculative(P.gdsf, (int) run->wpid, now)
                             ? "speculative"
                             : state_names[run->state];
        double l = 0;
        bool known = ll_gdsf_value(P.gdsf, (int) run->wpid, &l);
        json_array_append_new(
            workers, json_pack("{s:s, s:i, s:i, s:s, s:o, s:f, s:i, s:b, s:i, s:f}", "session",
                               run->session ? run->session : "", "client", run->client, "pid",
                               (int) run->wpid, "state", st, "L",
                               known ? json_real(l) : json_null(), "bytes", run->held_bytes,
                               "cells", run->cells, "spec", run->spec, "slot", run->slot, "idle_s",
                               run->state == S_WARM ? (now - run->idle_since) / 1000.0 : 0.0));
    }
    for (int i = 0; i < S_MAX_SESSIONS; i++) {
        s_sess_t *se = &P.sessions[i];
        if (!se->used)
            continue;
        double held = s_session_held(i, now) / 1000.0;
        double conn = se->client >= 0 && P.clients[se->client].fd >= 0
                          ? (now - P.clients[se->client].connected) / 1000.0
                          : held;
        json_array_append_new(sessions,
                              json_pack("{s:s, s:i, s:f, s:f, s:f}", "session", se->name, "client",
                                        se->client, "gpu_held_s", held, "connected_s", conn,
                                        "held_share", conn > 0 ? held / conn : 0.0));
    }
    return json_pack(
        "{s:s, s:i, s:o, s:o, s:o, s:b, s:i, s:O, s:i, s:b, s:o, s:o, s:f, s:i}", "type", "stats",
        "pid", (int) getpid(), "nodes", nodes, "slots", slots, "runs", runs, "cuda", P.cuda,
        "max_nodes", P.cfg.max_nodes, "safety", (json_t *) ll_ztree_safety(P.tree), "base_respawns",
        ll_ztree_base_respawns(P.tree), "base_broken", ll_ztree_broken(P.tree), "workers", workers,
        "sessions", sessions, "clock", ll_gdsf_clock(P.gdsf), "warm_idle_s", P.cfg.warm_idle_s);
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
            bad =
                "run: state_closure, import_closure, defines and deletes must be arrays of strings";
        if (bad) {
            s_client_error(c, id, bad);
            return;
        }
        int r = s_new_run(c, id, json_string_value(json_object_get(m, "session")), m, prefetch);
        if (r < 0) {
            s_client_error(c, id, "run: too many cells in flight");
            return;
        }
        s_session(c, P.runs[r].session, true);
        if (!json_is_array(json_object_get(m, "import_closure")))
            json_object_set_new(m, "import_closure", json_array());
        if (ll_ztree_broken(P.tree))
            s_fail_queued();
        else
            s_schedule();
        return;
    }
    int r = s_find_run(c, id);
    if (r < 0 && id && strcmp(type, "cancel") == 0) {
        /* A prefetch that finished: its speculative worker (never ran a
         * cell) leaves; a worker that ran cells stays. */
        for (int w = 0; w < S_MAX_RUNS; w++)
            if (P.runs[w].used && P.runs[w].state == S_WARM && P.runs[w].client == c &&
                P.runs[w].spec && P.runs[w].id && strcmp(P.runs[w].id, id) == 0)
                s_evict_worker(w, "its prefetch was cancelled", false);
        return;
    }
    if (strcmp(type, "stats") == 0) {
        s_send_client(c, s_stats());
    } else if (strcmp(type, "input_reply") == 0) {
        if (r < 0 || P.runs[r].wfd < 0)
            return;
        json_t *f =
            json_pack("{s:s, s:O}", "type", "input_reply", "value",
                      json_object_get(m, "value") ? json_object_get(m, "value") : json_string(""));
        ll_zframe_send(P.runs[r].wfd, f, -1);
        json_decref(f);
    } else if (strcmp(type, "interrupt") == 0 || strcmp(type, "cancel") == 0) {
        if (r < 0)
            return;
        bool cancel = type[0] == 'c';
        if (P.runs[r].prefetch) {
            /* Speculative work dropped: a worker forked for it goes (it
             * committed nothing); a warm one finishes restoring and stays. */
            if (P.runs[r].state == S_QUEUED) {
                s_send_client(c, json_pack("{s:s, s:s, s:b, s:s}", "type", "prefetched", "id", id,
                                           "ok", 0, "skipped", "cancelled"));
                s_drop_run(r);
            } else if (P.runs[r].fresh) {
                P.runs[r].cancelled = true;
                s_kill_run(r, SIGKILL);
            }
            return;
        }
        if (P.runs[r].state == S_QUEUED) {
            s_reply_error(r, cancel ? "Cancelled" : "KeyboardInterrupt",
                          cancel ? "the cell was cancelled before it started"
                                 : "interrupted before the cell started");
            s_drop_run(r);
        } else if (cancel) {
            P.runs[r].cancelled = true;
            s_kill_run(r, SIGKILL);
        } else {
            s_kill_run(r, SIGINT);
        }
    } else {
        s_client_error(c, id, "unknown frame type");
    }
}

static void s_client_gone(int c)
{
    for (int r = 0; r < S_MAX_RUNS; r++) {
        s_run_t *run = &P.runs[r];
        if (!run->used || run->client != c)
            continue;
        if (run->state == S_QUEUED) {
            s_drop_run(r);
            continue;
        }
        if (run->state == S_WARM) {
            s_evict_worker(r, "its client left", false);
        } else if (run->state == S_SAVING) {
            /* Its save commits (a cell that ran is kept, as if the client
             * had waited), then it leaves: nobody takes it warm. */
            run->evict_t = ll_clock_ms();
        } else if (run->state != S_EVICTING) {
            run->cancelled = true;
            s_kill_run(r, SIGKILL);
        }
    }
    for (int i = 0; i < S_MAX_SESSIONS; i++)
        if (P.sessions[i].used && P.sessions[i].client == c)
            s_session_end(i);
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used && P.runs[r].client == c)
            P.runs[r].client = -1;
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

/* Worker R is idle now, its save committed (or a prefetch prepared it):
 * keep it warm for its session.  CHANGED: its state changed (a cell ran, a
 * prefetch restored something), so GreedyDual values it from the clock now. */
static void s_make_warm(int r, bool changed)
{
    s_run_t *run = &P.runs[r];
    double now = ll_clock_ms();
    run->state = S_WARM;
    run->idle_since = now;
    run->handover = false;
    run->pending_sig = 0;
    if (run->slot < 0)
        return; /* staged: it holds no slot, so it is nobody's victim (it leaves when idle, cancelled or unused) */
    if (changed || !ll_gdsf_value(P.gdsf, (int) run->wpid, NULL))
        ll_gdsf_changed(P.gdsf, (int) run->wpid, run->held_bytes, run->spec, now);
    ll_gdsf_set_idle(P.gdsf, (int) run->wpid, true);
    ll_debug("pool", "worker %d warm for session %s (%.0f bytes)", (int) run->wpid, run->session,
             run->held_bytes);
}

static void s_worker_frame(int r, json_t *m)
{
    s_run_t *run = &P.runs[r];
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type || s_idle_worker(run))
        return; /* an idle worker has nothing to say */
    if (strcmp(type, "ready") == 0) {
        s_run_pid(r, (pid_t) json_integer_value(json_object_get(m, "pid")));
        if (run->handover) {
            /* The warm worker dropped stale interrupts: forward new ones. */
            run->handover = false;
            if (run->pending_sig && run->wpid > 0)
                kill(run->wpid, run->pending_sig);
            run->pending_sig = 0;
        }
        if (run->prefetch) {
            run->state = S_PREPARING;
            return;
        }
        run->state = S_RUNNING;
        json_object_set_new(m, "type", json_string("started"));
        json_object_set_new(m, "node", json_integer(run->node_id));
        json_object_set_new(m, "wait_ms", json_real(run->wait_ms));
        json_object_set_new(m, "warm_hit", json_boolean(run->warm_hit));
    } else if (strcmp(type, "saving") == 0) {
        if (run->state == S_RUNNING)
            run->state = S_SAVING;
        return;
    } else if (strcmp(type, "prepared") == 0 && run->prefetch) {
        json_t *rep = json_object_get(m, "report");
        json_t *ev = json_is_object(rep) ? json_deep_copy(rep) : json_object();
        bool ok = !json_object_get(ev, "fatal");
        bool stay = ok && json_is_true(json_object_get(ev, "stays_warm")) &&
                    P.cfg.warm_idle_s > 0 && run->client >= 0;
        json_t *restored = json_object_get(ev, "restored");
        bool changed = run->fresh || (json_is_array(restored) && json_array_size(restored) > 0) ||
                       json_array_size(json_object_get(ev, "dropped_stale")) > 0;
        if (json_is_number(json_object_get(ev, "held_bytes")))
            run->held_bytes = json_number_value(json_object_get(ev, "held_bytes"));
        json_object_set_new(ev, "type", json_string("prefetched"));
        json_object_set_new(ev, "id", json_string(run->id));
        json_object_set_new(ev, "ok", json_boolean(ok));
        json_object_set_new(ev, "warm_hit", json_boolean(run->warm_hit));
        json_object_set_new(ev, "staged", json_boolean(run->slot < 0));
        json_object_set_new(ev, "zygote_node", json_integer(run->node_id));
        json_object_set_new(ev, "wait_ms", json_real(run->wait_ms));
        s_answer_prefetch(r, ev);
        if (stay) {
            s_make_warm(r, changed);
            ll_gdsf_prepared(P.gdsf, (int) run->wpid, true,
                             ll_clock_ms()); /* for the session's coming cell */
            s_schedule();
        } else {
            s_drop_run(r); /* the worker leaves by itself */
            s_schedule();
        }
        return;
    } else if (strcmp(type, "reply") == 0) {
        /* The worker replies only after its save committed: the slot is free,
         * or the worker stays warm for the session's next cell. */
        json_t *md = json_object_get(m, "metadata");
        json_t *ll = md ? json_object_get(md, "looseleaf") : NULL;
        if (ll) {
            json_object_set_new(ll, "zygote_node", json_integer(run->node_id));
            json_object_set_new(ll, "wait_ms", json_real(run->wait_ms));
            json_object_set_new(ll, "warm_hit", json_boolean(run->warm_hit));
            json_object_set_new(ll, "staged", json_boolean(run->staged_hit));
            if (json_is_number(json_object_get(ll, "held_bytes")))
                run->held_bytes = json_number_value(json_object_get(ll, "held_bytes"));
        }
        json_object_set_new(m, "id", json_string(run->id));
        s_send_client(run->client, json_incref(m));
        int si = s_session(run->client, run->session, false);
        if (si >= 0)
            P.sessions[si].pf_credit =
                1; /* a cell ran: its next prefetch may take a slot (s_prefetch_evicts) */
        bool stay = ll && json_is_true(json_object_get(ll, "stays_warm")) &&
                    P.cfg.warm_idle_s > 0 && run->client >= 0 && !run->cancelled;
        if (stay) {
            run->cells++;
            run->spec = false;
            ll_gdsf_prepared(P.gdsf, (int) run->wpid, false,
                             0); /* the cell it was prepared for ran */
            s_make_warm(r, true);
        } else {
            s_drop_run(r); /* the worker exits by itself; its zygote reaps it */
        }
        s_schedule();
        return;
    }
    json_object_set_new(m, "id", json_string(run->id));
    s_send_client(run->client, json_incref(m));
}

/* ------------------------------------------------------------------ */
/* Start-up and the loop                                              */

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
    P.nslots = P.cfg.nslots;
    P.max_staged = P.cfg.max_staged;
    bool foreground = P.cfg.foreground;
    const char *log = P.cfg.log[0] ? P.cfg.log : NULL;
    P.gdsf = ll_gdsf_new(P.cfg.spec_s * 1000.0);
    if (!P.gdsf)
        return 1;
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
        P.nslots = ncuda < S_MAX_SLOTS ? ncuda : S_MAX_SLOTS;
    }
    /* Staged workers (a prefetch finding no slot prepares one without):
     * twice as many as slots unless set.  Without a GPU there is no device
     * memory, so they restore everything; on CUDA hosts (or when tests ask,
     * LL_POOL_STAGED_DEFER=1) only imports and the state's restore waits for
     * the slot: variables may hold device tensors. */
    if (P.max_staged < 0)
        P.max_staged = 2 * P.nslots;
    P.staged_defer = P.cuda || P.cfg.staged_defer;
    for (int s = 0; s < S_MAX_SLOTS; s++)
        P.slot_run[s] = -1;
    for (int c = 0; c < S_MAX_CLIENTS; c++)
        P.clients[c].fd = -1;
    for (int r = 0; r < S_MAX_RUNS; r++) {
        P.runs[r].wfd = -1;
        P.runs[r].slot = -1;
    }
    ll_info("pool", "serving %s: %d %s slot(s), up to %d zygote nodes, idle exit %d s", P.cfg.dir,
            P.nslots, P.cuda ? "CUDA" : "virtual", P.cfg.max_nodes, P.cfg.idle_exit_s);
    P.tree =
        ll_ztree_new(P.exe, P.exe_name, P.cfg.head, P.cfg.max_nodes, P.cfg.grow, s_node_lost, NULL);
    if (!P.tree || ll_ztree_spawn_base(P.tree) < 0) {
        ll_error("pool", "cannot start the base zygote: %s", strerror(errno));
        return 1;
    }
    P.idle_since = ll_clock_ms();

    enum { K_LISTEN, K_SIG, K_CLIENT, K_NODE, K_WORKER, K_PROBE };
    struct pollfd pfd[2 + S_MAX_CLIENTS + LL_ZTREE_MAX_NODES + S_MAX_RUNS + LL_ZTREE_MAX_PROBES];
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
        for (int r = 0; r < S_MAX_RUNS; r++)
            if (P.runs[r].used) {
                nruns++;
                if (P.runs[r].wfd >= 0 && !P.runs[r].eof)
                    pfd[np] = (struct pollfd){P.runs[r].wfd, POLLIN, 0}, kind[np] = K_WORKER,
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
        /* Warm workers unused for --warm-idle leave; an evicted one that
         * does not leave in time is killed (its save committed). */
        for (int r = 0; r < S_MAX_RUNS; r++) {
            s_run_t *run = &P.runs[r];
            double left = -1;
            if (run->used && run->state == S_WARM) {
                left = run->idle_since + P.cfg.warm_idle_s * 1000.0 - now;
                if (left <= 0) {
                    s_evict_worker(r, "idle timeout", false);
                    left = S_EXIT_GRACE_MS;
                }
            } else if (run->used && run->state == S_SAVING && run->client < 0) {
                left = run->evict_t + S_SAVE_GRACE_MS - now;
                if (left <= 0) {
                    ll_warn("pool", "worker %d still saving %.0f s after its client left: killed",
                            (int) run->wpid, S_SAVE_GRACE_MS / 1000);
                    run->cancelled = true;
                    kill(run->wpid, SIGKILL);
                    run->evict_t = now; /* its exit ends the entry; until then, once per grace */
                    left = S_SAVE_GRACE_MS;
                }
            } else if (run->used && run->state == S_EVICTING) {
                left = run->evict_t + S_EXIT_GRACE_MS - now;
                if (left <= 0 && run->wpid > 0 && !run->exited) {
                    ll_warn("pool", "warm worker %d did not exit: killed", (int) run->wpid);
                    kill(run->wpid, SIGKILL);
                    run->evict_t = now;
                    left = S_EXIT_GRACE_MS;
                }
            }
            if (left >= 0 && (timeout < 0 || (int) left + 1 < timeout))
                timeout = (int) left + 1;
        }
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
                if (!P.runs[k].used || P.runs[k].wfd != pfd[i].fd)
                    break;
                int fr = ll_zreader_fill(P.runs[k].wrd);
                json_t *m;
                bool bad = false;
                while (P.runs[k].used && (m = ll_zreader_pop(P.runs[k].wrd, &bad))) {
                    s_worker_frame(k, m);
                    json_decref(m);
                }
                if (P.runs[k].used && (fr < 0 || bad)) {
                    P.runs[k].eof = true;
                    if (P.runs[k].exited)
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
    for (int i = 0; i < S_MAX_SESSIONS; i++)
        if (P.sessions[i].used)
            s_session_end(i);
    ll_ztree_stop(P.tree);
    for (int r = 0; r < S_MAX_RUNS; r++)
        if (P.runs[r].used)
            s_kill_run(r, SIGKILL);
    unlink(P.sock);
    return 0;
}
