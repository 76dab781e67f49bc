/* ll_sched: the host pool's scheduling decisions (see ll_sched.h).  Used by
 * the pool's one thread; a few hundred entries at most, so plain arrays
 * scanned, as the pool always did, but only up to the last entry in use
 * (the fleet simulator runs thousands of these schedules). */
#include "policy/ll_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pass under way (ll_sched_begin .. ll_sched_next false). */
typedef struct {
    bool active;                  /* between begin and the last next */
    double now;                   /* the pass's clock */
    bool nodes_ready;             /* some zygote node accepts forks */
    int order[LL_SCHED_MAX_JOBS]; /* queued jobs, oldest first */
    int nq, i;                    /* queued, next to decide */
    int evicting;                 /* evictions under way whose slot no waiting cell claimed */
    bool blocked;                 /* an older cell waits: younger ones take no slot first */
    int last_fork;                /* the job of the last FORK (ll_sched_fork_failed) */
    int wait_r;                   /* the wait phase's next entry; -1 before it */
    int queued;                   /* wait phase: cells queued */
    bool all_held;                /* wait phase: every slot is held */
} s_pass_t;

struct ll_sched_t {
    int nslots;                        /* slots */
    int max_staged;                    /* staged workers at most */
    bool keep_warm;                    /* workers may stay warm */
    ll_gd_t *gd;                       /* eviction order of warm workers */
    int slot_job[LL_SCHED_MAX_SLOTS];  /* job holding each slot, -1 free */
    bool unleased[LL_SCHED_MAX_SLOTS]; /* hostd: the slot is not ours (ll_sched_slot_lease) */
    bool evict_hold;                   /* hostd: no eviction for a slot (ll_sched_evict_hold) */
    bool wait_quiet;                   /* hostd: no WAIT told yet (ll_sched_wait_quiet) */
    bool prefetch_ask;                 /* hostd: prefetches ask it first (ll_sched_prefetch_ask) */
    ll_sched_job_t jobs[LL_SCHED_MAX_JOBS];             /* jobs and their workers */
    ll_sched_session_t sessions[LL_SCHED_MAX_SESSIONS]; /* sessions of connected clients */
    int njobs;                                          /* entries from here on are all free */
    int nsess;                                          /* sessions from here on are all unused */
    s_pass_t pass;                                      /* the pass under way */
};

static void s_job_clear(ll_sched_job_t *j)
{
    free(j->session);
    memset(j, 0, sizeof *j);
    j->slot = -1;
}

/* After an entry was freed: the scans stop at the last one in use. */
static void s_jobs_shrink(ll_sched_t *self)
{
    while (self->njobs > 0 && self->jobs[self->njobs - 1].state == LL_SCHED_FREE)
        self->njobs--;
}

ll_sched_t *ll_sched_new(int nslots, int max_staged, double spec_window_ms, bool keep_warm)
{
    if (nslots < 1 || nslots > LL_SCHED_MAX_SLOTS)
        return NULL;
    ll_sched_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->gd = ll_gd_new(spec_window_ms);
    if (!self->gd) {
        free(self);
        return NULL;
    }
    self->nslots = nslots;
    self->max_staged = max_staged;
    self->keep_warm = keep_warm;
    for (int s = 0; s < LL_SCHED_MAX_SLOTS; s++)
        self->slot_job[s] = -1;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        self->jobs[r].slot = -1;
    return self;
}

void ll_sched_destroy(ll_sched_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_sched_t *self = *self_p;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        free(self->jobs[r].session);
    for (int i = 0; i < LL_SCHED_MAX_SESSIONS; i++)
        free(self->sessions[i].name);
    ll_gd_destroy(&self->gd);
    free(self);
    *self_p = NULL;
}

/* ------------------------------------------------------------------ */
/* Sessions                                                           */

