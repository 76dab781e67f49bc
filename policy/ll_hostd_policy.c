/* ll_hostd_policy: the slot broker's decisions (see ll_hostd_policy.h).
 * Used by the broker's one thread; a few hundred entries at most, so plain
 * arrays scanned. */
#include "policy/ll_hostd_policy.h"
#include "base/ll_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    bool used;         /* registered */
    unsigned uid;      /* its user */
    int nslots;        /* leases it may hold at once (its own slots) */
    int want;          /* slots wanted beyond what it holds */
    double wait_since; /* ms, since when it wants (0: wants none) */
    bool told_wait;    /* told WAIT since its want last changed */
    int revokes_for;   /* revocations under way for it */
    int want_pf;       /* slots wanted for prefetches */
    double pf_since;   /* ms, since when it wants them */
    bool told_pf;      /* told WAIT (PREFETCH) since want_pf last changed */
} s_conn_t;

struct ll_hostd_policy_t {
    int nslots;
    struct {
        bool used;    /* lent to UID before the broker restarted, not claimed yet */
        unsigned uid; /* the user it was lent to */
        double until; /* ms, end of the grace: then it is free */
    } restored[LL_HOSTD_MAX_SLOTS];
    s_conn_t conns[LL_HOSTD_MAX_CONNS];
    ll_hostd_lease_t leases[LL_HOSTD_MAX_LEASES];
    ll_hostd_user_t users[LL_HOSTD_MAX_USERS];
};

ll_hostd_policy_t *ll_hostd_policy_new(int nslots)
{
    if (nslots < 1 || nslots > LL_HOSTD_MAX_SLOTS)
        return NULL;
    ll_hostd_policy_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->nslots = nslots;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        self->leases[i].conn = -1;
    return self;
}

void ll_hostd_policy_destroy(ll_hostd_policy_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free(*self_p);
    *self_p = NULL;
}

int ll_hostd_policy_plan(int ngpu, int per_gpu, int total, double fraction, ll_gpu_plan_t *plan)
{
    memset(plan, 0, sizeof *plan);
    if (total < 0 || total > LL_HOSTD_MAX_SLOTS || per_gpu < 0 || per_gpu > LL_HOSTD_MAX_SLOTS ||
        (ngpu > 0 && per_gpu > 0 && ngpu * per_gpu > LL_HOSTD_MAX_SLOTS))
        return -1;
    if (ngpu > 0 && ll_gpu_plan(ngpu, per_gpu, total, fraction, plan) == 0)
        return plan->nslots;
    plan->nslots = total > 0 ? total : 2;
    for (int s = 0; s < plan->nslots; s++)
        plan->slot_dev[s] = -1;
    return plan->nslots;
}

static s_conn_t *s_conn(ll_hostd_policy_t *self, int conn)
{
    return conn >= 0 && conn < LL_HOSTD_MAX_CONNS && self->conns[conn].used ? &self->conns[conn]
                                                                            : NULL;
}

static ll_hostd_user_t *s_user(ll_hostd_policy_t *self, unsigned uid, bool make)
{
    for (int i = 0; i < LL_HOSTD_MAX_USERS; i++)
        if (self->users[i].used && self->users[i].uid == uid)
            return &self->users[i];
    for (int i = 0; make && i < LL_HOSTD_MAX_USERS; i++)
        if (!self->users[i].used) {
            memset(&self->users[i], 0, sizeof self->users[i]);
            self->users[i].used = true;
            self->users[i].uid = uid;
            return &self->users[i];
        }
    return NULL;
}

/* The lease CONN holds on SLOT, or NULL. */
static ll_hostd_lease_t *s_lease(ll_hostd_policy_t *self, int conn, int slot)
{
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        if (self->leases[i].conn == conn && self->leases[i].slot == slot)
            return &self->leases[i];
    return NULL;
}

/* No lease on SLOT, and none restored for its user to claim. */
static bool s_slot_free(const ll_hostd_policy_t *self, int slot)
{
    if (slot >= 0 && slot < LL_HOSTD_MAX_SLOTS && self->restored[slot].used)
        return false;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        if (self->leases[i].conn >= 0 && self->leases[i].slot == slot)
            return false;
    return true;
}

/* Leases of UID not being taken back, prefetches' aside (what counts
 * against its share). */
static int s_held(const ll_hostd_policy_t *self, unsigned uid)
{
    int n = 0;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        if (self->leases[i].conn >= 0 && self->leases[i].uid == uid && !self->leases[i].revoking &&
            !self->leases[i].prefetch)
            n++;
    return n;
}

/* Leases CONN holds (being taken back or not): at most its nslots. */
static int s_conn_leases(const ll_hostd_policy_t *self, int conn)
{
    int n = 0;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        n += self->leases[i].conn == conn;
    return n;
}

/* Users holding a lease or waiting for one. */
static int s_active_users(const ll_hostd_policy_t *self)
{
    unsigned seen[LL_HOSTD_MAX_CONNS + LL_HOSTD_MAX_LEASES];
    int n = 0;
    for (int c = 0; c < LL_HOSTD_MAX_CONNS + LL_HOSTD_MAX_LEASES; c++) {
        unsigned uid;
        if (c < LL_HOSTD_MAX_CONNS) {
            if (!self->conns[c].used || self->conns[c].want <= 0)
                continue;
            uid = self->conns[c].uid;
        } else {
            const ll_hostd_lease_t *l = &self->leases[c - LL_HOSTD_MAX_CONNS];
            if (l->conn < 0 || l->prefetch)
                continue;
            uid = l->uid;
        }
        bool dup = false;
        for (int k = 0; k < n && !dup; k++)
            dup = seen[k] == uid;
        if (!dup)
            seen[n++] = uid;
    }
    return n;
}

