/* ll_sched_selftest: the scheduler's self-test (ll_sched_selftest in
 * ll_sched.h), scripted sequences of events with each decision checked,
 * through the public interface only.  Run by build/ll_selftest. */
#include "policy/ll_sched.h"
#include "base/ll_check.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Self-test: scripted sequences of events, each decision checked.    */

/* One pass at NOW: its decisions into OUT (at most MAX), their count.  A
 * skipped or dropped job is dropped, as the pool does. */
static int s_test_pass(ll_sched_t *s, double now, bool nodes, ll_sched_decision_t *out, int max)
{
    ll_sched_decision_t d;
    int n = 0;
    ll_sched_begin(s, now, nodes);
    while (ll_sched_next(s, &d)) {
        if (d.op == LL_SCHED_SKIP || d.op == LL_SCHED_DROP)
            ll_sched_drop(s, d.r, now); /* as the caller does once it answered */
        if (n < max)
            out[n++] = d;
    }
    return n;
}

/* Worker PID of job R said ready, ran its cell and replied at NOW holding
 * BYTES, asking to stay warm. */
static bool s_test_cell_done(ll_sched_t *s, int r, int pid, double bytes, double now)
{
    ll_sched_set_worker(s, r, pid);
    ll_sched_ready(s, r);
    ll_sched_saving(s, r);
    return ll_sched_replied(s, r, true, bytes, now);
}

/* Worker PID of prefetch R said ready and prepared at NOW holding BYTES. */
static bool s_test_prepared(ll_sched_t *s, int r, int pid, double bytes, double now)
{
    ll_sched_set_worker(s, r, pid);
    ll_sched_ready(s, r);
    return ll_sched_prepared(s, r, true, true, bytes, now);
}

/* Cells: oldest first, no node no fork, told once they wait; an
 * eviction under pressure, one per waiting cell; a warm hit. */
static int s_test_cells(bool verbose)
{
    int fails = 0;
    const double win = 10000.0; /* speculation window: 10 s */
    ll_sched_decision_t d[8];
    int n;
    ll_sched_t *s = ll_sched_new(2, 4, win, true);
    S_CHECK(s && ll_sched_nslots(s) == 2 && ll_sched_slot_job(s, 0) == -1);
    S_CHECK(ll_sched_session_open(s, 0, "a") >= 0 && ll_sched_session_open(s, 1, "b") >= 0 &&
            ll_sched_session_open(s, 2, "c") >= 0);
    S_CHECK(ll_sched_session_open(s, 0, "a") == ll_sched_session_find(s, 0, "a"));
    int c1 = ll_sched_add(s, 2, "c", LL_SCHED_CELL, 0, 3); /* entry 0, youngest */
    int a1 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 1);
    int b1 = ll_sched_add(s, 1, "b", LL_SCHED_CELL, 0, 2);
    S_CHECK(c1 == 0 && a1 == 1 && b1 == 2);
    n = s_test_pass(s, 4, false, d, 8); /* no zygote node ready: nothing forks, slots are free */
    S_CHECK(n == 0 && ll_sched_job(s, a1)->state == LL_SCHED_QUEUED);
    n = s_test_pass(s, 5, true, d, 8);
    S_CHECK(n == 3);
    S_CHECK(d[0].op == LL_SCHED_FORK && d[0].r == a1 && d[0].slot == 0);
    S_CHECK(d[1].op == LL_SCHED_FORK && d[1].r == b1 && d[1].slot == 1);
    S_CHECK(d[2].op == LL_SCHED_WAIT && d[2].r == c1 && d[2].queued == 1);
    S_CHECK(ll_sched_job(s, a1)->state == LL_SCHED_FORKING && ll_sched_slot_job(s, 0) == a1);
    S_CHECK(ll_sched_job(s, a1)->worker.spec);   /* not yet ran a cell */
    S_CHECK(s_test_pass(s, 6, true, d, 8) == 0); /* told once */
    /* a1 replies and stays warm on slot 0: c1 evicts it (the only idle one). */
    S_CHECK(s_test_cell_done(s, a1, 101, 100, 10));
    S_CHECK(ll_sched_job(s, a1)->state == LL_SCHED_WARM && ll_sched_job(s, a1)->slot == 0);
    S_CHECK(ll_sched_job(s, a1)->worker.cells == 1 && !ll_sched_job(s, a1)->worker.spec);
    n = s_test_pass(s, 11, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_EVICT && d[0].r == c1 && d[0].w == a1);
    S_CHECK(d[0].l == 100 && !d[0].credit && d[0].restage); /* a's client is there */
    S_CHECK(ll_sched_job(s, a1)->state == LL_SCHED_EVICTING && ll_sched_job(s, a1)->slot == 0);
    S_CHECK(ll_gd_clock(ll_sched_gd(s)) == 100);
    /* b1 is warm too, but the eviction under way is c1's slot: no second one. */
    S_CHECK(s_test_cell_done(s, b1, 102, 50, 12));
    S_CHECK(s_test_pass(s, 13, true, d, 8) == 0 && ll_sched_job(s, b1)->state == LL_SCHED_WARM);
    /* a1's worker is gone: c1 forks on its slot; a's held time is billed. */
    ll_sched_drop(s, a1, 14);
    S_CHECK(ll_sched_session(s, ll_sched_session_find(s, 0, "a"))->held_ms == 14 - 5);
    n = s_test_pass(s, 14, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == c1 && d[0].slot == 0);
    /* b's next cell: a warm hit on b1's worker (same slot, entry moves). */
    int b2 = ll_sched_add(s, 1, "b", LL_SCHED_CELL, 0, 15);
    n = s_test_pass(s, 15, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == b2 && d[0].w == b1 && d[0].slot == 1);
    S_CHECK(ll_sched_job(s, b1)->state == LL_SCHED_FREE && ll_sched_slot_job(s, 1) == b2);
    S_CHECK(ll_sched_job(s, b2)->state == LL_SCHED_FORKING &&
            ll_sched_job(s, b2)->worker.key == 102);
    S_CHECK(ll_sched_job(s, b2)->worker.cells == 1 && !d[0].staged_hit);
    /* The worker died before it took b2 (nothing ran): b2 is queued again
     * and forks a fresh worker once a slot is free. */
    ll_sched_lost(s, b2);
    ll_sched_requeue(s, b2, 16);
    S_CHECK(ll_sched_job(s, b2)->state == LL_SCHED_QUEUED && ll_sched_job(s, b2)->slot == -1);
    S_CHECK(ll_sched_job(s, b2)->worker.key == 0 && !ll_sched_job(s, b2)->worker.gone);
    n = s_test_pass(s, 16, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == b2 && d[0].slot == 1);
    ll_sched_destroy(&s);
    S_CHECK(s == NULL);
    ll_sched_destroy(&s); /* safe twice */
    return fails;
}

