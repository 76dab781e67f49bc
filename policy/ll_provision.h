/* ll_provision: how many GPU hosts a fleet keeps powered (DESIGN.md "Many
 * users, many hosts", paper §3.4).  Pure policy on the model of ll_greedydual.h:
 * the caller observes the fleet's load and passes the clock; the module
 * says how many hosts to have, and whether a draining host may go.  Run by
 * the provisioning controller (a service exporting the demand to a cluster
 * autoscaler; `looseleaf simulate`, sim/, in a simulation).
 *
 * The load R is the number of GPUs doing work (slots held by jobs that
 * prepare, run or save a cell; not idle warm workers, which are a cache)
 * averaged over a window (time-weighted, exponentially with time constant
 * WINDOW_S), but never below the work there is right now (busy plus cells
 * waiting for a slot), so a burst is seen at once and a lull slowly.  The
 * GPUs wanted are those of a target utilisation plus square-root staffing:
 *
 *     c = ceil(R / target_util + beta * sqrt(R))
 *
 * R / target_util keeps the fleet's average utilisation at the target;
 * beta * sqrt(R) is the Halfin–Whitt headroom for the randomness of
 * arrivals: with c = R + beta * sqrt(R) servers, the probability that a
 * job finds every server busy tends to
 *
 *     alpha(beta) = 1 / (1 + beta * Phi(beta) / phi(beta))
 *
 * (Halfin & Whitt 1981; Phi, phi: the standard normal CDF and density), so
 * beta comes from the target probability of waiting, P_WAIT.  Hosts wanted
 * = ceil(c / gpus_per_host) within [MIN_HOSTS, MAX_HOSTS].  More hosts are
 * wanted at once; fewer only after the target stayed below the powered
 * hosts for DOWN_HOLD_S (booting a host costs minutes, flapping costs
 * more).  A draining host takes no new work and is powered off only once
 * its warm workers are gone and nothing is staged, queued or running there
 * (ll_provision_may_power_off): its sessions' state is in the store and
 * moves with their next job. */
#ifndef LL_PROVISION_H
#define LL_PROVISION_H

#include "policy/ll_place.h"

#include <stdbool.h>

typedef struct {
    int gpus_per_host;  /* slots per host (> 0) */
    double target_util; /* share of the provisioned GPUs the load should fill, (0, 1] */
    double p_wait;      /* target probability that a cell finds no GPU, (0, 1) */
    double window_s;    /* time constant of the load's average (> 0) */
    double down_hold_s; /* how long the target stays lower before hosts are drained */
    int min_hosts;      /* hosts kept powered whatever the load (>= 0) */
    int max_hosts;      /* the fleet's size at most; 0: unbounded */
    /* Below this load (the window's average), with no cell running or
     * waiting, no GPU is wanted.  The average decays exponentially and
     * never reaches 0, and square-root staffing wants a GPU for any load
     * above 0, so with MIN_HOSTS 0 the last host would stay up forever;
     * e.g. 0.01 (1% of one GPU over the window) lets an idle fleet
     * shrink to nothing.  0: only at exactly no load (the simulator's
     * fleets keep MIN_HOSTS > 0). */
    double idle_load;
} ll_provision_config_t;

typedef struct ll_provision_t ll_provision_t;

/* A controller with CFG (copied), no load seen yet.  NULL when CFG is out
 * of range or memory is short.  The caller destroys it. */
ll_provision_t *ll_provision_new(const ll_provision_config_t *cfg);

/* Destroy *SELF_P and null it.  Safe on NULL and twice. */
void ll_provision_destroy(ll_provision_t **self_p);

/* From NOW_S on, BUSY GPUs do work and QUEUED cells wait for one (the
 * previous observation held until NOW_S).  Times never go backwards. */
void ll_provision_observe(ll_provision_t *self, double now_s, double busy, int queued);

/* The load R at the last observation: the time-weighted average, or the
 * work there is now when more. */
double ll_provision_load(const ll_provision_t *self);

/* The hosts to have powered at NOW_S when POWERED are on or booting (not
 * draining): more than POWERED (boot the difference now), POWERED, or
 * fewer (drain the difference), fewer only once the target stayed below
 * POWERED for DOWN_HOLD_S; the hold restarts after each such answer. */
int ll_provision_decide(ll_provision_t *self, double now_s, int powered);

/* Square-root staffing: GPUs for load R at TARGET_UTIL with headroom BETA
 * (0 for R <= 0). */
int ll_provision_gpus(double load, double target_util, double beta);

/* Halfin–Whitt: the beta whose probability of waiting alpha(beta) is
 * P_WAIT (0 < P_WAIT < 1; 0 for P_WAIT >= 1). */
double ll_provision_beta(double p_wait);

/* alpha(BETA), the Halfin–Whitt probability of waiting (1 for BETA <= 0). */
double ll_provision_alpha(double beta);

/* Whether draining host H may be powered off: it takes no new work
 * (!accepting) and holds nothing: no job, no warm worker, nothing staged
 * or queued. */
bool ll_provision_may_power_off(const ll_place_host_t *h);

#endif
