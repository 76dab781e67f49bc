/* ll_sim_looseleaf: LooseLeaf in the fleet simulator, with or without
 * edit-time prefetch.  Runs in the `looseleaf simulate` process.
 *
 * Each powered host is what the host pool is, minus the processes: its
 * slots, queue, warm workers, staged workers and prefetch credits are an
 * ll_sched (policy/ll_sched.h, GreedyDual eviction inside: policy/ll_greedydual.h),
 * driven the way zygote/ll_hostpool_schedule.c drives it: a pass after every
 * event on the host, each decision applied (a fork, a hand-over to a warm
 * worker, an eviction and the restaged preparation it asks for, a skip),
 * workers' messages (ready, prepared, saving, reply, exit) arriving when the
 * cost table says the work takes.  Jobs go to hosts by ll_place
 * (consolidation), hosts come and go by ll_provision (ll_sim_fleet.c).
 *
 * What a job costs (cost table, sim/costs.json):
 *   cold cell      fork + imports the head lacks + CUDA start + restore of
 *                  the closure (+ the network when its state is elsewhere)
 *   warm hit       the hand-over + restore of what CPU cells wrote since
 *   staged hit     the hand-over + CUDA start + the deferred restore (GPU
 *                  hosts: a staged worker only imported)
 *   prefetch       as a cold cell into a slot; staged: fork + imports
 *   after the cell save of what it wrote, then the reply (the output)
 * Ablations, each LooseLeaf with one mechanism off, the rest as
 * above:
 *   noclosure      a worker restores the whole namespace, not the closure
 *   fullsave       after a cell the whole namespace is saved, not its writes
 *   noimportcache  a cold worker is a fresh interpreter importing the whole
 *                  import closure (python_start_s + import_all_s), not a
 *                  fork of a zygote holding the head (fork_s + import_tail_s)
 *   nowarm         the schedule keeps no worker warm (the pool with
 *                  LL_POOL_WARM_IDLE_S=0): every cell is a cold one; as in
 *                  the pool, a prefetched worker is not kept either, so this
 *                  loses prefetch's gain too
 * A session's jobs live on one host at a time, its home; a job placed on
 * another host first lets the old home go, as a kernel leaving that pool
 * would (ll_hostpool_client_left). */
#include "sim/ll_sim_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    EV_PLACE = LL_SIM_EV_DESIGN, /* S's cell (A = LL_SCHED_CELL) or prefetch reaches the pools */
    EV_READY,                    /* job B's worker on host A is ready (prepared) */
    EV_EXEC_END,                 /* job B's cell ran: its save starts */
    EV_SAVED,                    /* job B's save committed: the reply */
    EV_GONE,                     /* job B's worker exited */
    EV_IDLE,                     /* host A's worker B (its key) may have been idle warm_idle_s */
};

/* Job R of a host, beside the schedule's entry of the same index. */
typedef struct {
    ll_sim_sess_t *s; /* whose job; NULL: the entry is free */
    int cell;         /* the cell it runs or prepares */
    uint32_t tok;     /* its events carry it: a cleared entry ignores old ones */
    bool had_slot;    /* its worker held a slot (on a GPU host: started CUDA) */
    bool deferred;    /* staged on a GPU host: its restore waits for a slot */
    bool changed;     /* a prefetch forked or restored something */
    bool prepared;    /* a prefetch prepared the worker since its last cell */
    bool warm;        /* a cell handed to a warm worker */
    bool staged_hit;  /* ... a staged one, promoted into a slot */
    bool executing;   /* counted in the EXEC level */
    bool idle_timer;  /* an EV_IDLE for it is pending (one at a time) */
} s_job_t;

typedef struct {
    ll_sched_t *sched;               /* the host pool's decisions */
    s_job_t jobs[LL_SCHED_MAX_JOBS]; /* what the simulator keeps per job */
    double mem_used;                 /* bytes of sessions' state homed here */
    int busy, warm;                  /* slots counted in the levels */
} s_host_t;

