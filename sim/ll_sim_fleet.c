/* ll_sim_fleet: an elastic fleet of GPU hosts in the simulator (see
 * ll_sim_internal.h): hosts power on when the provisioning controller
 * (policy/ll_provision.h) wants more, take host_boot_s plus the base
 * zygote's start to accept work, drain when it wants fewer (the least
 * loaded first, ll_place_drain) and power off once a draining host holds
 * nothing, warm workers included.  Jobs go to hosts by ll_place.  The
 * designs that run on it (LooseLeaf, keep-alive, naive serverless) say what
 * their hosts hold.  With fleet_shared set it is a serverless provider's
 * shared capacity instead, for all of them alike: a job that finds no room
 * gets a new host ready at once, and a host that holds nothing (no job, no
 * warm worker or container) powers off; no controller runs.  Both modes
 * apply one set of rules to every design, so a difference in GPU-hours
 * between two designs is what they hold, not how their hosts are counted.
 * Runs in the `looseleaf simulate` process. */
#include "sim/ll_sim_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ll_sim_fleet_t {
    ll_sim_t *sim;                 /* the engine */
    int d;                         /* the design */
    const ll_sim_fleet_ops_t *ops; /* what the design's hosts hold */
    void *design;                  /* its state */
    const ll_cost_t *c;            /* costs and the controller's knobs */
    int G;                         /* slots per host */
    int max_hosts;                 /* 0: unbounded */
    ll_sim_host_t *h;              /* hosts, any state */
    int n, cap;
    ll_place_host_t *snaps; /* placement's view, one per host */
    int *stale;             /* the hosts whose view is stale, each once */
    int nstale;
    ll_provision_t *prov; /* the controller */
    bool started;         /* the first session came */
    bool shared;          /* fleet_shared: hosts on demand, no controller */
};

ll_sim_fleet_t *ll_sim_fleet_new(ll_sim_t *sim, int d, const ll_sim_fleet_ops_t *ops, void *design)
{
    const ll_sim_config_t *cfg = ll_sim_cfg(sim);
    ll_sim_fleet_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->sim = sim;
    f->d = d;
    f->ops = ops;
    f->design = design;
    f->c = &cfg->cost;
    f->G = cfg->gpus_per_host;
    f->max_hosts = cfg->max_hosts;
    f->shared = f->c->fleet_shared != 0;
    int min_hosts = f->shared ? 0 : (int) f->c->min_hosts;
    if (f->max_hosts > 0 && min_hosts > f->max_hosts)
        min_hosts = f->max_hosts;
    ll_provision_config_t pc = {.gpus_per_host = f->G,
                                .target_util = f->c->target_util,
                                .p_wait = f->c->p_wait,
                                .window_s = f->c->load_window_s,
                                .down_hold_s = f->c->down_hold_s,
                                .min_hosts = min_hosts,
                                .max_hosts = f->max_hosts};
    f->prov = ll_provision_new(&pc);
    if (!f->prov) {
        free(f);
        return NULL;
    }
    return f;
}

void ll_sim_fleet_destroy(ll_sim_fleet_t **f_p)
{
    if (!f_p || !*f_p)
        return;
    ll_sim_fleet_t *f = *f_p;
    for (int i = 0; i < f->n; i++)
        if (f->h[i].priv)
            f->ops->host_off(f->design, i, 0);
    free(f->h);
    free(f->snaps);
    free(f->stale);
    ll_provision_destroy(&f->prov);
    free(f);
    *f_p = NULL;
}

int ll_sim_fleet_nhosts(const ll_sim_fleet_t *f)
{
    return f->n;
}

ll_sim_host_t *ll_sim_fleet_host(ll_sim_fleet_t *f, int i)
{
    return &f->h[i];
}

/* Host I's view is stale (refreshed before placement looks at it). */
static void s_mark(ll_sim_fleet_t *f, int i)
{
    f->h[i].dirty = true;
    if (!f->h[i].listed) {
        f->h[i].listed = true;
        f->stale[f->nstale++] = i;
    }
}

static void s_refresh(ll_sim_fleet_t *f, int i)
{
    ll_sim_host_t *h = &f->h[i];
    if (!h->dirty)
        return;
    memset(&h->snap, 0, sizeof h->snap);
    h->snap.slots = f->G;
    if (h->state == LL_SIM_HOST_ON || h->state == LL_SIM_HOST_DRAINING)
        f->ops->refresh(f->design, i, &h->snap);
    h->snap.accepting = h->state == LL_SIM_HOST_ON;
    h->dirty = false;
    f->snaps[i] = h->snap;
}

