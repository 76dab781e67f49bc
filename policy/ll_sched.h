/* ll_sched: the host pool's scheduling decisions (zygote/API.md, "Warm
 * workers").  Pure policy on the model of ll_greedydual.h: no processes, no I/O,
 * no clock of its own (callers pass NOW), so a self-test scripts it.  Run
 * by the pool's one thread.
 *
 * The schedule holds, for every job (a cell or a prefetch, named by its
 * entry index R) and the worker it runs on once it has one, what the
 * decisions depend on: one state (ll_sched_state_t), the slot it holds,
 * its client and session, and the worker's eviction value (ll_greedydual.h, keyed
 * by the worker's pid).  It also holds each session's prefetch credit and
 * its slot-held time.  The pool keeps the processes and sockets beside it,
 * in entries of the same index, tells the schedule what happened (a job
 * queued, a worker ready, replied, gone) and applies what it decides.
 *
 * A pass (ll_sched_begin, then ll_sched_next until false) goes over the
 * queued jobs oldest first and decides:
 * - a cell: to its session's warm worker (a hit); else a free slot (a
 *   fork), never before an older cell still waiting; else it evicts the
 *   GreedyDual victim among idle warm workers (one eviction per waiting
 *   cell: an eviction under way counts as the slot on its way) and waits,
 *   told so once (LL_SCHED_WAIT) while every slot is held.  A cell whose
 *   session has a worker preparing a prefetch waits for that worker; one
 *   whose worker is staged (prepared without a slot) promotes it into a
 *   free slot, or evicts for it as a cold cell would;
 * - a prefetch: skipped while a cell of its session sent before it waits,
 *   or while the session's cell runs; to the session's warm worker (a
 *   staged one is promoted into a free slot when no cell waits, or when
 *   the prefetch may evict for it); else forked into a free slot when no
 *   cell waits; else into the slot of the GreedyDual victim it evicts,
 *   never a speculative one, when the victim's L is below clock +
 *   closure_bytes or the session holds its prefetch credit (one to start
 *   with, spent by such an eviction, earned back when a cell of the session
 *   replies); else staged, without a slot (at most MAX_STAGED pool-wide);
 *   else skipped;
 * - a restage (a prefetch the pool makes itself when it evicts a worker
 *   under pressure while its client is connected): staged or nothing,
 *   never a slot.
 * Under `looseleaf hostd` (ll_sched_prefetch_ask) a prefetch that would
 * evict or be staged first asks the broker for a slot at the lowest
 * priority, and waits queued for its answer.
 * A worker that is its session's home (it holds values no store can hold,
 * ll_sched_set_home) stays after its job even where workers do not stay
 * warm, is no prefetch's victim and a cell's victim only when no other
 * warm worker is left (then the one of smallest L), and leaves on no idle
 * timeout (the pool's timers ask ll_sched_job's worker.home).
 * Each decision is applied to the schedule before ll_sched_next returns it,
 * but for the dropping of a skipped or dropped job, which the caller does
 * once it answered; the caller then does what it says (fork, hand over,
 * kill, answer). */
#ifndef LL_SCHED_H
#define LL_SCHED_H

#include "policy/ll_greedydual.h"

#include <stdbool.h>

#define LL_SCHED_MAX_JOBS     512 /* cells and prefetches in flight, and workers, pool-wide */
#define LL_SCHED_MAX_SLOTS    64
#define LL_SCHED_MAX_SESSIONS 512

/* A job's state.  Only WARM workers are evictable.  (The numbers appear in
 * the pool's stats, "runs".) */
typedef enum {
    LL_SCHED_FREE = 0,  /* entry unused */
    LL_SCHED_QUEUED,    /* waits for a slot (or for its session's worker busy preparing) */
    LL_SCHED_FORKING,   /* forked (or handed to a warm worker), not yet ready */
    LL_SCHED_RUNNING,   /* the cell runs */
    LL_SCHED_SAVING,    /* the cell ran; its save has not committed */
    LL_SCHED_PREPARING, /* a prefetch: restoring and importing, no cell */
    LL_SCHED_WARM,      /* idle, its save committed: waits for its session's next job */
    LL_SCHED_EVICTING,  /* told to exit (or killed); holds its slot until it is gone */
} ll_sched_state_t;

typedef enum {
    LL_SCHED_CELL,     /* a cell to run */
    LL_SCHED_PREFETCH, /* a client's prefetch: prepare, run nothing */
    LL_SCHED_RESTAGE,  /* a prefetch the pool made itself: staged only, answered to nobody */
} ll_sched_kind_t;