int ll_sched_session_find(const ll_sched_t *self, int client, const char *name)
{
    for (int i = 0; i < self->nsess; i++) {
        const ll_sched_session_t *se = &self->sessions[i];
        if (se->used && se->client == client && name && strcmp(se->name, name) == 0)
            return i;
    }
    return -1;
}

int ll_sched_session_open(ll_sched_t *self, int client, const char *name)
{
    int i = ll_sched_session_find(self, client, name);
    if (i >= 0 || client < 0 || !name)
        return i;
    for (i = 0; i < LL_SCHED_MAX_SESSIONS && self->sessions[i].used; i++)
        ;
    if (i == LL_SCHED_MAX_SESSIONS)
        return -1;
    if (i >= self->nsess)
        self->nsess = i + 1;
    ll_sched_session_t *se = &self->sessions[i];
    se->name = strdup(name);
    if (!se->name)
        return -1;
    se->used = true;
    se->client = client;
    se->held_ms = 0;
    se->credit = 1; /* its first prefetch may take a slot: the user is about to run it */
    return i;
}

void ll_sched_session_close(ll_sched_t *self, int i)
{
    free(self->sessions[i].name);
    memset(&self->sessions[i], 0, sizeof self->sessions[i]);
    while (self->nsess > 0 && !self->sessions[self->nsess - 1].used)
        self->nsess--;
}

double ll_sched_session_held(const ll_sched_t *self, int i, double now)
{
    const ll_sched_session_t *se = &self->sessions[i];
    double held = se->held_ms;
    for (int r = 0; r < self->njobs; r++) {
        const ll_sched_job_t *j = &self->jobs[r];
        if (j->state && j->slot >= 0 && j->client == se->client && j->session &&
            strcmp(j->session, se->name) == 0)
            held += now - j->slot_t0;
    }
    return held;
}

/* ------------------------------------------------------------------ */
/* Slots                                                              */

static void s_take_slot(ll_sched_t *self, int r, int slot, double now)
{
    self->slot_job[slot] = r;
    self->jobs[r].slot = slot;
    self->jobs[r].slot_t0 = now;
}

/* R gives its slot back at NOW; its session is billed for the holding. */
static void s_release_slot(ll_sched_t *self, int r, double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    if (j->slot < 0)
        return;
    int i = ll_sched_session_find(self, j->client, j->session);
    if (i >= 0)
        self->sessions[i].held_ms += now - j->slot_t0;
    self->slot_job[j->slot] = -1;
    j->slot = -1;
}

static int s_free_slot(const ll_sched_t *self)
{
    for (int s = 0; s < self->nslots; s++)
        if (self->slot_job[s] < 0 && !self->unleased[s])
            return s;
    return -1;
}

/* ------------------------------------------------------------------ */
/* Jobs: what happened                                                */

int ll_sched_add(ll_sched_t *self, int client, const char *session, ll_sched_kind_t kind,
                 double closure_bytes, double now)
{
    int r = 0;
    while (r < LL_SCHED_MAX_JOBS && self->jobs[r].state)
        r++;
    if (r == LL_SCHED_MAX_JOBS)
        return -1;
    if (r >= self->njobs)
        self->njobs = r + 1;
    ll_sched_job_t *j = &self->jobs[r];
    s_job_clear(j);
    j->session = strdup(session);
    if (!j->session)
        return -1;
    j->state = LL_SCHED_QUEUED;
    j->kind = kind;
    j->client = client;
    j->t_queued = now;
    j->closure_bytes = closure_bytes > 0 ? closure_bytes : 0;
    return r;
}

void ll_sched_set_worker(ll_sched_t *self, int r, int key)
{
    self->jobs[r].worker.key = key;
}

void ll_sched_set_home(ll_sched_t *self, int r, int names)
{
    self->jobs[r].worker.home = names > 0 ? names : 0;
}