/* A failed fork blocks younger cells for the rest of the pass. */
static int s_test_fork_failed(bool verbose)
{
    int fails = 0;
    const double win = 10000.0; /* speculation window: 10 s */
    ll_sched_decision_t d[8];
    int n;
    ll_sched_t *s = ll_sched_new(2, 4, win, true);
    int a1 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 1);
    int b1 = ll_sched_add(s, 1, "b", LL_SCHED_CELL, 0, 2);
    ll_sched_begin(s, 3, true);
    S_CHECK(ll_sched_next(s, &d[0]) && d[0].op == LL_SCHED_FORK && d[0].r == a1);
    ll_sched_fork_failed(s, a1);
    S_CHECK(ll_sched_job(s, a1)->state == LL_SCHED_QUEUED && ll_sched_slot_job(s, 0) == -1);
    S_CHECK(!ll_sched_next(s, &d[0])); /* b1 waits behind a1; slots free: no WAIT */
    n = s_test_pass(s, 4, true, d, 8);
    S_CHECK(n == 2 && d[0].r == a1 && d[0].slot == 0 && d[1].r == b1 && d[1].slot == 1);
    /* Warm workers stay only while the pool keeps them and the client is
     * there; a cancelled one (may_stay false) never. */
    ll_sched_client_gone(s, 0);
    S_CHECK(ll_sched_job(s, a1)->client == -1);
    S_CHECK(!s_test_cell_done(s, a1, 201, 10, 5));
    ll_sched_set_worker(s, b1, 202);
    ll_sched_ready(s, b1);
    S_CHECK(!ll_sched_replied(s, b1, false, 10, 5));
    ll_sched_destroy(&s);
    s = ll_sched_new(1, 4, win, false);
    a1 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 1);
    S_CHECK(s_test_pass(s, 1, true, d, 8) == 1 && !s_test_cell_done(s, a1, 301, 10, 2));
    ll_sched_destroy(&s);
    return fails;
}