/* Lease L ends at NOW: its times go to its user; a revocation it was
 * counted for is done. */
static void s_lease_end(ll_hostd_policy_t *self, ll_hostd_lease_t *l, double now)
{
    ll_hostd_user_t *u = s_user(self, l->uid, false);
    if (u) {
        u->held_ms += now - l->t0;
        if (!l->idle)
            u->busy_ms += now - l->busy_t0;
    }
    if (l->revoking && l->for_conn >= 0 && self->conns[l->for_conn].used &&
        self->conns[l->for_conn].revokes_for > 0)
        self->conns[l->for_conn].revokes_for--;
    memset(l, 0, sizeof *l);
    l->conn = -1;
}

static ll_hostd_lease_t *s_lease_new(ll_hostd_policy_t *self, int conn, int slot, double now)
{
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        if (self->leases[i].conn < 0) {
            ll_hostd_lease_t *l = &self->leases[i];
            memset(l, 0, sizeof *l);
            l->conn = conn;
            l->uid = self->conns[conn].uid;
            l->slot = slot;
            l->for_conn = -1;
            l->t0 = l->busy_t0 = now;
            l->last_pid = -1;
            return l;
        }
    return NULL;
}

int ll_hostd_policy_open(ll_hostd_policy_t *self, int conn, unsigned uid, int nslots, double now)
{
    if (conn < 0 || conn >= LL_HOSTD_MAX_CONNS || self->conns[conn].used ||
        !s_user(self, uid, true))
        return -1;
    s_conn_t *c = &self->conns[conn];
    memset(c, 0, sizeof *c);
    c->used = true;
    c->uid = uid;
    c->nslots = nslots < 1 ? 1 : nslots > LL_HOSTD_MAX_SLOTS ? LL_HOSTD_MAX_SLOTS : nslots;
    return 0;
}

void ll_hostd_policy_close(ll_hostd_policy_t *self, int conn, double now)
{
    if (!s_conn(self, conn))
        return;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++) {
        if (self->leases[i].conn == conn)
            s_lease_end(self, &self->leases[i], now);
        if (self->leases[i].conn >= 0 && self->leases[i].for_conn == conn)
            self->leases[i].for_conn = -1; /* still taken back: someone else will want it */
    }
    memset(&self->conns[conn], 0, sizeof self->conns[conn]);
}

int ll_hostd_policy_restore(ll_hostd_policy_t *self, int slot, unsigned uid, double until)
{
    if (slot < 0 || slot >= self->nslots || self->restored[slot].used)
        return -1;
    self->restored[slot].used = true;
    self->restored[slot].uid = uid;
    self->restored[slot].until = until;
    return 0;
}

int ll_hostd_policy_adopt(ll_hostd_policy_t *self, int conn, int slot, bool idle, double now)
{
    s_conn_t *c = s_conn(self, conn);
    if (!c || slot < 0 || slot >= self->nslots || !self->restored[slot].used ||
        self->restored[slot].uid != c->uid || now >= self->restored[slot].until ||
        s_conn_leases(self, conn) >= c->nslots)
        return -1;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        if (self->leases[i].conn >= 0 && self->leases[i].slot == slot)
            return -1; /* (a restored slot is lent to nobody: defence) */
    ll_hostd_lease_t *l = s_lease_new(self, conn, slot, now);
    if (!l)
        return -1;
    self->restored[slot].used = false;
    l->idle = idle;
    return 0;
}

double ll_hostd_policy_deadline(const ll_hostd_policy_t *self)
{
    double t = 0;
    for (int s = 0; s < self->nslots; s++)
        if (self->restored[s].used && (t == 0 || self->restored[s].until < t))
            t = self->restored[s].until;
    return t;
}

bool ll_hostd_policy_restored(const ll_hostd_policy_t *self, int slot, unsigned *uid)
{
    if (slot < 0 || slot >= self->nslots || !self->restored[slot].used)
        return false;
    if (uid)
        *uid = self->restored[slot].uid;
    return true;
}

void ll_hostd_policy_want(ll_hostd_policy_t *self, int conn, int n, double now)
{
    s_conn_t *c = s_conn(self, conn);
    if (!c)
        return;
    n = n < 0 ? 0 : n > LL_HOSTD_MAX_SLOTS ? LL_HOSTD_MAX_SLOTS : n;
    if (n > 0 && c->want == 0)
        c->wait_since = now;
    if (n == 0)
        c->wait_since = 0;
    if (n != c->want)
        c->told_wait = false;
    c->want = n;
}

void ll_hostd_policy_want_prefetch(ll_hostd_policy_t *self, int conn, int n, double now)
{
    s_conn_t *c = s_conn(self, conn);
    if (!c)
        return;
    n = n < 0 ? 0 : n > LL_HOSTD_MAX_SLOTS ? LL_HOSTD_MAX_SLOTS : n;
    if (n > 0 && c->want_pf == 0)
        c->pf_since = now;
    c->told_pf = false; /* asked (again): answered (again) */
    c->want_pf = n;
}

