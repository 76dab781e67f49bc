/* ll_sim: the simulator's engine (see ll_sim.h): the clock, the event queue
 * (a binary heap ordered by time, then by the order events were made, so a
 * run is deterministic), the sessions as the trace gives them, the user's
 * side of every session, the figures.  Runs in the `looseleaf simulate`
 * process, single-threaded.
 *
 * The user (the same for every design): after a cell's output, a gap of
 * thinking (gap_s), then an edit window (edit_s) in which the frontend
 * sends draft hints (the prefetches LooseLeaf acts on), then Run.  A CPU
 * cell's output is back exec_s later; a GPU cell's when the design says
 * so (ll_sim_cell_done).  After the last cell the session stays tail_s,
 * then disconnects.
 *
 * The designs (ll_sim_baselines.c, ll_sim_looseleaf.c) sit above this
 * engine and call it; which designs there are is ll_sim_designs.c's, above
 * them, so the engine knows a design only by its ops. */
#include "sim/ll_sim_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const s_names[LL_SIM_NDESIGNS] = {"pinned",
                                                     "pinned_packed",
                                                     "keepalive",
                                                     "notebookos",
                                                     "naive",
                                                     "looseleaf_noprefetch",
                                                     "looseleaf_noclosure",
                                                     "looseleaf_fullsave",
                                                     "looseleaf_noimportcache",
                                                     "looseleaf_nowarm",
                                                     "looseleaf"};

/* A seat of a design: the session in it, and those waiting for it (a
 * seat's next user comes when the previous one's day, computed without
 * waits, ends; with waits the previous one may still be there). */
typedef struct {
    ll_sim_sess_t *occ, *head, *tail;
} s_seat_t;

typedef struct {
    const ll_sim_ops_t *ops; /* NULL: not run */
    void *st;                /* the design's state */
    double level[LL_SIM_NLEVELS], area[LL_SIM_NLEVELS], t_level[LL_SIM_NLEVELS];
    long alive;        /* its sessions not yet gone */
    bool closed;       /* its last session left: figures frozen */
    double t_first;    /* the first arrival */
    ll_sim_result_t r; /* the figures */
    int cap_samples;
    s_seat_t *seats; /* by seat number */
    long nseats;
} s_design_t;

struct ll_sim_t {
    ll_sim_config_t cfg;
    s_design_t d[LL_SIM_NDESIGNS];
    ll_sim_ev_t *heap; /* the event queue */
    size_t nheap, capheap;
    uint64_t seq;     /* events made */
    uint64_t handled; /* events handled */
    double now;       /* the clock */
    double next_sample;
    bool started;     /* a session came */
    bool trace_done;  /* the reader is exhausted */
    bool trace_cells; /* LL_SIM_TRACE_CELLS=1: every GPU cell's start on stderr */
};

const char *ll_sim_design_name(ll_sim_design_t d)
{
    return d >= 0 && d < LL_SIM_NDESIGNS ? s_names[d] : "?";
}