void ll_sched_ready(ll_sched_t *self, int r)
{
    ll_sched_job_t *j = &self->jobs[r];
    j->state = j->kind == LL_SCHED_CELL ? LL_SCHED_RUNNING : LL_SCHED_PREPARING;
}

void ll_sched_saving(ll_sched_t *self, int r)
{
    if (self->jobs[r].state == LL_SCHED_RUNNING)
        self->jobs[r].state = LL_SCHED_SAVING;
}

/* R's worker is idle now (its save committed, or a prefetch prepared it):
 * warm for its session.  CHANGED: its state changed, so GreedyDual values
 * it from the clock now.  A staged worker holds no slot: it is nobody's
 * victim (it leaves when idle, cancelled or unused).  A home is never
 * GreedyDual's victim (s_victim falls back to it). */
static void s_make_warm(ll_sched_t *self, int r, bool changed, double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    j->state = LL_SCHED_WARM;
    j->worker.idle_since = now;
    if (j->slot < 0)
        return;
    if (changed || !ll_gd_value(self->gd, j->worker.key, NULL))
        ll_gd_changed(self->gd, j->worker.key, j->worker.held_bytes, j->worker.spec, now);
    ll_gd_set_idle(self->gd, j->worker.key, j->worker.home == 0);
}

/* Whether R's worker may stay after its job (MAY_STAY: it and the pool's
 * side allow it): while its client is there, as a warm worker or a home. */
static bool s_stays(const ll_sched_t *self, const ll_sched_job_t *j, bool may_stay)
{
    return may_stay && (self->keep_warm || j->worker.home > 0) && j->client >= 0;
}

/* hostd (ll_sched_slot_lease): a worker on a slot taken back does not stay
 * warm after its job; its slot is free at its reply. */
static bool s_slot_revoked(const ll_sched_t *self, const ll_sched_job_t *j)
{
    return j->slot >= 0 && self->unleased[j->slot];
}

bool ll_sched_prepared(ll_sched_t *self, int r, bool may_stay, bool changed, double held_bytes,
                       double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    if (held_bytes >= 0)
        j->worker.held_bytes = held_bytes;
    if (!s_stays(self, j, may_stay) || s_slot_revoked(self, j))
        return false;
    s_make_warm(self, r, changed, now);
    ll_gd_prepared(self->gd, j->worker.key, true, now); /* for the session's coming cell */
    return true;
}

bool ll_sched_replied(ll_sched_t *self, int r, bool may_stay, double held_bytes, double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    if (held_bytes >= 0)
        j->worker.held_bytes = held_bytes;
    int si = ll_sched_session_find(self, j->client, j->session);
    if (si >= 0)
        self->sessions[si].credit = 1; /* a cell ran: its next prefetch may take a slot */
    if (!s_stays(self, j, may_stay) || s_slot_revoked(self, j))
        return false;
    j->worker.cells++;
    j->worker.spec = false;
    ll_gd_prepared(self->gd, j->worker.key, false, 0); /* the cell it was prepared for ran */
    s_make_warm(self, r, true, now);
    return true;
}

void ll_sched_lost(ll_sched_t *self, int r)
{
    self->jobs[r].worker.gone = true;
}

void ll_sched_requeue(ll_sched_t *self, int r, double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    s_release_slot(self, r, now);
    ll_gd_remove(self->gd, j->worker.key);
    j->worker.key = 0;
    j->worker.gone = false;
    j->worker.cells = 0;
    j->worker.held_bytes = 0;
    j->state = LL_SCHED_QUEUED;
}

void ll_sched_release(ll_sched_t *self, int w, double *l_out)
{
    ll_sched_job_t *j = &self->jobs[w];
    double l = 0;
    ll_gd_value(self->gd, j->worker.key, &l);
    ll_gd_remove(self->gd, j->worker.key);
    j->state = LL_SCHED_EVICTING;
    if (l_out)
        *l_out = l;
}

