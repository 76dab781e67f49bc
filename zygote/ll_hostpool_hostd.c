/* ll_hostpool_hostd: the host pool's link to `looseleaf hostd`, the host's
 * slot broker (hostd/API.md).  Run by the pool's one thread, from its loop.
 *
 * Without a broker (no socket at $LL_HOSTD_SOCKET, default
 * /run/looseleaf/hostd.sock; "off": never look) the pool uses its own slots
 * as it always did, and says so once.  With one, a slot is the pool's only
 * while it holds the broker's lease on it (ll_sched_slot_lease): the pool
 * tells the broker how many cells wait for a slot, marks each lease busy or
 * idle (a warm worker, with its GreedyDual value), and gives a lease back
 * when its slot is free and no cell waits.  While cells wait and the broker
 * has not answered, the pool evicts none of its own warm workers (the
 * broker may lend a free slot); once the broker says no slot is on its
 * way, the pool's own GreedyDual order decides as before.  A lease taken
 * back (revoke) is returned as soon as its slot is free: a warm worker on
 * it is evicted at once (its state is committed), a busy one finishes its
 * cell and does not stay warm.
 *
 * The pool's slot numbers are its own (its schedule's), the broker's are
 * the host's: a lease on broker slot b is held on a free slot of the
 * pool's (bslot), so a pool holds at most its own slots' worth, on any of
 * the host's.  A worker on a leased slot runs on the device the broker's
 * map gives b (welcome's slot_map: its CUDA_VISIBLE_DEVICES entry and
 * memory cap), so every pool puts broker slot b on the same device; a
 * broker with virtual slots gives no map (the pool's own plan places it),
 * and LL_POOL_NO_CUDA keeps the pool's workers off every device.
 *
 * Prefetches ask too, at the lowest priority: a prefetch finding no free
 * slot of ours waits for the broker's answer (ll_sched_prefetch_ask): a
 * slot lent for it (it forks there), or none (it is staged as without a
 * broker).  A lease holding a prefetch is marked so: the broker takes it
 * back first when anyone's cell waits, and a worker forked for the
 * prefetch is then killed at once (it committed nothing).
 *
 * When the broker goes away the pool falls back to its own slots (logged
 * once) and tries again every second; registering, it claims the slots its
 * workers hold right then (as the broker slots they had, when known).  The
 * broker adopts only what it lent us before it restarted; a slot it does not
 * adopt we give up as if it were taken back (unheld: nothing of it is said
 * to the broker).  A frame to the broker waits S_SEND_MS at most: a broker
 * that does not read is given up like one that went away. */
#include "hostd/ll_hostd_wire.h"
#include "zygote/ll_hostpool_internal.h"
#include "store/ll_quota.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define S_RETRY_MS   1000.0  /* between attempts to reach the broker */
#define S_REFUSED_MS 30000.0 /* ... after it refused to register us */
#define S_WELCOME_MS 5000.0  /* a broker that does not welcome us by then is given up */
#define S_SEND_MS    5000    /* ... nor one that takes no frame of ours for so long */

struct ll_hostpool_hostd_t {
    char sock[108];                 /* the broker's socket ("": none is looked for) */
    int fd;                         /* connection to it, -1 none (the pool's own slots) */
    ll_zreader_t *rd;               /* frames from it */
    bool registered;                /* it welcomed us */
    bool said_private;              /* "own slots" logged since the last registration */
    double next_try;                /* ms, next attempt to connect */
    double hello_t;                 /* ms, when we said hello */
    int want_sent;                  /* the last "want" the broker has (as it counts) */
    int pf_sent;                    /* ... and its "prefetch" */
    ll_quota_t *quota;              /* the user's store ledger: the broker's cap goes there */
    bool answered;                  /* the broker said wait since cells began to wait */
    bool hold_off;                  /* ... and that no slot is on its way: evict our own */
    bool lease[LL_SCHED_MAX_SLOTS]; /* we hold the broker's lease on the slot */
    int bslot[LL_SCHED_MAX_SLOTS];  /* ... on the broker's slot bslot (-1: none known) */
    bool map_cuda;                  /* the broker's slots lie on GPUs: map places workers */
    int map_n;                      /* broker slots in map */
    struct {
        int dev;                      /* device index (-1: none) */
        double frac;                  /* memory cap (0: none) */
        char vis[64];                 /* its CUDA_VISIBLE_DEVICES entry */
    } map[LL_GPU_MAX_SLOTS];          /* per broker slot, from welcome */
    bool revoked[LL_SCHED_MAX_SLOTS]; /* ... which it takes back */
    bool unheld[LL_SCHED_MAX_SLOTS];  /* claimed at hello, not adopted: given up as if taken
                                         back, and nothing said of it (the broker lent it not) */
    struct {
        bool sent, idle, prefetch;
        int pid, cells;
    } mark[LL_SCHED_MAX_SLOTS]; /* the last mark sent per slot */
};