int ll_sim_design_find(const char *name)
{
    for (int d = 0; d < LL_SIM_NDESIGNS; d++) {
        const char *a = s_names[d], *b = name;
        while (*a && *b && (*a == *b || (*a == '_' && *b == '-')))
            a++, b++;
        if (!*a && !*b)
            return d;
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* The event queue                                                    */

static bool s_before(const ll_sim_ev_t *a, const ll_sim_ev_t *b)
{
    return a->t != b->t ? a->t < b->t : a->seq < b->seq;
}

void ll_sim_at(ll_sim_t *sim, double t, int d, int kind, ll_sim_sess_t *s, int a, int b,
               uint32_t gen)
{
    if (sim->nheap == sim->capheap) {
        size_t cap = sim->capheap ? 2 * sim->capheap : 1024;
        ll_sim_ev_t *h = realloc(sim->heap, cap * sizeof *h);
        if (!h) {
            fprintf(stderr, "looseleaf simulate: out of memory (event queue)\n");
            abort(); /* no way to go on with a lost event */
        }
        sim->heap = h;
        sim->capheap = cap;
    }
    ll_sim_ev_t ev = {.t = t < sim->now ? sim->now : t,
                      .seq = sim->seq++,
                      .design = (uint8_t) d,
                      .kind = (uint8_t) kind,
                      .a = a,
                      .b = b,
                      .gen = gen,
                      .s = s};
    size_t i = sim->nheap++;
    while (i > 0 && s_before(&ev, &sim->heap[(i - 1) / 2])) {
        sim->heap[i] = sim->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    sim->heap[i] = ev;
}

static ll_sim_ev_t s_pop(ll_sim_t *sim)
{
    ll_sim_ev_t top = sim->heap[0], last = sim->heap[--sim->nheap];
    size_t i = 0, n = sim->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && s_before(&sim->heap[c + 1], &sim->heap[c]))
            c++;
        if (!s_before(&sim->heap[c], &last))
            break;
        sim->heap[i] = sim->heap[c];
        i = c;
    }
    if (n > 0)
        sim->heap[i] = last;
    return top;
}

/* ------------------------------------------------------------------ */
/* Figures                                                            */

void ll_sim_level(ll_sim_t *sim, int d, int l, double now, double delta)
{
    s_design_t *dd = &sim->d[d];
    if (!dd->closed) {
        dd->area[l] += dd->level[l] * (now - dd->t_level[l]);
        dd->t_level[l] = now;
    }
    dd->level[l] += delta;
    if (l == LL_SIM_POWERED && !dd->closed) {
        int hosts = (int) lround(dd->level[l]);
        if (hosts > dd->r.peak_hosts)
            dd->r.peak_hosts = hosts;
    }
}

void ll_sim_bill(ll_sim_t *sim, int d, double held_s, double connected_s)
{
    sim->d[d].r.session_held_s += held_s;
    sim->d[d].r.pool_connected_s += connected_s;
}

static int s_lat_bin(double lat)
{
    if (lat < 1e-5)
        return 0;
    int b = 1 + (int) floor((log10(lat) + 5.0) * LL_SIM_LAT_PER_DEC);
    return b < LL_SIM_LAT_BINS ? b : LL_SIM_LAT_BINS - 1;
}

double ll_sim_latency_bin_edge(int b)
{
    return b <= 0 ? 1e-5 : pow(10.0, -5.0 + (double) b / LL_SIM_LAT_PER_DEC);
}

double ll_sim_latency_quantile(const ll_sim_result_t *r, double q)
{
    if (r->gpu_cells <= 0)
        return 0;
    double want = q * (double) r->gpu_cells, cum = 0;
    for (int b = 0; b < LL_SIM_LAT_BINS; b++) {
        if (r->lat_bins[b] == 0)
            continue;
        if (cum + r->lat_bins[b] >= want) {
            if (b == 0)
                return 0;
            double f = (want - cum) / r->lat_bins[b]; /* log-linear inside the bin */
            double lo = log10(ll_sim_latency_bin_edge(b - 1)),
                   hi = log10(ll_sim_latency_bin_edge(b));
            double v = pow(10.0, lo + f * (hi - lo));
            return v < r->lat_max_s ? v : r->lat_max_s;
        }
        cum += r->lat_bins[b];
    }
    return r->lat_max_s;
}

double ll_sim_latency_share(const ll_sim_result_t *r, double t)
{
    if (r->gpu_cells <= 0)
        return 1.0;
    if (t == 1.0)
        return (double) r->within_1s / (double) r->gpu_cells;
    if (t == 0.05)
        return (double) r->within_50ms / (double) r->gpu_cells;
    double cum = 0;
    for (int b = 0; b < LL_SIM_LAT_BINS && ll_sim_latency_bin_edge(b) <= t * (1 + 1e-12); b++)
        cum += r->lat_bins[b];
    return cum / (double) r->gpu_cells;
}

void ll_sim_started(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now, int flags)
{
    ll_sim_result_t *r = &sim->d[d].r;
    double lat = now - s->ds[d].t_run;
    if (lat < 0)
        lat = 0;
    r->gpu_cells++;
    r->within_1s += lat <= 1.0;
    r->within_50ms += lat <= 0.05;
    r->warm_hits += (flags & LL_SIM_WARM) != 0;
    r->prefetched += (flags & LL_SIM_PREFETCHED) != 0;
    r->staged += (flags & LL_SIM_STAGED) != 0;
    r->lat_sum_s += lat;
    if (lat > r->lat_max_s)
        r->lat_max_s = lat;
    r->lat_bins[s_lat_bin(lat)]++;
    if (sim->trace_cells)
        fprintf(stderr, "%s %s cell %d: run %.3f start %.3f latency %.4f%s%s%s\n", s_names[d],
                s->tr->id, s->ds[d].cell, s->ds[d].t_run, now, lat,
                flags & LL_SIM_WARM ? " warm" : "", flags & LL_SIM_PREFETCHED ? " prefetched" : "",
                flags & LL_SIM_STAGED ? " staged" : "");
}

/* Timeline points up to NOW (the levels held since the last event). */
static void s_sample(ll_sim_t *sim, double now)
{
    while (sim->next_sample <= now) {
        for (int d = 0; d < LL_SIM_NDESIGNS; d++) {
            s_design_t *dd = &sim->d[d];
            if (!dd->ops || dd->closed)
                continue;
            ll_sim_result_t *r = &dd->r;
            if (r->nsamples == dd->cap_samples) {
                int cap = dd->cap_samples ? 2 * dd->cap_samples : 256;
                float *t = realloc(r->t_s, (size_t) cap * sizeof *t);
                if (t)
                    r->t_s = t;
                float *p = t ? realloc(r->powered_gpus, (size_t) cap * sizeof *p) : NULL;
                if (p)
                    r->powered_gpus = p;
                float *b = p ? realloc(r->busy_gpus, (size_t) cap * sizeof *b) : NULL;
                if (!b)
                    continue; /* a point lost: the figures are unaffected */
                r->busy_gpus = b;
                dd->cap_samples = cap;
            }
            r->t_s[r->nsamples] = (float) sim->next_sample;
            r->powered_gpus[r->nsamples] =
                (float) (dd->level[LL_SIM_POWERED] * sim->cfg.gpus_per_host);
            r->busy_gpus[r->nsamples] = (float) dd->level[LL_SIM_BUSY];
            r->nsamples++;
        }
        sim->next_sample += sim->cfg.sample_s;
    }
}

/* Design D's last session left at NOW and no session is to come: its
 * figures are final; its hosts power off. */
static void s_close(ll_sim_t *sim, int d, double now)
{
    s_design_t *dd = &sim->d[d];
    if (dd->closed)
        return;
    dd->ops->finish(dd->st, now);
    for (int l = 0; l < LL_SIM_NLEVELS; l++)
        ll_sim_level(sim, d, l, now, 0);
    dd->closed = true;
    dd->r.span_s = now - dd->t_first;
    dd->r.host_s = dd->area[LL_SIM_POWERED];
    dd->r.busy_gpu_s = dd->area[LL_SIM_BUSY];
    dd->r.exec_gpu_s = dd->area[LL_SIM_EXEC];
    dd->r.held_gpu_s = dd->area[LL_SIM_HELD];
}

/* ------------------------------------------------------------------ */
/* The user                                                           */

bool ll_sim_closed(const ll_sim_t *sim, int d)
{
    return sim->d[d].closed;
}

const ll_sim_config_t *ll_sim_cfg(const ll_sim_t *sim)
{
    return &sim->cfg;
}

const ll_sim_config_t *ll_sim_config(const ll_sim_t *self)
{
    return &self->cfg;
}

const ll_trace_cell_t *ll_sim_cell(const ll_sim_sess_t *s, int d)
{
    return &s->tr->cells[s->ds[d].cell];
}

static void s_next_cell(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[d];
    if (ds->cell < s->tr->ncells)
        ll_sim_at(sim, now + s->tr->cells[ds->cell].gap_s, d, LL_SIM_EV_EDIT, s, 0, 0, 0);
    else
        ll_sim_at(sim, now + s->tr->tail_s, d, LL_SIM_EV_LEAVE, s, 0, 0, 0);
}

void ll_sim_cell_done(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now)
{
    s->ds[d].cell++;
    s_next_cell(sim, d, s, now);
}

/* S connects in design D at NOW. */
static void s_connect(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now)
{
    s_design_t *dd = &sim->d[d];
    s->ds[d].t_arrive = now;
    dd->ops->start(dd->st, s, now);
    s_next_cell(sim, d, s, now);
}

/* S's seat in design D (growing the table); NULL without one. */
static s_seat_t *s_seat(s_design_t *dd, long seat)
{
    if (seat < 0)
        return NULL;
    if (seat >= dd->nseats) {
        long n = seat + 1 > 2 * dd->nseats ? seat + 1 : 2 * dd->nseats;
        s_seat_t *t = realloc(dd->seats, (size_t) n * sizeof *t);
        if (!t) {
            fprintf(stderr, "looseleaf simulate: out of memory (seats)\n");
            abort();
        }
        memset(t + dd->nseats, 0, (size_t) (n - dd->nseats) * sizeof *t);
        dd->seats = t;
        dd->nseats = n;
    }
    return &dd->seats[seat];
}

static void s_start_session(ll_sim_t *sim, ll_trace_session_t *tr)
{
    ll_sim_sess_t *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "looseleaf simulate: out of memory (sessions)\n");
        abort();
    }
    s->tr = tr;
    double now = tr->arrival_s;
    for (int d = 0; d < LL_SIM_NDESIGNS; d++) {
        s_design_t *dd = &sim->d[d];
        if (!dd->ops)
            continue;
        if (!sim->started)
            dd->t_first = now;
        ll_sim_ds_t *ds = &s->ds[d];
        ds->host = ds->leader = -1;
        ds->t_pool = -1;
        for (int k = 0; k < 4; k++)
            ds->replica[k] = -1;
        s->pending++;
        dd->alive++;
        s_seat_t *seat = s_seat(dd, tr->seat);
        if (seat && seat->occ) {
            /* Its seat's previous user is still there (it waited for GPUs
             * in this design): this one connects when that one leaves, so
             * a seat never holds two sessions. */
            if (seat->tail)
                seat->tail->ds[d].seat_next = s;
            else
                seat->head = s;
            seat->tail = s;
            continue;
        }
        if (seat)
            seat->occ = s;
        s_connect(sim, d, s, now);
    }
    if (!sim->started) {
        sim->started = true;
        sim->next_sample = now;
    }
}

