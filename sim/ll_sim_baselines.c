/* ll_sim_baselines: the designs LooseLeaf is compared with in the fleet
 * simulator, each as simple as its published description and
 * charged from the same cost table (sim/costs.json).  Runs in the
 * `looseleaf simulate` process, single-threaded.
 *
 * pinned      Colab-style: a session holds one GPU from connect to close,
 *             placed best-fit (the fullest host with a free GPU); a host
 *             powers off as soon as it is empty.  Its host is ready when the
 *             session connects (the wait to connect is no cell's latency:
 *             pinned's best case).  A GPU cell starts at once; the session's
 *             first pays the CUDA start.
 * pinned_packed  pinned's lower bound, an ideally packed fleet: at every
 *             instant ceil(sessions connected / G) hosts, as if sessions
 *             moved between hosts for free whenever one left (no real
 *             scheduler does that; it is the floor any pinned placement
 *             sits on).  Cells as pinned's.
 * keepalive   Modal-style: a GPU container per session, made at a GPU cell
 *             when there is none (a fresh process: interpreter, every import
 *             of the cell's closure, CUDA start, the whole namespace loaded:
 *             the state was discarded, and reloading it from a snapshot is
 *             its cheapest way back) and discarded keepalive_idle_s after
 *             the session's last cell.  Hosts: the elastic fleet, the same
 *             rules as LooseLeaf's and naive's (a container holds a slot
 *             while it lives; the controller provisions for the containers
 *             held).  It used to get its own idealised hosts (ready at
 *             once, off once empty) while LooseLeaf paid for boots and
 *             headroom; fleet_shared=1 gives that to all three alike.
 * notebookos  NotebookOS: nbos_replicas replicas per kernel on distinct
 *             hosts (the least subscribed; a host takes replicas up to
 *             nbos_subscription GPU requests per GPU, more hosts boot when
 *             none has room); a GPU cell binds a free GPU on one of its
 *             replicas' hosts and moves the state to it (the namespace in,
 *             and out after the cell); the other replicas catch up on the
 *             cell's writes over the network in the gap (a cell on one of
 *             them waits for that).  No free GPU on a replica's host: the
 *             replica migrates to a host with one (a fresh process and the
 *             state over the network); none anywhere: a host boots.  A host
 *             powers off once no replica and no cell is left on it.
 * naive       serverless without LooseLeaf's mechanisms: every GPU cell in a
 *             fresh process (interpreter, every import, CUDA start, the whole
 *             namespace unpickled), and the whole namespace pickled back
 *             after it.  Hosts: the elastic fleet. */
#include "sim/ll_sim_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    EV_START = LL_SIM_EV_DESIGN, /* S's GPU cell starts executing (B: flags) */
    EV_END,                      /* ... its execution ended */
    EV_DONE,                     /* ... its GPU is given back (after a save or copy) */
    EV_IDLE,                     /* keep-alive: S's container may have idled out */
    EV_BOOTED,                   /* pinned, NotebookOS: host A is ready (GEN) */
};

/* A host of the designs that manage their own (pinned, NotebookOS). */
typedef struct {
    ll_sim_host_state_t state;
    int used;     /* GPUs in use */
    int replicas; /* NotebookOS: replicas it holds */
    uint32_t gen; /* its boot's token */
} s_bhost_t;

/* State of any baseline. */
typedef struct {
    ll_sim_t *sim;
    int d;
    const ll_cost_t *c;
    int G;
    int max_hosts;
    double cuda;  /* CUDA start (0 without GPUs) */
    s_bhost_t *h; /* pinned, NotebookOS */
    int n, cap;
    ll_sim_fleet_t *fleet; /* keep-alive, naive */
    int *used;             /* ... GPUs in use per fleet host */
    int nused;
    ll_sim_queue_t wait; /* GPU cells (keep-alive, naive, NotebookOS) or sessions (pinned) */
    int packed_sessions, packed_hosts; /* pinned_packed: sessions connected, hosts powered */
} s_base_t;