/* Prefetch credit: spent by an eviction whose victim is not
 * older, earned back when a cell of the session replies; a speculative
 * worker is protected from prefetches (not from cells). */
static int s_test_credit(bool verbose)
{
    int fails = 0;
    const double win = 10000.0; /* speculation window: 10 s */
    ll_sched_decision_t d[8];
    int n;
    ll_sched_t *s = ll_sched_new(1, 0, win, true); /* 1 slot, no staged workers */
    int sx = ll_sched_session_open(s, 0, "x"), sy = ll_sched_session_open(s, 1, "y");
    S_CHECK(ll_sched_session(s, sy)->credit == 1);
    int x1 = ll_sched_add(s, 0, "x", LL_SCHED_CELL, 0, 0);
    S_CHECK(s_test_pass(s, 0, true, d, 8) == 1 && s_test_cell_done(s, x1, 401, 1000, 1));
    int p1 = ll_sched_add(s, 1, "y", LL_SCHED_PREFETCH, 0, 2);
    n = s_test_pass(s, 2, true, d, 8); /* L 1000 is not below clock 0 + 0: the credit */
    S_CHECK(n == 1 && d[0].op == LL_SCHED_EVICT && d[0].r == p1 && d[0].w == x1 && d[0].credit);
    S_CHECK(ll_sched_session(s, sy)->credit == 0 && ll_sched_job(s, p1)->queue.awaits_evict);
    S_CHECK(!d[0].restage);                      /* no room for staged workers */
    S_CHECK(s_test_pass(s, 3, true, d, 8) == 0); /* it waits for that slot, evicting no more */
    ll_sched_drop(s, x1, 4);
    n = s_test_pass(s, 4, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == p1 && d[0].slot == 0);
    S_CHECK(s_test_prepared(s, p1, 402, 10, 5) && ll_sched_job(s, p1)->worker.spec);
    S_CHECK(ll_gd_speculative(ll_sched_gd(s), 402, 6));
    /* x prefetches (credit 1): the only idle worker is speculative: kept. */
    int p2 = ll_sched_add(s, 0, "x", LL_SCHED_PREFETCH, 0, 6);
    n = s_test_pass(s, 6, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_SKIP && d[0].r == p2);
    S_CHECK(strcmp(d[0].why, "no free GPU slot") == 0 && ll_sched_job(s, p2)->state == 0);
    S_CHECK(ll_sched_session(s, sx)->credit == 1 && ll_sched_job(s, p1)->state == LL_SCHED_WARM);
    /* A cell of x may evict it (speculative after completed, but a victim). */
    int x2 = ll_sched_add(s, 0, "x", LL_SCHED_CELL, 0, 7);
    n = s_test_pass(s, 7, true, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_SCHED_EVICT && d[0].r == x2 && d[0].w == p1);
    S_CHECK(d[1].op == LL_SCHED_WAIT && d[1].r == x2);
    ll_sched_drop(s, p1, 8);
    S_CHECK(s_test_pass(s, 8, true, d, 8) == 1 && d[0].r == x2);
    /* y (credit 0) prefetches while x2 runs... */
    S_CHECK(s_test_cell_done(s, x2, 403, 1000, 9));
    int p3 = ll_sched_add(s, 1, "y", LL_SCHED_PREFETCH, 0, 10);
    n = s_test_pass(s, 10, true, d, 8); /* x2's L is not older, no credit: skipped */
    S_CHECK(n == 1 && d[0].op == LL_SCHED_SKIP && d[0].r == p3);
    /* ... but a prefetch bringing more than the victim's state is worth may
     * evict it without credit (its L is below clock + closure_bytes). */
    int p4 = ll_sched_add(s, 1, "y", LL_SCHED_PREFETCH, 5000, 11);
    n = s_test_pass(s, 11, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_EVICT && d[0].r == p4 && d[0].w == x2 && !d[0].credit);
    S_CHECK(ll_sched_session(s, sy)->credit == 0);
    ll_sched_drop(s, x2, 12);
    S_CHECK(s_test_pass(s, 12, true, d, 8) == 1 && d[0].op == LL_SCHED_FORK && d[0].r == p4);
    /* y's cell arrives while p4 prepares: it waits for that worker (busy),
     * and a second prefetch is skipped (the cell came first). */
    int y1 = ll_sched_add(s, 1, "y", LL_SCHED_CELL, 0, 13);
    int p5 = ll_sched_add(s, 1, "y", LL_SCHED_PREFETCH, 0, 14);
    n = s_test_pass(s, 14, true, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_SCHED_SKIP && d[0].r == p5);
    S_CHECK(strcmp(d[0].why, "the session's cell waits for a GPU slot") == 0);
    S_CHECK(d[1].op == LL_SCHED_WAIT && d[1].r == y1);
    S_CHECK(s_test_prepared(s, p4, 404, 10, 15));
    n = s_test_pass(s, 15, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == y1 && d[0].w == p4 && d[0].slot == 0);
    /* The cell replies: y's credit is back; a prefetch while it runs is
     * skipped. */
    ll_sched_set_worker(s, y1, 404);
    ll_sched_ready(s, y1);
    int p6 = ll_sched_add(s, 1, "y", LL_SCHED_PREFETCH, 0, 16);
    n = s_test_pass(s, 16, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_SKIP && d[0].r == p6);
    S_CHECK(strcmp(d[0].why, "the session's worker is running a cell") == 0);
    S_CHECK(ll_sched_replied(s, y1, true, 10, 17) && ll_sched_session(s, sy)->credit == 1);
    ll_sched_destroy(&s);
    return fails;
}