static void s_private(ll_hostpool_t *pool, const char *why);

static void s_send(ll_hostpool_t *pool, json_t *m)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    /* Never wait long on the broker: one that does not read is gone. */
    if (hd->fd >= 0 && ll_zframe_send_within(hd->fd, m, -1, S_SEND_MS) < 0) {
        int e = errno;
        json_decref(m);
        s_private(pool, e == ETIMEDOUT ? "does not read" : "went away");
        return;
    }
    json_decref(m);
}

/* Back to the pool's own slots (the broker is gone or never was). */
static void s_private(ll_hostpool_t *pool, const char *why)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    if (hd->fd >= 0) {
        close(hd->fd);
        hd->fd = -1;
    }
    ll_zreader_destroy(&hd->rd);
    int nslots = ll_sched_nslots(pool->sched);
    for (int s = 0; s < nslots; s++)
        ll_sched_slot_lease(pool->sched, s, true);
    ll_sched_evict_hold(pool->sched, false);
    ll_sched_wait_quiet(pool->sched, false);
    ll_sched_prefetch_ask(pool->sched, false);
    for (int s = 0; s < nslots; s++)
        if (ll_sched_slot_job(pool->sched, s) < 0)
            hd->bslot[s] = -1; /* a worker holding it keeps its number: claimed again */
    memset(hd->lease, 0, sizeof hd->lease);
    memset(hd->revoked, 0, sizeof hd->revoked);
    memset(hd->unheld, 0, sizeof hd->unheld);
    memset(hd->mark, 0, sizeof hd->mark);
    hd->registered = hd->hold_off = hd->answered = false;
    hd->next_try = ll_clock_ms() + S_RETRY_MS;
    if (!hd->said_private) {
        /* Said whatever the log level: an administrator looks for it. */
        int level = ll_log_level;
        if (ll_log_level < LL_LOG_WARN)
            ll_log_level = LL_LOG_WARN;
        ll_warn("pool", "hostd %s (%s): using the pool's own %d slot(s)", hd->sock, why, nslots);
        ll_log_level = level;
        hd->said_private = true;
    }
}

/* Whether job J (holding a slot) is a prefetch's: preparing one, or a
 * worker a prefetch prepared that has run no cell yet. */
static bool s_holds_prefetch(const ll_sched_job_t *j)
{
    if (j->kind != LL_SCHED_CELL)
        return j->state == LL_SCHED_FORKING || j->state == LL_SCHED_PREPARING ||
               (j->state == LL_SCHED_WARM && j->worker.spec);
    return j->state == LL_SCHED_WARM && j->worker.spec;
}

/* The broker takes back the slot of prefetch R, preparing: a worker forked
 * for it is killed (it committed nothing; its client is told the prefetch
 * ended, as on a cancel); a warm worker re-checking versions finishes and
 * then leaves (its slot is no longer ours).  Once per job. */
static void s_drop_prefetch(ll_hostpool_t *pool, int r)
{
    ll_hostpool_run_t *run = &pool->runs[r];
    if (run->cancelled || run->origin != LL_HOSTPOOL_ORIGIN_FORKED)
        return;
    ll_info("pool", "prefetch %s: hostd takes its slot back for a cell: its worker goes", run->id);
    run->cancelled = true;
    if (run->worker.pid > 0)
        ll_hostpool_signal_worker(run->worker.pid, SIGKILL);
    else
        run->sig.pending = SIGKILL; /* sent when the zygote reports the fork */
}

/* Try to reach the broker; on success register, claiming the slots held
 * now, and take no other slot until it lends one. */