static s_base_t *s_new(ll_sim_t *sim, int d)
{
    s_base_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    const ll_sim_config_t *cfg = ll_sim_cfg(sim);
    b->sim = sim;
    b->d = d;
    b->c = &cfg->cost;
    b->G = cfg->gpus_per_host;
    b->max_hosts = cfg->max_hosts;
    b->cuda = cfg->gpu ? cfg->cost.cuda_init_s : 0;
    return b;
}

static void s_destroy(void *st)
{
    s_base_t *b = st;
    ll_sim_fleet_destroy(&b->fleet);
    free(b->h);
    free(b->used);
    free(b->wait.q);
    free(b);
}

/* A host of B's own, powered at NOW; ready at once (READY) or after its
 * boot.  -1 when the fleet is at its size or out of memory. */
static int s_bhost_on(s_base_t *b, double now, bool ready)
{
    int i = 0, powered = 0;
    for (int k = 0; k < b->n; k++)
        powered += b->h[k].state != LL_SIM_HOST_OFF;
    if (b->max_hosts > 0 && powered >= b->max_hosts)
        return -1;
    while (i < b->n && b->h[i].state != LL_SIM_HOST_OFF)
        i++;
    if (i == b->n) {
        if (b->n == b->cap) {
            int cap = b->cap ? 2 * b->cap : 16;
            s_bhost_t *h = realloc(b->h, (size_t) cap * sizeof *h);
            if (!h)
                return -1;
            b->h = h;
            b->cap = cap;
        }
        memset(&b->h[b->n], 0, sizeof b->h[b->n]);
        b->n++;
    }
    s_bhost_t *h = &b->h[i];
    h->state = ready ? LL_SIM_HOST_ON : LL_SIM_HOST_BOOTING;
    h->used = h->replicas = 0;
    h->gen++;
    ll_sim_level(b->sim, b->d, LL_SIM_POWERED, now, 1);
    if (!ready)
        ll_sim_at(b->sim, now + b->c->host_boot_s, b->d, EV_BOOTED, NULL, i, 0, h->gen);
    return i;
}

static void s_bhost_off(s_base_t *b, int i, double now)
{
    b->h[i].state = LL_SIM_HOST_OFF;
    b->h[i].gen++;
    ll_sim_level(b->sim, b->d, LL_SIM_POWERED, now, -1);
}

static void s_finish_own(void *st, double now)
{
    s_base_t *b = st;
    for (int i = 0; i < b->n; i++)
        if (b->h[i].state != LL_SIM_HOST_OFF)
            s_bhost_off(b, i, now);
    if (b->fleet)
        ll_sim_fleet_finish(b->fleet, now);
}

/* S's GPU cell starts at T (its latency is T - Run; FLAGS as for
 * ll_sim_started), runs, and its GPU is given back DONE_AFTER after it
 * ends. */
static void s_schedule_start(s_base_t *b, ll_sim_sess_t *s, double t, int flags)
{
    ll_sim_at(b->sim, t, b->d, EV_START, s, 0, flags, 0);
}

static void s_started(s_base_t *b, const ll_sim_ev_t *ev)
{
    ll_sim_started(b->sim, b->d, ev->s, ev->t, ev->b);
    ll_sim_level(b->sim, b->d, LL_SIM_EXEC, ev->t, 1);
    ll_sim_at(b->sim, ev->t + ll_sim_cell(ev->s, b->d)->exec_s, b->d, EV_END, ev->s, 0, 0, 0);
}

/* ------------------------------------------------------------------ */
/* pinned                                                             */

static void *s_pinned_create(ll_sim_t *sim, int d)
{
    return s_new(sim, d);
}

/* Best fit at NOW: the fullest host with a free GPU, else a new host
 * (ready at once); -1 when the fleet is at its size. */
static int s_best_fit(s_base_t *b, double now)
{
    int best = -1;
    for (int i = 0; i < b->n; i++)
        if (b->h[i].state == LL_SIM_HOST_ON && b->h[i].used < b->G &&
            (best < 0 || b->h[i].used > b->h[best].used))
            best = i;
    return best >= 0 ? best : s_bhost_on(b, now, true);
}