static void s_edit(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[d];
    const ll_trace_cell_t *c = ll_sim_cell(s, d);
    ds->t_edit = now;
    if (c->gpu && sim->d[d].ops->prefetch && c->pf_at[0] >= 0 && c->pf_at[0] < c->edit_s)
        ll_sim_at(sim, now + c->pf_at[0], d, LL_SIM_EV_PREFETCH, s, 0, 0, ds->gen);
    ll_sim_at(sim, now + c->edit_s, d, LL_SIM_EV_RUN, s, 0, 0, 0);
}

static void s_prefetch(ll_sim_t *sim, int d, ll_sim_sess_t *s, const ll_sim_ev_t *ev)
{
    ll_sim_ds_t *ds = &s->ds[d];
    if (ev->gen != ds->gen)
        return; /* its cell already ran */
    const ll_trace_cell_t *c = ll_sim_cell(s, d);
    sim->d[d].ops->prefetch(sim->d[d].st, s, ev->t);
    double next = -1, end = ds->t_edit + c->edit_s;
    if (ev->a == 0 && c->pf_at[1] >= 0)
        next = ds->t_edit + c->pf_at[1];
    else if (c->pf_every > 0)
        next = ev->t + c->pf_every;
    if (next >= 0 && next < end)
        ll_sim_at(sim, next, d, LL_SIM_EV_PREFETCH, s, ev->a + 1, 0, ds->gen);
}