void ll_sched_drop(ll_sched_t *self, int r, double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    s_release_slot(self, r, now);
    if (j->worker.key > 0)
        ll_gd_remove(self->gd, j->worker.key);
    s_job_clear(j);
    s_jobs_shrink(self);
}

void ll_sched_client_gone(ll_sched_t *self, int client)
{
    for (int r = 0; r < self->njobs; r++)
        if (self->jobs[r].state && self->jobs[r].client == client)
            self->jobs[r].client = -1;
}

/* ------------------------------------------------------------------ */
/* What the decisions look at                                         */

static bool s_same_session(const ll_sched_job_t *a, const ll_sched_job_t *b)
{
    return a->client == b->client && a->session && b->session &&
           strcmp(a->session, b->session) == 0;
}

/* Whether a cell of R's session sent no later than R is queued (it
 * superseded R; a cell sent after R waits for R's preparation instead). */
static bool s_session_cell_queued(const ll_sched_t *self, int r)
{
    const ll_sched_job_t *j = &self->jobs[r];
    for (int q = 0; q < self->njobs; q++) {
        const ll_sched_job_t *c = &self->jobs[q];
        if (q != r && c->state == LL_SCHED_QUEUED && c->kind == LL_SCHED_CELL &&
            c->t_queued <= j->t_queued && s_same_session(c, j))
            return true;
    }
    return false;
}

/* Whether any cell waits for a slot. */
static bool s_cells_waiting(const ll_sched_t *self)
{
    for (int r = 0; r < self->njobs; r++)
        if (self->jobs[r].state == LL_SCHED_QUEUED && self->jobs[r].kind == LL_SCHED_CELL)
            return true;
    return false;
}

/* Workers prepared, or being prepared, without a slot (staged). */
static int s_staged_count(const ll_sched_t *self)
{
    int n = 0;
    for (int r = 0; r < self->njobs; r++) {
        const ll_sched_job_t *j = &self->jobs[r];
        if (j->slot < 0 && (j->state == LL_SCHED_FORKING || j->state == LL_SCHED_PREPARING ||
                            j->state == LL_SCHED_WARM))
            n++;
    }
    return n;
}

/* The session's warm worker for queued R (same client and session, not
 * gone), else -1; of several (cells that overlapped), the one that became
 * warm last.  *BUSY: the session has a worker preparing a prefetch (R waits
 * for it rather than forking another); *RUNNING: one runs or saves a cell. */
static int s_warm_for(const ll_sched_t *self, int r, bool *busy, bool *running)
{
    const ll_sched_job_t *j = &self->jobs[r];
    int best = -1;
    *busy = *running = false;
    for (int w = 0; w < self->njobs; w++) {
        const ll_sched_job_t *wk = &self->jobs[w];
        if (w == r || !wk->state || !s_same_session(wk, j))
            continue;
        if (wk->state == LL_SCHED_WARM && !wk->worker.gone) {
            if (best < 0 || wk->worker.idle_since > self->jobs[best].worker.idle_since)
                best = w;
        } else if (wk->state == LL_SCHED_PREPARING ||
                   (wk->kind != LL_SCHED_CELL && wk->state == LL_SCHED_FORKING)) {
            *busy = true;
        } else if (wk->state == LL_SCHED_FORKING || wk->state == LL_SCHED_RUNNING ||
                   wk->state == LL_SCHED_SAVING) {
            *running = true;
        }
    }
    return best;
}

/* The warm entry of GreedyDual's victim at NOW, or -1.  Homes are no
 * GreedyDual victims: when no other warm worker holds a slot, the home
 * whose state is oldest (smallest L) is, as the last choice. */
