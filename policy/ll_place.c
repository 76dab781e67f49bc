/* ll_place: placement by consolidation (see ll_place.h).  Pure: a scan over
 * the caller's snapshot of its hosts, a few hundred at most per call. */
#include "policy/ll_place.h"
#include "base/ll_check.h"

#include <stdio.h>

int ll_place_free_slots(const ll_place_host_t *h)
{
    int f = h->slots - h->busy - h->warm;
    return f > 0 ? f : 0;
}

/* Whether host H may take a job of a session whose state is not there. */
static bool s_room(const ll_place_host_t *h, double state_bytes)
{
    return h->accepting && h->mem_free >= state_bytes;
}

/* Whether A is more loaded than B (held slots, then busy ones). */
static bool s_more_loaded(const ll_place_host_t *a, const ll_place_host_t *b)
{
    int ha = a->busy + a->warm, hb = b->busy + b->warm;
    return ha != hb ? ha > hb : a->busy > b->busy;
}

int ll_place_choose(const ll_place_host_t *hosts, int n, const ll_place_ask_t *ask,
                    ll_place_how_t *how)
{
    ll_place_how_t dummy;
    if (!how)
        how = &dummy;
    *how = LL_PLACE_NONE;
    if (ask->home >= 0 && ask->home < n) {
        const ll_place_host_t *h = &hosts[ask->home];
        if (h->accepting && (ask->home_slot || ll_place_free_slots(h) > 0 || h->warm > h->queued)) {
            *how = LL_PLACE_HOME;
            return ask->home;
        }
    }
    int free_best = -1, evict_best = -1, queue_best = -1;
    for (int i = 0; i < n; i++) {
        const ll_place_host_t *h = &hosts[i];
        if (!s_room(h, ask->state_bytes))
            continue;
        if (ll_place_free_slots(h) > 0) {
            if (free_best < 0 || s_more_loaded(h, &hosts[free_best]))
                free_best = i;
        } else if (h->warm > h->queued) {
            if (evict_best < 0 || s_more_loaded(h, &hosts[evict_best]))
                evict_best = i;
        }
        /* Shortest queue per slot: q/s < q'/s' without division. */
        if (queue_best < 0) {
            queue_best = i;
        } else {
            const ll_place_host_t *b = &hosts[queue_best];
            double l = (double) h->queued * b->slots, r = (double) b->queued * h->slots;
            if (l < r || (l == r && h->staged < b->staged))
                queue_best = i;
        }
    }
    if (free_best >= 0) {
        *how = LL_PLACE_FREE;
        return free_best;
    }
    if (evict_best >= 0) {
        *how = LL_PLACE_EVICT;
        return evict_best;
    }
    if (queue_best >= 0) {
        *how = LL_PLACE_QUEUE;
        return queue_best;
    }
    return -1;
}

int ll_place_drain(const ll_place_host_t *hosts, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        const ll_place_host_t *h = &hosts[i], *b = best >= 0 ? &hosts[best] : NULL;
        if (!h->accepting)
            continue;
        int hh = h->busy + h->warm, hb = b ? b->busy + b->warm : 0;
        int wh = h->queued + h->staged, wb = b ? b->queued + b->staged : 0;
        if (!b || hh < hb || (hh == hb && wh < wb) ||
            (hh == hb && wh == wb && h->mem_free >= b->mem_free))
            best = i;
    }
    return best;
}

/* ------------------------------------------------------------------ */
/* Self-test: scripted fleets, each decision checked.                 */