int ll_hostd_policy_mark_prefetch(ll_hostd_policy_t *self, int conn, int slot, bool prefetch)
{
    ll_hostd_lease_t *l = s_conn(self, conn) ? s_lease(self, conn, slot) : NULL;
    if (!l)
        return -1;
    l->prefetch = prefetch;
    return 0;
}

int ll_hostd_policy_release(ll_hostd_policy_t *self, int conn, int slot, double now)
{
    ll_hostd_lease_t *l = s_conn(self, conn) ? s_lease(self, conn, slot) : NULL;
    if (!l)
        return -1;
    s_lease_end(self, l, now);
    return 0;
}

int ll_hostd_policy_mark(ll_hostd_policy_t *self, int conn, int slot, bool idle, double value,
                         int pid, int cells, double now)
{
    ll_hostd_lease_t *l = s_conn(self, conn) ? s_lease(self, conn, slot) : NULL;
    if (!l)
        return -1;
    ll_hostd_user_t *u = s_user(self, l->uid, false);
    if (idle && !l->idle && u)
        u->busy_ms += now - l->busy_t0;
    if (!idle && l->idle)
        l->busy_t0 = now;
    if (!idle && pid > 0 && u && (pid != l->last_pid || cells != l->last_cells)) {
        /* A cell starts on this worker: the first one it runs forked for it
         * (a cold start), any later one is a warm hit. */
        if (cells > 0)
            u->warm_hits++;
        else
            u->cold_starts++;
        l->last_pid = pid;
        l->last_cells = cells;
    }
    l->idle = idle;
    l->value = value;
    return 0;
}

/* The waiting connection to serve first: its user holds the fewest leases,
 * then it waits longest.  SKIP: connections already looked at this turn.
 * One holding as many leases as it has slots waits for its own. */
static int s_first_waiting(const ll_hostd_policy_t *self, const bool *skip)
{
    int best = -1, best_held = 0;
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++) {
        const s_conn_t *cn = &self->conns[c];
        if (!cn->used || cn->want <= 0 || skip[c] || s_conn_leases(self, c) >= cn->nslots)
            continue;
        int held = s_held(self, cn->uid);
        if (best < 0 || held < best_held ||
            (held == best_held && cn->wait_since < self->conns[best].wait_since)) {
            best = c;
            best_held = held;
        }
    }
    return best;
}

/* Whether lease L comes back at once when taken back: an idle worker is
 * evicted, a prefetch's is dropped (it committed nothing). */
static bool s_quick(const ll_hostd_lease_t *l)
{
    return l->idle || l->prefetch;
}

/* Revocations under way for connection CI of leases that come back at
 * once (s_quick). */
static int s_revoking_idle_for(const ll_hostd_policy_t *self, int ci)
{
    int n = 0;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        n += self->leases[i].conn >= 0 && self->leases[i].revoking &&
             self->leases[i].for_conn == ci && s_quick(&self->leases[i]);
    return n;
}

/* The lease to take back for waiting connection C, or NULL: a prefetch's
 * of anyone's (C's own too; an idle one first, then the latest lent);
 * else among users above share (not C's), an idle lease of the smallest
 * value, else (unless IDLE_ONLY) the longest-held busy one. */
static ll_hostd_lease_t *s_victim(ll_hostd_policy_t *self, const s_conn_t *c, bool idle_only)
{
    double share =
        (double) self->nslots / (double) (s_active_users(self) ? s_active_users(self) : 1);
    ll_hostd_lease_t *idle = NULL, *busy = NULL, *pf = NULL;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++) {
        ll_hostd_lease_t *l = &self->leases[i];
        if (l->conn >= 0 && !l->revoking && l->prefetch &&
            (!pf || (l->idle && !pf->idle) || (l->idle == pf->idle && l->t0 > pf->t0)))
            pf = l;
    }
    if (pf)
        return pf;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++) {
        ll_hostd_lease_t *l = &self->leases[i];
        if (l->conn < 0 || l->revoking || l->uid == c->uid ||
            (double) s_held(self, l->uid) <= share)
            continue;
        if (l->idle && (!idle || l->value < idle->value))
            idle = l;
        if (!l->idle && (!busy || l->t0 < busy->t0))
            busy = l;
    }
    return idle ? idle : idle_only ? NULL : busy;
}

/* Whether a cell of anyone's waits for a slot it could take. */
static bool s_cells_wait(const ll_hostd_policy_t *self)
{
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++)
        if (self->conns[c].used && self->conns[c].want > 0 &&
            s_conn_leases(self, c) < self->conns[c].nslots)
            return true;
    return false;
}

/* After the cells: a free slot nobody's cell can take goes to the
 * prefetches waiting longest of the user holding the fewest leases; a pool
 * whose prefetches get none is told so once.  NL, BUSY: leases and held
 * slots (never more leases than slots: a defence, adoption cannot pass them). */