static void s_connect(ll_hostpool_t *pool)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", hd->sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        s_private(pool, e == ENOENT ? "not running" : strerror(e));
        return;
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK); /* read in the loop; frames to it are tiny */
    hd->fd = fd;
    hd->rd = ll_zreader_new(fd);
    json_t *held = json_array();
    int nslots = ll_sched_nslots(pool->sched);
    const ll_gd_t *g = ll_sched_gd(pool->sched);
    /* The broker slots claimed: the one a slot had when known (and not
     * claimed twice), else its own number, else the lowest unclaimed. */
    bool claimed[LL_GPU_MAX_SLOTS] = {false};
    for (int s = 0; s < nslots; s++) {
        int b = hd->bslot[s];
        hd->lease[s] = ll_sched_slot_job(pool->sched, s) >= 0;
        if (hd->lease[s] && b >= 0 && b < LL_GPU_MAX_SLOTS && !claimed[b])
            claimed[b] = true;
        else
            hd->bslot[s] = -1;
    }
    for (int s = 0; s < nslots; s++) {
        if (!hd->lease[s] || hd->bslot[s] >= 0)
            continue;
        int b = s < LL_GPU_MAX_SLOTS && !claimed[s] ? s : 0;
        while (b < LL_GPU_MAX_SLOTS && claimed[b])
            b++;
        if (b < LL_GPU_MAX_SLOTS) {
            claimed[b] = true;
            hd->bslot[s] = b;
        }
    }
    for (int s = 0; s < nslots; s++) {
        int r = ll_sched_slot_job(pool->sched, s);
        hd->revoked[s] = hd->unheld[s] = false;
        ll_sched_slot_lease(pool->sched, s, r >= 0);
        if (r < 0 || hd->bslot[s] < 0)
            continue;
        const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
        double l = 0;
        ll_gd_value(g, j->worker.key, &l);
        json_array_append_new(held,
                              json_pack("{s:i, s:b, s:f, s:i, s:i, s:b}", "slot", hd->bslot[s],
                                        "idle", j->state == LL_SCHED_WARM, "value",
                                        l - ll_gd_clock(g), "pid", j->worker.key, "cells",
                                        j->worker.cells, "prefetch", s_holds_prefetch(j)));
    }
    memset(hd->mark, 0, sizeof hd->mark);
    hd->want_sent = hd->pf_sent = 0;
    hd->hold_off = hd->answered = false;
    ll_sched_evict_hold(pool->sched, true);
    ll_sched_wait_quiet(pool->sched, true);
    hd->hello_t = ll_clock_ms();
    s_send(pool, json_pack("{s:s, s:i, s:i, s:o}", "type", "hello", "nslots", nslots, "pid",
                           (int) getpid(), "held", held));
}

void ll_hostpool_hostd_start(ll_hostpool_t *pool)
{
    ll_hostpool_hostd_t *hd = calloc(1, sizeof *hd);
    if (!hd)
        return; /* no broker link: the pool's own slots */
    pool->hostd = hd;
    hd->fd = -1;
    char err[640];
    hd->quota = ll_quota_open(NULL, err, sizeof err);
    if (!hd->quota && err[0])
        ll_warn("pool", "%s: the broker's store cap cannot be applied", err);
    for (int s = 0; s < LL_SCHED_MAX_SLOTS; s++)
        hd->bslot[s] = -1;
    ll_hostd_socket_path(hd->sock, sizeof hd->sock);
    if (strcmp(hd->sock, "off") == 0) {
        hd->sock[0] = '\0';
        return;
    }
    s_connect(pool);
}

void ll_hostpool_hostd_stop(ll_hostpool_t *pool)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    if (!hd)
        return;
    if (hd->fd >= 0)
        close(hd->fd);
    ll_zreader_destroy(&hd->rd);
    ll_quota_destroy(&hd->quota);
    free(hd);
    pool->hostd = NULL;
}

int ll_hostpool_hostd_fd(const ll_hostpool_t *pool)
{
    return pool->hostd ? pool->hostd->fd : -1;
}

int ll_hostpool_hostd_timer(ll_hostpool_t *pool, double now, int timeout, bool *pass)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    *pass = false;
    if (hd && hd->fd >= 0 && !hd->registered) {
        /* Until it welcomes us the pool takes no new slot: not for long. */
        if (now >= hd->hello_t + S_WELCOME_MS) {
            s_private(pool, "did not answer");
            *pass = true;
            return 0;
        }
        int left = (int) (hd->hello_t + S_WELCOME_MS - now) + 1;
        return timeout < 0 || left < timeout ? left : timeout;
    }
    if (!hd || !hd->sock[0] || hd->fd >= 0)
        return timeout;
    if (now >= hd->next_try) {
        s_connect(pool);
        if (hd->fd >= 0)
            return 0; /* a new descriptor: the loop's next turn polls it */
    }
    int left = (int) (hd->next_try - now) + 1;
    return timeout < 0 || left < timeout ? left : timeout;
}