typedef struct {
    ll_sim_t *sim;
    int d;
    const ll_cost_t *c; /* costs */
    bool gpu;           /* GPU hosts */
    int G;              /* slots per host */
    ll_sim_fleet_t *fleet;
    int next_key;        /* worker pids */
    ll_sim_queue_t wait; /* GPU cells no host could take yet */
    bool closures;       /* restore the closure (off: the namespace) */
    bool incremental;    /* save what the cell wrote (off: the namespace) */
    bool import_cache;   /* fork from a zygote with the head (off: a fresh interpreter) */
    bool warm;           /* keep workers warm after their cell */
} s_ll_t;

/* What S's current cell J restores when its worker is made, and saves. */
static double s_closure_bytes(const s_ll_t *L, const ll_trace_cell_t *c)
{
    return L->closures ? c->closure_bytes : c->namespace_bytes;
}

static s_host_t *s_host(s_ll_t *L, int i)
{
    return i >= 0 && i < ll_sim_fleet_nhosts(L->fleet) ? ll_sim_fleet_host(L->fleet, i)->priv
                                                       : NULL;
}

static int s_client(const ll_sim_sess_t *s)
{
    return (int) (s->tr->index % 2000000000L);
}

static void s_clear(s_host_t *h, int r)
{
    uint32_t tok = h->jobs[r].tok + 1;
    memset(&h->jobs[r], 0, sizeof h->jobs[r]);
    h->jobs[r].tok = tok;
}

/* Restoring BYTES of S's state on its host at the current costs. */
static double s_restore(s_ll_t *L, ll_sim_sess_t *s, double bytes)
{
    ll_sim_ds_t *ds = &s->ds[L->d];
    double t = L->c->restore_fixed_s + bytes / L->c->h2d_bw;
    if (ds->remote) {
        t += bytes / L->c->net_bw;
        ds->remote = false;
    }
    return t;
}

/* Slots held on host I: by jobs, by idle warm workers; the levels follow. */
static void s_count(s_ll_t *L, int i, double now)
{
    s_host_t *h = s_host(L, i);
    int busy = 0, warm = 0;
    for (int k = 0; k < L->G; k++) {
        int r = ll_sched_slot_job(h->sched, k);
        if (r < 0)
            continue;
        if (ll_sched_job(h->sched, r)->state == LL_SCHED_WARM)
            warm++;
        else
            busy++;
    }
    if (busy != h->busy)
        ll_sim_level(L->sim, L->d, LL_SIM_BUSY, now, busy - h->busy);
    if (busy + warm != h->busy + h->warm)
        ll_sim_level(L->sim, L->d, LL_SIM_HELD, now, busy + warm - h->busy - h->warm);
    h->busy = busy;
    h->warm = warm;
}

/* Job R's worker became warm at NOW: it leaves warm_idle_s later unless
 * used.  One timer per worker (it follows the worker from entry to entry):
 * when it fires it looks whether the worker became warm again since, and
 * waits for that instead. */
static void s_idle_timer(s_ll_t *L, int i, int r, double now)
{
    s_host_t *h = s_host(L, i);
    s_job_t *j = &h->jobs[r];
    if (j->idle_timer)
        return;
    j->idle_timer = true;
    ll_sim_at(L->sim, now + L->c->warm_idle_s, L->d, EV_IDLE, NULL, i,
              ll_sched_job(h->sched, r)->worker.key, 0);
}

static void s_pass(s_ll_t *L, int i, double now);

/* EV_IDLE: worker KEY on host I. */
static void s_idle(s_ll_t *L, int i, int key, double now)
{
    s_host_t *h = s_host(L, i);
    int r = 0, end = h ? ll_sched_jobs_end(h->sched) : 0;
    while (r < end &&
           !(ll_sched_job(h->sched, r)->state && ll_sched_job(h->sched, r)->worker.key == key))
        r++;
    if (r == end)
        return; /* it is gone */
    const ll_sched_job_t *j = ll_sched_job(h->sched, r);
    h->jobs[r].idle_timer = false;
    if (j->state != LL_SCHED_WARM)
        return; /* busy again: it gets a timer when it is warm again */
    double due = j->worker.idle_since / 1000.0 + L->c->warm_idle_s;
    if (now < due - 1e-6) {
        h->jobs[r].idle_timer = true;
        ll_sim_at(L->sim, due, L->d, EV_IDLE, NULL, i, key, 0);
        return;
    }
    ll_sched_release(h->sched, r, NULL);
    ll_sim_at(L->sim, now + L->c->worker_exit_s, L->d, EV_GONE, NULL, i, r, h->jobs[r].tok);
    s_pass(L, i, now);
}