static int s_victim(const ll_sched_t *self, double now)
{
    int key = ll_gd_victim(self->gd, now);
    for (int v = 0; v < self->njobs && key >= 0; v++)
        if (self->jobs[v].state == LL_SCHED_WARM && self->jobs[v].worker.key == key)
            return v;
    int best = -1;
    double best_l = 0;
    for (int v = 0; v < LL_SCHED_MAX_JOBS; v++) {
        const ll_sched_job_t *j = &self->jobs[v];
        double l = 0;
        if (j->state != LL_SCHED_WARM || j->worker.home == 0 || j->slot < 0 || j->worker.gone ||
            !ll_gd_value(self->gd, j->worker.key, &l))
            continue;
        if (best < 0 || l < best_l)
            best = v, best_l = l;
    }
    return best;
}

/* ------------------------------------------------------------------ */
/* Decisions, each applied before it is returned                      */

static bool s_fork(ll_sched_t *self, int r, int slot, ll_sched_decision_t *d)
{
    ll_sched_job_t *j = &self->jobs[r];
    j->state = LL_SCHED_FORKING;
    j->worker.spec = true;
    if (slot >= 0)
        s_take_slot(self, r, slot, self->pass.now);
    self->pass.last_fork = r;
    d->op = LL_SCHED_FORK;
    d->r = r;
    d->slot = slot;
    return true;
}

/* Queued R goes to warm worker W (its slot, if any, was taken for it). */
static bool s_hand(ll_sched_t *self, int r, int w, ll_sched_decision_t *d)
{
    ll_sched_job_t *j = &self->jobs[r], *wk = &self->jobs[w];
    j->worker = wk->worker;
    j->slot = wk->slot;
    j->slot_t0 = wk->slot_t0;
    if (j->slot >= 0)
        self->slot_job[j->slot] = r;
    wk->slot = -1;
    s_job_clear(wk);
    s_jobs_shrink(self);
    j->state = j->kind == LL_SCHED_CELL ? LL_SCHED_FORKING : LL_SCHED_PREPARING;
    ll_gd_set_idle(self->gd, j->worker.key, false);
    d->op = LL_SCHED_HAND;
    d->r = r;
    d->w = w;
    d->slot = j->slot;
    return true;
}

/* Evict warm worker V under pressure, for R: GreedyDual's clock advances to
 * its L; it holds its slot until it is gone.  Its session is prepared
 * again, staged, while its client is there and there is room. */
static bool s_evict(ll_sched_t *self, int r, int v, bool credit, ll_sched_decision_t *d)
{
    ll_sched_job_t *wk = &self->jobs[v];
    d->l = 0;
    ll_gd_value(self->gd, wk->worker.key, &d->l);
    ll_gd_evict(self->gd, wk->worker.key);
    wk->state = LL_SCHED_EVICTING;
    d->op = LL_SCHED_EVICT;
    d->r = r;
    d->w = v;
    d->credit = credit;
    d->restage = wk->client >= 0 && s_staged_count(self) < self->max_staged;
    return true;
}

static bool s_skip(ll_sched_t *self, int r, const char *why, ll_sched_decision_t *d)
{
    d->op = LL_SCHED_SKIP;
    d->r = r;
    d->why = why;
    return true;
}

/* Prefetch R finds every slot held: whether it evicts the GreedyDual
 * victim among idle warm workers (completed before speculative, smallest
 * L), never one that is speculative (prepared by a prefetch for its
 * session's coming cell, ll_greedydual.h: a cell may take it, a prefetch not),
 * when either
 * - the victim's L is below the L the prefetched worker would get (the
 *   clock now plus the bytes of its closure, when the request gives them,
 *   else 0): state that went unused since the clock passed it;
 * - or the session holds a prefetch credit.  A session starts with one
 *   credit, spends it here and earns it back by running a cell: an honest
 *   user edits and then runs what was prefetched, so each of its prefetches
 *   may take a slot from state left idle, as its cell would at Run, but
 *   within the edit time.  A client that only prefetches gets one slot
 *   this way, then none until it runs a cell.
 * Repeated prefetches of an unchanged closure do not renew H either, so
 * they cannot keep evicting sessions whose state changed since.  On an
 * eviction, fills *D and marks R as waiting for that slot. */
