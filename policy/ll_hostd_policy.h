/* ll_hostd_policy: the slot broker's decisions (`looseleaf hostd`,
 * hostd/API.md): which user's pool gets which of the host's slots, and
 * whose lease is taken back when a pool waits.  Pure policy on the model
 * of ll_greedydual.h and ll_sched.h: no processes, no I/O, no clock of its own
 * (callers pass NOW), so a self-test scripts it.  Run by the broker's one
 * thread.
 *
 * A connection is one user's host pool (its uid checked by the caller with
 * SO_PEERCRED).  A lease is one slot lent to one connection; a slot is free
 * when no lease names it.  A pool holds at most as many leases as it has
 * slots of its own, on any of the broker's slots: the pool puts the worker
 * of broker slot k on k's device (ll_hostd_policy_plan).  A pool says how many more slots it wants (its
 * cells waiting for one), marks each lease busy or idle (an idle warm
 * worker: evictable, with its GreedyDual value) and returns leases.
 *
 * The policy (a pass: ll_hostd_policy_next until false):
 * - waiting connections are served in order of their user's leases held
 *   (fewest first), then of how long they wait: a free slot goes to the
 *   first one (GRANT);
 * - when no slot is free, a waiting user takes a lease back from a user
 *   above share (share = slots / users holding or waiting): that user's
 *   idle lease with the smallest value first (GreedyDual among warm
 *   workers), else its longest-held busy one, which ends at its cell's
 *   reply (REVOKE; one per slot wanted);
 * - otherwise the waiting pool is told once (WAIT) whether a slot is on its
 *   way (a revocation for it) or not: then it may evict one of its own
 *   warm workers, or wait for its own or anyone's slot to free.
 * So a waiting user below share is served at the latest when a cell of a
 * user above share ends (at once when such a user holds an idle lease),
 * plus the time that pool takes to evict and return the lease.
 *
 * Prefetches (a pool preparing a worker for a cell its user edits) ask at
 * the lowest priority: a prefetch is lent a slot only when one is free and
 * no waiting cell of anyone's can take it; a lease holding a prefetch
 * (lent for one, or marked so: its worker never ran a cell) is the first
 * taken back when any user's cell waits, whatever the shares, and counts
 * in no share nor order (a user is never above share, nor served later,
 * for its prefetches).  A pool whose prefetches get no slot is told so
 * once (WAIT, PREFETCH): it prepares them without one (staged).
 *
 * The policy grants nothing a pool did not get from the broker: a lease a
 * pool claims when it (re-)registers (ll_hostd_policy_adopt) is accepted
 * only where the broker lent that slot to that uid before it restarted
 * (ll_hostd_policy_restore, from the broker's record) and nobody holds it
 * now, within the pool's own slots.  A restored slot is held for its uid
 * (lent to nobody else) until claimed or until its grace ends.  Any other
 * claim is refused: the pool gives that slot up (as on a revocation). */
#ifndef LL_HOSTD_POLICY_H
#define LL_HOSTD_POLICY_H

#include "policy/ll_gpu_plan.h"

#include <stdbool.h>

#define LL_HOSTD_MAX_CONNS  256 /* pools connected at once */
#define LL_HOSTD_MAX_SLOTS  64
#define LL_HOSTD_MAX_LEASES 256 /* slots, plus what pools adopt beyond them */
#define LL_HOSTD_MAX_USERS  256 /* users ever seen (their GPU-seconds) */

typedef enum {
    LL_HOSTD_GRANT,  /* lend SLOT to CONN (PREFETCH: for a prefetch) */
    LL_HOSTD_REVOKE, /* tell CONN to give SLOT back (for FOR_CONN) */
    LL_HOSTD_WAIT,   /* tell CONN its wanted slots wait; REVOKING: one is on its way;
                        PREFETCH: its prefetches get none now */
} ll_hostd_op_t;

typedef struct {
    ll_hostd_op_t op;
    int conn;      /* the pool told */
    int slot;      /* GRANT, REVOKE */
    int for_conn;  /* REVOKE: the waiting pool it is for */
    bool revoking; /* WAIT: a revocation for CONN is under way */
    bool prefetch; /* GRANT, WAIT: about CONN's prefetches */
} ll_hostd_decision_t;

/* One lease (read-only for callers). */
typedef struct {
    int conn;       /* owner, -1: entry unused */
    unsigned uid;   /* owner's uid */
    int slot;       /* the slot lent */
    bool idle;      /* an idle warm worker holds it: evictable */
    double value;   /* idle: its GreedyDual value (the pool's L above its clock) */
    bool revoking;  /* taken back, not yet returned */
    bool prefetch;  /* it holds a prefetch: lowest priority, first taken back */
    int for_conn;   /* revoking: for whom (-1 once that pool left) */
    double t0;      /* ms, lent at */
    double busy_t0; /* ms, busy since (while not idle) */
    int last_pid;   /* the worker on it at its last mark (hit counting) */
    int last_cells; /* and the cells that worker had run */
} ll_hostd_lease_t;

/* One user's totals (read-only for callers). */
typedef struct {
    bool used;
    unsigned uid;
    double held_ms; /* lease-held time of leases that ended, or of busy spells that ended */
    double busy_ms; /* busy time of spells that ended */
    long grants, revokes, cold_starts, warm_hits;
} ll_hostd_user_t;

typedef struct ll_hostd_policy_t ll_hostd_policy_t;