/* ---- decisions, applied as ll_hostpool_schedule.c applies them ---- */

static void s_fork(s_ll_t *L, int i, int r, int slot, double now)
{
    s_host_t *h = s_host(L, i);
    s_job_t *j = &h->jobs[r];
    ll_sim_sess_t *s = j->s;
    const ll_trace_cell_t *c = &s->tr->cells[j->cell];
    ll_sched_set_worker(h->sched, r, ++L->next_key);
    double prep =
        L->import_cache ? L->c->fork_s + c->import_tail_s : L->c->python_start_s + c->import_all_s;
    j->had_slot = slot >= 0;
    j->changed = true;
    j->prepared = j->warm = j->staged_hit = j->deferred = false;
    if (slot >= 0 || !L->gpu) {
        if (slot >= 0 && L->gpu)
            prep += L->c->cuda_init_s;
        prep += s_restore(L, s, s_closure_bytes(L, c));
        s->ds[L->d].dirty_bytes = 0;
    } else {
        j->deferred = true; /* staged on a GPU host: it only imports */
    }
    ll_sim_at(L->sim, now + prep, L->d, EV_READY, NULL, i, r, j->tok);
}

static void s_hand(s_ll_t *L, int i, const ll_sched_decision_t *d, double now)
{
    s_host_t *h = s_host(L, i);
    s_job_t *j = &h->jobs[d->r], *w = &h->jobs[d->w];
    j->had_slot = w->had_slot;
    j->deferred = w->deferred;
    j->prepared = w->prepared;
    j->idle_timer = w->idle_timer;
    s_clear(h, d->w);
    ll_sim_sess_t *s = j->s;
    ll_sim_ds_t *ds = &s->ds[L->d];
    const ll_trace_cell_t *c = &s->tr->cells[j->cell];
    double prep = L->c->warm_prep_s;
    bool promoted = !j->had_slot && d->slot >= 0;
    j->changed = false;
    if (promoted) {
        j->had_slot = true;
        if (L->gpu)
            prep += L->c->cuda_init_s;
        if (j->deferred) {
            prep += s_restore(L, s, s_closure_bytes(L, c));
            j->deferred = false;
            ds->dirty_bytes = 0;
            j->changed = true;
        }
    }
    if (!j->deferred && ds->dirty_bytes > 0) {
        prep += s_restore(L, s, fmin(ds->dirty_bytes, s_closure_bytes(L, c)));
        ds->dirty_bytes = 0;
        j->changed = true;
    }
    if (ll_sched_job(h->sched, d->r)->kind == LL_SCHED_CELL) {
        j->warm = true;
        j->staged_hit = d->staged_hit;
    }
    ll_sim_at(L->sim, now + prep, L->d, EV_READY, NULL, i, d->r, j->tok);
}

static void s_evict(s_ll_t *L, int i, const ll_sched_decision_t *d, double now)
{
    s_host_t *h = s_host(L, i);
    ll_sim_at(L->sim, now + L->c->worker_exit_s, L->d, EV_GONE, NULL, i, d->w, h->jobs[d->w].tok);
    const ll_sched_job_t *wj = ll_sched_job(h->sched, d->w);
    if (!d->restage || !h->jobs[d->w].s)
        return;
    /* Its session is prepared again, staged (ll_hostpool_schedule.c s_restage). */
    int r = ll_sched_add(h->sched, wj->client, wj->session, LL_SCHED_RESTAGE, 0, now * 1000.0);
    if (r < 0)
        return;
    s_clear(h, r);
    h->jobs[r].s = h->jobs[d->w].s;
    h->jobs[r].cell = h->jobs[d->w].cell;
}

