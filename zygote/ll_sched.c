/* ll_sched: the host pool's scheduling decisions (see ll_sched.h).  Used by
 * the pool's one thread; a few hundred entries at most, so plain arrays
 * scanned, as the pool always did, but only up to the last entry in use
 * (the fleet simulator runs thousands of these schedules). */
#include "zygote/ll_sched.h"

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
    ll_gdsf_t *gdsf;                   /* eviction order of warm workers */
    int slot_job[LL_SCHED_MAX_SLOTS];  /* job holding each slot, -1 free */
    bool unleased[LL_SCHED_MAX_SLOTS]; /* hostd: the slot is not ours (ll_sched_slot_lease) */
    bool evict_hold;                   /* hostd: no eviction for a slot (ll_sched_evict_hold) */
    bool wait_quiet;                   /* hostd: no WAIT told yet (ll_sched_wait_quiet) */
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
    self->gdsf = ll_gdsf_new(spec_window_ms);
    if (!self->gdsf) {
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
    ll_gdsf_destroy(&self->gdsf);
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
 * victim (it leaves when idle, cancelled or unused). */
static void s_make_warm(ll_sched_t *self, int r, bool changed, double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    j->state = LL_SCHED_WARM;
    j->worker.idle_since = now;
    if (j->slot < 0)
        return;
    if (changed || !ll_gdsf_value(self->gdsf, j->worker.key, NULL))
        ll_gdsf_changed(self->gdsf, j->worker.key, j->worker.held_bytes, j->worker.spec, now);
    ll_gdsf_set_idle(self->gdsf, j->worker.key, true);
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
    if (!(may_stay && self->keep_warm && j->client >= 0) || s_slot_revoked(self, j))
        return false;
    s_make_warm(self, r, changed, now);
    ll_gdsf_prepared(self->gdsf, j->worker.key, true, now); /* for the session's coming cell */
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
    if (!(may_stay && self->keep_warm && j->client >= 0) || s_slot_revoked(self, j))
        return false;
    j->worker.cells++;
    j->worker.spec = false;
    ll_gdsf_prepared(self->gdsf, j->worker.key, false, 0); /* the cell it was prepared for ran */
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
    ll_gdsf_remove(self->gdsf, j->worker.key);
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
    ll_gdsf_value(self->gdsf, j->worker.key, &l);
    ll_gdsf_remove(self->gdsf, j->worker.key);
    j->state = LL_SCHED_EVICTING;
    if (l_out)
        *l_out = l;
}

void ll_sched_drop(ll_sched_t *self, int r, double now)
{
    ll_sched_job_t *j = &self->jobs[r];
    s_release_slot(self, r, now);
    if (j->worker.key > 0)
        ll_gdsf_remove(self->gdsf, j->worker.key);
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

/* The warm entry of GreedyDual's victim at NOW, or -1. */
static int s_victim(const ll_sched_t *self, double now)
{
    int key = ll_gdsf_victim(self->gdsf, now);
    for (int v = 0; v < self->njobs && key >= 0; v++)
        if (self->jobs[v].state == LL_SCHED_WARM && self->jobs[v].worker.key == key)
            return v;
    return -1;
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
    ll_gdsf_set_idle(self->gdsf, j->worker.key, false);
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
    ll_gdsf_value(self->gdsf, wk->worker.key, &d->l);
    ll_gdsf_evict(self->gdsf, wk->worker.key);
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
 * session's coming cell, ll_gdsf.h: a cell may take it, a prefetch not),
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
    int victim = ll_gdsf_victim(self->gdsf, now);
    if (victim < 0 || !ll_gdsf_value(self->gdsf, victim, &l) ||
        ll_gdsf_speculative(self->gdsf, victim, now))
        return false; /* every idle worker is prepared for its session's coming cell */
    bool older = l < ll_gdsf_clock(self->gdsf) + j->closure_bytes;
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

int ll_sched_slot_job(const ll_sched_t *self, int s)
{
    return self->slot_job[s];
}

const ll_gdsf_t *ll_sched_gdsf(const ll_sched_t *self)
{
    return self->gdsf;
}

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

#define S_CHECK(cond)                                                                 \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fails++;                                                                  \
            if (verbose)                                                              \
                fprintf(stderr, "ll_sched: failed: %s (line %d)\n", #cond, __LINE__); \
        }                                                                             \
    } while (0)

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
    S_CHECK(ll_gdsf_clock(ll_sched_gdsf(s)) == 100);
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
    S_CHECK(ll_gdsf_speculative(ll_sched_gdsf(s), 402, 6));
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
            ll_gdsf_speculative(ll_sched_gdsf(s), 501, 3));
    int ap = ll_sched_add(s, 0, "a", LL_SCHED_PREFETCH, 0, 3);
    n = s_test_pass(s, 3, true, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_SCHED_FORK && d[0].r == ap && d[0].slot == -1);
    S_CHECK(ll_sched_session(s, sa)->credit == 1); /* no eviction: credit kept */
    S_CHECK(s_test_prepared(s, ap, 502, 20, 4) && ll_sched_job(s, ap)->slot == -1);
    S_CHECK(!ll_gdsf_value(ll_sched_gdsf(s), 502, NULL)); /* staged: nobody's victim */
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
    S_CHECK(ll_sched_job(s, a1)->state == LL_SCHED_EVICTING &&
            ll_gdsf_clock(ll_sched_gdsf(s)) == 0);
    ll_sched_drop(s, a1, 500);
    S_CHECK(ll_sched_session_held(s, si, 900) == 400 && ll_sched_slot_job(s, 0) == -1);
    ll_sched_session_close(s, si);
    S_CHECK(ll_sched_session_find(s, 0, "a") == -1);
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

int ll_sched_selftest(bool verbose)
{
    int fails = s_test_cells(verbose) + s_test_fork_failed(verbose) + s_test_credit(verbose) +
                s_test_staged(verbose) + s_test_promotion(verbose) + s_test_sessions(verbose) +
                s_test_leases(verbose);
    if (verbose)
        fprintf(stderr, "ll_sched: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
#undef S_CHECK