/* Every stale view refreshed. */
static void s_refresh_stale(ll_sim_fleet_t *f)
{
    for (int k = 0; k < f->nstale; k++) {
        f->h[f->stale[k]].listed = false;
        s_refresh(f, f->stale[k]);
    }
    f->nstale = 0;
}

/* A host slot to power: an off one, or a new one.  -1: no memory. */
static int s_new_host(ll_sim_fleet_t *f)
{
    for (int i = 0; i < f->n; i++)
        if (f->h[i].state == LL_SIM_HOST_OFF)
            return i;
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 16;
        ll_sim_host_t *h = realloc(f->h, (size_t) cap * sizeof *h);
        if (!h)
            return -1;
        f->h = h;
        ll_place_host_t *s = realloc(f->snaps, (size_t) cap * sizeof *s);
        if (!s)
            return -1;
        f->snaps = s;
        int *st = realloc(f->stale, (size_t) cap * sizeof *st);
        if (!st)
            return -1;
        f->stale = st;
        f->cap = cap;
    }
    memset(&f->h[f->n], 0, sizeof f->h[f->n]);
    memset(&f->snaps[f->n], 0, sizeof f->snaps[f->n]);
    return f->n++;
}

static int s_count(const ll_sim_fleet_t *f, ll_sim_host_state_t st)
{
    int k = 0;
    for (int i = 0; i < f->n; i++)
        k += f->h[i].state == st;
    return k;
}

/* Power a host on at NOW: ready at once (READY) or after its boot. */
static void s_power_on(ll_sim_fleet_t *f, double now, bool ready)
{
    int i = s_new_host(f);
    if (i < 0)
        return;
    ll_sim_host_t *h = &f->h[i];
    s_mark(f, i);
    h->boot_gen++;
    ll_sim_level(f->sim, f->d, LL_SIM_POWERED, now, 1);
    if (ready) {
        h->state = LL_SIM_HOST_ON;
        f->ops->host_on(f->design, i, now);
        s_refresh(f, i);
        return;
    }
    h->state = LL_SIM_HOST_BOOTING;
    s_refresh(f, i);
    ll_sim_at(f->sim, now + f->c->host_boot_s + f->c->zygote_start_s, f->d, LL_SIM_EV_FLEET_BOOTED,
              NULL, i, 0, h->boot_gen);
}

static void s_power_off(ll_sim_fleet_t *f, int i, double now)
{
    ll_sim_host_t *h = &f->h[i];
    f->ops->host_off(f->design, i, now);
    h->priv = NULL;
    h->state = LL_SIM_HOST_OFF;
    s_mark(f, i);
    h->boot_gen++;
    s_refresh(f, i);
    ll_sim_level(f->sim, f->d, LL_SIM_POWERED, now, -1);
}

void ll_sim_fleet_touched(ll_sim_fleet_t *f, int i, double now)
{
    ll_sim_host_t *h = &f->h[i];
    s_mark(f, i);
    if (f->shared && h->state == LL_SIM_HOST_ON) {
        /* Shared capacity: an empty host is given back at once. */
        s_refresh(f, i);
        const ll_place_host_t *v = &h->snap;
        if (v->busy == 0 && v->warm == 0 && v->staged == 0 && v->queued == 0)
            s_power_off(f, i, now);
        return;
    }
    if (h->state != LL_SIM_HOST_DRAINING)
        return;
    s_refresh(f, i);
    if (ll_provision_may_power_off(&h->snap))
        s_power_off(f, i, now);
}

/* Hosts powered (booting, on or draining). */
static int s_powered(const ll_sim_fleet_t *f)
{
    return f->n - s_count(f, LL_SIM_HOST_OFF);
}

