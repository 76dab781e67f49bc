/* ll_provision: target utilisation plus square-root staffing (see
 * ll_provision.h).  Pure: a few numbers of state, the caller's clock. */
#include "policy/ll_provision.h"
#include "base/ll_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct ll_provision_t {
    ll_provision_config_t cfg; /* the policy's knobs */
    double beta;               /* headroom factor from cfg.p_wait */
    double t;                  /* time of the last observation, s; < 0 before the first */
    double busy;               /* GPUs doing work since then */
    int queued;                /* cells waiting since then */
    double avg;                /* time-weighted average of busy */
    double below_since;        /* since when the target is below the powered hosts; < 0: not */
};

double ll_provision_alpha(double beta)
{
    if (beta <= 0)
        return 1.0;
    double Phi = 0.5 * erfc(-beta / sqrt(2.0));
    double phi = exp(-0.5 * beta * beta) / sqrt(2.0 * M_PI);
    return 1.0 / (1.0 + beta * Phi / phi);
}

double ll_provision_beta(double p_wait)
{
    if (p_wait >= 1.0)
        return 0.0;
    if (p_wait <= 0.0)
        p_wait = 1e-9;
    /* alpha falls monotonically from 1 at 0: bisection. */
    double lo = 0.0, hi = 8.0;
    for (int i = 0; i < 100; i++) {
        double mid = 0.5 * (lo + hi);
        if (ll_provision_alpha(mid) > p_wait)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

int ll_provision_gpus(double load, double target_util, double beta)
{
    if (load <= 0)
        return 0;
    return (int) ceil(load / target_util + beta * sqrt(load) - 1e-9);
}

ll_provision_t *ll_provision_new(const ll_provision_config_t *cfg)
{
    if (!cfg || cfg->gpus_per_host <= 0 || !(cfg->target_util > 0 && cfg->target_util <= 1) ||
        !(cfg->p_wait > 0 && cfg->p_wait < 1) || !(cfg->window_s > 0) || cfg->down_hold_s < 0 ||
        cfg->min_hosts < 0 || cfg->max_hosts < 0 || !(cfg->idle_load >= 0) ||
        (cfg->max_hosts > 0 && cfg->max_hosts < cfg->min_hosts))
        return NULL;
    ll_provision_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->cfg = *cfg;
    self->beta = ll_provision_beta(cfg->p_wait);
    self->t = -1;
    self->below_since = -1;
    return self;
}

void ll_provision_destroy(ll_provision_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free(*self_p);
    *self_p = NULL;
}

void ll_provision_observe(ll_provision_t *self, double now_s, double busy, int queued)
{
    if (self->t >= 0 && now_s > self->t) {
        /* The last value held over (t, now]: the average moves toward it. */
        double w = 1.0 - exp(-(now_s - self->t) / self->cfg.window_s);
        self->avg += w * (self->busy - self->avg);
    } else if (self->t < 0) {
        self->avg = busy;
    }
    if (self->t < 0 || now_s >= self->t)
        self->t = now_s;
    self->busy = busy > 0 ? busy : 0;
    self->queued = queued > 0 ? queued : 0;
}

double ll_provision_load(const ll_provision_t *self)
{
    double now = self->busy + self->queued;
    if (now <= 0 && self->avg < self->cfg.idle_load)
        return 0;
    return now > self->avg ? now : self->avg;
}

int ll_provision_decide(ll_provision_t *self, double now_s, int powered)
{
    const ll_provision_config_t *c = &self->cfg;
    int gpus = ll_provision_gpus(ll_provision_load(self), c->target_util, self->beta);
    int want = (gpus + c->gpus_per_host - 1) / c->gpus_per_host;
    if (want < c->min_hosts)
        want = c->min_hosts;
    if (c->max_hosts > 0 && want > c->max_hosts)
        want = c->max_hosts;
    if (want >= powered) {
        self->below_since = -1;
        return want;
    }
    if (self->below_since < 0)
        self->below_since = now_s;
    if (now_s - self->below_since < c->down_hold_s)
        return powered;
    self->below_since = now_s; /* the next drain waits its own hold */
    return want;
}

bool ll_provision_may_power_off(const ll_place_host_t *h)
{
    return !h->accepting && h->busy == 0 && h->warm == 0 && h->staged == 0 && h->queued == 0;
}

/* ------------------------------------------------------------------ */
/* Self-test: the staffing formula, then a scripted day of load.      */

int ll_provision_selftest(bool verbose)
{
    int fails = 0;
    /* Halfin–Whitt: alpha(0) = 1, falls with beta; the textbook points
     * alpha(1) ~ 0.223 (1/(1 + 0.8413/0.2420)), alpha(2) ~ 0.0269
     * (1/(1 + 2 * 0.9772/0.0540)). */
    S_CHECK(ll_provision_alpha(0) == 1.0);
    S_CHECK(fabs(ll_provision_alpha(1.0) - 0.2234) < 0.001);
    S_CHECK(fabs(ll_provision_alpha(2.0) - 0.0269) < 0.001);
    double b5 = ll_provision_beta(0.05);
    S_CHECK(fabs(ll_provision_alpha(b5) - 0.05) < 1e-6 && b5 > 1.6 && b5 < 1.8);
    S_CHECK(ll_provision_beta(1.0) == 0.0 && ll_provision_beta(0.2) < b5);
    /* c = ceil(R/rho + beta sqrt R): 16 busy at 80% with beta 1.5 ->
     * 20 + 6 = 26; none busy -> none. */
    S_CHECK(ll_provision_gpus(16, 0.8, 1.5) == 26);
    S_CHECK(ll_provision_gpus(16, 1.0, 0.0) == 16 && ll_provision_gpus(0, 0.8, 1.5) == 0);
    S_CHECK(ll_provision_gpus(0.1, 1.0, 0.0) == 1);

    /* Bad configurations are refused. */
    ll_provision_config_t cfg = {.gpus_per_host = 8,
                                 .target_util = 0.8,
                                 .p_wait = 0.05,
                                 .window_s = 300,
                                 .down_hold_s = 600,
                                 .min_hosts = 1,
                                 .max_hosts = 0};
    ll_provision_config_t bad = cfg;
    bad.target_util = 0;
    S_CHECK(ll_provision_new(&bad) == NULL);
    bad = cfg;
    bad.p_wait = 1;
    S_CHECK(ll_provision_new(&bad) == NULL);
    bad = cfg;
    bad.max_hosts = 1;
    bad.min_hosts = 2;
    S_CHECK(ll_provision_new(&bad) == NULL && ll_provision_new(NULL) == NULL);

    ll_provision_t *p = ll_provision_new(&cfg);
    S_CHECK(p != NULL);
    /* Nothing seen: the minimum. */
    S_CHECK(ll_provision_decide(p, 0, 0) == 1);
    ll_provision_observe(p, 0, 0, 0);
    S_CHECK(ll_provision_decide(p, 0, 1) == 1);
    /* A burst: 12 cells run and 4 wait.  The load is seen at once (16),
     * however low the average: 16/0.8 + b5*4 = 26.8 -> 27 GPUs, 4 hosts. */
    ll_provision_observe(p, 10, 12, 4);
    S_CHECK(ll_provision_load(p) == 16);
    S_CHECK(ll_provision_decide(p, 10, 1) == 4);
    /* The burst goes: the average decays with the window (5 min), so the
     * target stays up for a while, then drops, but hosts are drained only
     * after the target stayed lower for the hold (10 min). */
    ll_provision_observe(p, 70, 1, 0);
    double l70 = ll_provision_load(p);
    S_CHECK(l70 > 1 && l70 < 12);                /* 12 held over a minute: ~2 + 0.18*12 */
    S_CHECK(ll_provision_decide(p, 70, 4) == 4); /* lower (1 host): the hold starts */
    S_CHECK(ll_provision_decide(p, 300, 4) == 4);
    ll_provision_observe(p, 3000, 1, 0); /* long after: the average is ~1 */
    S_CHECK(fabs(ll_provision_load(p) - 1.0) < 0.01);
    S_CHECK(ll_provision_decide(p, 3000, 4) == 1);
    S_CHECK(ll_provision_decide(p, 3010, 3) == 3); /* the next drain waits its own hold */
    S_CHECK(ll_provision_decide(p, 3600, 3) == 1);
    /* A rise while draining: at once, and it resets the hold. */
    ll_provision_observe(p, 3620, 30, 0);
    S_CHECK(ll_provision_decide(p, 3620, 3) == 6); /* 37.5 + 9.4 = 47 GPUs */
    ll_provision_observe(p, 3630, 0, 0);
    S_CHECK(ll_provision_decide(p, 3630, 6) == 6);
    ll_provision_destroy(&p);
    S_CHECK(p == NULL);
    ll_provision_destroy(&p);

    /* The fleet's bounds. */
    cfg.max_hosts = 2;
    cfg.min_hosts = 0;
    p = ll_provision_new(&cfg);
    S_CHECK(ll_provision_decide(p, 0, 0) == 0);
    ll_provision_observe(p, 0, 100, 0);
    S_CHECK(ll_provision_decide(p, 0, 0) == 2);
    ll_provision_destroy(&p);

    /* Down to no host: without idle_load the decaying average keeps one
     * host for good; with it, an idle fleet empties once the average fell
     * below it (and the hold passed), and work now counts whatever the
     * average. */
    cfg.max_hosts = 0;
    cfg.down_hold_s = 10;
    p = ll_provision_new(&cfg);
    ll_provision_observe(p, 0, 8, 0);
    S_CHECK(ll_provision_decide(p, 0, 0) == 2); /* 10 + 4.8 -> 15 GPUs */
    ll_provision_observe(p, 1, 0, 0);
    ll_provision_observe(p, 6000, 0, 0); /* 20 windows: ~1.6e-8 */
    S_CHECK(ll_provision_load(p) > 0 && ll_provision_decide(p, 6000, 2) == 2);
    S_CHECK(ll_provision_decide(p, 6020, 2) == 1); /* 1 GPU for the residue */
    ll_provision_destroy(&p);
    cfg.idle_load = 0.01;
    p = ll_provision_new(&cfg);
    ll_provision_observe(p, 0, 8, 0);
    ll_provision_observe(p, 1, 0, 0);
    ll_provision_observe(p, 600, 0, 0); /* 2 windows: ~1.1, above idle_load */
    S_CHECK(ll_provision_decide(p, 600, 2) == 2);
    ll_provision_observe(p, 6000, 0, 0);
    S_CHECK(ll_provision_load(p) == 0 && ll_provision_decide(p, 6000, 2) == 0);
    ll_provision_observe(p, 6030, 0, 1); /* a cell waits: seen at once */
    S_CHECK(ll_provision_load(p) == 1 && ll_provision_decide(p, 6030, 0) == 1);
    bad = cfg;
    bad.idle_load = -1;
    S_CHECK(ll_provision_new(&bad) == NULL);
    ll_provision_destroy(&p);

    /* Power-off: a draining host, only once nothing is held there. */
    ll_place_host_t h = {.accepting = true, .slots = 8};
    S_CHECK(!ll_provision_may_power_off(&h)); /* still accepting */
    h.accepting = false;
    h.warm = 1;
    S_CHECK(!ll_provision_may_power_off(&h)); /* a warm worker is there */
    h.warm = 0;
    h.staged = 1;
    S_CHECK(!ll_provision_may_power_off(&h));
    h.staged = 0;
    h.busy = 1;
    S_CHECK(!ll_provision_may_power_off(&h));
    h.busy = 0;
    S_CHECK(ll_provision_may_power_off(&h));
    if (verbose)
        fprintf(stderr, "ll_provision: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
