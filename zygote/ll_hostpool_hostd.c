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
 * When the broker goes away the pool falls back to its own slots (logged
 * once) and tries again every second; registering, it claims the slots its
 * workers hold right then, so nothing running is disturbed. */
#include "zygote/ll_hostd.h"
#include "zygote/ll_hostpool_internal.h"
#include "store/ll_quota.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define S_RETRY_MS   1000.0  /* between attempts to reach the broker */
#define S_REFUSED_MS 30000.0 /* ... after it refused to register us */
#define S_WELCOME_MS 5000.0  /* a broker that does not welcome us by then is given up */

struct ll_hostpool_hostd_t {
    char sock[108];                   /* the broker's socket ("": none is looked for) */
    int fd;                           /* connection to it, -1 none (the pool's own slots) */
    ll_zreader_t *rd;                 /* frames from it */
    bool registered;                  /* it welcomed us */
    bool said_private;                /* "own slots" logged since the last registration */
    double next_try;                  /* ms, next attempt to connect */
    double hello_t;                   /* ms, when we said hello */
    int want_sent;                    /* the last "want" the broker has (as it counts) */
    ll_quota_t *quota;                /* the user's store ledger: the broker's cap goes there */
    bool answered;                    /* the broker said wait since cells began to wait */
    bool hold_off;                    /* ... and that no slot is on its way: evict our own */
    bool lease[LL_SCHED_MAX_SLOTS];   /* we hold the broker's lease on the slot */
    bool revoked[LL_SCHED_MAX_SLOTS]; /* ... which it takes back */
    struct {
        bool sent, idle;
        int pid, cells;
    } mark[LL_SCHED_MAX_SLOTS]; /* the last mark sent per slot */
};

static void s_send(ll_hostpool_t *pool, json_t *m)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    if (hd->fd >= 0 && ll_zframe_send(hd->fd, m, -1) < 0)
        ll_debug("pool", "hostd: send failed: %s", strerror(errno)); /* its EOF follows */
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
    memset(hd->lease, 0, sizeof hd->lease);
    memset(hd->revoked, 0, sizeof hd->revoked);
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
    const ll_gdsf_t *g = ll_sched_gdsf(pool->sched);
    for (int s = 0; s < nslots; s++) {
        int r = ll_sched_slot_job(pool->sched, s);
        hd->lease[s] = r >= 0;
        hd->revoked[s] = false;
        ll_sched_slot_lease(pool->sched, s, r >= 0);
        if (r < 0)
            continue;
        const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
        double l = 0;
        ll_gdsf_value(g, j->worker.key, &l);
        json_array_append_new(held,
                              json_pack("{s:i, s:b, s:f, s:i, s:i}", "slot", s, "idle",
                                        j->state == LL_SCHED_WARM, "value", l - ll_gdsf_clock(g),
                                        "pid", j->worker.key, "cells", j->worker.cells));
    }
    memset(hd->mark, 0, sizeof hd->mark);
    hd->want_sent = 0;
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