static bool s_prefetch_evicts(ll_sched_t *self, int r, ll_sched_decision_t *d)
{
    ll_sched_job_t *j = &self->jobs[r];
    double now = self->pass.now, l = 0;
    if (self->evict_hold)
        return false; /* hostd: a slot may come from the broker */
    int victim = ll_gd_victim(self->gd, now);
    if (victim < 0 || !ll_gd_value(self->gd, victim, &l) ||
        ll_gd_speculative(self->gd, victim, now))
        return false; /* every idle worker is prepared for its session's coming cell */
    bool older = l < ll_gd_clock(self->gd) + j->closure_bytes;
    int si = ll_sched_session_find(self, j->client, j->session);
    bool credit = si >= 0 && self->sessions[si].credit > 0;
    int v = s_victim(self, now);
    if ((!older && !credit) || v < 0)
        return false;
    if (!older)
        self->sessions[si].credit--;
    j->queue.awaits_evict = true; /* stays queued until that worker is gone */
    return s_evict(self, r, v, !older, d);
}

/* hostd: whether prefetch R, finding no free slot and no cell waiting,
 * waits for the broker's answer (a slot lent, or none) rather than evict
 * or be staged now. */
static bool s_prefetch_asks(ll_sched_t *self, int r)
{
    ll_sched_job_t *j = &self->jobs[r];
    if (!self->prefetch_ask || j->kind != LL_SCHED_PREFETCH || j->queue.lease_refused ||
        j->queue.awaits_evict)
        return false;
    j->queue.wants_lease = true;
    return true;
}

/* Prefetch R, whose session's worker W is staged: its user edits a GPU
 * cell, so W gets a slot now if one is free, or may be freed by the
 * prefetch rules (the wait for it then falls in the edit time), else it
 * re-checks versions without one. */
static bool s_decide_staged_prefetch(ll_sched_t *self, int r, int w, ll_sched_decision_t *d)
{
    ll_sched_job_t *j = &self->jobs[r];
    int slot = s_free_slot(self);
    bool cells = s_cells_waiting(self);
    if (slot >= 0 && !cells) {
        s_take_slot(self, w, slot, self->pass.now);
        return s_hand(self, r, w, d);
    }
    if (slot < 0 && !cells && s_prefetch_asks(self, r))
        return false;
    if (slot < 0 && !cells && !j->queue.awaits_evict && j->kind != LL_SCHED_RESTAGE &&
        s_prefetch_evicts(self, r, d))
        return true;
    if (!j->queue.awaits_evict || cells)
        return s_hand(self, r, w, d);
    return false;
}

/* Prefetch R without a warm worker of its session. */
static bool s_decide_prefetch(ll_sched_t *self, int r, ll_sched_decision_t *d)
{
    ll_sched_job_t *j = &self->jobs[r];
    int slot = s_free_slot(self);
    bool cells = s_cells_waiting(self);
    bool node = self->pass.nodes_ready;
    bool room = s_staged_count(self) < self->max_staged;
    if (j->kind == LL_SCHED_RESTAGE) {
        /* Staged or not at all: it takes nobody's slot. */
        if (node && room)
            return s_fork(self, r, -1, d);
        d->op = LL_SCHED_DROP;
        d->r = r;
        return true;
    }
    if (slot >= 0 && !cells && node)
        return s_fork(self, r, slot, d);
    if (slot < 0 && !cells && s_prefetch_asks(self, r))
        return false;
    if (slot < 0 && !cells && !j->queue.awaits_evict && s_prefetch_evicts(self, r, d))
        return true;
    if (!j->queue.awaits_evict && node && room)
        return s_fork(self, r, -1, d); /* staged: prepared without a slot, it takes one at Run */
    if (!j->queue.awaits_evict)
        return s_skip(self, r, cells ? "cells wait for a GPU slot" : "no free GPU slot", d);
    return false;
}