static void s_run(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now)
{
    ll_sim_ds_t *ds = &s->ds[d];
    const ll_trace_cell_t *c = ll_sim_cell(s, d);
    ds->gen++;
    ds->t_run = now;
    if (c->gpu)
        sim->d[d].ops->run_gpu(sim->d[d].st, s, now);
    else
        ll_sim_at(sim, now + c->exec_s, d, LL_SIM_EV_CPU_DONE, s, 0, 0, 0);
}

static void s_free_session(ll_sim_sess_t *s)
{
    ll_trace_session_destroy(&s->tr);
    free(s);
}

void ll_sim_hold(ll_sim_sess_t *s)
{
    s->holds++;
}

void ll_sim_unhold(ll_sim_t *sim, ll_sim_sess_t *s)
{
    if (--s->holds == 0 && s->pending == 0)
        s_free_session(s);
}

void ll_sim_queue_push(ll_sim_queue_t *q, ll_sim_sess_t *s)
{
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 64;
        ll_sim_sess_t **n = realloc(q->q, (size_t) cap * sizeof *n);
        if (!n) {
            fprintf(stderr, "looseleaf simulate: out of memory\n");
            abort();
        }
        q->q = n;
        q->cap = cap;
    }
    q->q[q->n++] = s;
}

static void s_leave(ll_sim_t *sim, int d, ll_sim_sess_t *s, double now)
{
    s_design_t *dd = &sim->d[d];
    dd->ops->leave(dd->st, s, now);
    s->ds[d].done = true;
    dd->r.sessions++;
    dd->r.connected_s += now - s->ds[d].t_arrive;
    dd->alive--;
    s_seat_t *seat = s_seat(dd, s->tr->seat);
    if (seat && seat->occ == s) {
        /* The seat's next user, if it came meanwhile, connects now: after
         * this one left (the handover never holds both). */
        ll_sim_sess_t *n = seat->head;
        seat->occ = n;
        if (n) {
            seat->head = n->ds[d].seat_next;
            if (!seat->head)
                seat->tail = NULL;
            n->ds[d].seat_next = NULL;
            s_connect(sim, d, n, now);
        }
    }
    if (--s->pending == 0 && s->holds == 0)
        s_free_session(s);
    if (dd->alive == 0 && sim->trace_done)
        s_close(sim, d, now);
}