static bool s_next_prefetch(ll_hostd_policy_t *self, double now, int nl, int busy,
                            ll_hostd_decision_t *d)
{
    int slot = -1;
    for (int s = 0; s < self->nslots && nl < self->nslots && busy < self->nslots && slot < 0; s++)
        if (s_slot_free(self, s))
            slot = s;
    if (s_cells_wait(self))
        slot = -1;
    int best = -1, best_n = 0;
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++) {
        s_conn_t *cn = &self->conns[c];
        if (!cn->used || cn->want_pf <= 0 || s_conn_leases(self, c) >= cn->nslots)
            continue;
        int n = 0;
        for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
            n += self->leases[i].conn >= 0 && self->leases[i].uid == cn->uid;
        if (best < 0 || n < best_n || (n == best_n && cn->pf_since < self->conns[best].pf_since)) {
            best = c;
            best_n = n;
        }
    }
    if (best >= 0 && slot >= 0) {
        s_conn_t *c = &self->conns[best];
        ll_hostd_lease_t *l = s_lease_new(self, best, slot, now);
        if (!l)
            return false;
        l->prefetch = true;
        ll_hostd_user_t *u = s_user(self, c->uid, false);
        if (u)
            u->grants++;
        c->want_pf--;
        c->told_pf = false;
        *d = (ll_hostd_decision_t){LL_HOSTD_GRANT, best, slot, -1, false, true};
        return true;
    }
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++) {
        s_conn_t *cn = &self->conns[c];
        if (cn->used && cn->want_pf > 0 && !cn->told_pf) {
            cn->told_pf = true;
            *d = (ll_hostd_decision_t){LL_HOSTD_WAIT, c, -1, -1, false, true};
            return true;
        }
    }
    return false;
}

bool ll_hostd_policy_next(ll_hostd_policy_t *self, double now, ll_hostd_decision_t *d)
{
    bool skip[LL_HOSTD_MAX_CONNS] = {false};
    memset(d, 0, sizeof *d);
    for (int s = 0; s < self->nslots; s++)
        if (self->restored[s].used && now >= self->restored[s].until)
            self->restored[s].used = false; /* not claimed back in time: free */
    int busy = ll_hostd_policy_busy_slots(self), nl = ll_hostd_policy_nleases(self);
    for (;;) {
        int ci = s_first_waiting(self, skip);
        if (ci < 0)
            return s_next_prefetch(self, now, nl, busy, d);
        skip[ci] = true;
        s_conn_t *c = &self->conns[ci];
        int want = c->want, room = c->nslots - s_conn_leases(self, ci);
        want = want < room ? want : room;
        /* A free slot it can use (never more leases than slots: adoption
         * takes only free slots, this is a defence). */
        for (int s = 0; s < self->nslots && nl < self->nslots && busy < self->nslots; s++)
            if (s_slot_free(self, s)) {
                ll_hostd_lease_t *l = s_lease_new(self, ci, s, now);
                if (!l)
                    return false;
                ll_hostd_user_t *u = s_user(self, c->uid, false);
                if (u)
                    u->grants++;
                c->want--;
                c->told_wait = false;
                if (c->want == 0)
                    c->wait_since = 0;
                *d = (ll_hostd_decision_t){LL_HOSTD_GRANT, ci, s, -1, false, false};
                return true;
            }
        /* One revocation per slot wanted; but a busy lease taken back comes
         * back only at its cell's end, so an idle lease that turns up
         * meanwhile is taken back too (the bound: at once when idle). */
        if (c->revokes_for < want || s_revoking_idle_for(self, ci) < want) {
            ll_hostd_lease_t *v = s_victim(self, c, c->revokes_for >= want);
            if (v) {
                v->revoking = true;
                v->for_conn = ci;
                c->revokes_for++;
                c->told_wait = false; /* told below that a slot is on its way */
                ll_hostd_user_t *u = s_user(self, v->uid, false);
                if (u)
                    u->revokes++;
                *d = (ll_hostd_decision_t){LL_HOSTD_REVOKE, v->conn, v->slot, ci, false, false};
                return true;
            }
        }
        if (!c->told_wait) {
            c->told_wait = true;
            *d = (ll_hostd_decision_t){LL_HOSTD_WAIT, ci, -1, -1, c->revokes_for > 0, false};
            return true;
        }
    }
}

int ll_hostd_policy_nslots(const ll_hostd_policy_t *self)
{
    return self->nslots;
}

const ll_hostd_lease_t *ll_hostd_policy_lease(const ll_hostd_policy_t *self, int i)
{
    return &self->leases[i];
}

const ll_hostd_user_t *ll_hostd_policy_user(const ll_hostd_policy_t *self, int i)
{
    return &self->users[i];
}

void ll_hostd_policy_user_times(const ll_hostd_policy_t *self, int i, double now, double *held_ms,
                                double *busy_ms)
{
    const ll_hostd_user_t *u = &self->users[i];
    double h = u->held_ms, b = u->busy_ms;
    for (int k = 0; k < LL_HOSTD_MAX_LEASES; k++) {
        const ll_hostd_lease_t *l = &self->leases[k];
        if (l->conn < 0 || !u->used || l->uid != u->uid)
            continue;
        h += now - l->t0;
        if (!l->idle)
            b += now - l->busy_t0;
    }
    *held_ms = h;
    *busy_ms = b;
}

bool ll_hostd_policy_conn(const ll_hostd_policy_t *self, int conn, unsigned *uid, int *want)
{
    if (conn < 0 || conn >= LL_HOSTD_MAX_CONNS || !self->conns[conn].used)
        return false;
    if (uid)
        *uid = self->conns[conn].uid;
    if (want)
        *want = self->conns[conn].want;
    return true;
}

int ll_hostd_policy_nleases(const ll_hostd_policy_t *self)
{
    int n = 0;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        n += self->leases[i].conn >= 0;
    return n;
}

int ll_hostd_policy_busy_slots(const ll_hostd_policy_t *self)
{
    int n = 0;
    for (int s = 0; s < self->nslots; s++)
        n += !s_slot_free(self, s);
    return n;
}