/* One pass of host I's schedule at NOW, its decisions applied. */
static void s_pass(s_ll_t *L, int i, double now)
{
    s_host_t *h = s_host(L, i);
    ll_sched_decision_t d;
    ll_sched_begin(h->sched, now * 1000.0, true);
    while (ll_sched_next(h->sched, &d)) {
        switch (d.op) {
        case LL_SCHED_FORK: s_fork(L, i, d.r, d.slot, now); break;
        case LL_SCHED_HAND: s_hand(L, i, &d, now); break;
        case LL_SCHED_EVICT: s_evict(L, i, &d, now); break;
        case LL_SCHED_SKIP:
        case LL_SCHED_DROP:
            ll_sched_drop(h->sched, d.r, now * 1000.0);
            s_clear(h, d.r);
            break;
        case LL_SCHED_WAIT: break;
        }
    }
    s_count(L, i, now);
    ll_sim_fleet_touched(L->fleet, i, now);
}

/* ---- sessions and hosts ---- */

/* S's kernel leaves host I (its session ended, or its next job goes to
 * another host): what ll_hostpool_client_left does, then the pool's bill. */
static void s_leave_host(s_ll_t *L, ll_sim_sess_t *s, int i, double now)
{
    s_host_t *h = s_host(L, i);
    if (!h)
        return;
    int client = s_client(s);
    for (int r = 0; r < ll_sched_jobs_end(h->sched); r++) {
        const ll_sched_job_t *j = ll_sched_job(h->sched, r);
        if (!j->state || j->client != client)
            continue;
        if (j->state == LL_SCHED_QUEUED) {
            ll_sched_drop(h->sched, r, now * 1000.0);
            s_clear(h, r);
        } else if (j->state == LL_SCHED_WARM) {
            ll_sched_release(h->sched, r, NULL);
            ll_sim_at(L->sim, now + L->c->worker_exit_s, L->d, EV_GONE, NULL, i, r, h->jobs[r].tok);
        } else if (j->state != LL_SCHED_EVICTING && j->state != LL_SCHED_SAVING) {
            /* A preparing prefetch (or restage) is killed: gone once it exits. */
            h->jobs[r].tok++;
            ll_sim_at(L->sim, now + L->c->worker_exit_s, L->d, EV_GONE, NULL, i, r, h->jobs[r].tok);
        }
    }
    int si = ll_sched_session_find(h->sched, client, s->tr->id);
    ll_sim_ds_t *ds = &s->ds[L->d];
    if (si >= 0) {
        /* The pool's bill: slot-held time over the time the kernel was
         * connected to this pool (from its first job here). */
        ll_sim_bill(L->sim, L->d, ll_sched_session_held(h->sched, si, now * 1000.0) / 1000.0,
                    now - ds->t_pool);
        ll_sched_session_close(h->sched, si);
    }
    ds->t_pool = -1;
    ll_sched_client_gone(h->sched, client);
    h->mem_used -= ds->resident;
    ds->resident = 0;
    s_pass(L, i, now);
}

static void s_wait(s_ll_t *L, ll_sim_sess_t *s)
{
    ll_sim_queue_push(&L->wait, s);
    s->ds[L->d].waiting = true;
}

/* S's worker on host I: whether it has one there (not leaving), and
 * whether one holds a slot. */
static bool s_worker_at(s_ll_t *L, ll_sim_sess_t *s, int i, bool *slot)
{
    s_host_t *h = s_host(L, i);
    bool any = false;
    *slot = false;
    int client = s_client(s);
    for (int r = 0; h && r < ll_sched_jobs_end(h->sched); r++) {
        const ll_sched_job_t *j = ll_sched_job(h->sched, r);
        if (!j->state || j->client != client || j->state == LL_SCHED_QUEUED ||
            j->state == LL_SCHED_EVICTING)
            continue;
        any = true;
        *slot = *slot || j->slot >= 0;
    }
    return any;
}

/* A job of S (a cell, or a prefetch for the cell being edited) reaches the
 * fleet at NOW: placed on a host, queued in its schedule, a pass. */