static void s_dispatch(ll_sim_t *sim, const ll_sim_ev_t *ev)
{
    int d = ev->design;
    s_design_t *dd = &sim->d[d];
    ll_sim_sess_t *s = ev->s;
    switch (ev->kind) {
    case LL_SIM_EV_EDIT: s_edit(sim, d, s, ev->t); break;
    case LL_SIM_EV_PREFETCH: s_prefetch(sim, d, s, ev); break;
    case LL_SIM_EV_RUN: s_run(sim, d, s, ev->t); break;
    case LL_SIM_EV_CPU_DONE:
        s->ds[d].dirty_bytes += ll_sim_cell(s, d)->written_bytes;
        if (dd->ops->cpu_done)
            dd->ops->cpu_done(dd->st, s, ev->t);
        ll_sim_cell_done(sim, d, s, ev->t);
        break;
    case LL_SIM_EV_LEAVE: s_leave(sim, d, s, ev->t); break;
    default:
        if (!dd->closed)
            dd->ops->event(dd->st, ev);
        else if (dd->ops->dropped)
            dd->ops->dropped(dd->st, ev); /* (a keep-alive timer held its session) */
        break;
    }
}

/* ------------------------------------------------------------------ */
/* The simulator                                                      */

ll_sim_t *ll_sim_new_designs(const ll_sim_config_t *cfg,
                             const ll_sim_ops_t *const ops[LL_SIM_NDESIGNS], char *err,
                             size_t errlen)
{
    if (cfg->gpus_per_host < 1 || cfg->gpus_per_host > LL_SCHED_MAX_SLOTS || cfg->max_hosts < 0 ||
        !(cfg->sample_s > 0) || !cfg->designs) {
        snprintf(err, errlen,
                 "bad configuration: 1..%d GPUs per host, hosts >= 0, a sampling step > 0, "
                 "some design",
                 LL_SCHED_MAX_SLOTS);
        return NULL;
    }
    ll_sim_t *sim = calloc(1, sizeof *sim);
    if (!sim) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sim->cfg = *cfg;
    const char *tc = getenv("LL_SIM_TRACE_CELLS");
    sim->trace_cells = tc && *tc == '1';
    for (int d = 0; d < LL_SIM_NDESIGNS; d++) {
        if (!(cfg->designs & (1u << d)))
            continue;
        sim->d[d].ops = ops[d];
        sim->d[d].r.ran = true;
        sim->d[d].st = ops[d]->create(sim, d);
        if (!sim->d[d].st) {
            snprintf(err, errlen, "out of memory (design %s)", s_names[d]);
            ll_sim_destroy(&sim);
            return NULL;
        }
    }
    return sim;
}