/* Cell R finds no slot: it waits, and evicts the GreedyDual victim unless
 * an eviction under way already frees a slot for it. */
static bool s_decide_pressure(ll_sched_t *self, int r, ll_sched_decision_t *d)
{
    self->pass.blocked = true;
    if (self->pass.evicting > 0) {
        self->pass.evicting--; /* a slot is on its way to this cell */
        return false;
    }
    if (self->evict_hold)
        return false; /* hostd: a slot may come from the broker first */
    int v = s_victim(self, self->pass.now);
    return v >= 0 && s_evict(self, r, v, false, d);
}

/* The decision for queued R, if any. */
static bool s_decide(ll_sched_t *self, int r, ll_sched_decision_t *d)
{
    ll_sched_job_t *j = &self->jobs[r];
    bool prefetch = j->kind != LL_SCHED_CELL;
    if (j->state != LL_SCHED_QUEUED)
        return false;
    if (prefetch && s_session_cell_queued(self, r))
        return s_skip(self, r, "the session's cell waits for a GPU slot", d);
    bool busy = false, running = false;
    int w = s_warm_for(self, r, &busy, &running);
    if (w >= 0 && self->jobs[w].slot < 0 && prefetch)
        return s_decide_staged_prefetch(self, r, w, d);
    if (w >= 0 && self->jobs[w].slot >= 0)
        return s_hand(self, r, w, d);
    if (w >= 0) {
        /* The cell's worker was prepared without a slot (staged): it takes
         * a free one, or waits as a cold cell would, evicting. */
        if (self->pass.blocked)
            return false;
        int slot = s_free_slot(self);
        if (slot < 0)
            return s_decide_pressure(self, r, d);
        s_take_slot(self, w, slot, self->pass.now);
        s_hand(self, r, w, d);
        d->staged_hit = true;
        return true;
    }
    if (busy)
        return false;        /* the session's prefetch is preparing its worker: wait for it */
    if (prefetch && running) /* the session's cell runs: its worker stays warm after it */
        return s_skip(self, r, "the session's worker is running a cell", d);
    if (prefetch)
        return s_decide_prefetch(self, r, d);
    if (self->pass.blocked)
        return false;
    int slot = s_free_slot(self);
    if (slot < 0)
        return s_decide_pressure(self, r, d);
    if (!self->pass.nodes_ready) {
        self->pass.blocked = true; /* no node ready yet */
        return false;
    }
    return s_fork(self, r, slot, d);
}

void ll_sched_begin(ll_sched_t *self, double now, bool nodes_ready)
{
    s_pass_t *p = &self->pass;
    p->active = true;
    p->now = now;
    p->nodes_ready = nodes_ready;
    p->nq = p->i = 0;
    p->blocked = false;
    p->last_fork = -1;
    p->wait_r = -1;
    for (int r = 0; r < self->njobs; r++)
        if (self->jobs[r].state == LL_SCHED_QUEUED)
            p->order[p->nq++] = r;
    /* Oldest first (a handful at most: insertion sort, stable). */
    for (int i = 1; i < p->nq; i++)
        for (int k = i;
             k > 0 && self->jobs[p->order[k]].t_queued < self->jobs[p->order[k - 1]].t_queued;
             k--) {
            int t = p->order[k];
            p->order[k] = p->order[k - 1];
            p->order[k - 1] = t;
        }
    p->evicting = 0;
    for (int r = 0; r < self->njobs; r++)
        if (self->jobs[r].state == LL_SCHED_EVICTING && self->jobs[r].slot >= 0)
            p->evicting++; /* a staged one frees none */
}