/* Staged workers: a prefetch that finds no slot it may take is
 * prepared without one; the session's cell promotes it into a free
 * slot, or evicts for it; a restage never takes a slot. */
static int s_test_staged(bool verbose)
{
    int fails = 0;
    const double win = 10000.0; /* speculation window: 10 s */
    ll_sched_decision_t d[8];
    int n;
    ll_sched_t *s = ll_sched_new(1, 2, win, true);
    int sa = ll_sched_session_open(s, 0, "a");
    ll_sched_session_open(s, 1, "b");
    int b0 = ll_sched_add(s, 1, "b", LL_SCHED_CELL, 0, 0);
    S_CHECK(s_test_pass(s, 0, true, d, 8) == 1 && s_test_cell_done(s, b0, 501, 10, 0));
    /* b's worker was prepared by a prefetch for its coming cell: protected. */
    int bp = ll_sched_add(s, 1, "b", LL_SCHED_PREFETCH, 0, 1);
    n = s_test_pass(s, 1, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == bp && d[0].slot == 0);
    S_CHECK(ll_sched_job(s, bp)->state == LL_SCHED_PREPARING);
    S_CHECK(ll_sched_prepared(s, bp, true, false, 10, 2) &&
            ll_gd_speculative(ll_sched_gd(s), 501, 3));
    int ap = ll_sched_add(s, 0, "a", LL_SCHED_PREFETCH, 0, 3);
    n = s_test_pass(s, 3, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == ap && d[0].slot == -1);
    S_CHECK(ll_sched_session(s, sa)->credit == 1); /* no eviction: credit kept */
    S_CHECK(s_test_prepared(s, ap, 502, 20, 4) && ll_sched_job(s, ap)->slot == -1);
    S_CHECK(!ll_gd_value(ll_sched_gd(s), 502, NULL)); /* staged: nobody's victim */
    /* a prefetches again: its staged worker re-checks versions, still
     * staged (the only idle slot holder is speculative). */
    int ap2 = ll_sched_add(s, 0, "a", LL_SCHED_PREFETCH, 0, 5);
    n = s_test_pass(s, 5, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == ap2 && d[0].w == ap && d[0].slot == -1);
    S_CHECK(ll_sched_prepared(s, ap2, true, false, 20, 6));
    /* a's cell: no free slot, so it evicts for its staged worker... */
    int ac = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 7);
    n = s_test_pass(s, 7, true, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_SCHED_EVICT && d[0].r == ac && d[0].w == bp);
    S_CHECK(d[0].restage); /* b is connected, one staged worker of two */
    S_CHECK(d[1].op == LL_SCHED_WAIT && d[1].r == ac);
    /* ... the pool prepares b again, staged; it takes no slot ... */
    int br = ll_sched_add(s, 1, "b", LL_SCHED_RESTAGE, 0, 8);
    n = s_test_pass(s, 8, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == br && d[0].slot == -1);
    /* ... and once the evicted worker is gone, a's cell promotes its staged
     * worker into the slot. */
    ll_sched_drop(s, bp, 9);
    n = s_test_pass(s, 9, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == ac && d[0].w == ap2 && d[0].slot == 0);
    S_CHECK(d[0].staged_hit && ll_sched_slot_job(s, 0) == ac && ll_sched_job(s, ac)->slot_t0 == 9);
    /* A restage finds no room (two staged: br and a new one): dropped. */
    int bq = ll_sched_add(s, 3, "q", LL_SCHED_RESTAGE, 0, 10);
    int bz = ll_sched_add(s, 2, "z", LL_SCHED_RESTAGE, 0, 11);
    n = s_test_pass(s, 11, true, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_SCHED_FORK && d[0].r == bq && d[0].slot == -1);
    S_CHECK(d[1].op == LL_SCHED_DROP && d[1].r == bz && ll_sched_job(s, bz)->state == 0);
    ll_sched_destroy(&s);
    return fails;
}