/* Bind a GPU to S at NOW, best fit.  False when the fleet is full. */
static bool s_pinned_bind(s_base_t *b, ll_sim_sess_t *s, double now)
{
    int best = s_best_fit(b, now);
    if (best < 0)
        return false;
    b->h[best].used++;
    s->ds[b->d].host = best;
    s->ds[b->d].bound = true;
    ll_sim_level(b->sim, b->d, LL_SIM_HELD, now, 1);
    return true;
}

static void s_pinned_run(s_base_t *b, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[b->d];
    double lat = ds->cuda ? 0 : b->cuda;
    ds->cuda = true;
    s_schedule_start(b, s, now + lat, LL_SIM_WARM);
}

static void s_pinned_start(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    if (!s_pinned_bind(b, s, now))
        ll_sim_queue_push(&b->wait, s);
}

static void s_pinned_run_gpu(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    if (s->ds[b->d].bound)
        s_pinned_run(b, s, now);
    else
        s->ds[b->d].waiting = true; /* no GPU yet: it starts when the session gets one */
}

static void s_pinned_leave(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    ll_sim_ds_t *ds = &s->ds[b->d];
    if (!ds->bound) {
        for (int k = 0; k < b->wait.n; k++)
            if (b->wait.q[k] == s)
                b->wait.q[k] = b->wait.q[--b->wait.n]; /* (order matters little here) */
        return;
    }
    s_bhost_t *h = &b->h[ds->host];
    h->used--;
    ds->bound = false;
    ll_sim_level(b->sim, b->d, LL_SIM_HELD, now, -1);
    if (h->used == 0)
        s_bhost_off(b, ds->host, now);
    while (b->wait.n > 0 && s_pinned_bind(b, b->wait.q[0], now)) {
        ll_sim_sess_t *w = b->wait.q[0];
        memmove(b->wait.q, b->wait.q + 1, (size_t) (--b->wait.n) * sizeof *b->wait.q);
        if (w->ds[b->d].waiting) {
            w->ds[b->d].waiting = false;
            s_pinned_run(b, w, now);
        }
    }
}

static void s_pinned_event(void *st, const ll_sim_ev_t *ev)
{
    s_base_t *b = st;
    switch (ev->kind) {
    case EV_START: s_started(b, ev); break;
    case EV_END:
        ll_sim_level(b->sim, b->d, LL_SIM_EXEC, ev->t, -1);
        ll_sim_cell_done(b->sim, b->d, ev->s, ev->t);
        break;
    }
}

/* ---- pinned_packed: the ideally packed bound ---- */

static void s_packed_hosts(s_base_t *b, double now)
{
    int want = (b->packed_sessions + b->G - 1) / b->G;
    if (want != b->packed_hosts)
        ll_sim_level(b->sim, b->d, LL_SIM_POWERED, now, want - b->packed_hosts);
    b->packed_hosts = want;
}

static void s_packed_start(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    b->packed_sessions++;
    s->ds[b->d].bound = true;
    ll_sim_level(b->sim, b->d, LL_SIM_HELD, now, 1);
    s_packed_hosts(b, now);
}

static void s_packed_run_gpu(void *st, ll_sim_sess_t *s, double now)
{
    s_pinned_run(st, s, now);
}

static void s_packed_leave(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    b->packed_sessions--;
    s->ds[b->d].bound = false;
    ll_sim_level(b->sim, b->d, LL_SIM_HELD, now, -1);
    s_packed_hosts(b, now);
}

static void s_packed_finish(void *st, double now)
{
    s_base_t *b = st;
    b->packed_sessions = 0;
    s_packed_hosts(b, now);
}

const ll_sim_ops_t ll_sim_pinned_packed_ops = {
    .create = s_pinned_create,
    .destroy = s_destroy,
    .start = s_packed_start,
    .prefetch = NULL,
    .run_gpu = s_packed_run_gpu,
    .cpu_done = NULL,
    .leave = s_packed_leave,
    .event = s_pinned_event,
    .finish = s_packed_finish,
};

const ll_sim_ops_t ll_sim_pinned_ops = {
    .create = s_pinned_create,
    .destroy = s_destroy,
    .start = s_pinned_start,
    .prefetch = NULL,
    .run_gpu = s_pinned_run_gpu,
    .cpu_done = NULL,
    .leave = s_pinned_leave,
    .event = s_pinned_event,
    .finish = s_finish_own,
};