bool ll_sched_next(ll_sched_t *self, ll_sched_decision_t *d)
{
    s_pass_t *p = &self->pass;
    if (!p->active)
        return false;
    memset(d, 0, sizeof *d);
    d->w = d->slot = -1;
    while (p->i < p->nq) {
        int r = p->order[p->i++];
        if (s_decide(self, r, d))
            return true;
        memset(d, 0, sizeof *d);
        d->w = d->slot = -1;
    }
    /* Then every queued cell is told, once, that it waits while every slot
     * is held. */
    if (p->wait_r < 0) {
        p->wait_r = 0;
        p->queued = 0;
        for (int r = 0; r < self->njobs; r++)
            if (self->jobs[r].state == LL_SCHED_QUEUED && self->jobs[r].kind == LL_SCHED_CELL)
                p->queued++;
        p->all_held = s_free_slot(self) < 0 && !self->wait_quiet;
    }
    while (p->all_held && p->wait_r < self->njobs) {
        ll_sched_job_t *j = &self->jobs[p->wait_r++];
        if (j->state == LL_SCHED_QUEUED && j->kind == LL_SCHED_CELL && !j->queue.told_wait) {
            j->queue.told_wait = true;
            d->op = LL_SCHED_WAIT;
            d->r = (int) (j - self->jobs);
            d->queued = p->queued;
            return true;
        }
    }
    p->active = false;
    return false;
}

void ll_sched_fork_failed(ll_sched_t *self, int r)
{
    ll_sched_job_t *j = &self->jobs[r];
    if (j->state != LL_SCHED_FORKING)
        return;
    if (j->slot >= 0) {
        self->slot_job[j->slot] = -1; /* never held: nothing to bill */
        j->slot = -1;
    }
    j->state = LL_SCHED_QUEUED;
    if (self->pass.active && self->pass.last_fork == r && j->kind == LL_SCHED_CELL)
        self->pass.blocked = true;
}

/* ------------------------------------------------------------------ */
/* Reading                                                            */

const ll_sched_job_t *ll_sched_job(const ll_sched_t *self, int r)
{
    return &self->jobs[r];
}

const ll_sched_session_t *ll_sched_session(const ll_sched_t *self, int i)
{
    return &self->sessions[i];
}

int ll_sched_jobs_end(const ll_sched_t *self)
{
    return self->njobs;
}

int ll_sched_nslots(const ll_sched_t *self)
{
    return self->nslots;
}

/* ---- hostd (zygote/ll_hostpool_hostd.c): slots leased from the broker ---- */

void ll_sched_slot_lease(ll_sched_t *self, int s, bool leased)
{
    if (s >= 0 && s < self->nslots)
        self->unleased[s] = !leased;
}

bool ll_sched_slot_leased(const ll_sched_t *self, int s)
{
    return s >= 0 && s < self->nslots && !self->unleased[s];
}

void ll_sched_evict_hold(ll_sched_t *self, bool hold)
{
    self->evict_hold = hold;
}

void ll_sched_wait_quiet(ll_sched_t *self, bool quiet)
{
    self->wait_quiet = quiet;
}

void ll_sched_prefetch_ask(ll_sched_t *self, bool ask)
{
    self->prefetch_ask = ask;
}

void ll_sched_prefetch_refused(ll_sched_t *self)
{
    for (int r = 0; r < self->njobs; r++)
        if (self->jobs[r].state == LL_SCHED_QUEUED && self->jobs[r].queue.wants_lease)
            self->jobs[r].queue.lease_refused = true;
}

int ll_sched_prefetch_wanting(const ll_sched_t *self)
{
    int n = 0;
    for (int r = 0; r < self->njobs; r++)
        n += self->jobs[r].state == LL_SCHED_QUEUED && self->jobs[r].queue.wants_lease &&
             !self->jobs[r].queue.lease_refused;
    return n;
}

int ll_sched_slot_job(const ll_sched_t *self, int s)
{
    return self->slot_job[s];
}

const ll_gd_t *ll_sched_gd(const ll_sched_t *self)
{
    return self->gd;
}