/* A staged worker promoted by its session's prefetch: into a free
 * slot when no cell waits, or by evicting with the session's credit. */
static int s_test_promotion(bool verbose)
{
    int fails = 0;
    const double win = 10000.0; /* speculation window: 10 s */
    ll_sched_decision_t d[8];
    int n;
    ll_sched_t *s = ll_sched_new(1, 2, win, true);
    ll_sched_session_open(s, 0, "a");
    int sb = ll_sched_session_open(s, 1, "b");
    int b0 = ll_sched_add(s, 1, "b", LL_SCHED_CELL, 0, 0);
    S_CHECK(s_test_pass(s, 0, true, d, 8) == 1 && s_test_cell_done(s, b0, 601, 10, 0));
    int ap = ll_sched_add(s, 0, "a", LL_SCHED_PREFETCH, 0, 1);
    n = s_test_pass(s, 1, true, d, 8); /* evicts b0 with a's credit */
    S_CHECK(n == 1 && d[0].op == LL_SCHED_EVICT && d[0].w == b0 && d[0].credit);
    ll_sched_drop(s, b0, 2);
    S_CHECK(s_test_pass(s, 2, true, d, 8) == 1 && d[0].op == LL_SCHED_FORK && d[0].slot == 0);
    S_CHECK(s_test_prepared(s, ap, 602, 10, 3));
    /* b prefetches: a's worker is speculative, so b's is staged. */
    int bp = ll_sched_add(s, 1, "b", LL_SCHED_PREFETCH, 0, 4);
    S_CHECK(s_test_pass(s, 4, true, d, 8) == 1 && d[0].op == LL_SCHED_FORK && d[0].slot == -1);
    S_CHECK(s_test_prepared(s, bp, 603, 10, 5));
    /* Past a's window, b prefetches again: its staged worker evicts a's
     * with b's credit and waits for that slot, then takes it. */
    int bp2 = ll_sched_add(s, 1, "b", LL_SCHED_PREFETCH, 0, 20000);
    n = s_test_pass(s, 20000, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_EVICT && d[0].r == bp2 && d[0].w == ap && d[0].credit);
    S_CHECK(ll_sched_session(s, sb)->credit == 0);
    S_CHECK(s_test_pass(s, 20001, true, d, 8) == 0); /* waits for the slot */
    ll_sched_drop(s, ap, 20002);
    n = s_test_pass(s, 20002, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == bp2 && d[0].w == bp && d[0].slot == 0);
    ll_sched_destroy(&s);
    return fails;
}

/* Sessions: slot-held time, running holdings included. */
static int s_test_sessions(bool verbose)
{
    int fails = 0;
    const double win = 10000.0; /* speculation window: 10 s */
    ll_sched_decision_t d[8];
    ll_sched_t *s = ll_sched_new(1, 2, win, true);
    int si = ll_sched_session_open(s, 0, "a");
    S_CHECK(ll_sched_session_open(s, -1, "a") == -1 && ll_sched_session_open(s, 0, NULL) == -1);
    int a1 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 100);
    S_CHECK(s_test_pass(s, 100, true, d, 8) == 1);
    S_CHECK(ll_sched_session_held(s, si, 350) == 250);
    S_CHECK(s_test_cell_done(s, a1, 701, 10, 400));
    ll_sched_release(s, a1, NULL); /* idle timeout: no clock change */
    S_CHECK(ll_sched_job(s, a1)->state == LL_SCHED_EVICTING && ll_gd_clock(ll_sched_gd(s)) == 0);
    ll_sched_drop(s, a1, 500);
    S_CHECK(ll_sched_session_held(s, si, 900) == 400 && ll_sched_slot_job(s, 0) == -1);
    ll_sched_session_close(s, si);
    S_CHECK(ll_sched_session_find(s, 0, "a") == -1);
    ll_sched_destroy(&s);
    return fails;
}

