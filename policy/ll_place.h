/* ll_place: which GPU host a session's next job goes to, when a fleet has
 * many (DESIGN.md "Many users, many hosts", paper §3.4): placement by
 * consolidation.  Pure policy on the model of ll_greedydual.h: the caller
 * describes its hosts as they are now, the module decides; no processes,
 * no I/O, no clock.  Run by whoever places jobs: the fleet's placement
 * step in a service, `looseleaf simulate` (sim/) in a simulation.
 *
 * Consolidation: work goes to the most loaded host that can take it, so
 * the least loaded hosts empty out and can be powered off (ll_provision.h)
 * rather than every host staying half used.  For a job (a cell, or an
 * edit-time prefetch) of a session:
 * 1. the session's home, the host holding its worker (warm, staged or
 *    preparing), when that worker holds a slot there or the home has a
 *    free slot or an idle warm worker to evict: its state is there, and
 *    the host's own schedule (ll_sched.h) hands the job to that worker;
 * 2. else the most loaded accepting host with a free slot and room for
 *    the session's state (held slots, then busy ones, then the lower
 *    index);
 * 3. else the most loaded accepting host with room and an idle warm worker
 *    no waiting cell has claimed yet: its schedule evicts the GreedyDual
 *    victim there (a prefetch evicts only as ll_sched allows, else it is
 *    staged there);
 * 4. else the accepting host with room and the shortest queue per slot
 *    (then the fewest staged workers): the job waits there, and the
 *    provisioning controller sees the queue;
 * 5. else nowhere (no host accepts, or none has room): the caller waits
 *    for one to boot. */
#ifndef LL_PLACE_H
#define LL_PLACE_H

#include <stdbool.h>

/* One host as placement sees it (the caller's snapshot). */
typedef struct {
    bool accepting;  /* powered, its base zygote ready, not draining: takes new jobs */
    int slots;       /* GPU slots */
    int busy;        /* slots held by jobs: forking, preparing, running, saving, evicting */
    int warm;        /* slots held by idle warm workers (evictable) */
    int staged;      /* workers prepared without a slot */
    int queued;      /* cells waiting for a slot */
    double mem_free; /* payload-pool bytes free for another session's state */
} ll_place_host_t;

typedef enum {
    LL_PLACE_NONE = 0, /* no host can take it now */
    LL_PLACE_HOME,     /* rule 1: the session's home */
    LL_PLACE_FREE,     /* rule 2: a free slot */
    LL_PLACE_EVICT,    /* rule 3: an idle warm worker to evict */
    LL_PLACE_QUEUE,    /* rule 4: waits in a queue */
} ll_place_how_t;

/* What is asked: a job of a session whose worker lives on host HOME (-1:
 * none), holding a slot there or not (HOME_SLOT), and whose state needs
 * STATE_BYTES of room on a host that is not its home. */
typedef struct {
    int home;           /* host index of the session's worker, -1 none */
    bool home_slot;     /* that worker holds a slot there (warm, or busy preparing) */
    double state_bytes; /* room the session's state needs on another host */
} ll_place_ask_t;

/* The host for ASK among HOSTS[0..N), with the rule that chose it in *HOW
 * (may be NULL); -1 (LL_PLACE_NONE) when no host can take it. */
int ll_place_choose(const ll_place_host_t *hosts, int n, const ll_place_ask_t *ask,
                    ll_place_how_t *how);

/* Slots of H neither held by a job nor by a warm worker. */
int ll_place_free_slots(const ll_place_host_t *h);

/* The host to drain when the fleet shrinks: the accepting host holding the
 * fewest slots, then with the fewest queued cells and staged workers, then
 * the most memory free, then the highest index (consolidation empties the
 * others last); -1 when none accepts. */
int ll_place_drain(const ll_place_host_t *hosts, int n);

#endif
