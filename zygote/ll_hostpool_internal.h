/* ll_hostpool_internal: what the parts of the host pool share and nobody
 * else should see.  ll_hostpool.c is the process: its set-up, the poll
 * loop, the clients' connections; ll_hostpool_jobs.c is what clients ask
 * and workers say; ll_hostpool_schedule.c applies the schedule's
 * (ll_sched.h) decisions to processes; ll_hostpool_runs.c keeps the job
 * entries and ends their workers; ll_hostpool_stats.c answers `stats`.
 * Each file uses only the ones listed before it below (tests/tree checks
 * that no two need each other).  All run on the pool's one thread.
 *
 * The pool's state is one ll_hostpool_t, made by ll_hostpool_main and
 * passed to every function (one pool per process). */
#ifndef LL_HOSTPOOL_INTERNAL_H
#define LL_HOSTPOOL_INTERNAL_H

#include "base/ll_gpu.h"
#include "policy/ll_gpu_plan.h"
#include "zygote/ll_hostpool_config.h"
#include "policy/ll_sched.h"
#include "proto/ll_zframe.h"
#include "zygote/ll_ztree.h"

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define LL_HOSTPOOL_MAX_CLIENTS 128

/* A kernel connected to the pool.  Frames to it are queued and written as
 * its socket takes them (ll_hostpool_send). */
typedef struct {
    int fd;            /* -1: free entry */
    ll_zreader_t *rd;  /* frames from the client */
    char *out;         /* bytes queued for it */
    size_t olen, ocap; /* queued, allocated */
    bool dead;         /* to be dropped at the end of this loop turn */
    double connected;  /* ms, when it connected (a pinned session's GPU time starts here) */
} ll_hostpool_client_t;

/* How a job got its worker (what its reports say). */
typedef enum {
    LL_HOSTPOOL_ORIGIN_NONE,   /* none yet: queued */
    LL_HOSTPOOL_ORIGIN_FORKED, /* forked for this job */
    LL_HOSTPOOL_ORIGIN_WARM,   /* its session's warm worker took it (a hit) */
    LL_HOSTPOOL_ORIGIN_STAGED, /* ... one a prefetch prepared without a slot, promoted for it */
} ll_hostpool_origin_t;

/* The pool's side of job R: the request, its worker's process and socket,
 * what the reports say.  Its state, slot, client and session are the
 * schedule's (ll_sched_job(pool->sched, R)): entry R here is job R there,
 * and is in use exactly while that one is.  A warm worker keeps its entry
 * after its job and hands it, worker and all, to the next job of its
 * session. */
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
        bool exited;      /* its exit status is known (both: it is gone) */
        int status;       /* its waitpid status */
    } worker;
    struct {
        bool handover; /* handed to a warm worker that has not said ready: signals wait */
        int pending;   /* a signal asked for before the worker could take it */
    } sig;
    bool cancelled;  /* killed on request (cancel, its client left, a save overdue) */
    bool group_wait; /* its worker is gone, the rest of its process group not yet: the slot waits */
    bool silent; /* a prefetch the pool made itself (a staged worker's promotion): answers nobody */
    bool promote_tried; /* a staged worker the pool tried to prepare on a free slot (once) */
    ll_hostpool_origin_t origin; /* how it got its worker */
    double wait_ms;              /* time it waited for its worker */
    double evict_t; /* ms, when it was told to exit (or its client left while it saved) */
    bool began;     /* its worker said something of the cell (output): its code may have run */
    int retries;    /* times the job was given a fresh worker after one died preparing it */
    unsigned long long oom_kills; /* the host's OOM kills when the job went to its worker */
} ll_hostpool_run_t;

/* A home worker that went (ll_hostpool_tell_gone, ll_hostpool_homes.c):
 * its session's next workers are told, so a cell reading what it held
 * names why. */
#define LL_HOSTPOOL_GONE 32
typedef struct {
    int client;       /* its client (-1: entry unused) */
    char session[64]; /* its session */
    int pid;          /* the worker */
    char why[300];    /* "evicted for another session at 12:01:07" */
} ll_hostpool_gone_t;
/* The link to `looseleaf hostd` (ll_hostpool_hostd.c). */
typedef struct ll_hostpool_hostd_t ll_hostpool_hostd_t;