/* Homes: a worker holding values no store can hold stays where workers do
 * not stay warm, is no prefetch's victim, and a cell's only when no other
 * warm worker is left. */
static int s_test_homes(bool verbose)
{
    int fails = 0;
    ll_sched_decision_t d[8];
    int n;
    /* Without warm workers, only a home stays. */
    ll_sched_t *s = ll_sched_new(2, 0, 10000.0, false);
    S_CHECK(s && ll_sched_session_open(s, 0, "a") >= 0 && ll_sched_session_open(s, 1, "b") >= 0);
    int a1 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 1);
    int b1 = ll_sched_add(s, 1, "b", LL_SCHED_CELL, 0, 1);
    n = s_test_pass(s, 2, true, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_SCHED_FORK && d[1].op == LL_SCHED_FORK);
    ll_sched_set_home(s, a1, 2);
    S_CHECK(s_test_cell_done(s, a1, 201, 10, 3) && ll_sched_job(s, a1)->state == LL_SCHED_WARM);
    S_CHECK(!s_test_cell_done(s, b1, 202, 10, 3));
    ll_sched_drop(s, b1, 3);
    /* The session's next cell is a hit on its home. */
    int a2 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 4);
    n = s_test_pass(s, 5, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == a2 &&
            ll_sched_job(s, a2)->worker.home == 2);
    ll_sched_set_home(s, a2, 0); /* its cell rebound the names: no home any more */
    S_CHECK(!ll_sched_replied(s, a2, true, 10, 6));
    ll_sched_destroy(&s);

    /* Warm workers: the home (older state, smaller L) goes last. */
    s = ll_sched_new(2, 4, 10000.0, true);
    S_CHECK(s && ll_sched_session_open(s, 0, "a") >= 0 && ll_sched_session_open(s, 1, "b") >= 0 &&
            ll_sched_session_open(s, 2, "c") >= 0 && ll_sched_session_open(s, 3, "d") >= 0);
    a1 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 1);
    b1 = ll_sched_add(s, 1, "b", LL_SCHED_CELL, 0, 1);
    S_CHECK(s_test_pass(s, 2, true, d, 8) == 2);
    ll_sched_set_home(s, a1, 1);
    S_CHECK(s_test_cell_done(s, a1, 301, 10, 3));   /* L 10 */
    S_CHECK(s_test_cell_done(s, b1, 302, 5000, 4)); /* L 5000 */
    int c1 = ll_sched_add(s, 2, "c", LL_SCHED_CELL, 0, 5);
    n = s_test_pass(s, 6, true, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_SCHED_EVICT && d[0].r == c1 && d[0].w == b1);
    S_CHECK(d[1].op == LL_SCHED_WAIT && d[1].r == c1);
    ll_sched_drop(s, b1, 7); /* gone */
    n = s_test_pass(s, 7, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == c1 && d[0].slot == 1);
    S_CHECK(s_test_cell_done(s, c1, 303, 100, 8));
    /* A prefetch evicts no home: with c's worker busy (its next cell) it is staged. */
    int c2 = ll_sched_add(s, 2, "c", LL_SCHED_CELL, 0, 8.5);
    n = s_test_pass(s, 8.5, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_HAND && d[0].r == c2);
    ll_sched_ready(s, c2);
    int d1 = ll_sched_add(s, 3, "d", LL_SCHED_PREFETCH, 1e12, 9);
    n = s_test_pass(s, 10, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == d1 && d[0].slot == -1);
    S_CHECK(s_test_prepared(s, d1, 304, 10, 10.5) && ll_sched_job(s, d1)->slot == -1);
    /* A cell, when only the home is left, evicts it. */
    int d2 = ll_sched_add(s, 3, "d", LL_SCHED_CELL, 0, 11);
    n = s_test_pass(s, 12, true, d, 8);
    S_CHECK(n >= 1 && d[0].op == LL_SCHED_EVICT && d[0].r == d2 && d[0].w == a1);
    ll_sched_destroy(&s);
    return fails;
}

/* hostd: slots not leased take no job; held, they let no worker stay warm;
 * the eviction hold makes a cell wait instead of evicting. */