static void s_place(s_ll_t *L, ll_sim_sess_t *s, ll_sched_kind_t kind, double now)
{
    ll_sim_ds_t *ds = &s->ds[L->d];
    const ll_trace_cell_t *c = ll_sim_cell(s, L->d);
    ll_place_ask_t ask = {.home = -1, .state_bytes = c->namespace_bytes};
    bool slot = false;
    if (ds->host >= 0 && s_worker_at(L, s, ds->host, &slot)) {
        ask.home = ds->host;
        ask.home_slot = slot;
    }
    ll_place_how_t how;
    int i = ll_sim_fleet_place(L->fleet, &ask, &how, now);
    if (i < 0) {
        if (kind == LL_SCHED_CELL)
            s_wait(L, s);
        return; /* a prefetch that finds no host is not sent */
    }
    if (i != ds->host) {
        if (ds->host >= 0)
            s_leave_host(L, s, ds->host, now);
        ds->resident = 0; /* (its old home may be off: nothing to give back) */
        ds->host = i;
        ds->remote = true; /* its state is elsewhere: the first restore pulls it */
    }
    s_host_t *h = s_host(L, i);
    if (ds->t_pool < 0)
        ds->t_pool = now; /* its kernel connects to this pool */
    h->mem_used += c->namespace_bytes - ds->resident;
    ds->resident = c->namespace_bytes;
    ll_sched_session_open(h->sched, s_client(s), s->tr->id);
    int r = ll_sched_add(h->sched, s_client(s), s->tr->id, kind,
                         kind == LL_SCHED_CELL ? 0 : s_closure_bytes(L, c), now * 1000.0);
    if (r < 0) {
        if (kind == LL_SCHED_CELL)
            s_wait(L, s); /* its table is full: as if no host could take it */
        return;
    }
    s_clear(h, r);
    h->jobs[r].s = s;
    h->jobs[r].cell = ds->cell;
    s_pass(L, i, now);
}

/* ---- events ---- */

static void s_ready(s_ll_t *L, int i, int r, double now)
{
    s_host_t *h = s_host(L, i);
    s_job_t *j = &h->jobs[r];
    ll_sim_sess_t *s = j->s;
    const ll_trace_cell_t *c = &s->tr->cells[j->cell];
    ll_sched_ready(h->sched, r);
    if (ll_sched_job(h->sched, r)->kind == LL_SCHED_CELL) {
        int flags = (j->warm ? LL_SIM_WARM : 0) | (j->prepared ? LL_SIM_PREFETCHED : 0) |
                    (j->staged_hit ? LL_SIM_STAGED : 0);
        ll_sim_started(L->sim, L->d, s, now, flags);
        ll_sim_level(L->sim, L->d, LL_SIM_EXEC, now, 1);
        j->executing = true;
        ll_sim_at(L->sim, now + c->exec_s, L->d, EV_EXEC_END, NULL, i, r, j->tok);
    } else if (ll_sched_prepared(h->sched, r, true, j->changed, s_closure_bytes(L, c),
                                 now * 1000.0)) {
        j->prepared = true;
        s_idle_timer(L, i, r, now);
    } else {
        ll_sched_drop(h->sched, r, now * 1000.0);
        s_clear(h, r);
    }
    s_pass(L, i, now);
}

static void s_exec_end(s_ll_t *L, int i, int r, double now)
{
    s_host_t *h = s_host(L, i);
    s_job_t *j = &h->jobs[r];
    const ll_trace_cell_t *c = &j->s->tr->cells[j->cell];
    ll_sched_saving(h->sched, r);
    ll_sim_level(L->sim, L->d, LL_SIM_EXEC, now, -1);
    j->executing = false;
    double save = L->c->save_fixed_s +
                  (L->incremental ? c->written_bytes : c->namespace_bytes) / L->c->d2h_bw;
    ll_sim_at(L->sim, now + save, L->d, EV_SAVED, NULL, i, r, j->tok);
}