/* One job and its worker, as the schedule sees it (read-only for callers). */
typedef struct {
    ll_sched_state_t state; /* LL_SCHED_FREE: the entry is unused */
    ll_sched_kind_t kind;   /* what was asked */
    int client;             /* the client that asked; -1 once it left */
    char *session;          /* the request's session (owned by the schedule) */
    double t_queued;        /* ms, when it was queued: the queue's order */
    double closure_bytes;   /* a prefetch's closure_bytes (0: not given) */
    int slot;               /* held slot, -1 none (queued, or a staged worker) */
    double slot_t0;         /* ms, when it took its slot */
    struct {                /* while queued: */
        bool told_wait;     /* a cell was told it waits (LL_SCHED_WAIT, once) */
        bool awaits_evict;  /* a prefetch evicted a worker and waits for its slot */
        bool wants_lease;   /* hostd: a prefetch waits for the broker's answer (a slot or none) */
        bool lease_refused; /* hostd: ... which lent none: it is staged, as without a broker */
    } queue;
    struct {               /* its worker, once it has one (moves with it on a hand-over): */
        int key;           /* the worker's pid, its GreedyDual key; 0 before known */
        bool gone;         /* its socket closed or its exit is known: it takes no job */
        bool spec;         /* it never ran a cell (a prefetch prepared it) */
        int cells;         /* cells it ran */
        double held_bytes; /* bytes of state it holds (its last report) */
        double idle_since; /* ms, when it last became warm */
        int home; /* names it is its session's home for (its last report): kept, evicted last */
    } worker;
} ll_sched_job_t;

/* A client's session: its prefetch credit and its GPU-seconds. */
typedef struct {
    bool used;      /* entry in use */
    int client;     /* its client */
    char *name;     /* the requests' "session" (owned) */
    double held_ms; /* slot-held time of holdings that ended */
    int credit;     /* prefetch evictions it may make (0 or 1) */
} ll_sched_session_t;

typedef enum {
    LL_SCHED_FORK,  /* fork a worker for R on SLOT (-1: staged, without a slot) */
    LL_SCHED_HAND,  /* hand R to warm worker W: the worker, and its slot SLOT (-1: staged), moved
                      into R's entry; W's entry is free */
    LL_SCHED_EVICT, /* evict warm worker W under slot pressure, for R (now EVICTING: it holds
                       its slot until it is gone) */
    LL_SCHED_SKIP,  /* prefetch R will not be prepared (WHY): answer it, then drop it
                       (ll_sched_drop) before the next decision */
    LL_SCHED_DROP,  /* restage R finds no room: drop it silently (ll_sched_drop) */
    LL_SCHED_WAIT,  /* tell cell R it waits: every slot is held, QUEUED cells are queued */
} ll_sched_op_t;

typedef struct {
    ll_sched_op_t op; /* what to do */
    int r;            /* the job decided on */
    int w;            /* HAND, EVICT: the warm worker's entry (HAND: already moved into R) */
    int slot;         /* FORK, HAND: the slot the job runs on, -1 none (staged) */
    bool staged_hit;  /* HAND: a cell takes its session's staged worker (promoted to SLOT) */
    bool credit;      /* EVICT for a prefetch: it spent its session's credit (L was not older) */
    bool restage;     /* EVICT: prepare W's session again, staged (ll_sched_add, RESTAGE) */
    double l;         /* EVICT: W's L, before the eviction */
    const char *why;  /* SKIP: the reason, for the answer */
    int queued;       /* WAIT: cells queued */
} ll_sched_decision_t;

typedef struct ll_sched_t ll_sched_t;

/* A schedule of NSLOTS slots (1..LL_SCHED_MAX_SLOTS), MAX_STAGED staged
 * workers at most; GreedyDual speculation window SPEC_WINDOW_MS; KEEP_WARM:
 * workers may stay warm after their job.  NULL when out of memory.  The
 * caller destroys it. */
ll_sched_t *ll_sched_new(int nslots, int max_staged, double spec_window_ms, bool keep_warm);

/* Destroy *SELF_P and null it.  Safe on NULL and twice. */
void ll_sched_destroy(ll_sched_t **self_p);

/* ---- what happened (the caller tells) ---- */

/* A new job of CLIENT's SESSION, queued at NOW.  Returns its entry, or -1
 * when the table is full (or out of memory). */
int ll_sched_add(ll_sched_t *self, int client, const char *session, ll_sched_kind_t kind,
                 double closure_bytes, double now);

/* The session (CLIENT, NAME), made when new (with one prefetch credit).
 * Returns its entry, or -1 when the table is full. */
int ll_sched_session_open(ll_sched_t *self, int client, const char *name);

/* R's worker is pid KEY (known from the zygote or the worker). */
void ll_sched_set_worker(ll_sched_t *self, int r, int key);

/* R's worker reports being its session's home for NAMES names (0: none),
 * before ll_sched_prepared / ll_sched_replied. */
void ll_sched_set_home(ll_sched_t *self, int r, int names);

/* R's worker said ready: a cell runs (RUNNING), a prefetch prepares
 * (PREPARING). */
void ll_sched_ready(ll_sched_t *self, int r);

/* R's cell ran; its save started (RUNNING -> SAVING). */
void ll_sched_saving(ll_sched_t *self, int r);

/* R's worker finished a prefetch (PREPARED) or a cell (ll_sched_replied)
 * at NOW; MAY_STAY: the worker and the pool's side allow it to stay warm;
 * HELD_BYTES: what it reports holding (< 0: no report).  CHANGED: the
 * prefetch changed its state (restored or dropped something, or a fresh
 * worker), so its GreedyDual value is renewed.  Returns whether it stays
 * (WARM; it stays only while its client is connected and the pool keeps
 * warm workers); if not, the caller drops R (ll_sched_drop).  A reply also
 * gives its session's prefetch credit back. */