int ll_hostpool_hostd_timer(ll_hostpool_t *pool, double now, int timeout)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    if (hd && hd->fd >= 0 && !hd->registered) {
        /* Until it welcomes us the pool takes no new slot: not for long. */
        if (now >= hd->hello_t + S_WELCOME_MS) {
            s_private(pool, "did not answer");
            ll_hostpool_schedule(pool);
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
 * wait for a zygote, not a slot). */
static int s_want(const ll_hostpool_t *pool)
{
    int n = 0, end = ll_sched_jobs_end(pool->sched), nslots = ll_sched_nslots(pool->sched);
    for (int r = 0; r < end; r++) {
        const ll_sched_job_t *j = ll_sched_job(pool->sched, r);
        n += j->state == LL_SCHED_QUEUED && j->kind == LL_SCHED_CELL;
    }
    for (int s = 0; s < nslots; s++)
        n -= ll_sched_slot_leased(pool->sched, s) && ll_sched_slot_job(pool->sched, s) < 0;
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
    const ll_gdsf_t *g = ll_sched_gdsf(pool->sched);
    for (int s = 0; s < nslots; s++) {
        if (!hd->lease[s])
            continue;
        int r = ll_sched_slot_job(pool->sched, s);
        if (r < 0) {
            if (hd->revoked[s] || !s_cells_queued(pool)) {
                hd->lease[s] = hd->revoked[s] = false;
                hd->mark[s].sent = false;
                ll_sched_slot_lease(pool->sched, s, false);
                s_send(pool, json_pack("{s:s, s:i}", "type", "release", "slot", s));
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
        if (hd->mark[s].sent && hd->mark[s].idle == idle && hd->mark[s].pid == j->worker.key &&
            hd->mark[s].cells == j->worker.cells)
            continue;
        double l = 0;
        ll_gdsf_value(g, j->worker.key, &l);
        hd->mark[s].sent = true;
        hd->mark[s].idle = idle;
        hd->mark[s].pid = j->worker.key;
        hd->mark[s].cells = j->worker.cells;
        s_send(pool, json_pack("{s:s, s:i, s:b, s:f, s:i, s:i}", "type", "mark", "slot", s, "idle",
                               idle, "value", idle ? l - ll_gdsf_clock(g) : 0.0, "pid",
                               j->worker.key, "cells", j->worker.cells));
    }
    int want = s_want(pool);
    if (want != hd->want_sent) {
        hd->want_sent = want;
        s_send(pool, json_pack("{s:s, s:i}", "type", "want", "n", want));
    }
    if (want == 0)
        hd->hold_off = hd->answered = false;
    ll_sched_evict_hold(pool->sched, !hd->hold_off);
    ll_sched_wait_quiet(pool->sched, !hd->answered);
}

/* One frame from the broker. */
static void s_frame(ll_hostpool_t *pool, json_t *m)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    const char *type = json_string_value(json_object_get(m, "type"));
    int nslots = ll_sched_nslots(pool->sched);
    json_t *js = json_object_get(m, "slot");
    int s = json_is_integer(js) ? (int) json_integer_value(js) : -1;
    if (!type)
        return;
    if (strcmp(type, "welcome") == 0) {
        hd->registered = true;
        hd->said_private = false;
        /* The administrator's cap on the user's checkpoint store, for every
         * store of the user (ll_quota): 0 lifts it.  It stays through a
         * broker outage. */
        json_int_t cap = json_integer_value(json_object_get(m, "store_cap"));
        ll_quota_set_cap(hd->quota, cap > 0 ? (uint64_t) cap : 0, LL_QUOTA_SRC_HOSTD);
        ll_warn("pool",
                "hostd %s: registered (%lld host slot(s), %zu of ours claimed, store cap %lld MiB)",
                hd->sock, json_integer_value(json_object_get(m, "slots")),
                json_array_size(json_object_get(m, "adopted")), (long long) (cap >> 20));
    } else if (strcmp(type, "grant") == 0 && s >= 0 && s < nslots) {
        hd->lease[s] = true;
        hd->revoked[s] = false;
        hd->mark[s].sent = false;
        ll_sched_slot_lease(pool->sched, s, true);
        if (hd->want_sent > 0)
            hd->want_sent--; /* as the broker counts */
        ll_info("pool", "hostd lent slot %d", s);
    } else if (strcmp(type, "revoke") == 0 && s >= 0 && s < nslots) {
        if (!hd->lease[s])
            return; /* returned already */
        hd->revoked[s] = true;
        ll_sched_slot_lease(pool->sched, s, false);
        ll_info("pool", "hostd takes slot %d back", s);
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

void ll_hostpool_hostd_input(ll_hostpool_t *pool)
{
    ll_hostpool_hostd_t *hd = pool->hostd;
    if (!hd || hd->fd < 0)
        return;
    int fr = ll_zreader_fill(hd->rd);
    json_t *m;
    bool bad = false;
    while (hd->fd >= 0 && (m = ll_zreader_pop(hd->rd, &bad))) {
        s_frame(pool, m);
        json_decref(m);
    }
    if (fr < 0 || bad) {
        s_private(pool, bad ? "sent a malformed frame" : "went away");
        return;
    }
    ll_hostpool_schedule(pool);
}