int ll_sim_fleet_place(ll_sim_fleet_t *f, const ll_place_ask_t *ask, ll_place_how_t *how,
                       double now)
{
    s_refresh_stale(f);
    /* The home rule first, on the home alone (ll_place_choose tries it first
     * too): most jobs go home, and a fleet may have hundreds of hosts. */
    if (ask->home >= 0 && ask->home < f->n) {
        ll_place_ask_t home = *ask;
        home.home = 0;
        if (ll_place_choose(&f->snaps[ask->home], 1, &home, how) == 0 && *how == LL_PLACE_HOME)
            return ask->home;
    }
    int i = ll_place_choose(f->snaps, f->n, ask, how);
    if (f->shared) {
        /* Shared capacity: no room means a new host, ready now (unless
         * the fleet is at its size: then the job queues or waits). */
        if ((i < 0 || *how == LL_PLACE_QUEUE) &&
            (f->max_hosts == 0 || s_powered(f) < f->max_hosts)) {
            s_power_on(f, now, true);
            i = ll_place_choose(f->snaps, f->n, ask, how);
        }
        return i;
    }
    if (i < 0 || *how == LL_PLACE_QUEUE)
        ll_sim_fleet_control(f, now); /* more work than room: the controller sees it now */
    return i;
}

void ll_sim_fleet_control(ll_sim_fleet_t *f, double now)
{
    if (f->shared)
        return; /* no controller: hosts come with jobs and go when empty */
    double busy = 0;
    int queued = f->ops->waiting(f->design);
    s_refresh_stale(f);
    for (int i = 0; i < f->n; i++) {
        busy += f->h[i].snap.busy;
        queued += f->h[i].snap.queued;
    }
    ll_provision_observe(f->prov, now, busy, queued);
    int powered = s_count(f, LL_SIM_HOST_ON) + s_count(f, LL_SIM_HOST_BOOTING);
    int want = ll_provision_decide(f->prov, now, powered);
    for (; want > powered; powered++) {
        /* A draining host comes back before a new one boots: the most
         * loaded, whose warm workers are still there. */
        int best = -1;
        for (int i = 0; i < f->n; i++)
            if (f->h[i].state == LL_SIM_HOST_DRAINING &&
                (best < 0 || f->h[i].snap.busy + f->h[i].snap.warm >
                                 f->h[best].snap.busy + f->h[best].snap.warm))
                best = i;
        if (best >= 0) {
            f->h[best].state = LL_SIM_HOST_ON;
            s_mark(f, best);
            s_refresh(f, best);
            f->ops->capacity(f->design, now);
            continue;
        }
        if (f->max_hosts > 0 && s_powered(f) >= f->max_hosts)
            break;
        s_power_on(f, now, false);
    }
    for (; want < powered; powered--) {
        int i = ll_place_drain(f->snaps, f->n);
        if (i < 0)
            break;
        f->h[i].state = LL_SIM_HOST_DRAINING;
        s_mark(f, i);
        s_refresh(f, i);
        ll_sim_fleet_touched(f, i, now);
    }
}

bool ll_sim_fleet_event(ll_sim_fleet_t *f, const ll_sim_ev_t *ev)
{
    if (ev->kind == LL_SIM_EV_FLEET_BOOTED) {
        ll_sim_host_t *h = &f->h[ev->a];
        if (h->state != LL_SIM_HOST_BOOTING || h->boot_gen != ev->gen)
            return true;
        h->state = LL_SIM_HOST_ON;
        s_mark(f, ev->a);
        f->ops->host_on(f->design, ev->a, ev->t);
        s_refresh(f, ev->a);
        f->ops->capacity(f->design, ev->t);
        return true;
    }
    if (ev->kind == LL_SIM_EV_FLEET_TICK) {
        ll_sim_fleet_control(f, ev->t);
        if (!ll_sim_closed(f->sim, f->d))
            ll_sim_at(f->sim, ev->t + f->c->control_s, f->d, LL_SIM_EV_FLEET_TICK, NULL, 0, 0, 0);
        return true;
    }
    return false;
}

void ll_sim_fleet_start(ll_sim_fleet_t *f, double now)
{
    if (f->started)
        return;
    f->started = true;
    if (f->shared)
        return; /* hosts come with the first jobs */
    int k = ll_provision_decide(f->prov, now, 0);
    for (int i = 0; i < k; i++)
        s_power_on(f, now, true);
    ll_sim_at(f->sim, now + f->c->control_s, f->d, LL_SIM_EV_FLEET_TICK, NULL, 0, 0, 0);
}

void ll_sim_fleet_finish(ll_sim_fleet_t *f, double now)
{
    for (int i = 0; i < f->n; i++)
        if (f->h[i].state != LL_SIM_HOST_OFF)
            s_power_off(f, i, now);
}
