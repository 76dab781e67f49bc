/* ll_greedydual: GreedyDual eviction of idle warm workers (see ll_greedydual.h).  Used by
 * the host pool's one thread; a few dozen entries, so a plain array. */
#include "policy/ll_greedydual.h"
#include "base/ll_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int key;           /* the caller's name for the worker */
    double h;          /* clock value when its state last changed */
    double bytes;      /* c: bytes of state it holds */
    double changed_ms; /* when its state last changed */
    bool speculative;  /* prepared by a prefetch, never ran a cell */
    double
        prepared_ms; /* since when a prefetch prepared it for its session's coming cell; < 0: not */
    bool idle;       /* evictable */
} s_entry_t;

struct ll_gd_t {
    double clock;          /* H of new state; advances to each evicted L */
    double spec_window_ms; /* how long a speculative worker outranks completed ones */
    s_entry_t *e;          /* entries */
    int n, cap;            /* used, allocated */
};

ll_gd_t *ll_gd_new(double spec_window_ms)
{
    ll_gd_t *self = calloc(1, sizeof *self);
    if (self)
        self->spec_window_ms = spec_window_ms;
    return self;
}

void ll_gd_destroy(ll_gd_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->e);
    free(*self_p);
    *self_p = NULL;
}

static s_entry_t *s_find(const ll_gd_t *self, int key)
{
    for (int i = 0; i < self->n; i++)
        if (self->e[i].key == key)
            return &self->e[i];
    return NULL;
}

int ll_gd_changed(ll_gd_t *self, int key, double bytes, bool speculative, double now_ms)
{
    s_entry_t *e = s_find(self, key);
    if (!e) {
        if (self->n == self->cap) {
            int cap = self->cap ? self->cap * 2 : 16;
            s_entry_t *ne = realloc(self->e, (size_t) cap * sizeof *ne);
            if (!ne)
                return -1;
            self->e = ne;
            self->cap = cap;
        }
        e = &self->e[self->n++];
        memset(e, 0, sizeof *e);
        e->key = key;
        e->prepared_ms = -1;
    }
    e->h = self->clock;
    e->bytes = bytes > 0 ? bytes : 0;
    e->changed_ms = now_ms;
    e->speculative = speculative;
    return 0;
}

void ll_gd_set_idle(ll_gd_t *self, int key, bool idle)
{
    s_entry_t *e = s_find(self, key);
    if (e)
        e->idle = idle;
}

void ll_gd_remove(ll_gd_t *self, int key)
{
    s_entry_t *e = s_find(self, key);
    if (e)
        *e = self->e[--self->n];
}

void ll_gd_prepared(ll_gd_t *self, int key, bool on, double now_ms)
{
    s_entry_t *e = s_find(self, key);
    if (e && !on)
        e->prepared_ms = -1;
    else if (e && e->prepared_ms < 0)
        e->prepared_ms = now_ms; /* a later prefetch does not renew it */
}

static bool s_spec(const ll_gd_t *self, const s_entry_t *e, double now_ms)
{
    return (e->speculative && now_ms - e->changed_ms < self->spec_window_ms) ||
           (e->prepared_ms >= 0 && now_ms - e->prepared_ms < self->spec_window_ms);
}

int ll_gd_victim(const ll_gd_t *self, double now_ms)
{
    const s_entry_t *best = NULL;
    for (int i = 0; i < self->n; i++) {
        const s_entry_t *e = &self->e[i];
        if (!e->idle)
            continue;
        if (!best) {
            best = e;
            continue;
        }
        bool es = s_spec(self, e, now_ms), bs = s_spec(self, best, now_ms);
        double el = e->h + e->bytes, bl = best->h + best->bytes;
        /* Completed before speculative; then the smallest L; then the state
         * that changed longest ago; then the key (a total order). */
        if (es != bs                            ? !es
            : el != bl                          ? el < bl
            : e->changed_ms != best->changed_ms ? e->changed_ms < best->changed_ms
                                                : e->key < best->key)
            best = e;
    }
    return best ? best->key : -1;
}

int ll_gd_evict(ll_gd_t *self, int key)
{
    s_entry_t *e = s_find(self, key);
    if (!e)
        return -1;
    double l = e->h + e->bytes;
    if (l > self->clock)
        self->clock = l;
    ll_gd_remove(self, key);
    return 0;
}