static int s_test_leases(bool verbose)
{
    int fails = 0;
    ll_sched_decision_t d[8];
    ll_sched_t *s = ll_sched_new(2, 4, 10000.0, true);
    S_CHECK(s && ll_sched_session_open(s, 0, "a") >= 0 && ll_sched_session_open(s, 0, "b") >= 0);
    ll_sched_slot_lease(s, 0, false);
    ll_sched_slot_lease(s, 1, false);
    S_CHECK(!ll_sched_slot_leased(s, 0) && !ll_sched_slot_leased(s, 5));
    int a1 = ll_sched_add(s, 0, "a", LL_SCHED_CELL, 0, 1);
    int n = s_test_pass(s, 2, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_WAIT && d[0].r == a1); /* no slot is ours */
    ll_sched_slot_lease(s, 1, true);
    n = s_test_pass(s, 3, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].slot == 1);
    S_CHECK(s_test_cell_done(s, a1, 201, 10, 4)); /* warm on slot 1 */
    /* b's cell finds no free leased slot: with the hold it waits, without
     * it evicts a's warm worker. */
    ll_sched_evict_hold(s, true);
    ll_sched_wait_quiet(s, true);
    int b1 = ll_sched_add(s, 0, "b", LL_SCHED_CELL, 0, 5);
    S_CHECK(s_test_pass(s, 6, true, d, 8) == 0); /* nothing to tell yet: the broker may lend one */
    ll_sched_wait_quiet(s, false);
    n = s_test_pass(s, 6, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_WAIT && d[0].r == b1);
    ll_sched_evict_hold(s, false);
    n = s_test_pass(s, 7, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_EVICT && d[0].w == a1);
    ll_sched_drop(s, a1, 8);
    n = s_test_pass(s, 8, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == b1 && d[0].slot == 1);
    /* Slot 1 taken back while b1 runs: its worker does not stay warm. */
    ll_sched_slot_lease(s, 1, false);
    S_CHECK(!s_test_cell_done(s, b1, 202, 10, 9));
    ll_sched_drop(s, b1, 9);
    S_CHECK(ll_sched_slot_job(s, 1) == -1);
    ll_sched_destroy(&s);
    return fails;
}

/* hostd: a prefetch finding no slot of ours waits for the broker's answer:
 * a slot lent (it forks there), or none (staged, as without a broker). */
static int s_test_prefetch_ask(bool verbose)
{
    int fails = 0;
    ll_sched_decision_t d[8];
    ll_sched_t *s = ll_sched_new(1, 4, 10000.0, true);
    S_CHECK(s && ll_sched_session_open(s, 0, "a") >= 0 && ll_sched_session_open(s, 0, "b") >= 0);
    ll_sched_slot_lease(s, 0, false);
    ll_sched_prefetch_ask(s, true);
    int p1 = ll_sched_add(s, 0, "a", LL_SCHED_PREFETCH, 0, 1);
    S_CHECK(s_test_pass(s, 2, true, d, 8) == 0 && ll_sched_prefetch_wanting(s) == 1);
    ll_sched_slot_lease(s, 0, true); /* lent for it */
    int n = s_test_pass(s, 3, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == p1 && d[0].slot == 0);
    S_CHECK(ll_sched_prefetch_wanting(s) == 0);
    /* Another session's prefetch: none lent this time, so it is staged. */
    int p2 = ll_sched_add(s, 0, "b", LL_SCHED_PREFETCH, 0, 4);
    S_CHECK(s_test_pass(s, 5, true, d, 8) == 0 && ll_sched_prefetch_wanting(s) == 1);
    ll_sched_prefetch_refused(s);
    S_CHECK(ll_sched_prefetch_wanting(s) == 0);
    n = s_test_pass(s, 6, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == p2 && d[0].slot == -1);
    /* A restage never asks: staged at once. */
    int r3 = ll_sched_add(s, 0, "c", LL_SCHED_RESTAGE, 0, 7);
    n = s_test_pass(s, 8, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == r3 && d[0].slot == -1);
    ll_sched_destroy(&s);
    return fails;
}

int ll_sched_selftest(bool verbose)
{
    int fails = s_test_cells(verbose) + s_test_fork_failed(verbose) + s_test_credit(verbose) +
                s_test_staged(verbose) + s_test_promotion(verbose) + s_test_sessions(verbose) +
                s_test_homes(verbose) + s_test_leases(verbose) + s_test_prefetch_ask(verbose);
    if (verbose)
        fprintf(stderr, "ll_sched: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