/* ------------------------------------------------------------------ */
/* keep-alive and naive serverless, on the elastic fleet: a GPU taken
 * per container (keep-alive) or per cell (naive)                     */

static int *s_used(s_base_t *b, int i)
{
    if (i >= b->nused) {
        int n = ll_sim_fleet_nhosts(b->fleet) + 16;
        int *u = realloc(b->used, (size_t) n * sizeof *u);
        if (!u) {
            fprintf(stderr, "looseleaf simulate: out of memory\n");
            abort();
        }
        memset(u + b->nused, 0, (size_t) (n - b->nused) * sizeof *u);
        b->used = u;
        b->nused = n;
    }
    return &b->used[i];
}

static void s_el_refresh(void *st, int i, ll_place_host_t *snap)
{
    s_base_t *b = st;
    snap->busy = *s_used(b, i);
    snap->mem_free = b->c->host_mem_bytes;
}

static void s_el_host_on(void *st, int i, double now)
{
    s_base_t *b = st;
    *s_used(b, i) = 0;
    ll_sim_fleet_host(b->fleet, i)->priv = b; /* (marks the host as the design's) */
}

static void s_el_host_off(void *st, int i, double now)
{
    s_base_t *b = st;
    ll_sim_fleet_host(b->fleet, i)->priv = NULL;
}

static int s_el_waiting(void *st)
{
    return ((s_base_t *) st)->wait.n;
}

static void s_el_capacity(void *st, double now);

static const ll_sim_fleet_ops_t s_el_ops = {
    .refresh = s_el_refresh,
    .host_on = s_el_host_on,
    .host_off = s_el_host_off,
    .capacity = s_el_capacity,
    .waiting = s_el_waiting,
};

static void *s_el_create(ll_sim_t *sim, int d)
{
    s_base_t *b = s_new(sim, d);
    if (!b)
        return NULL;
    b->fleet = ll_sim_fleet_new(sim, d, &s_el_ops, b);
    if (!b->fleet) {
        free(b);
        return NULL;
    }
    return b;
}

static void s_el_start(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    if (b->fleet)
        ll_sim_fleet_start(b->fleet, now);
}

/* A fresh process for S's current cell: interpreter, every import, CUDA,
 * the whole namespace unpickled. */
static double s_cold(s_base_t *b, ll_sim_sess_t *s)
{
    const ll_trace_cell_t *c = ll_sim_cell(s, b->d);
    return b->c->python_start_s + c->import_all_s + b->cuda +
           c->namespace_bytes / b->c->pickle_load_bw;
}

/* Take a GPU for S at NOW: a free slot on the fleet.  False: none now (it
 * waits; the controller sees it). */
static bool s_el_take(s_base_t *b, ll_sim_sess_t *s, double now)
{
    ll_place_ask_t ask = {.home = -1, .state_bytes = 0};
    ll_place_how_t how;
    int i = ll_sim_fleet_place(b->fleet, &ask, &how, now);
    if (i < 0 || how != LL_PLACE_FREE)
        return false;
    (*s_used(b, i))++;
    ll_sim_fleet_touched(b->fleet, i, now);
    s->ds[b->d].host = i;
    s->ds[b->d].bound = true;
    ll_sim_level(b->sim, b->d, LL_SIM_BUSY, now, 1);
    ll_sim_level(b->sim, b->d, LL_SIM_HELD, now, 1);
    return true;
}

static void s_el_give(s_base_t *b, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[b->d];
    ds->bound = false;
    ll_sim_level(b->sim, b->d, LL_SIM_BUSY, now, -1);
    ll_sim_level(b->sim, b->d, LL_SIM_HELD, now, -1);
    (*s_used(b, ds->host))--;
    ll_sim_fleet_touched(b->fleet, ds->host, now);
    s_el_capacity(b, now);
}