/* Slots wanted: cells queued beyond the free slots we hold (a cell may
 * wait for a zygote, not a slot; *BEYOND: those), at most our slots
 * without a lease (*ROOM: those; the broker lends no more than our slots). */
static int s_want(const ll_hostpool_t *pool, int *room_out, int *beyond)
{
    int n = 0, end = ll_sched_jobs_end(pool->sched), nslots = ll_sched_nslots(pool->sched);
    for (int r = 0; r < end; r++) {
        const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
        n += j->state == LL_SCHED_QUEUED && j->kind == LL_SCHED_CELL;
    }
    int room = 0; /* slots of ours without a lease: at most that many more */
    for (int s = 0; s < nslots; s++) {
        n -= ll_sched_slot_leased(pool->sched, s) && ll_sched_slot_job(pool->sched, s) < 0;
        room += !pool->hostd->lease[s];
    }
    *beyond = n;
    n = n < room ? n : room;
    *room_out = room;
    return n > 0 ? n : 0;
}

/* Whether any cell is queued (a free leased slot is kept for it). */
static bool s_cells_queued(const ll_hostpool_t *pool)
{
    int end = ll_sched_jobs_end(pool->sched);
    for (int r = 0; r < end; r++)
        if (ll_sched_job(pool->sched, r)->state == LL_SCHED_QUEUED &&
            ll_sched_job(pool->sched, r)->kind == LL_SCHED_CELL)
            return true;
    return false;
}

void ll_hostpool_hostd_sync(ll_hostpool_t *pool)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    if (!hd || hd->fd < 0 || !hd->registered)
        return;
    int nslots = ll_sched_nslots(pool->sched);
    const ll_gd_t *g = ll_sched_gd(pool->sched);
    for (int s = 0; s < nslots; s++) {
        if (!hd->lease[s])
            continue;
        int r = ll_sched_slot_job(pool->sched, s);
        if (r < 0) {
            if (hd->revoked[s] || !s_cells_queued(pool)) {
                bool said = !hd->unheld[s];
                int b = hd->bslot[s];
                hd->lease[s] = hd->revoked[s] = hd->unheld[s] = false;
                hd->mark[s].sent = false;
                hd->bslot[s] = -1;
                ll_sched_slot_lease(pool->sched, s, false);
                if (said)
                    s_send(pool, json_pack("{s:s, s:i}", "type", "release", "slot", b));
                if (hd->fd < 0)
                    return; /* the broker went (s_send): our own slots now */
            }
            continue;
        }
        const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
        /* An evicting worker runs no cell either: idle for the broker's count. */
        bool idle = j->state == LL_SCHED_WARM || j->state == LL_SCHED_EVICTING;
        if (hd->revoked[s] && j->state == LL_SCHED_WARM) {
            ll_hostpool_evict_warm(pool, r, "hostd takes its slot back for another user");
            continue;
        }
        if (hd->revoked[s] && j->kind != LL_SCHED_CELL &&
            (j->state == LL_SCHED_FORKING || j->state == LL_SCHED_PREPARING))
            s_drop_prefetch(pool, r);
        bool pf = s_holds_prefetch(j);
        if (hd->unheld[s])
            continue; /* not the broker's lease: nothing to mark */
        if (hd->mark[s].sent && hd->mark[s].idle == idle && hd->mark[s].pid == j->worker.key &&
            hd->mark[s].cells == j->worker.cells && hd->mark[s].prefetch == pf)
            continue;
        double l = 0;
        ll_gd_value(g, j->worker.key, &l);
        hd->mark[s].sent = true;
        hd->mark[s].idle = idle;
        hd->mark[s].pid = j->worker.key;
        hd->mark[s].cells = j->worker.cells;
        hd->mark[s].prefetch = pf;
        s_send(pool, json_pack("{s:s, s:i, s:b, s:f, s:i, s:i, s:b}", "type", "mark", "slot",
                               hd->bslot[s], "idle", idle, "value", idle ? l - ll_gd_clock(g) : 0.0,
                               "pid", j->worker.key, "cells", j->worker.cells, "prefetch", pf));
        if (hd->fd < 0)
            return; /* the broker went (s_send): our own slots now */
    }
    int room = 0, beyond = 0, want = s_want(pool, &room, &beyond);
    int pf = ll_sched_prefetch_wanting(pool->sched); /* beyond the cells: at the lowest priority */
    pf = pf < room - want ? pf : room - want;
    pf = pf > 0 ? pf : 0;
    if (want != hd->want_sent || pf != hd->pf_sent) {
        hd->want_sent = want;
        hd->pf_sent = pf;
        s_send(pool, json_pack("{s:s, s:i, s:i}", "type", "want", "n", want, "prefetch", pf));
        if (hd->fd < 0)
            return;
    }
    if (want == 0 && beyond > 0)
        hd->hold_off = hd->answered = true; /* every slot of ours is leased: evict our own */
    else if (want == 0)
        hd->hold_off = hd->answered = false;
    ll_sched_evict_hold(pool->sched, !hd->hold_off);
    ll_sched_wait_quiet(pool->sched, !hd->answered);
}

