/* ll_sim_internal: what the simulator's engine (ll_sim.c) shares with its
 * designs (ll_sim_looseleaf.c, ll_sim_baselines.c) and the elastic fleet
 * they share (ll_sim_fleet.c).  Private to sim/.  Single-threaded.
 *
 * The engine owns the clock, the event queue, the sessions and the user's
 * side of each session (gap, edit, Run, the next cell), identical for every
 * design; a design owns what happens between a GPU cell's Run and its
 * output, and the hosts it keeps powered.  Each design sees each session
 * through its own ll_sim_ds_t, so designs never interact. */
#ifndef LL_SIM_INTERNAL_H
#define LL_SIM_INTERNAL_H

#include "sim/ll_sim.h"
#include "policy/ll_place.h"
#include "policy/ll_provision.h"
#include "policy/ll_sched.h"

typedef struct ll_sim_sess ll_sim_sess_t;

/* A session as one design sees it. */
typedef struct {
    double t_arrive;          /* when it connected in this design (a seat's next session
                               * connects once the previous one left) */
    ll_sim_sess_t *seat_next; /* the next session waiting for the same seat */
    int cell;                 /* the cell being edited, run or waited for */
    double t_edit;            /* its edit window's start */
    double t_run;             /* its Run */
    uint32_t gen;             /* bumped at each Run: stale prefetch events are dropped */
    bool done;                /* the session left */
    bool waiting;             /* a GPU cell waits for a host (a design's queue) */
    /* where its state and processes are */
    int host;           /* home host (its worker, GPU, container, or replica leader); -1 none */
    bool remote;        /* its state is on another host than HOME: the next restore pulls it */
    double dirty_bytes; /* written by CPU cells since its worker last synced */
    double resident;    /* bytes of its state counted in its home host's memory */
    bool store_open;    /* LooseLeaf: its kernel opened the store (its first GPU job) ... */
    double t_store;     /* ... which is open from then on */
    double t_pool;      /* LooseLeaf: when its kernel first reached a pool (< 0: not yet) */
    bool cuda;          /* its process started CUDA (pinned, keep-alive) */
    bool bound;         /* pinned: its GPU is bound; keep-alive: its container exists */
    double ka_idle;     /* keep-alive: its container idle since (< 0: running a cell) */
    bool ka_timer;      /* keep-alive: its idle timer is pending (one at a time) */
    int replica[4];     /* NotebookOS: the hosts of its replicas */
    double sync_done;   /* NotebookOS: the other replicas have the last cell's writes */
    int leader;         /* NotebookOS: the replica that ran its last GPU cell */
} ll_sim_ds_t;

/* A session of the trace, with every design's view of it. */
struct ll_sim_sess {
    ll_trace_session_t *tr;          /* owned */
    int pending;                     /* designs not done with it */
    int holds;                       /* events of designs still referring to it */
    ll_sim_ds_t ds[LL_SIM_NDESIGNS]; /* per design */
};

/* Event kinds the engine handles; designs use LL_SIM_EV_DESIGN and up. */
enum {
    LL_SIM_EV_EDIT = 1, /* S's current cell's edit window starts */
    LL_SIM_EV_PREFETCH, /* a prefetch for it is sent (A: which one) */
    LL_SIM_EV_RUN,      /* the user presses Run */
    LL_SIM_EV_CPU_DONE, /* a CPU cell's output is back */
    LL_SIM_EV_LEAVE,    /* the session disconnects */
    LL_SIM_EV_TICK,     /* the design's controller looks */
    LL_SIM_EV_DESIGN = 16,
};

typedef struct {
    double t;         /* when, s */
    uint64_t seq;     /* ties in order of scheduling */
    uint8_t design;   /* whose */
    uint8_t kind;     /* what */
    int32_t a, b;     /* the design's arguments (host, job entry) */
    uint32_t gen;     /* a token the handler checks (stale events are dropped) */
    ll_sim_sess_t *s; /* the session, if any */
} ll_sim_ev_t;