/* ------------------------------------------------------------------ */
/* Self-test: scripted sequences, each decision checked.               */

/* Every decision of a pass at NOW into OUT (at most MAX); their count. */
static int s_test_pass(ll_hostd_policy_t *p, double now, ll_hostd_decision_t *out, int max)
{
    ll_hostd_decision_t d;
    int n = 0;
    while (ll_hostd_policy_next(p, now, &d) && n < 64)
        if (n < max)
            out[n++] = d;
    return n;
}

/* Two users on two slots: grants never exceed the slots; a release of
 * someone else's lease changes nothing; the fewest-held user goes first. */
static int s_test_grants(bool verbose)
{
    int fails = 0;
    ll_hostd_decision_t d[8];
    ll_hostd_policy_t *p = ll_hostd_policy_new(2);
    S_CHECK(p && ll_hostd_policy_open(p, 0, 1001, 3, 0) == 0); /* a pool of 3 slots */
    S_CHECK(ll_hostd_policy_open(p, 0, 1001, 2, 0) == -1);     /* in use */
    S_CHECK(ll_hostd_policy_open(p, 1, 1002, 2, 0) == 0);
    ll_hostd_policy_want(p, 0, 3, 1); /* user 1001 wants 3 */
    int n = s_test_pass(p, 1, d, 8);
    S_CHECK(n == 3 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 0 && d[0].slot == 0);
    S_CHECK(d[1].op == LL_HOSTD_GRANT && d[1].slot == 1);
    S_CHECK(d[2].op == LL_HOSTD_WAIT && d[2].conn == 0 &&
            !d[2].revoking); /* alone: no share to take */
    S_CHECK(ll_hostd_policy_nleases(p) == 2 && ll_hostd_policy_busy_slots(p) == 2);
    S_CHECK(s_test_pass(p, 2, d, 8) == 0); /* told once */
    /* User 1002 cannot give back or mark 1001's leases. */
    S_CHECK(ll_hostd_policy_release(p, 1, 0, 3) == -1 && ll_hostd_policy_nleases(p) == 2);
    S_CHECK(ll_hostd_policy_mark(p, 1, 0, true, 5, 0, 0, 3) == -1);
    S_CHECK(!ll_hostd_policy_lease(p, 0)->idle);
    /* 1002 arrives: share is 1, 1001 holds 2 (both busy): its longest-held
     * lease is taken back for 1002, who is told a slot is on its way. */
    ll_hostd_policy_want(p, 1, 1, 4);
    n = s_test_pass(p, 4, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_REVOKE && d[0].conn == 0 && d[0].for_conn == 1);
    S_CHECK(d[1].op == LL_HOSTD_WAIT && d[1].conn == 1 && d[1].revoking);
    int revoked = d[0].slot;
    /* 1001 returns it: it goes to 1002 (fewer held), not back to 1001. */
    S_CHECK(ll_hostd_policy_release(p, 0, revoked, 10) == 0);
    n = s_test_pass(p, 10, d, 8);
    S_CHECK(n >= 1 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 1 && d[0].slot == revoked);
    S_CHECK(ll_hostd_policy_busy_slots(p) == 2 && ll_hostd_policy_nleases(p) == 2);
    /* Users' times: 1001 held slot 0 and 1 from 1; one ended at 10. */
    double held, busy;
    ll_hostd_policy_user_times(p, 0, 20, &held, &busy);
    S_CHECK(held == 9 + 19 && busy == held);
    S_CHECK(ll_hostd_policy_user(p, 0)->grants == 2 && ll_hostd_policy_user(p, 0)->revokes == 1);
    ll_hostd_policy_close(p, 0, 30);
    S_CHECK(ll_hostd_policy_nleases(p) == 1 && ll_hostd_policy_release(p, 0, 1, 31) == -1);
    ll_hostd_policy_destroy(&p);
    ll_hostd_policy_destroy(&p);
    S_CHECK(!p);
    return fails;
}

/* Fairness among warm leases: the heavy user's idle lease of the smallest
 * value goes first; a user at share takes nothing from another at share. */
