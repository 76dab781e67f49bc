/* ll_history: the committed versions of a session's variables kept after
 * newer ones superseded them (time travel: %looseleaf history / checkout),
 * within a byte budget.  Design and Redis keys: ll_history.c.
 *
 * The calls taking ll_store_t lock the store themselves (ll_store_enter)
 * unless their comment says "mutex held". */
#ifndef LL_HISTORY_H
#define LL_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/ll_redis.h"
#include "store/ll_store.h"

/* Turn the session's history on or off for every process of the session
 * (a Redis key each Store reads at its first commit).  0 or -1. */
int ll_history_set(ll_store_t *st, bool on);

/* Mutex held.  Whether commits of ST record history (read from Redis the
 * first time).  -1 when Redis could not say (the commit then fails). */
int ll_history_on(ll_store_t *st);

/* Whether a commit of NWRITES names keeps write W as a version of its own:
 * one with payloads always; one without (a scalar, a small list) only in a
 * commit of at most LL_HISTORY_SMALL_MAX names, so that a cell binding 100k
 * names neither grows its transaction fourfold nor makes every prune read
 * 100k index entries. */
#define LL_HISTORY_SMALL_MAX 64
static inline bool ll_history_keeps(const ll_store_write_t *w, size_t nwrites)
{
    return w->nprefs > 0 || nwrites <= LL_HISTORY_SMALL_MAX;
}

/* Mutex held.  Queue, inside a commit's MULTI, what keeps write W (its
 * entry key VKEY, its payload refs as JSON PREFS_JSON) as version VBUF of
 * cell CELL: *SENT grows by the replies to drain.  Nonzero when a command
 * could not be queued. */
int ll_history_queue(ll_store_t *st, ll_redis_argv_t *a, const char *vkey,
                     const ll_store_write_t *w, const char *vbuf, const char *prefs_json,
                     const char *cell, int *sent);

/* Mutex held; for reclamation: mark the regions kept versions use (as
 * ll_pool_refs_fn does for current ones).  0 or -1. */
int ll_history_mark(ll_store_t *st, uint64_t *mark, size_t nregions);

/* Mutex held; for a save that found the pool full (WHY "pool") or met the
 * user's cap ("cap", in the save's own process or, for another session's
 * save, in the owner's idle hook): drop the oldest superseded versions the
 * history keeps until REGIONS of the pool's regions are held by none of
 * them any more (SIZE_MAX: every one), so that a save never fails for old
 * versions' sake.  Each is remembered as dropped, and why.  The caller
 * reclaims (and trims, for the cap) what they held.  The number dropped
 * (0 when the history is off or keeps none), or -1. */
int ll_history_relieve(ll_store_t *st, size_t regions, const char *why);

/* One operation of the Python layer (ll_store_py.c), OP:
 *   "set"    NUM != 0: on, else off;                        *TEXT ""
 *   "list"   NAME (NULL: every name): one line per kept version, oldest
 *            first: "VER\tNAME\tTIME\tNBYTES\tCURRENT\tCELL" (TIME unix
 *            seconds, CURRENT 1 for the name's committed version), then one
 *            "dropped\tVER\tNAME\tTIME\tWHY" per dropped version (WHY:
 *            "budget", "pool" or "cap", see ll_history_relieve)
 *   "fetch"  NAME at version NUM: *ENTRY (caller frees with
 *            ll_store_entries_free(*entry, 1)) or NULL when not kept;
 *            *TEXT "kept", "dropped TIME WHY" (dropped then, why) or
 *            "unknown"
 *   "prune"  keep at most NUM bytes of superseded versions (their payload
 *            regions that no current version uses, and their blobs), and
 *            at most NAME (a decimal count; NULL: any number) of them,
 *            dropping the oldest first: one "VER\tNAME" line per dropped
 *            version.
 * *TEXT is malloc'd (caller frees).  0, or -1 with the reason recorded. */
int ll_history_op(ll_store_t *st, const char *op, const char *name, uint64_t num, char **text,
                  ll_store_entry_t **entry);

#endif