typedef struct {
    ll_hostpool_config_t cfg; /* what the pool was told (read once at its start) */
    char sock[PATH_MAX + 16]; /* listening socket path */
    char exe[PATH_MAX]; /* our binary (/proc/self/exe: it survives a rebuild), exec'd as `zygote` */
    char exe_name[PATH_MAX]; /* its name, for the zygotes' argv[0] */
    int listen_fd;           /* the listening socket */
    int sig_fd;              /* SIGCHLD, SIGTERM, SIGINT */
    int lock_fd;             /* pool.lock, held while the pool serves the dir */
    bool cuda;               /* slots are on CUDA devices */
    ll_gpu_info_t gpus;      /* what the detection found (stats) */
    ll_gpu_plan_t plan;      /* cuda: the slots' devices and memory caps */
    char visible[256];       /* cuda: the pool's own CUDA_VISIBLE_DEVICES ("" unset) */
    bool staged_defer; /* staged workers leave the state's restore to the cell's run (CUDA hosts) */
    ll_sched_t *sched; /* jobs, slots, sessions: the scheduling decisions */
    ll_ztree_t *tree;  /* the zygote nodes and the CUDA-safety probes */
    ll_hostpool_client_t clients[LL_HOSTPOOL_MAX_CLIENTS];
    ll_hostpool_run_t runs[LL_SCHED_MAX_JOBS];
    ll_hostpool_gone_t gone[LL_HOSTPOOL_GONE]; /* home workers that went, newest at gone_next - 1 */
    int gone_next;                             /* where the next one goes (a ring) */
    double idle_since;                         /* ms, 0 while busy */
    bool stop;                                 /* SIGTERM or SIGINT came */
    bool sweep; /* a worker went: look for what its cells left (ll_hostpool_kill_strays) */
    ll_hostpool_hostd_t *hostd; /* the slot broker's link; NULL: the pool's own slots */
} ll_hostpool_t;

/* The schedule's side of job R (its state, slot, client, session). */
static inline const ll_sched_job_t *ll_hostpool_job(const ll_hostpool_t *pool, int r)
{
    return ll_sched_job(pool->sched, r);
}
/* Whether entry R is in use. */
static inline bool ll_hostpool_used(const ll_hostpool_t *pool, int r)
{
    return ll_hostpool_job(pool, r)->state != LL_SCHED_FREE;
}
/* Whether job R is a prefetch (asked, or the pool's own restage). */
static inline bool ll_hostpool_is_prefetch(const ll_hostpool_t *pool, int r)
{
    return ll_hostpool_job(pool, r)->kind != LL_SCHED_CELL;
}
/* A warm worker, or one leaving: it has nothing to say and runs no job. */
static inline bool ll_hostpool_idle_worker(const ll_hostpool_t *pool, int r)
{
    return ll_hostpool_job(pool, r)->state == LL_SCHED_WARM ||
           ll_hostpool_job(pool, r)->state == LL_SCHED_EVICTING;
}

/* The files below, lowest first: each uses only those above it.
 * ll_hostpool_procs.c and ll_hostpool_clients.c need no other;
 * ll_hostpool_homes.c, ll_hostpool_runs.c, ll_hostpool_hostd.c,
 * ll_hostpool_stats.c, ll_hostpool_schedule.c and ll_hostpool_jobs.c
 * follow in that order, and ll_hostpool.c (the process) is on top. */

/* ---- ll_hostpool_procs.c: workers as processes ---- */

/* SIG's name without "SIG" ("KILL"), "?" when unknown. */
const char *ll_hostpool_signame(int sig);
/* Signal SIG to worker PID; SIGKILL goes to its whole process group. */
void ll_hostpool_signal_worker(pid_t pid, int sig);
/* Whether a process of worker PID's group still exists (a zombie too). */
bool ll_hostpool_group_alive(pid_t pid);
/* Kill what cells started out of their worker's process group (a session
 * of its own, a double fork) and their worker no longer holds: our
 * children that are neither a worker nor in our own group (zygotes,
 * probes), and everything under them; with WORKERS_TOO (the pool stops)
 * every worker and everything under it as well.  Each worker is its
 * descendants' subreaper (ll_zygote.c), so while it lives what its cells
 * orphan stays under it, and once it is gone it comes to us (we are
 * theirs).  Looks through /proc; returns the processes killed, not
 * counting workers. */