static void s_saved(s_ll_t *L, int i, int r, double now)
{
    s_host_t *h = s_host(L, i);
    s_job_t *j = &h->jobs[r];
    ll_sim_sess_t *s = j->s;
    const ll_trace_cell_t *c = &s->tr->cells[j->cell];
    double held = s_closure_bytes(L, c) + c->written_bytes;
    if (ll_sched_replied(h->sched, r, true, held, now * 1000.0)) {
        j->prepared = j->warm = j->staged_hit = false;
        s_idle_timer(L, i, r, now);
    } else {
        ll_sched_drop(h->sched, r, now * 1000.0);
        s_clear(h, r);
    }
    ll_sim_cell_done(L->sim, L->d, s, now);
    s_pass(L, i, now);
}

static void s_event(void *st, const ll_sim_ev_t *ev)
{
    s_ll_t *L = st;
    if (ll_sim_fleet_event(L->fleet, ev))
        return;
    double now = ev->t;
    if (ev->kind == EV_IDLE) {
        s_idle(L, ev->a, ev->b, now);
        return;
    }
    if (ev->kind == EV_PLACE) {
        ll_sim_ds_t *ds = &ev->s->ds[L->d];
        if (ev->a == LL_SCHED_CELL)
            s_place(L, ev->s, LL_SCHED_CELL, now);
        else if (ev->gen == ds->gen && !ds->done)
            s_place(L, ev->s, LL_SCHED_PREFETCH, now);
        return;
    }
    s_host_t *h = s_host(L, ev->a);
    if (!h || h->jobs[ev->b].tok != ev->gen)
        return; /* the entry moved on (a hand-over, a kill) or the host is gone */
    int i = ev->a, r = ev->b;
    switch (ev->kind) {
    case EV_READY: s_ready(L, i, r, now); break;
    case EV_EXEC_END: s_exec_end(L, i, r, now); break;
    case EV_SAVED: s_saved(L, i, r, now); break;
    case EV_GONE:
        ll_sched_drop(h->sched, r, now * 1000.0);
        s_clear(h, r);
        s_pass(L, i, now);
        break;
    }
}

/* ---- the fleet's view of a host ---- */

static void s_refresh(void *st, int i, ll_place_host_t *snap)
{
    s_ll_t *L = st;
    s_host_t *h = s_host(L, i);
    if (!h)
        return;
    snap->busy = h->busy;
    snap->warm = h->warm;
    for (int r = 0; r < ll_sched_jobs_end(h->sched); r++) {
        const ll_sched_job_t *j = ll_sched_job(h->sched, r);
        if (j->state == LL_SCHED_QUEUED && j->kind == LL_SCHED_CELL)
            snap->queued++;
        else if (j->slot < 0 && (j->state == LL_SCHED_FORKING || j->state == LL_SCHED_PREPARING ||
                                 j->state == LL_SCHED_WARM))
            snap->staged++;
    }
    snap->mem_free = L->c->host_mem_bytes - h->mem_used;
}

static void s_host_on(void *st, int i, double now)
{
    s_ll_t *L = st;
    s_host_t *h = calloc(1, sizeof *h);
    if (h)
        h->sched = ll_sched_new(L->G, (int) (L->c->staged_per_slot * L->G),
                                L->c->spec_window_s * 1000.0, L->warm && L->c->warm_idle_s > 0);
    if (!h || !h->sched) {
        fprintf(stderr, "looseleaf simulate: out of memory (a host)\n");
        abort();
    }
    ll_sim_fleet_host(L->fleet, i)->priv = h;
}

static void s_host_off(void *st, int i, double now)
{
    s_ll_t *L = st;
    s_host_t *h = s_host(L, i);
    if (!h)
        return;
    s_count(L, i, now); /* nothing held: the levels are already there */
    ll_sched_destroy(&h->sched);
    free(h);
    ll_sim_fleet_host(L->fleet, i)->priv = NULL;
}

static void s_capacity(void *st, double now)
{
    s_ll_t *L = st;
    ll_sim_queue_t w = L->wait; /* placing one may queue it again */
    L->wait = (ll_sim_queue_t){0};
    for (int k = 0; k < w.n; k++) {
        w.q[k]->ds[L->d].waiting = false;
        s_place(L, w.q[k], LL_SCHED_CELL, now);
    }
    free(w.q);
}