/* How a GPU cell started (ll_sim_started's FLAGS). */
enum {
    LL_SIM_WARM = 1,       /* on a process that held the session's state */
    LL_SIM_PREFETCHED = 2, /* prepared by a prefetch since the last cell */
    LL_SIM_STAGED = 4,     /* on a staged worker promoted into a slot */
};

/* A design: its state and what it does with the engine's events. */
typedef struct {
    void *(*create)(ll_sim_t *sim, int d); /* its state; NULL: no memory */
    void (*destroy)(void *st);
    void (*start)(void *st, ll_sim_sess_t *s, double now);    /* the session connected */
    void (*prefetch)(void *st, ll_sim_sess_t *s, double now); /* a prefetch (NULL: ignored) */
    void (*run_gpu)(void *st, ll_sim_sess_t *s, double now);  /* Run of a GPU cell */
    void (*cpu_done)(void *st, ll_sim_sess_t *s, double now); /* a CPU cell ran (may be NULL) */
    void (*leave)(void *st, ll_sim_sess_t *s, double now);    /* the session disconnects */
    void (*event)(void *st, const ll_sim_ev_t *ev);           /* its own events, and TICK */
    void (*finish)(void *st, double now); /* the run is over: power everything off */
    /* Its own event EV came after its figures closed (it is dropped): let go
     * of what EV held (ll_sim_hold).  NULL: its events hold nothing. */
    void (*dropped)(void *st, const ll_sim_ev_t *ev);
} ll_sim_ops_t;

extern const ll_sim_ops_t ll_sim_looseleaf_ops, ll_sim_looseleaf_nopf_ops, ll_sim_pinned_ops,
    ll_sim_pinned_packed_ops, ll_sim_keepalive_ops, ll_sim_naive_ops, ll_sim_notebookos_ops;

/* ---- the engine, for designs ---- */

/* ll_sim_new with the designs' OPS (in ll_sim_design_t's order; the
 * config's mask picks among them): ll_sim_designs.c's table. */
ll_sim_t *ll_sim_new_designs(const ll_sim_config_t *cfg,
                             const ll_sim_ops_t *const ops[LL_SIM_NDESIGNS], char *err,
                             size_t errlen);

/* Schedule an event of design D at T (>= now). */
void ll_sim_at(ll_sim_t *sim, double t, int d, int kind, ll_sim_sess_t *s, int a, int b,
               uint32_t gen);

/* Whether design D's figures are final (its last session left). */
bool ll_sim_closed(const ll_sim_t *sim, int d);

/* The configuration, and the current cell of S. */
const ll_sim_config_t *ll_sim_cfg(const ll_sim_t *sim);
const ll_trace_cell_t *ll_sim_cell(const ll_sim_sess_t *s, int d);

/* S's current GPU cell started executing at NOW (FLAGS: LL_SIM_WARM ...):
 * its start latency is NOW - its Run. */
void ll_sim_started(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now, int flags);

/* An event of a design that may fire after S left refers to S: S stays
 * allocated until ll_sim_unhold (one per hold). */
void ll_sim_hold(ll_sim_sess_t *s);
void ll_sim_unhold(ll_sim_t *sim, ll_sim_sess_t *s);

/* Sessions waiting for a host or a GPU, oldest first: a design's queue.
 * Its fields are read and edited in place; Q->q is freed with free(). */
typedef struct {
    ll_sim_sess_t **q;
    int n, cap;
} ll_sim_queue_t;

/* Append S to Q.  Out of memory ends the simulation (abort): a run that
 * lost a waiting session would report wrong figures. */
void ll_sim_queue_push(ll_sim_queue_t *q, ll_sim_sess_t *s);

/* S's current cell's output is back at NOW: the user goes on. */
void ll_sim_cell_done(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now);