/* Our slot holding the lease on broker slot B, or -1. */
static int s_ours(const ll_hostpool_t *pool, int b)
{
    const ll_hostpool_hostd_t *hd = pool->hostd;
    for (int s = 0; b >= 0 && s < ll_sched_nslots(pool->sched); s++)
        if (hd->lease[s] && !hd->unheld[s] && hd->bslot[s] == b)
            return s;
    return -1;
}

/* The broker's slot map from welcome M: where its slots lie. */
static void s_welcome_map(ll_hostpool_t *pool, const json_t *m)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    json_t *e;
    size_t i;
    hd->map_n = 0;
    hd->map_cuda = json_is_true(json_object_get(m, "cuda"));
    json_array_foreach(json_object_get(m, "slot_map"), i, e) {
        if (i >= LL_GPU_MAX_SLOTS)
            break;
        json_t *dev = json_object_get(e, "device");
        const char *vis = json_string_value(json_object_get(e, "cuda_visible"));
        hd->map[i].dev = json_is_integer(dev) ? (int) json_integer_value(dev) : -1;
        hd->map[i].frac = json_number_value(json_object_get(e, "mem_fraction"));
        snprintf(hd->map[i].vis, sizeof hd->map[i].vis, "%s", vis ? vis : "");
        hd->map_n = (int) i + 1;
        if (hd->map[i].dev < 0 || !vis)
            hd->map_cuda = false; /* a slot without a device: no map at all */
    }
    if (hd->map_cuda && !pool->cfg.no_cuda)
        pool->staged_defer = true; /* workers get devices: staged ones only import */
}

bool ll_hostpool_hostd_device(const ll_hostpool_t *pool, int slot, int *dev, const char **vis,
                              double *frac)
{
    const ll_hostpool_hostd_t *hd = pool->hostd;
    if (!hd || !hd->registered || !hd->map_cuda || pool->cfg.no_cuda || slot < 0 ||
        slot >= ll_sched_nslots(pool->sched) || !hd->lease[slot] || hd->bslot[slot] < 0 ||
        hd->bslot[slot] >= hd->map_n)
        return false;
    *dev = hd->map[hd->bslot[slot]].dev;
    *vis = hd->map[hd->bslot[slot]].vis;
    *frac = hd->map[hd->bslot[slot]].frac;
    return true;
}

int ll_hostpool_hostd_slot(const ll_hostpool_t *pool, int slot)
{
    const ll_hostpool_hostd_t *hd = pool->hostd;
    return hd && hd->registered && slot >= 0 && slot < ll_sched_nslots(pool->sched) &&
                   hd->lease[slot]
               ? hd->bslot[slot]
               : -1;
}