static int s_test_fair(bool verbose)
{
    int fails = 0;
    ll_hostd_decision_t d[8];
    ll_hostd_policy_t *p = ll_hostd_policy_new(3);
    S_CHECK(ll_hostd_policy_open(p, 0, 1001, 3, 0) == 0 &&
            ll_hostd_policy_open(p, 1, 1002, 3, 0) == 0);
    ll_hostd_policy_want(p, 0, 3, 1);
    S_CHECK(s_test_pass(p, 1, d, 8) == 3);
    S_CHECK(ll_hostd_policy_mark(p, 0, 0, true, 500, 11, 1, 2) == 0); /* idle, value 500 */
    S_CHECK(ll_hostd_policy_mark(p, 0, 1, true, 100, 12, 1, 2) == 0); /* idle, value 100 */
    S_CHECK(ll_hostd_policy_mark(p, 0, 2, false, 0, 13, 0, 2) == 0);  /* busy */
    ll_hostd_policy_want(p, 1, 1, 3);
    int n = s_test_pass(p, 3, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_REVOKE && d[0].slot == 1); /* smallest value */
    S_CHECK(ll_hostd_policy_release(p, 0, 1, 4) == 0);
    n = s_test_pass(p, 4, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 1 && d[0].slot == 1);
    /* 1002 wants one more: 1001 holds 2 > share 1.5: its idle one goes. */
    ll_hostd_policy_want(p, 1, 1, 5);
    n = s_test_pass(p, 5, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_REVOKE && d[0].slot == 0);
    S_CHECK(ll_hostd_policy_release(p, 0, 0, 6) == 0 && s_test_pass(p, 6, d, 8) >= 1);
    S_CHECK(d[0].op == LL_HOSTD_GRANT && d[0].conn == 1);
    /* Now 1002 holds 2, 1001 holds 1 (busy): 1001 wants one: 1002 is above
     * share (1.5) but busy: its longest-held lease is taken back. */
    ll_hostd_policy_want(p, 0, 1, 7);
    n = s_test_pass(p, 7, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_REVOKE && d[0].conn == 1 && d[0].slot == 1);
    /* Hits: the marks say a cold start, then a warm hit on the same worker. */
    S_CHECK(ll_hostd_policy_mark(p, 1, 0, false, 0, 21, 0, 8) == 0);
    S_CHECK(ll_hostd_policy_mark(p, 1, 0, true, 10, 21, 1, 9) == 0);
    S_CHECK(ll_hostd_policy_mark(p, 1, 0, false, 0, 21, 1, 10) == 0);
    S_CHECK(ll_hostd_policy_user(p, 1)->cold_starts == 1 &&
            ll_hostd_policy_user(p, 1)->warm_hits == 1);
    ll_hostd_policy_destroy(&p);
    /* Two users at share, one idle lease each: no revocation, a WAIT
     * without one on its way (the waiting pool evicts its own). */
    p = ll_hostd_policy_new(2);
    ll_hostd_policy_open(p, 0, 1001, 2, 0);
    ll_hostd_policy_open(p, 1, 1002, 2, 0);
    ll_hostd_policy_want(p, 0, 1, 1);
    ll_hostd_policy_want(p, 1, 1, 1);
    S_CHECK(s_test_pass(p, 1, d, 8) == 2);
    ll_hostd_policy_mark(p, 0, d[0].conn == 0 ? d[0].slot : d[1].slot, true, 1, 5, 1, 2);
    ll_hostd_policy_want(p, 1, 1, 3);
    n = s_test_pass(p, 3, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_WAIT && d[0].conn == 1 && !d[0].revoking);
    ll_hostd_policy_destroy(&p);
    return fails;
}

/* A busy lease taken back comes back only at its cell's end: an idle lease
 * of a user above share that turns up meanwhile is taken back too. */
static int s_test_idle_meanwhile(bool verbose)
{
    int fails = 0;
    ll_hostd_decision_t d[8];
    ll_hostd_policy_t *p = ll_hostd_policy_new(3);
    ll_hostd_policy_open(p, 0, 1001, 3, 0);
    ll_hostd_policy_open(p, 1, 1002, 3, 0);
    ll_hostd_policy_want(p, 0, 3, 1);
    S_CHECK(s_test_pass(p, 1, d, 8) == 3); /* 1001: slots 0, 1, 2, all busy */
    ll_hostd_policy_want(p, 1, 1, 2);
    int n = s_test_pass(p, 2, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_REVOKE && d[0].slot == 0 && d[1].revoking);
    S_CHECK(s_test_pass(p, 3, d, 8) == 0); /* one revocation per slot wanted */
    S_CHECK(ll_hostd_policy_mark(p, 0, 2, true, 9, 31, 1, 4) == 0); /* slot 2 turns idle */
    n = s_test_pass(p, 4, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_REVOKE && d[0].conn == 0 && d[0].slot == 2);
    S_CHECK(d[1].op == LL_HOSTD_WAIT && d[1].conn == 1 && d[1].revoking);
    S_CHECK(ll_hostd_policy_release(p, 0, 2, 5) == 0);
    n = s_test_pass(p, 5, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 1 && d[0].slot == 2);
    S_CHECK(ll_hostd_policy_release(p, 0, 0, 6) == 0); /* the busy one comes back: nobody waits */
    S_CHECK(s_test_pass(p, 6, d, 8) == 0 && ll_hostd_policy_busy_slots(p) == 2);
    ll_hostd_policy_destroy(&p);
    return fails;
}

/* Re-registration: a claim is granted only where the broker lent that
 * slot to that uid before it restarted (restored), nobody holds it, and
 * within the pool's slots; a restored slot is lent to nobody else until
 * claimed or its grace ends.  Nothing a client says leases a slot twice. */