/* Levels integrated over time, per design. */
enum { LL_SIM_POWERED = 0, LL_SIM_BUSY, LL_SIM_EXEC, LL_SIM_HELD, LL_SIM_NLEVELS };

/* Level L of design D changes by DELTA at NOW. */
void ll_sim_level(ll_sim_t *sim, int d, int l, double now, double delta);

/* The pool's bill for a session of design D: HELD_S slot-held seconds of
 * CONNECTED_S connected to the pool. */
void ll_sim_bill(ll_sim_t *sim, int d, double held_s, double connected_s);

/* ---- the elastic fleet (ll_sim_fleet.c): hosts booted and drained by
 * ll_provision, jobs placed by ll_place.  Used by LooseLeaf, keep-alive
 * and naive serverless. ---- */

typedef enum {
    LL_SIM_HOST_OFF = 0,
    LL_SIM_HOST_BOOTING,
    LL_SIM_HOST_ON,
    LL_SIM_HOST_DRAINING
} ll_sim_host_state_t;

typedef struct {
    ll_sim_host_state_t state; /* powered or not */
    ll_place_host_t snap;      /* what placement sees (valid unless dirty) */
    bool dirty;                /* the design changed it since */
    bool listed;               /* it is on the fleet's list of stale views */
    uint32_t boot_gen;         /* its boot event's token */
    void *priv;                /* the design's per-host state */
} ll_sim_host_t;

typedef struct ll_sim_fleet_t ll_sim_fleet_t;

typedef struct {
    /* The placement summary of host I (busy, warm, staged, queued, mem_free;
     * the fleet sets accepting and slots). */
    void (*refresh)(void *design, int i, ll_place_host_t *snap);
    void (*host_on)(void *design, int i, double now);  /* booted: make priv */
    void (*host_off)(void *design, int i, double now); /* powered off: free priv */
    void (*capacity)(void *design, double now);        /* a host came: retry waiting work */
    int (*waiting)(void *design);                      /* work waiting for a host */
} ll_sim_fleet_ops_t;

/* A fleet for design D with OPS on DESIGN, its controller from the cost
 * table.  NULL when out of memory.  It keeps min_hosts hosts powered from
 * the first session on (ready at once: the fleet was warm). */
ll_sim_fleet_t *ll_sim_fleet_new(ll_sim_t *sim, int d, const ll_sim_fleet_ops_t *ops, void *design);
void ll_sim_fleet_destroy(ll_sim_fleet_t **f_p);

/* Hosts (any state), host I. */
int ll_sim_fleet_nhosts(const ll_sim_fleet_t *f);
ll_sim_host_t *ll_sim_fleet_host(ll_sim_fleet_t *f, int i);

/* Place a job for ASK (ll_place_choose over fresh snapshots): the host, or
 * -1; *HOW the rule.  A queued or unplaced job wakes the controller. */
int ll_sim_fleet_place(ll_sim_fleet_t *f, const ll_place_ask_t *ask, ll_place_how_t *how,
                       double now);

/* Host I changed at NOW (its snapshot is stale); a draining host with
 * nothing left is powered off. */
void ll_sim_fleet_touched(ll_sim_fleet_t *f, int i, double now);

/* The fleet's own events (boot done, controller tick): true when EV was
 * one. */
bool ll_sim_fleet_event(ll_sim_fleet_t *f, const ll_sim_ev_t *ev);

/* Make sure the fleet runs (the first session came): powers min_hosts. */
void ll_sim_fleet_start(ll_sim_fleet_t *f, double now);

/* The controller looks now (also called on its own every control_s). */
void ll_sim_fleet_control(ll_sim_fleet_t *f, double now);

/* Power every host off at NOW (the end of the run). */
void ll_sim_fleet_finish(ll_sim_fleet_t *f, double now);

#define LL_SIM_EV_FLEET_BOOTED (LL_SIM_EV_DESIGN + 40)
#define LL_SIM_EV_FLEET_TICK   (LL_SIM_EV_DESIGN + 41)

#endif