/* S's GPU cell at NOW, with a container (keep-alive) or not. */
static void s_el_cell(s_base_t *b, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[b->d];
    if (b->d == LL_SIM_KEEPALIVE && ds->bound) {
        ds->ka_idle = -1; /* busy: not idle */
        s_schedule_start(b, s, now, LL_SIM_WARM);
        return;
    }
    if (!s_el_take(b, s, now)) {
        ds->waiting = true;
        ll_sim_queue_push(&b->wait, s);
        return;
    }
    ds->ka_idle = -1;
    s_schedule_start(b, s, now + s_cold(b, s), 0);
}

static void s_el_capacity(void *st, double now)
{
    s_base_t *b = st;
    while (b->wait.n > 0) {
        ll_sim_sess_t *s = b->wait.q[0];
        if (!s_el_take(b, s, now))
            break;
        memmove(b->wait.q, b->wait.q + 1, (size_t) (--b->wait.n) * sizeof *b->wait.q);
        s->ds[b->d].waiting = false;
        s->ds[b->d].ka_idle = -1;
        s_schedule_start(b, s, now + s_cold(b, s), 0);
    }
}

static void s_el_run_gpu(void *st, ll_sim_sess_t *s, double now)
{
    s_el_cell(st, s, now);
}

/* S's container is idle from NOW: one timer per session, which on firing
 * looks again (the idle clock may have restarted since). */
static void s_ka_idle_timer(s_base_t *b, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[b->d];
    if (!ds->bound)
        return;
    ds->ka_idle = now;
    if (!ds->ka_timer) {
        ds->ka_timer = true;
        ll_sim_hold(s); /* it may fire after the session left */
        ll_sim_at(b->sim, now + b->c->keepalive_idle_s, b->d, EV_IDLE, s, 0, 0, 0);
    }
}

static void s_el_cpu_done(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    if (b->d == LL_SIM_KEEPALIVE)
        s_ka_idle_timer(b, s, now); /* the kernel was active: the idle clock restarts */
}

static void s_el_leave(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    if (s->ds[b->d].bound)
        s_el_give(b, s, now);
}

static void s_el_event(void *st, const ll_sim_ev_t *ev)
{
    s_base_t *b = st;
    if (b->fleet && ll_sim_fleet_event(b->fleet, ev))
        return;
    ll_sim_sess_t *s = ev->s;
    switch (ev->kind) {
    case EV_START: s_started(b, ev); break;
    case EV_END: {
        ll_sim_level(b->sim, b->d, LL_SIM_EXEC, ev->t, -1);
        if (b->d == LL_SIM_KEEPALIVE) {
            /* The container stays, idle, holding its GPU (nobody may take it). */
            s_ka_idle_timer(b, s, ev->t);
            ll_sim_cell_done(b->sim, b->d, s, ev->t);
        } else {
            double dump = ll_sim_cell(s, b->d)->namespace_bytes / b->c->pickle_dump_bw;
            ll_sim_at(b->sim, ev->t + dump, b->d, EV_DONE, s, 0, 0, 0);
        }
        break;
    }
    case EV_DONE:
        s_el_give(b, s, ev->t);
        ll_sim_cell_done(b->sim, b->d, s, ev->t);
        break;
    case EV_IDLE: {
        ll_sim_ds_t *ds = &s->ds[b->d];
        ds->ka_timer = false;
        if (ds->bound && ds->ka_idle >= 0) {
            double due = ds->ka_idle + b->c->keepalive_idle_s;
            if (ev->t >= due - 1e-9) {
                s_el_give(b, s, ev->t);
            } else {
                ds->ka_timer = true; /* busy meanwhile: look again when it may be due */
                ll_sim_hold(s);
                ll_sim_at(b->sim, due, b->d, EV_IDLE, s, 0, 0, 0);
            }
        }
        ll_sim_unhold(b->sim, s);
        break;
    }
    }
}

/* An idle timer that fires after the run closed still holds its session. */
static void s_ka_dropped(void *st, const ll_sim_ev_t *ev)
{
    s_base_t *b = st;
    if (ev->kind == EV_IDLE)
        ll_sim_unhold(b->sim, ev->s);
}

const ll_sim_ops_t ll_sim_keepalive_ops = {
    .create = s_el_create,
    .destroy = s_destroy,
    .start = s_el_start,
    .prefetch = NULL,
    .run_gpu = s_el_run_gpu,
    .cpu_done = s_el_cpu_done,
    .leave = s_el_leave,
    .event = s_el_event,
    .finish = s_finish_own,
    .dropped = s_ka_dropped,
};