int ll_place_selftest(bool verbose)
{
    int fails = 0;
    const double GB = 1e9;
    ll_place_how_t how;
    /* Three 8-slot hosts: 0 lightly, 1 heavily loaded with a free slot, 2
     * full of busy workers. */
    ll_place_host_t h[4] = {
        {.accepting = true, .slots = 8, .busy = 1, .warm = 1, .mem_free = 100 * GB},
        {.accepting = true, .slots = 8, .busy = 5, .warm = 2, .mem_free = 100 * GB},
        {.accepting = true, .slots = 8, .busy = 8, .mem_free = 100 * GB},
        {.accepting = false, .slots = 8, .mem_free = 100 * GB}, /* booting */
    };
    ll_place_ask_t ask = {.home = -1, .state_bytes = 1 * GB};
    /* Consolidation: the most loaded host with a free slot, not the emptiest. */
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 1 && how == LL_PLACE_FREE);
    S_CHECK(ll_place_free_slots(&h[1]) == 1 && ll_place_free_slots(&h[2]) == 0);
    /* ... unless its memory cannot hold the session's state. */
    h[1].mem_free = 0.5 * GB;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 0 && how == LL_PLACE_FREE);
    h[1].mem_free = 100 * GB;
    /* Equal held slots: the busier one (fewer evictable workers). */
    h[0].busy = 5;
    h[0].warm = 2;
    h[1].busy = 4;
    h[1].warm = 3;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 0);
    /* The session's home wins while its worker holds a slot there, even
     * on a full host (the warm worker's slot is the session's). */
    ask.home = 2;
    ask.home_slot = true;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 2 && how == LL_PLACE_HOME);
    /* A staged worker (no slot) on a full home: a free slot elsewhere. */
    ask.home_slot = false;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 0 && how == LL_PLACE_FREE);
    /* ... but at home when an idle warm worker there may be evicted for it. */
    h[2].busy = 7;
    h[2].warm = 1;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 2 && how == LL_PLACE_HOME);
    /* ... unless a waiting cell already claimed that worker's slot. */
    h[2].queued = 1;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 0 && how == LL_PLACE_FREE);
    /* A home that does not accept (draining) is left. */
    h[2].queued = 0;
    h[2].accepting = false;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 0 && how == LL_PLACE_FREE);
    h[2].accepting = true;
    /* No free slot anywhere: evict an idle warm worker on the most loaded
     * host (held slots, then busy ones) with one no waiting cell claimed. */
    ask.home = -1;
    h[0].busy = 8;
    h[0].warm = 0;
    h[1].busy = 6;
    h[1].warm = 2;
    h[2].busy = 7;
    h[2].warm = 1;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 2 && how == LL_PLACE_EVICT); /* busier */
    h[2].queued = 1; /* its one worker is claimed */
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 1 && how == LL_PLACE_EVICT);
    /* Every slot busy: the shortest queue per slot, then fewer staged. */
    h[1].busy = 8;
    h[1].warm = 0;
    h[2].busy = 8;
    h[2].warm = 0;
    h[0].queued = 2;
    h[1].queued = 1;
    h[2].queued = 1;
    h[1].staged = 3;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 2 && how == LL_PLACE_QUEUE);
    h[3].accepting = true; /* the booted host: empty, so the free slot is there */
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == 3 && how == LL_PLACE_FREE);
    /* Nobody accepts: nowhere. */
    for (int i = 0; i < 4; i++)
        h[i].accepting = false;
    S_CHECK(ll_place_choose(h, 4, &ask, &how) == -1 && how == LL_PLACE_NONE);
    S_CHECK(ll_place_choose(h, 0, &ask, NULL) == -1);
    S_CHECK(ll_place_drain(h, 4) == -1);

    /* Draining: the host holding the fewest slots, then the least waiting
     * work, then the most memory free. */
    ll_place_host_t d[3] = {
        {.accepting = true, .slots = 8, .busy = 2, .warm = 1, .mem_free = 10 * GB},
        {.accepting = true, .slots = 8, .busy = 1, .warm = 1, .staged = 1, .mem_free = 10 * GB},
        {.accepting = true, .slots = 8, .busy = 0, .warm = 2, .mem_free = 20 * GB},
    };
    S_CHECK(ll_place_drain(d, 3) == 2); /* ties on held slots with 1: nothing staged */
    d[2].staged = 2;
    S_CHECK(ll_place_drain(d, 3) == 1);
    d[1].accepting = false; /* already draining */
    S_CHECK(ll_place_drain(d, 3) == 2);
    if (verbose)
        fprintf(stderr, "ll_place: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