/* One frame from the broker. */
static void s_frame(ll_hostpool_t *pool, json_t *m)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    const char *type = json_string_value(json_object_get(m, "type"));
    int nslots = ll_sched_nslots(pool->sched);
    json_t *js = json_object_get(m, "slot");
    int b = json_is_integer(js) ? (int) json_integer_value(js) : -1; /* the broker's slot */
    if (!type)
        return;
    if (strcmp(type, "welcome") == 0) {
        hd->registered = true;
        hd->said_private = false;
        s_welcome_map(pool, m);
        /* A slot we claimed and the broker did not adopt (it did not lend
         * it to us, or another holds it now) is given up as if taken back:
         * a warm worker there is evicted, a busy one finishes its cell. */
        for (int s = 0; s < nslots; s++) {
            if (!hd->lease[s])
                continue;
            bool adopted = false; /* (a slot we could not claim: not adopted either) */
            json_t *e;
            size_t i;
            json_array_foreach(json_object_get(m, "adopted"), i, e)
                adopted |= json_integer_value(e) == hd->bslot[s];
            if (!adopted) {
                hd->revoked[s] = hd->unheld[s] = true;
                ll_sched_slot_lease(pool->sched, s, false);
                ll_info("pool", "hostd did not adopt slot %d (ours %d): given up", hd->bslot[s], s);
            }
        }
        ll_sched_prefetch_ask(pool->sched, json_is_true(json_object_get(m, "prefetch_leases")));
        /* The administrator's cap on the user's checkpoint store, for every
         * store of the user (ll_quota): 0 lifts it.  It stays through a
         * broker outage. */
        json_int_t cap = json_integer_value(json_object_get(m, "store_cap"));
        ll_quota_set_cap(hd->quota, cap > 0 ? (uint64_t) cap : 0, LL_QUOTA_SRC_HOSTD);
        ll_warn(
            "pool",
            "hostd %s: registered (%lld host %s slot(s), %zu of ours claimed, store cap %lld MiB)",
            hd->sock, json_integer_value(json_object_get(m, "slots")),
            hd->map_cuda ? "GPU" : "virtual", json_array_size(json_object_get(m, "adopted")),
            (long long) (cap >> 20));
    } else if (strcmp(type, "grant") == 0 && b >= 0 && b < LL_GPU_MAX_SLOTS) {
        bool for_pf = json_is_true(json_object_get(m, "prefetch"));
        if (for_pf && hd->pf_sent > 0)
            hd->pf_sent--; /* as the broker counts */
        else if (!for_pf && hd->want_sent > 0)
            hd->want_sent--;
        int s = 0; /* a free slot of ours holds it */
        while (s < nslots && (hd->lease[s] || ll_sched_slot_job(pool->sched, s) >= 0))
            s++;
        if (s == nslots) {
            ll_warn("pool", "hostd lent slot %d, but every slot of ours is leased: returned", b);
            s_send(pool, json_pack("{s:s, s:i}", "type", "release", "slot", b));
            return;
        }
        hd->lease[s] = true;
        hd->bslot[s] = b;
        hd->revoked[s] = false;
        hd->mark[s].sent = false;
        ll_sched_slot_lease(pool->sched, s, true);
        ll_info("pool", "hostd lent slot %d (ours %d)%s", b, s, for_pf ? " for a prefetch" : "");
    } else if (strcmp(type, "revoke") == 0) {
        int s = s_ours(pool, b);
        if (s < 0)
            return; /* returned already */
        hd->revoked[s] = true;
        ll_sched_slot_lease(pool->sched, s, false);
        ll_info("pool", "hostd takes slot %d (ours %d) back", b, s);
    } else if (strcmp(type, "wait") == 0 && json_is_true(json_object_get(m, "prefetch"))) {
        ll_sched_prefetch_refused(pool->sched); /* none lent: staged, as without a broker */
        hd->pf_sent = -1;                       /* a prefetch asking later is asked for anew */
    } else if (strcmp(type, "wait") == 0) {
        hd->answered = true;
        hd->hold_off = !json_is_true(json_object_get(m, "revoking"));
        ll_sched_evict_hold(pool->sched, !hd->hold_off);
        ll_sched_wait_quiet(pool->sched, false);
    } else if (strcmp(type, "error") == 0 && !hd->registered) {
        /* It will not have us (too many users): our own slots, and ask
         * again later. */
        char why[300];
        snprintf(why, sizeof why, "refused to register: %.200s",
                 json_string_value(json_object_get(m, "error")));
        s_private(pool, why);
        hd->next_try = ll_clock_ms() + S_REFUSED_MS;
    } else if (strcmp(type, "error") == 0) {
        ll_warn("pool", "hostd refused a request: %s",
                json_string_value(json_object_get(m, "error")));
    }
}

bool ll_hostpool_hostd_input(ll_hostpool_t *pool)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    if (!hd || hd->fd < 0)
        return false;
    int fr = ll_zreader_fill(hd->rd);
    json_t *m;
    bool bad = false;
    while (hd->fd >= 0 && (m = ll_zreader_pop(hd->rd, &bad))) {
        s_frame(pool, m);
        json_decref(m);
    }
    if (fr < 0 || bad) {
        s_private(pool, bad ? "sent a malformed frame" : "went away");
        return false;
    }
    return true;
}