double ll_gd_clock(const ll_gd_t *self)
{
    return self->clock;
}

bool ll_gd_value(const ll_gd_t *self, int key, double *l_out)
{
    const s_entry_t *e = s_find(self, key);
    if (e && l_out)
        *l_out = e->h + e->bytes;
    return e != NULL;
}

bool ll_gd_speculative(const ll_gd_t *self, int key, double now_ms)
{
    const s_entry_t *e = s_find(self, key);
    return e && s_spec(self, e, now_ms);
}

/* ------------------------------------------------------------------ */
/* Self-test with a scripted clock.                                   */

int ll_greedydual_selftest(bool verbose)
{
    int fails = 0;
    const double win = 10000.0; /* speculation window: 10 s */
    double t = 0, l = 0;

    /* Eviction order follows L = H + c, and the clock advances to each
     * evicted L. */
    ll_gd_t *g = ll_gd_new(win);
    S_CHECK(g && ll_gd_clock(g) == 0);
    S_CHECK(ll_gd_victim(g, t) == -1);
    ll_gd_changed(g, 1, 300, false, t);
    ll_gd_changed(g, 2, 100, false, t);
    ll_gd_changed(g, 3, 200, false, t);
    S_CHECK(ll_gd_victim(g, t) == -1); /* new entries are busy (running) */
    ll_gd_set_idle(g, 1, true);
    ll_gd_set_idle(g, 3, true);
    S_CHECK(ll_gd_victim(g, t) == 3); /* 2 is smaller but busy: never a victim */
    ll_gd_set_idle(g, 2, true);
    S_CHECK(ll_gd_victim(g, t) == 2);
    S_CHECK(ll_gd_evict(g, 2) == 0 && ll_gd_clock(g) == 100);
    S_CHECK(!ll_gd_value(g, 2, &l) && ll_gd_evict(g, 2) == -1);
    /* New state is valued from the advanced clock: 4 (150 bytes, H 100)
     * outranks 3 (200 bytes, H 0) although it holds less. */
    t += 1000;
    ll_gd_changed(g, 4, 150, false, t);
    ll_gd_set_idle(g, 4, true);
    S_CHECK(ll_gd_value(g, 4, &l) && l == 250);
    S_CHECK(ll_gd_victim(g, t) == 3);
    S_CHECK(ll_gd_evict(g, 3) == 0 && ll_gd_clock(g) == 200);
    S_CHECK(ll_gd_victim(g, t) == 4); /* L 250 < 300 */
    S_CHECK(ll_gd_evict(g, 4) == 0 && ll_gd_clock(g) == 250);
    S_CHECK(ll_gd_victim(g, t) == 1 && ll_gd_evict(g, 1) == 0 && ll_gd_clock(g) == 300);
    S_CHECK(ll_gd_victim(g, t) == -1);
    /* A removal (client gone, idle timeout) does not move the clock. */
    ll_gd_changed(g, 5, 1e9, false, t);
    ll_gd_remove(g, 5);
    S_CHECK(ll_gd_clock(g) == 300 && !ll_gd_value(g, 5, &l));
    ll_gd_destroy(&g);
    S_CHECK(g == NULL);
    ll_gd_destroy(&g); /* safe twice */

    /* Completed workers go before speculative ones, whatever their L, while
     * the speculation is fresh; a busy one is never chosen. */
    g = ll_gd_new(win);
    t = 0;
    ll_gd_changed(g, 10, 1000, false, t); /* completed, large */
    ll_gd_changed(g, 11, 10, true, t);    /* speculative, small */
    ll_gd_set_idle(g, 10, true);
    ll_gd_set_idle(g, 11, true);
    S_CHECK(ll_gd_speculative(g, 11, t) && !ll_gd_speculative(g, 10, t));
    S_CHECK(ll_gd_victim(g, t) == 10);
    ll_gd_set_idle(g, 10, false); /* it runs a cell again */
    S_CHECK(ll_gd_victim(g, t) == 11);
    /* Running a cell makes a speculative worker a completed one. */
    ll_gd_changed(g, 11, 10, false, t);
    ll_gd_set_idle(g, 11, true);
    S_CHECK(!ll_gd_speculative(g, 11, t));
    ll_gd_destroy(&g);

    /* Repeated prefetches of the same closure cannot keep a worker resident
     * against an honest session.  Slots: 2.  The gamer's worker G was
     * prepared once (its state never changes after: the pool does not call
     * ll_gd_changed when a prefetch restores nothing, so H and the window
     * stay); the honest session's workers run cells whose state changes. */
    g = ll_gd_new(win);
    t = 0;
    int gamer = 20, honest = 21;
    ll_gd_changed(g, gamer, 4096, true, t);
    ll_gd_set_idle(g, gamer, true);
    ll_gd_changed(g, honest, 4096, false, t);
    ll_gd_set_idle(g, honest, true);
    /* Inside its window the speculative worker is kept... */
    S_CHECK(ll_gd_victim(g, t + 1000) == honest);
    /* ... the honest session runs again (a new worker, new state), evicting
     * a third session's idle worker meanwhile advanced the clock ... */
    ll_gd_changed(g, 22, 1, false, t);
    ll_gd_set_idle(g, 22, true);
    ll_gd_set_idle(g, honest, false);
    S_CHECK(ll_gd_victim(g, t + 2000) == 22 && ll_gd_evict(g, 22) == 0 && ll_gd_clock(g) == 1);
    t += 5000;
    ll_gd_changed(g, honest, 4096, false, t);
    ll_gd_set_idle(g, honest, true);
    /* ... the gamer keeps prefetching the same closure: nothing changes, so
     * nothing is renewed.  Once its window passed, its older H loses. */
    for (int k = 0; k < 100; k++) {
        t += 100;
        ll_gd_set_idle(g, gamer, false); /* the prefetch re-checks versions */
        ll_gd_set_idle(g, gamer, true);  /* restored nothing: no ll_gd_changed */
    }
    t = 20000;
    S_CHECK(!ll_gd_speculative(g, gamer, t));
    double lg = 0, lh = 0;
    S_CHECK(ll_gd_value(g, gamer, &lg) && ll_gd_value(g, honest, &lh) && lg < lh);
    S_CHECK(ll_gd_victim(g, t) == gamer);
    S_CHECK(ll_gd_evict(g, gamer) == 0 && ll_gd_clock(g) == lg);
    S_CHECK(ll_gd_victim(g, t) == honest);
    ll_gd_destroy(&g);

    /* A worker that ran cells, prepared by a prefetch for its session's
     * coming cell, ranks as speculative from that prefetch for the window;
     * more prefetches (a client hinting without running) do not renew it,
     * and the cell it was prepared for makes it a completed worker again. */
    g = ll_gd_new(win);
    ll_gd_changed(g, 40, 10, false, 0); /* small L: the victim unless prepared */
    ll_gd_changed(g, 41, 1000, false, 0);
    ll_gd_set_idle(g, 40, true);
    ll_gd_set_idle(g, 41, true);
    S_CHECK(ll_gd_victim(g, 100) == 40);
    ll_gd_prepared(g, 40, true, 1000);
    S_CHECK(ll_gd_speculative(g, 40, 1000) && ll_gd_victim(g, 1000) == 41);
    for (t = 2000; t < 12000; t += 1000)
        ll_gd_prepared(g, 40, true, t); /* hints, no cell */
    S_CHECK(!ll_gd_speculative(g, 40, 11000) && ll_gd_victim(g, 11000) == 40);
    ll_gd_prepared(g, 40, false, 11000); /* its cell ran */
    ll_gd_prepared(g, 40, true, 12000);  /* the next cell's hint: a new window */
    S_CHECK(ll_gd_speculative(g, 40, 12500) && ll_gd_victim(g, 12500) == 41);
    ll_gd_prepared(g, 99, true, 0); /* unknown key: no-op */
    ll_gd_destroy(&g);

    /* Equal L: the state that changed longest ago goes first. */
    g = ll_gd_new(win);
    ll_gd_changed(g, 31, 50, false, 2000);
    ll_gd_changed(g, 30, 50, false, 1000);
    ll_gd_set_idle(g, 30, true);
    ll_gd_set_idle(g, 31, true);
    S_CHECK(ll_gd_victim(g, 3000) == 30);
    ll_gd_set_idle(g, 99, true); /* unknown: ignored */
    ll_gd_remove(g, 99);
    ll_gd_destroy(&g);
    if (verbose)
        fprintf(stderr, "ll_greedydual: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