static int s_test_adopt(bool verbose)
{
    int fails = 0;
    ll_hostd_decision_t d[8];
    ll_hostd_policy_t *p = ll_hostd_policy_new(3);
    S_CHECK(ll_hostd_policy_restore(p, 0, 1001, 100) == 0 &&
            ll_hostd_policy_restore(p, 1, 1001, 100) == 0 &&
            ll_hostd_policy_restore(p, 2, 1002, 100) == 0);
    S_CHECK(ll_hostd_policy_restore(p, 0, 1002, 100) == -1 &&
            ll_hostd_policy_restore(p, 3, 1002, 100) == -1);
    S_CHECK(ll_hostd_policy_deadline(p) == 100);
    ll_hostd_policy_open(p, 0, 1001, 1, 0); /* a pool of one slot */
    ll_hostd_policy_open(p, 1, 1002, 2, 0);
    ll_hostd_policy_open(p, 2, 1003, 2, 0);
    /* Another user's slot, a slot never lent, out of range: refused. */
    S_CHECK(ll_hostd_policy_adopt(p, 1, 0, false, 1) == -1);
    S_CHECK(ll_hostd_policy_adopt(p, 2, 2, false, 1) == -1);
    S_CHECK(ll_hostd_policy_adopt(p, 1, 7, false, 1) == -1 &&
            ll_hostd_policy_adopt(p, 1, -1, false, 1) == -1);
    /* Its own: granted once; past its own slots' worth: refused. */
    S_CHECK(ll_hostd_policy_adopt(p, 0, 0, false, 1) == 0);
    S_CHECK(ll_hostd_policy_adopt(p, 0, 0, false, 1) == -1);
    S_CHECK(ll_hostd_policy_adopt(p, 0, 1, true, 1) == -1);
    /* A waiting pool gets neither restored slot while its grace lasts. */
    ll_hostd_policy_want(p, 2, 1, 2);
    int n = s_test_pass(p, 2, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_WAIT && d[0].conn == 2);
    S_CHECK(ll_hostd_policy_busy_slots(p) == 3 && ll_hostd_policy_nleases(p) == 1);
    S_CHECK(ll_hostd_policy_adopt(p, 1, 2, true, 3) == 0); /* 1002 claims its own */
    /* The grace ends: slot 1 (not claimed) is free and lent; a claim is then too late. */
    n = s_test_pass(p, 100, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 2 && d[0].slot == 1);
    S_CHECK(ll_hostd_policy_deadline(p) == 0 && !ll_hostd_policy_restored(p, 1, NULL));
    ll_hostd_policy_close(p, 0, 101);
    ll_hostd_policy_open(p, 0, 1001, 1, 101);
    S_CHECK(ll_hostd_policy_adopt(p, 0, 0, false, 101) == -1); /* nothing restored any more */
    S_CHECK(ll_hostd_policy_nleases(p) == 2 && ll_hostd_policy_busy_slots(p) == 2);
    ll_hostd_policy_destroy(&p);
    S_CHECK(!ll_hostd_policy_new(0) && !ll_hostd_policy_new(LL_HOSTD_MAX_SLOTS + 1));
    return fails;
}

/* The slots counted as the pool counts its own, and leases on several
 * slots per GPU: pools hold at most their own slots' worth, on any of the
 * broker's, never more than the broker's slots in all. */
static int s_test_plan(bool verbose)
{
    int fails = 0;
    ll_gpu_plan_t pl;
    /* One per GPU by default; two per GPU (LL_POOL_GPU_SLOTS=2): alternating, capped. */
    S_CHECK(ll_hostd_policy_plan(2, 0, 0, -1, &pl) == 2 && pl.slot_dev[1] == 1 &&
            pl.mem_fraction[0] == 0);
    S_CHECK(ll_hostd_policy_plan(2, 2, 0, -1, &pl) == 4 && pl.slot_dev[0] == 0 &&
            pl.slot_dev[1] == 1 && pl.slot_dev[2] == 0 && pl.slot_dev[3] == 1);
    S_CHECK(pl.mem_fraction[3] == 0.475 && pl.per_dev[0] == 2);
    /* --slots / LL_POOL_SLOTS: the total, spread over the devices; the per-GPU count wins. */
    S_CHECK(ll_hostd_policy_plan(2, 0, 3, -1, &pl) == 3 && pl.slot_dev[2] == 0 &&
            pl.mem_fraction[1] == 0 && pl.mem_fraction[2] == 0.475);
    S_CHECK(ll_hostd_policy_plan(1, 3, 2, 0.3, &pl) == 3 && pl.mem_fraction[2] == 0.3);
    /* No GPU: virtual slots (no device), the total or 2. */
    S_CHECK(ll_hostd_policy_plan(0, 2, 0, -1, &pl) == 2 && pl.slot_dev[0] == -1 &&
            pl.slot_dev[1] == -1);
    S_CHECK(ll_hostd_policy_plan(0, 0, 5, -1, &pl) == 5 && pl.slot_dev[4] == -1);
    S_CHECK(ll_hostd_policy_plan(0, 0, LL_HOSTD_MAX_SLOTS + 1, -1, &pl) == -1 &&
            ll_hostd_policy_plan(8, 9, 0, -1, &pl) == -1);

    /* Two GPUs, two slots each: three users' pools of 2 slots each want 3. */
    ll_hostd_decision_t d[16];
    ll_hostd_policy_t *p = ll_hostd_policy_new(4);
    for (int c = 0; c < 3; c++) {
        S_CHECK(ll_hostd_policy_open(p, c, 1001 + c, 2, 0) == 0);
        ll_hostd_policy_want(p, c, 3, 1 + c);
    }
    int n = s_test_pass(p, 5, d, 16), grants = 0, per[3] = {0}, used[4] = {0};
    for (int i = 0; i < n; i++)
        if (d[i].op == LL_HOSTD_GRANT) {
            grants++;
            per[d[i].conn]++;
            used[d[i].slot]++;
        }
    S_CHECK(grants == 4 && ll_hostd_policy_nleases(p) == 4 && ll_hostd_policy_busy_slots(p) == 4);
    S_CHECK(per[0] <= 2 && per[1] <= 2 && per[2] <= 2 && per[0] + per[1] + per[2] == 4);
    S_CHECK(used[0] == 1 && used[1] == 1 && used[2] == 1 && used[3] == 1);
    /* Slots 2 and 3 went to pools of 2 slots: a pool's slots are any of the broker's. */
    S_CHECK(per[1] >= 1 && per[2] >= 1);
    /* The pool at its own slots' worth asks for no revocation beyond them. */
    for (int i = 0; i < n; i++)
        S_CHECK(d[i].op != LL_HOSTD_REVOKE || d[i].for_conn != 0);
    ll_hostd_policy_destroy(&p);
    return fails;
}