void ll_sim_destroy(ll_sim_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_sim_t *sim = *self_p;
    /* Sessions still referenced by queued events (a run cut short). */
    ll_sim_sess_t **seen = NULL;
    size_t nseen = 0, ncand = sim->nheap;
    for (int d = 0; d < LL_SIM_NDESIGNS; d++)
        for (long k = 0; k < sim->d[d].nseats; k++)
            for (ll_sim_sess_t *w = sim->d[d].seats[k].head; w; w = w->ds[d].seat_next)
                ncand++;
    for (size_t i = 0; i < ncand; i++) {
        ll_sim_sess_t *s = NULL;
        if (i < sim->nheap) {
            s = sim->heap[i].s;
        } else { /* sessions waiting for their seat (the i-th of them) */
            size_t want = i - sim->nheap, at = 0;
            for (int d = 0; d < LL_SIM_NDESIGNS && !s; d++)
                for (long k = 0; k < sim->d[d].nseats && !s; k++)
                    for (ll_sim_sess_t *w = sim->d[d].seats[k].head; w && !s;
                         w = w->ds[d].seat_next)
                        if (at++ == want)
                            s = w;
        }
        bool dup = !s;
        for (size_t k = 0; k < nseen && !dup; k++)
            dup = seen[k] == s;
        if (dup)
            continue;
        ll_sim_sess_t **n = realloc(seen, (nseen + 1) * sizeof *n);
        if (!n)
            break;
        seen = n;
        seen[nseen++] = s;
    }
    for (size_t k = 0; k < nseen; k++) {
        ll_trace_session_destroy(&seen[k]->tr);
        free(seen[k]);
    }
    free(seen);
    for (int d = 0; d < LL_SIM_NDESIGNS; d++) {
        if (sim->d[d].ops && sim->d[d].st)
            sim->d[d].ops->destroy(sim->d[d].st);
        free(sim->d[d].r.t_s);
        free(sim->d[d].r.powered_gpus);
        free(sim->d[d].r.busy_gpus);
        free(sim->d[d].seats);
    }
    free(sim->heap);
    free(sim);
    *self_p = NULL;
}

int ll_sim_run(ll_sim_t *sim, ll_trace_reader_t *reader, char *err, size_t errlen)
{
    ll_trace_session_t *next = NULL;
    int rc = ll_trace_reader_next(reader, &next, err, errlen);
    if (rc < 0)
        return -1;
    sim->trace_done = rc == 0;
    for (;;) {
        /* At the same instant, what is already scheduled (a departure
         * among it) goes before an arrival: a seat's handover at T never
         * holds both sessions, and a GPU freed at T is free for it. */
        if (next && (sim->nheap == 0 || next->arrival_s < sim->heap[0].t)) {
            sim->now = next->arrival_s;
            s_sample(sim, sim->now);
            s_start_session(sim, next);
            next = NULL;
            rc = ll_trace_reader_next(reader, &next, err, errlen);
            if (rc < 0)
                return -1;
            sim->trace_done = rc == 0;
            continue;
        }
        if (sim->nheap == 0)
            break;
        ll_sim_ev_t ev = s_pop(sim);
        sim->now = ev.t;
        s_sample(sim, sim->now);
        s_dispatch(sim, &ev);
        sim->handled++;
    }
    for (int d = 0; d < LL_SIM_NDESIGNS; d++)
        if (sim->d[d].ops && !sim->d[d].closed)
            s_close(sim, d, sim->now); /* no session at all */
    return 0;
}

const ll_sim_result_t *ll_sim_result(const ll_sim_t *self, ll_sim_design_t d)
{
    return &self->d[d].r;
}

double ll_sim_gpu_hours(const ll_sim_t *self, ll_sim_design_t d)
{
    return self->d[d].r.host_s * self->cfg.gpus_per_host / 3600.0;
}

uint64_t ll_sim_events(const ll_sim_t *self)
{
    return self->handled;
}