int ll_hostpool_kill_strays(ll_hostpool_t *pool, bool workers_too);
/* The OOM kills of this host so far (/proc/vmstat; 0 when unknown). */
unsigned long long ll_hostpool_oom_kills(void);

/* ---- ll_hostpool_clients.c: frames to the clients ---- */

/* Queue MSG (stolen) for client C and write what its socket takes now; a
 * client gone, or one that does not read (past 512 MiB queued), gets
 * nothing (the latter is marked dead). */
void ll_hostpool_send(ll_hostpool_t *pool, int c, json_t *msg);
/* Write what client C's socket takes now (it polled writable). */
void ll_hostpool_flush(ll_hostpool_t *pool, int c);

/* ---- ll_hostpool_homes.c ---- */

/* R's worker, the home of values of its session, goes (HOW: "evicted for
 * another session", ...): its client is told, with the time, once; no-op
 * when it is no home. */
void ll_hostpool_tell_gone(ll_hostpool_t *pool, int r, const char *how);
/* The home workers of R's session that went, as {pid: why}: a new object
 * the caller owns, NULL when none. */
json_t *ll_hostpool_gone_of(ll_hostpool_t *pool, int r);

/* ---- ll_hostpool_runs.c: entries, and how their workers end ---- */

/* A new queued job of client C (ID, SESSION; REQ: the request, the entry
 * takes its own reference), or -1 when the table is full (or memory). */
int ll_hostpool_new_run(ll_hostpool_t *pool, int c, const char *id, const char *session,
                        json_t *req, ll_sched_kind_t kind);
/* Forget the pool's side of entry R (the schedule's is the caller's). */
void ll_hostpool_run_free(ll_hostpool_t *pool, int r);
/* Forget job R: its slot is free, its worker (if any) unknown. */
void ll_hostpool_drop_run(ll_hostpool_t *pool, int r);
/* Job R's worker is gone: the rest of its process group is killed and its
 * slot waits for that group; then R is dropped. */
void ll_hostpool_drop_worker(ll_hostpool_t *pool, int r);
/* Job R's worker will not stay warm (MAY_STAY: it said it could, so it
 * waits and is told to exit); it keeps its slot until it is gone. */
void ll_hostpool_let_go(ll_hostpool_t *pool, int r, bool may_stay);
/* Answer M (stolen, "prefetched") to the client of prefetch R, if any. */
void ll_hostpool_answer_prefetch(ll_hostpool_t *pool, int r, json_t *m);
/* Prefetch R will not be prepared (WHY): answer so and drop it. */
void ll_hostpool_skip_prefetch(ll_hostpool_t *pool, int r, const char *why);
/* The reply of job R whose worker never replied (ENAME, EVALUE). */
void ll_hostpool_reply_error(ll_hostpool_t *pool, int r, const char *ename, const char *evalue);
/* The client of session I left: one line on the pool log, then forget it. */
void ll_hostpool_session_end(ll_hostpool_t *pool, int i);
/* Warm worker W leaves (WHY; L its GreedyDual value), keeping its slot
 * until it is gone; PRESSURE: killed at once, else asked to exit. */
void ll_hostpool_worker_leaves(ll_hostpool_t *pool, int w, const char *why, double l,
                               bool pressure);
/* Let warm worker W go, not under pressure (WHY: logged). */
void ll_hostpool_release_worker(ll_hostpool_t *pool, int w, const char *why);
/* hostd takes back the slot of warm worker W: it leaves at once (killed:
 * its save committed), holding its slot until it is gone.  WHY: logged. */
void ll_hostpool_evict_warm(ll_hostpool_t *pool, int w, const char *why);
/* Signal SIG to job R's worker, or hold it until the worker can take it. */
void ll_hostpool_kill_run(ll_hostpool_t *pool, int r, int sig);