/* Prefetches at the lowest priority: lent only a free slot no cell wants,
 * the first taken back when anyone's cell waits, counted in no share. */
static int s_test_prefetch(bool verbose)
{
    int fails = 0;
    ll_hostd_decision_t d[8];
    ll_hostd_policy_t *p = ll_hostd_policy_new(2);
    ll_hostd_policy_open(p, 0, 1001, 2, 0);
    ll_hostd_policy_open(p, 1, 1002, 2, 0);
    ll_hostd_policy_want(p, 0, 1, 1);
    int n = s_test_pass(p, 1, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_GRANT && d[0].slot == 0 && !d[0].prefetch);
    /* 1001 prefetches: slot 1 is free and no cell waits: lent, for the prefetch. */
    ll_hostd_policy_want_prefetch(p, 0, 1, 2);
    n = s_test_pass(p, 2, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 0 && d[0].slot == 1 &&
            d[0].prefetch);
    const ll_hostd_lease_t *pl = NULL;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++)
        if (ll_hostd_policy_lease(p, i)->conn == 0 && ll_hostd_policy_lease(p, i)->slot == 1)
            pl = ll_hostd_policy_lease(p, i);
    S_CHECK(pl && pl->prefetch);
    S_CHECK(ll_hostd_policy_mark(p, 0, 1, false, 0, 41, 0, 3) == 0); /* preparing: busy */
    /* 1002's cell waits: 1001 holds one cell's slot, its share (its prefetch
     * counts in none), yet its prefetch's slot is taken back at once. */
    ll_hostd_policy_want(p, 1, 1, 4);
    n = s_test_pass(p, 4, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_REVOKE && d[0].conn == 0 && d[0].slot == 1 &&
            d[0].for_conn == 1);
    S_CHECK(d[1].op == LL_HOSTD_WAIT && d[1].conn == 1 && d[1].revoking && !d[1].prefetch);
    S_CHECK(s_test_pass(p, 5, d, 8) == 0); /* one revocation: it comes back at once */
    S_CHECK(ll_hostd_policy_release(p, 0, 1, 6) == 0);
    n = s_test_pass(p, 6, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 1 && d[0].slot == 1 &&
            !d[0].prefetch);
    /* No free slot: the prefetch is told once it gets none; nothing is taken for it. */
    ll_hostd_policy_want_prefetch(p, 0, 1, 7);
    n = s_test_pass(p, 7, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_WAIT && d[0].conn == 0 && d[0].prefetch);
    S_CHECK(s_test_pass(p, 8, d, 8) == 0);
    ll_hostd_policy_destroy(&p);

    /* A cell and a prefetch ask for the one free slot, the prefetch first:
     * the cell gets it. */
    p = ll_hostd_policy_new(1);
    ll_hostd_policy_open(p, 0, 1001, 1, 0);
    ll_hostd_policy_open(p, 1, 1002, 1, 0);
    ll_hostd_policy_want_prefetch(p, 0, 1, 1);
    ll_hostd_policy_want(p, 1, 1, 2);
    n = s_test_pass(p, 2, d, 8);
    S_CHECK(n == 2 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 1 && !d[0].prefetch);
    S_CHECK(d[1].op == LL_HOSTD_WAIT && d[1].conn == 0 && d[1].prefetch);
    ll_hostd_policy_destroy(&p);

    /* A prefetch's lease whose worker then runs its cell is a cell's lease:
     * at share, it is kept (the waiting pool evicts its own). */
    p = ll_hostd_policy_new(2);
    ll_hostd_policy_open(p, 0, 1001, 2, 0);
    ll_hostd_policy_open(p, 1, 1002, 2, 0);
    ll_hostd_policy_want_prefetch(p, 0, 1, 1);
    S_CHECK(s_test_pass(p, 1, d, 8) == 1 && d[0].prefetch && d[0].conn == 0);
    int ps = d[0].slot;
    ll_hostd_policy_want(p, 1, 1, 2);
    S_CHECK(s_test_pass(p, 2, d, 8) == 1 && d[0].op == LL_HOSTD_GRANT && d[0].conn == 1);
    S_CHECK(ll_hostd_policy_mark_prefetch(p, 0, ps, false) == 0 &&
            ll_hostd_policy_mark_prefetch(p, 1, ps, false) == -1);
    ll_hostd_policy_want(p, 1, 1, 3);
    n = s_test_pass(p, 3, d, 8);
    S_CHECK(n == 1 && d[0].op == LL_HOSTD_WAIT && d[0].conn == 1 && !d[0].revoking);
    ll_hostd_policy_destroy(&p);
    return fails;
}

int ll_hostd_policy_selftest(bool verbose)
{
    int fails = s_test_grants(verbose) + s_test_fair(verbose) + s_test_idle_meanwhile(verbose) +
                s_test_adopt(verbose) + s_test_plan(verbose) + s_test_prefetch(verbose);
    if (verbose)
        fprintf(stderr, "ll_hostd_policy: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