/* The broker's slots, counted as the host pool counts its own (ll_gpu_plan,
 * the same knobs): with NGPU CUDA devices (> 0), PER_GPU workers on each
 * when > 0 (--gpu-slots, LL_POOL_GPU_SLOTS), else TOTAL when > 0 (--slots,
 * LL_POOL_SLOTS) spread over them, else one per device; each capped at
 * FRACTION of its device (-1: 0.95 / workers on the device, none when
 * alone).  Without a device (NGPU 0): TOTAL virtual slots, else 2, whose
 * slot_dev is -1.  Fills *PLAN; returns its slots, or -1 when TOTAL or
 * PER_GPU is out of range (over LL_HOSTD_MAX_SLOTS slots). */
int ll_hostd_policy_plan(int ngpu, int per_gpu, int total, double fraction, ll_gpu_plan_t *plan);

/* A broker of NSLOTS slots (1..LL_HOSTD_MAX_SLOTS); NULL when out of
 * memory or out of range.  The caller destroys it. */
ll_hostd_policy_t *ll_hostd_policy_new(int nslots);
void ll_hostd_policy_destroy(ll_hostd_policy_t **self_p);

/* ---- what happened ---- */

/* Pool CONN (0..LL_HOSTD_MAX_CONNS-1) of UID registered; it holds NSLOTS
 * leases at most (its own slots), on any of the broker's.  Returns 0, or
 * -1 (CONN out of range or in use, no room for a new user). */
int ll_hostd_policy_open(ll_hostd_policy_t *self, int conn, unsigned uid, int nslots, double now);

/* CONN left at NOW: its leases end (what it ran is gone with it). */
void ll_hostd_policy_close(ll_hostd_policy_t *self, int conn, double now);

/* Before the broker restarted, it had lent SLOT to UID: held for UID's
 * pool to claim back until UNTIL (ms).  0, or -1 (slot out of range or
 * already restored). */
int ll_hostd_policy_restore(ll_hostd_policy_t *self, int slot, unsigned uid, double until);

/* CONN claims SLOT, which it held when it registered.  0, or -1 when the
 * claim is not granted: no such connection, slot out of range, leased to
 * anyone, not restored for CONN's uid (or its grace is over), or CONN
 * holds its own slots' worth already. */
int ll_hostd_policy_adopt(ll_hostd_policy_t *self, int conn, int slot, bool idle, double now);

/* The earliest end of a restored slot's grace (ms), 0 when none: call
 * ll_hostd_policy_next then (the slot becomes free). */
double ll_hostd_policy_deadline(const ll_hostd_policy_t *self);

/* CONN wants N slots more than it holds (0: none). */
void ll_hostd_policy_want(ll_hostd_policy_t *self, int conn, int n, double now);

/* CONN wants N slots for prefetches (0: none), at the lowest priority;
 * each call with N > 0 is answered (a GRANT for a prefetch, else WAIT,
 * PREFETCH). */
void ll_hostd_policy_want_prefetch(ll_hostd_policy_t *self, int conn, int n, double now);

/* CONN's lease on SLOT holds a prefetch (its worker ran no cell) or not.
 * 0, or -1 when CONN holds no lease on SLOT. */
int ll_hostd_policy_mark_prefetch(ll_hostd_policy_t *self, int conn, int slot, bool prefetch);

/* CONN returns SLOT at NOW.  0, or -1 when CONN holds no lease on SLOT
 * (nothing changes). */
int ll_hostd_policy_release(ll_hostd_policy_t *self, int conn, int slot, double now);

/* CONN's lease on SLOT is IDLE (VALUE: its GreedyDual value) or busy; PID
 * and CELLS: the worker on it and the cells it ran (warm-hit counting).
 * 0, or -1 when CONN holds no lease on SLOT. */
int ll_hostd_policy_mark(ll_hostd_policy_t *self, int conn, int slot, bool idle, double value,
                         int pid, int cells, double now);

/* ---- decisions ---- */

/* The next decision at NOW into *D, already applied; false when there is
 * none.  Call until false after anything happened. */
bool ll_hostd_policy_next(ll_hostd_policy_t *self, double now, ll_hostd_decision_t *d);

/* ---- reading ---- */

int ll_hostd_policy_nslots(const ll_hostd_policy_t *self);
/* Whether SLOT is restored for a uid (*UID) and not yet claimed. */
bool ll_hostd_policy_restored(const ll_hostd_policy_t *self, int slot, unsigned *uid);
/* Lease entry I (0..LL_HOSTD_MAX_LEASES-1), conn < 0 when unused. */
const ll_hostd_lease_t *ll_hostd_policy_lease(const ll_hostd_policy_t *self, int i);
/* User entry I (0..LL_HOSTD_MAX_USERS-1); its held and busy ms at NOW,
 * the leases still open counted. */
const ll_hostd_user_t *ll_hostd_policy_user(const ll_hostd_policy_t *self, int i);
void ll_hostd_policy_user_times(const ll_hostd_policy_t *self, int i, double now, double *held_ms,
                                double *busy_ms);
/* CONN's uid, slots wanted, and whether it is registered. */
bool ll_hostd_policy_conn(const ll_hostd_policy_t *self, int conn, unsigned *uid, int *want);
/* Leases open now (over-committed ones included), and the slots they hold. */
int ll_hostd_policy_nleases(const ll_hostd_policy_t *self);
int ll_hostd_policy_busy_slots(const ll_hostd_policy_t *self);

#endif