bool ll_sched_prepared(ll_sched_t *self, int r, bool may_stay, bool changed, double held_bytes,
                       double now);
bool ll_sched_replied(ll_sched_t *self, int r, bool may_stay, double held_bytes, double now);

/* R's worker will take no job: its socket closed, or its exit is known. */
void ll_sched_lost(ll_sched_t *self, int r);

/* R was handed to a warm worker that died before it took the job (nothing
 * ran): R is queued again without a worker (its slot released at NOW). */
void ll_sched_requeue(ll_sched_t *self, int r, double now);

/* Warm worker W leaves at NOW, not under pressure (idle timeout, its client
 * left, its prefetch was cancelled): EVICTING, the clock stays.  *L_OUT
 * (may be NULL) gets its L (0 when it had none). */
void ll_sched_release(ll_sched_t *self, int w, double *l_out);

/* Forget R (its worker is gone, or it never got one), releasing its slot
 * at NOW. */
void ll_sched_drop(ll_sched_t *self, int r, double now);

/* CLIENT left: its jobs go on without a client (-1).  Its sessions are the
 * caller's to close first (ll_sched_session_close). */
void ll_sched_client_gone(ll_sched_t *self, int client);

/* Forget session I. */
void ll_sched_session_close(ll_sched_t *self, int i);

/* ---- decisions ---- */

/* Start a pass over the queue at NOW; NODES_READY: some zygote node
 * accepts forks (no job is forked without). */
void ll_sched_begin(ll_sched_t *self, double now, bool nodes_ready);

/* The next decision of the pass into *D, already applied to the schedule
 * (but SKIP and DROP: the caller drops R); false when the pass is over.
 * Between two calls the caller may tell the schedule what happened (a job
 * dropped, a new one added), never start another pass. */
bool ll_sched_next(ll_sched_t *self, ll_sched_decision_t *d);

/* The FORK just decided for R could not be sent: R is queued again,
 * holding no slot, and a cell blocks younger ones for the rest of the
 * pass. */
void ll_sched_fork_failed(ll_sched_t *self, int r);

/* ---- reading ---- */

/* Job R (0 <= R < LL_SCHED_MAX_JOBS), owned by the schedule (it changes
 * with it). */
const ll_sched_job_t *ll_sched_job(const ll_sched_t *self, int r);

/* Session I (0 <= I < LL_SCHED_MAX_SESSIONS, owned by the schedule), and
 * its slot-held ms at NOW (the holdings still running included); the
 * session of (CLIENT, NAME), or -1. */
const ll_sched_session_t *ll_sched_session(const ll_sched_t *self, int i);
double ll_sched_session_held(const ll_sched_t *self, int i, double now);
int ll_sched_session_find(const ll_sched_t *self, int client, const char *name);

/* One past the highest entry in use: every entry from there on is free
 * (scans of the jobs may stop there). */
int ll_sched_jobs_end(const ll_sched_t *self);

/* The slots, and the job holding slot S (-1: free). */
int ll_sched_nslots(const ll_sched_t *self);
int ll_sched_slot_job(const ll_sched_t *self, int s);

/* ---- slots leased from `looseleaf hostd` (hostd/API.md) ---- */

/* Whether slot S is the pool's to use (all are, until the pool talks to a
 * broker).  An unleased slot takes no new job when free; a worker holding
 * it when it was taken back does not stay warm after its job (its slot is
 * free at its reply).  The caller evicts a warm worker there itself. */
void ll_sched_slot_lease(ll_sched_t *self, int s, bool leased);
bool ll_sched_slot_leased(const ll_sched_t *self, int s);

/* HOLD: a cell or prefetch finding no free slot evicts no warm worker (it
 * waits: the broker may lend a slot first).  Off by default. */
void ll_sched_evict_hold(ll_sched_t *self, bool hold);

/* QUIET: cells finding every slot held are not told they wait (not yet:
 * the broker may lend one at once); told once it is off.  Off by default. */
void ll_sched_wait_quiet(ll_sched_t *self, bool quiet);

/* ASK: a prefetch (a client's, not a restage) finding no free slot and
 * no cell waiting waits for the broker (wants_lease) instead of evicting or
 * being staged, until a slot is lent (it takes it) or the broker lends
 * none (ll_sched_prefetch_refused: then it is decided as without a
 * broker).  Off by default. */
void ll_sched_prefetch_ask(ll_sched_t *self, bool ask);
/* The broker lends no slot to the prefetches waiting for it now. */
void ll_sched_prefetch_refused(ll_sched_t *self);
/* Prefetches waiting for the broker's answer. */
int ll_sched_prefetch_wanting(const ll_sched_t *self);

/* The eviction order of warm workers (values, clock, speculation), owned
 * by the schedule. */
const ll_gd_t *ll_sched_gd(const ll_sched_t *self);

#endif