const ll_sim_ops_t ll_sim_naive_ops = {
    .create = s_el_create,
    .destroy = s_destroy,
    .start = s_el_start,
    .prefetch = NULL,
    .run_gpu = s_el_run_gpu,
    .cpu_done = NULL,
    .leave = s_el_leave,
    .event = s_el_event,
    .finish = s_finish_own,
};

/* ------------------------------------------------------------------ */
/* NotebookOS                                                         */

static void *s_nbos_create(ll_sim_t *sim, int d)
{
    return s_new(sim, d);
}

static int s_nbos_nrep(const s_base_t *b)
{
    int r = (int) b->c->nbos_replicas;
    return r < 1 ? 1 : r > 4 ? 4 : r;
}

static bool s_holds(const ll_sim_ds_t *ds, int n, int host)
{
    for (int k = 0; k < n; k++)
        if (ds->replica[k] == host)
            return true;
    return false;
}

static void s_nbos_start(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    ll_sim_ds_t *ds = &s->ds[b->d];
    int nrep = s_nbos_nrep(b), cap = (int) (b->c->nbos_subscription * b->G);
    for (int k = 0; k < nrep; k++) {
        int best = -1;
        for (int i = 0; i < b->n; i++)
            if (b->h[i].state != LL_SIM_HOST_OFF && b->h[i].replicas < cap && !s_holds(ds, k, i) &&
                (best < 0 || b->h[i].replicas < b->h[best].replicas))
                best = i;
        if (best < 0) /* a new host, ready at connect (as pinned's: no cell waits on it) */
            best = s_bhost_on(b, now, true);
        if (best < 0)
            break; /* the fleet is full: fewer replicas */
        b->h[best].replicas++;
        ds->replica[k] = best;
    }
}

/* Try to start S's waiting GPU cell at NOW: on a replica's host with a
 * free GPU, else by migrating a replica to a host with one.  False: no
 * free GPU anywhere. */
static bool s_nbos_try(s_base_t *b, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[b->d];
    const ll_trace_cell_t *c = ll_sim_cell(s, b->d);
    int nrep = s_nbos_nrep(b), best = -1;
    for (int k = 0; k < nrep; k++) {
        int i = ds->replica[k];
        if (i < 0 || b->h[i].state != LL_SIM_HOST_ON || b->h[i].used >= b->G)
            continue;
        if (best < 0 || i == ds->leader || (best != ds->leader && b->h[i].used < b->h[best].used))
            best = i;
    }
    double lat = c->namespace_bytes / b->c->h2d_bw; /* the state moves to the GPU */
    int flags = LL_SIM_WARM;
    if (best >= 0) {
        if (best != ds->leader && ds->sync_done > now)
            lat += ds->sync_done - now; /* that replica still catches up */
    } else {
        /* Migrate: the replica on the fullest host goes to the emptiest ON
         * host with a free GPU. */
        for (int i = 0; i < b->n; i++)
            if (b->h[i].state == LL_SIM_HOST_ON && b->h[i].used < b->G && !s_holds(ds, nrep, i) &&
                (best < 0 || b->h[i].used < b->h[best].used))
                best = i;
        if (best < 0)
            return false;
        int worst = 0;
        for (int k = 1; k < nrep; k++)
            if (ds->replica[k] >= 0 && (ds->replica[worst] < 0 ||
                                        b->h[ds->replica[k]].used > b->h[ds->replica[worst]].used))
                worst = k;
        int old = ds->replica[worst];
        if (old >= 0) {
            b->h[old].replicas--;
            if (b->h[old].replicas == 0 && b->h[old].used == 0 &&
                b->h[old].state != LL_SIM_HOST_OFF)
                s_bhost_off(b, old, now);
        }
        ds->replica[worst] = best;
        b->h[best].replicas++;
        lat += b->c->python_start_s + c->import_all_s + b->cuda + c->namespace_bytes / b->c->net_bw;
        flags = 0;
    }
    b->h[best].used++;
    ds->host = best;
    ll_sim_level(b->sim, b->d, LL_SIM_BUSY, now, 1);
    ll_sim_level(b->sim, b->d, LL_SIM_HELD, now, 1);
    s_schedule_start(b, s, now + lat, flags);
    return true;
}

