/* ll_greedydual: which idle warm worker the host pool evicts under slot pressure
 * (GreedyDual, DESIGN.md mechanism 4).  Pure policy: no processes, no
 * clock of its own (callers pass NOW), so a self-test can script it.
 *
 * Each entry (a worker, named by an int KEY) has L = H + c: c = bytes of
 * state it holds, H = the pool clock when that state last changed (a cell
 * ran, a prefetch restored something).  The victim is the idle entry with
 * the smallest L, completed workers before speculative ones (prepared by a
 * prefetch, never ran a cell; or a worker that ran cells, prepared by a
 * prefetch for its session's coming cell), but a speculative worker keeps
 * that priority only for SPEC_WINDOW_MS after its state last changed (or
 * the first prefetch since its last cell): speculation is bounded, and
 * repeating a prefetch that changes nothing renews neither H nor the
 * window.  Evicting advances the clock to the victim's L, so newer
 * state outranks state that went unused.  Busy entries (preparing,
 * running, saving) are never victims.  Run by the pool's one thread. */
#ifndef LL_GREEDYDUAL_H
#define LL_GREEDYDUAL_H

#include <stdbool.h>

typedef struct ll_gd_t ll_gd_t;

/* A policy with clock 0.  NULL when out of memory. */
ll_gd_t *ll_gd_new(double spec_window_ms);
void ll_gd_destroy(ll_gd_t **self_p);

/* KEY's state changed at NOW_MS (added if new): H = clock, c = BYTES.
 * SPECULATIVE: it holds a prefetch's preparation and never ran a cell.
 * New entries are busy until ll_gd_set_idle.  Returns 0 or -1 (memory). */
int ll_gd_changed(ll_gd_t *self, int key, double bytes, bool speculative, double now_ms);

/* ON: a prefetch prepared KEY, a worker that already ran cells, for its
 * session's coming cell: it ranks as speculative for SPEC_WINDOW_MS from
 * the first such prefetch (later ones do not renew the window); OFF: that
 * cell ran.  No-op for an unknown key. */
void ll_gd_prepared(ll_gd_t *self, int key, bool on, double now_ms);

/* Whether KEY may be evicted now (idle, its save committed).  No-op for an
 * unknown key. */
void ll_gd_set_idle(ll_gd_t *self, int key, bool idle);

/* Forget KEY (it exited, or left for a reason other than pressure: its
 * client went away, idle timeout).  The clock stays. */
void ll_gd_remove(ll_gd_t *self, int key);

/* The idle entry to evict at NOW_MS, or -1 when none is idle. */
int ll_gd_victim(const ll_gd_t *self, double now_ms);

/* Evict KEY under pressure: forget it and advance the clock to its L (never
 * backwards).  Returns 0, or -1 for an unknown key. */
int ll_gd_evict(ll_gd_t *self, int key);

/* The clock, and KEY's L (false for an unknown key). */
double ll_gd_clock(const ll_gd_t *self);
bool ll_gd_value(const ll_gd_t *self, int key, double *l_out);

/* Whether KEY counts as speculative at NOW_MS (prepared, never ran a cell,
 * inside its window). */
bool ll_gd_speculative(const ll_gd_t *self, int key, double now_ms);

#endif