/* Every queued job gets an error reply (the base zygote cannot start). */
void ll_hostpool_fail_queued(ll_hostpool_t *pool);

/* ll_ztree_gone_fn (ARG: the pool): node N is going; cells whose worker it
 * was forking get a ZygoteDied reply. */
void ll_hostpool_node_lost(void *arg, int n);

/* At NOW: warm workers unused for --warm-idle leave, workers overdue are
 * killed.  Returns TIMEOUT, or the ms until the next such deadline when
 * sooner. */
int ll_hostpool_worker_timers(ll_hostpool_t *pool, double now, int timeout);

/* Whether a job or a worker exists (the pool is not idle). */
bool ll_hostpool_busy(const ll_hostpool_t *pool);

/* The pool stops: every session's line is logged, every worker killed. */
void ll_hostpool_runs_stop(ll_hostpool_t *pool);

/* ---- ll_hostpool_hostd.c: slots leased from `looseleaf hostd` ---- */

/* Look for the broker (hostd/API.md), registering when it answers. */
void ll_hostpool_hostd_start(ll_hostpool_t *pool);
void ll_hostpool_hostd_stop(ll_hostpool_t *pool);
/* The broker's connection to poll for POLLIN, -1 none. */
int ll_hostpool_hostd_fd(const ll_hostpool_t *pool);
/* Its frames (grants, revocations, answers).  Returns whether the caller
 * is to run a pass of the schedule now (the link is below the schedule, so
 * it asks for one: what it was lent or lost changes what the pass does). */
bool ll_hostpool_hostd_input(ll_hostpool_t *pool);
/* At NOW: try to reach it again when due, give it up when it does not
 * welcome us in time (then *PASS: the caller runs a pass of the schedule,
 * on the pool's own slots).  TIMEOUT, or the ms to the next attempt when
 * sooner. */
int ll_hostpool_hostd_timer(ll_hostpool_t *pool, double now, int timeout, bool *pass);
/* After a pass: tell the broker what changed (cells waiting, leases busy or
 * idle, leases free to return), and evict warm workers on slots it takes
 * back. */
void ll_hostpool_hostd_sync(ll_hostpool_t *pool);
/* Where the worker on our SLOT runs when the broker's map places it (a
 * registered pool's leased slot, on a broker of GPU slots, the pool not
 * under LL_POOL_NO_CUDA): its device index, CUDA_VISIBLE_DEVICES entry
 * (owned by the link) and memory cap (0: none); false: the pool's own plan. */
bool ll_hostpool_hostd_device(const ll_hostpool_t *pool, int slot, int *dev, const char **vis,
                              double *frac);
/* The broker's slot our SLOT holds a lease on, -1 none (or no broker). */
int ll_hostpool_hostd_slot(const ll_hostpool_t *pool, int slot);

/* ---- ll_hostpool_stats.c ---- */

/* The `stats` event (zygote/API.md); the caller owns it. */
json_t *ll_hostpool_stats(ll_hostpool_t *pool);

/* ---- ll_hostpool_schedule.c ---- */

/* One pass of the schedule, its decisions applied. */
void ll_hostpool_schedule(ll_hostpool_t *pool);

/* ---- ll_hostpool_jobs.c: what clients ask and zygotes and workers say ---- */

/* Frame M (borrowed) from client C: a request, a signal, stats. */
void ll_hostpool_client_frame(ll_hostpool_t *pool, int c, json_t *m);

/* Client C left: its queued jobs go, its warm workers leave, its running
 * ones are killed (a saving one finishes its save), its sessions end. */
void ll_hostpool_client_left(ll_hostpool_t *pool, int c);

/* Frame M (borrowed) from node N's zygote. */
void ll_hostpool_node_frame(ll_hostpool_t *pool, int n, json_t *m);

/* Job R's worker socket FD is readable (R's worker may have moved on). */
void ll_hostpool_worker_input(ll_hostpool_t *pool, int r, int fd);

/* PID (no probe) was reaped with STATUS: a worker's fate, if it was one. */
void ll_hostpool_worker_exited(ll_hostpool_t *pool, pid_t pid, int status);

#endif