/* GPUs freed or a host booted: waiting cells start, oldest first. */
static void s_nbos_retry(s_base_t *b, double now)
{
    int k = 0;
    while (k < b->wait.n) {
        ll_sim_sess_t *s = b->wait.q[k];
        if (s_nbos_try(b, s, now)) {
            memmove(b->wait.q + k, b->wait.q + k + 1,
                    (size_t) (b->wait.n - k - 1) * sizeof *b->wait.q);
            b->wait.n--;
            s->ds[b->d].waiting = false;
        } else {
            k++;
        }
    }
}

static void s_nbos_run_gpu(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    if (s_nbos_try(b, s, now))
        return;
    s->ds[b->d].waiting = true;
    ll_sim_queue_push(&b->wait, s);
    /* No free GPU anywhere: scale out, a host per G cells waiting. */
    int booting = 0;
    for (int i = 0; i < b->n; i++)
        booting += b->h[i].state == LL_SIM_HOST_BOOTING;
    if (booting * b->G < b->wait.n)
        s_bhost_on(b, now, false);
}

static void s_nbos_leave(void *st, ll_sim_sess_t *s, double now)
{
    s_base_t *b = st;
    ll_sim_ds_t *ds = &s->ds[b->d];
    for (int k = 0; k < s_nbos_nrep(b); k++) {
        int i = ds->replica[k];
        if (i < 0)
            continue;
        b->h[i].replicas--;
        if (b->h[i].replicas == 0 && b->h[i].used == 0 && b->h[i].state != LL_SIM_HOST_OFF)
            s_bhost_off(b, i, now);
        ds->replica[k] = -1;
    }
}

static void s_nbos_event(void *st, const ll_sim_ev_t *ev)
{
    s_base_t *b = st;
    ll_sim_sess_t *s = ev->s;
    switch (ev->kind) {
    case EV_START: s_started(b, ev); break;
    case EV_END: {
        ll_sim_level(b->sim, b->d, LL_SIM_EXEC, ev->t, -1);
        const ll_trace_cell_t *c = ll_sim_cell(s, b->d);
        ll_sim_at(b->sim, ev->t + c->namespace_bytes / b->c->d2h_bw, b->d, EV_DONE, s, 0, 0, 0);
        break;
    }
    case EV_DONE: {
        ll_sim_ds_t *ds = &s->ds[b->d];
        const ll_trace_cell_t *c = ll_sim_cell(s, b->d);
        s_bhost_t *h = &b->h[ds->host];
        h->used--;
        ll_sim_level(b->sim, b->d, LL_SIM_BUSY, ev->t, -1);
        ll_sim_level(b->sim, b->d, LL_SIM_HELD, ev->t, -1);
        ds->leader = ds->host;
        ds->sync_done = ev->t + c->written_bytes / b->c->net_bw;
        if (h->used == 0 && h->replicas == 0)
            s_bhost_off(b, ds->host, ev->t);
        ll_sim_cell_done(b->sim, b->d, s, ev->t);
        s_nbos_retry(b, ev->t);
        break;
    }
    case EV_BOOTED:
        if (b->h[ev->a].state == LL_SIM_HOST_BOOTING && b->h[ev->a].gen == ev->gen) {
            b->h[ev->a].state = LL_SIM_HOST_ON;
            s_nbos_retry(b, ev->t);
            if (b->h[ev->a].used == 0 && b->h[ev->a].replicas == 0)
                s_bhost_off(b, ev->a, ev->t); /* nobody needed it in the end */
        }
        break;
    }
}

const ll_sim_ops_t ll_sim_notebookos_ops = {
    .create = s_nbos_create,
    .destroy = s_destroy,
    .start = s_nbos_start,
    .prefetch = NULL,
    .run_gpu = s_nbos_run_gpu,
    .cpu_done = NULL,
    .leave = s_nbos_leave,
    .event = s_nbos_event,
    .finish = s_finish_own,
};