static int s_waiting(void *st)
{
    return ((s_ll_t *) st)->wait.n;
}

static const ll_sim_fleet_ops_t s_fleet_ops = {
    .refresh = s_refresh,
    .host_on = s_host_on,
    .host_off = s_host_off,
    .capacity = s_capacity,
    .waiting = s_waiting,
};

/* ---- the design ---- */

static void *s_create(ll_sim_t *sim, int d)
{
    s_ll_t *L = calloc(1, sizeof *L);
    if (!L)
        return NULL;
    const ll_sim_config_t *cfg = ll_sim_cfg(sim);
    L->sim = sim;
    L->d = d;
    L->c = &cfg->cost;
    L->gpu = cfg->gpu;
    L->G = cfg->gpus_per_host;
    L->closures = d != LL_SIM_LOOSELEAF_NOCLOSURE;
    L->incremental = d != LL_SIM_LOOSELEAF_FULLSAVE;
    L->import_cache = d != LL_SIM_LOOSELEAF_NOIMPORT;
    L->warm = d != LL_SIM_LOOSELEAF_NOWARM;
    L->fleet = ll_sim_fleet_new(sim, d, &s_fleet_ops, L);
    if (!L->fleet) {
        free(L);
        return NULL;
    }
    return L;
}

static void s_destroy(void *st)
{
    s_ll_t *L = st;
    ll_sim_fleet_destroy(&L->fleet);
    free(L->wait.q);
    free(L);
}

static void s_start(void *st, ll_sim_sess_t *s, double now)
{
    s_ll_t *L = st;
    ll_sim_fleet_start(L->fleet, now);
    s->ds[L->d].remote = true;
}

/* When a GPU job the kernel starts at NOW reaches the pools: after its
 * analysis and routing, and for the session's first, after the kernel
 * opened its store and committed what CPU cells made (the kernel does one
 * thing at a time: a job behind that waits for it too). */
static double s_kernel_s(s_ll_t *L, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[L->d];
    if (!ds->store_open) {
        ds->store_open = true;
        ds->t_store = now + L->c->first_commit_s;
    }
    return (ds->t_store > now ? ds->t_store : now) + L->c->kernel_route_s;
}

static void s_prefetch(void *st, ll_sim_sess_t *s, double now)
{
    s_ll_t *L = st;
    ll_sim_at(L->sim, s_kernel_s(L, s, now), L->d, EV_PLACE, s, LL_SCHED_PREFETCH, 0,
              s->ds[L->d].gen);
}

static void s_run_gpu(void *st, ll_sim_sess_t *s, double now)
{
    s_ll_t *L = st;
    ll_sim_at(L->sim, s_kernel_s(L, s, now), L->d, EV_PLACE, s, LL_SCHED_CELL, 0, 0);
}

static void s_leave(void *st, ll_sim_sess_t *s, double now)
{
    s_ll_t *L = st;
    ll_sim_ds_t *ds = &s->ds[L->d];
    if (ds->host >= 0)
        s_leave_host(L, s, ds->host, now);
    ds->host = -1;
}

static void s_finish(void *st, double now)
{
    s_ll_t *L = st;
    ll_sim_fleet_finish(L->fleet, now);
}

const ll_sim_ops_t ll_sim_looseleaf_ops = {
    .create = s_create,
    .destroy = s_destroy,
    .start = s_start,
    .prefetch = s_prefetch,
    .run_gpu = s_run_gpu,
    .cpu_done = NULL,
    .leave = s_leave,
    .event = s_event,
    .finish = s_finish,
};

/* Without edit-time prefetch: the engine sends it no hints. */
const ll_sim_ops_t ll_sim_looseleaf_nopf_ops = {
    .create = s_create,
    .destroy = s_destroy,
    .start = s_start,
    .prefetch = NULL,
    .run_gpu = s_run_gpu,
    .cpu_done = NULL,
    .leave = s_leave,
    .event = s_event,
    .finish = s_finish,
};
