/* ll_hostd: `looseleaf hostd`, the host's slot broker, and `looseleaf top`
 * (ll_hostd.h, hostd/API.md).  The broker is one process per host, normally
 * started as root by systemd (hostd/looseleaf-hostd.service); it runs no
 * user code and never touches a user's files or processes.  Each user's
 * host pool connects to its socket, is identified by SO_PEERCRED, and
 * borrows slots; which pool gets which slot, and whose lease is taken back,
 * is ll_hostd_policy.h's.
 *
 * Runs single-threaded: one poll loop over the listening socket, the pools'
 * connections, a signalfd (SIGTERM/SIGINT) and, with --metrics-port, a
 * localhost TCP socket answering `GET /metrics` with Prometheus text.
 *
 * What must stay true:
 * - a connection names only its own leases: every lease is the
 *   connection's that got it, so a request about another's lease is an
 *   error that changes nothing (the uid, from SO_PEERCRED, is what the
 *   share counts and what `top` shows);
 * - the broker trusts no client (any local user may connect): every field
 *   is checked (ll_hostd_wire) before anything is done, and it grants
 *   nothing a client did not get from it: a slot claimed at `hello` is
 *   adopted only when this broker, before a restart, lent it to that uid
 *   (its record, <socket>.leases) and nobody holds it now;
 * - the broker never blocks on a client: it only writes what a socket takes
 *   now; the rest waits in the connection's queue, and while a client's
 *   replies wait its requests are not read (so nothing grows).  A client
 *   that takes nothing for S_STALL_MS is dropped (a pool's leases end; it
 *   falls back to its own slots and registers again);
 * - what a client costs is bounded: S_MAX_PER_UID connections per uid,
 *   frames of LL_HOSTD_FRAME_MAX bytes (the reader buffers one), queues of
 *   S_OUT_SOFT plus one reply; a metrics connection lives S_HTTP_MS at most;
 * - when it stops, pools see their connection close and fall back. */
#include "base/ll_gpu.h"
#include "hostd/ll_hostd.h"
#include "policy/ll_hostd_policy.h"
#include "hostd/ll_hostd_wire.h"
#include "hostd/ll_lease.h"
#include "hostd/ll_hostd_metrics.h"
#include "proto/ll_zframe.h"
#include "store/ll_store.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* A user's pools (one per LooseLeaf build and Python environment) and a
 * `looseleaf top` or two: connections of one uid at once. */
#define S_MAX_PER_UID 8
#define S_MAX_HTTP    16
#define S_HTTP_MS     5000.0     /* a metrics connection's whole life: request and answer */
#define S_OUT_SOFT    65536      /* a client's requests are read while less waits to go to it */
#define S_OUT_MAX     (1u << 20) /* never more queued for one client (a defence) */
#define S_STALL_MS    10000.0    /* a client that takes none of its queue for this long goes */
#define S_RESTORE_MS  15000.0 /* after a restart, a recorded lease waits this long for its pool */

typedef struct {
    int fd;           /* -1: free */
    ll_zreader_t *rd; /* frames from it (at most LL_HOSTD_FRAME_MAX) */
    unsigned uid;     /* its peer's uid (SO_PEERCRED) */
    int pid;          /* its peer's pid */
    bool pool;        /* it registered (hello): a policy connection of the same index */
    bool dead;        /* to be dropped at the end of this turn */
    char *out;        /* frames queued for it, not yet written */
    size_t olen;      /* bytes in out */
    size_t ocap;      /* allocated */
    double progress;  /* ms: when its queue last shrank (or filled from empty) */
} s_conn_t;

typedef struct {
    int fd;           /* -1: free */
    char buf[2048];   /* the request so far */
    size_t len;       /* bytes in buf */
    char *out;        /* the answer, once the request is in (malloc'd) */
    size_t olen, off; /* its length, and what went */
    double t0;        /* ms, accepted at: closed at t0 + S_HTTP_MS whatever it did */
} s_http_t;

typedef struct {
    char sock[108];
    char record[128]; /* sock + ".leases": who holds which slot, for a restart */
    bool record_dirty;
    int nslots;
    ll_gpu_plan_t plan;                 /* the slots over the devices (slot_dev -1: virtual) */
    ll_gpu_info_t gpus;                 /* what the detection found */
    int ngpu;                           /* devices the slots lie over (0: virtual slots) */
    char visible[LL_GPU_MAX_SLOTS][64]; /* per slot: the CUDA_VISIBLE_DEVICES entry of its device */
    int metrics_port;
    size_t store_cap; /* bytes of checkpoint store each user may hold, 0: no cap */
    int listen_fd, sig_fd, http_fd;
    double started;
    ll_hostd_policy_t *policy;
    ll_lease_ctx_t *lease; /* cluster leases (ll_lease.h); NULL: no cluster key */
    s_conn_t conns[LL_HOSTD_MAX_CONNS];
    s_http_t http[S_MAX_HTTP];
    bool stop;
} s_hostd_t;

/* What any local user can cause, logged at most once per interval each. */
static ll_log_limit_t s_log_refused = LL_LOG_LIMIT_INIT, s_log_dropped = LL_LOG_LIMIT_INIT,
                      s_log_conns = LL_LOG_LIMIT_INIT, s_log_http = LL_LOG_LIMIT_INIT;
/* Pools registering and leaving: every one shows in normal use (a host's
 * few users, a pool restarted), but a client that registers and leaves in
 * a loop costs a line per interval once the burst is spent. */
static ll_log_limit_t s_log_pools = LL_LOG_LIMIT_BURST_INIT(32);

/* GPUs the NVIDIA driver knows (/proc/driver/nvidia/gpus/ holds one entry
 * per GPU): the broker counts without loading CUDA.  0 when none. */
static int s_count_gpus(void)
{
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* ------------------------------------------------------------------ */
/* The record of leases: a restarted broker adopts only what it lent  */

/* Every lease (and restored slot not yet claimed) as "slot uid" lines
 * into the record, replaced whole (rename).  Root's, 0600. */
static void s_record_write(s_hostd_t *h)
{
    char tmp[sizeof h->record + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", h->record);
    h->record_dirty = false;
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        ll_warn_limited(&s_log_conns, "hostd", "cannot write %s: %s (a restart adopts nothing)",
                        tmp, strerror(errno));
        return;
    }
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++) {
        const ll_hostd_lease_t *l = ll_hostd_policy_lease(h->policy, i);
        if (l->conn >= 0)
            fprintf(f, "%d %u\n", l->slot, l->uid);
    }
    for (int s = 0; s < h->nslots; s++) {
        unsigned uid;
        if (ll_hostd_policy_restored(h->policy, s, &uid))
            fprintf(f, "%d %u\n", s, uid);
    }
    if (fclose(f) != 0 || rename(tmp, h->record) != 0) {
        ll_warn_limited(&s_log_conns, "hostd", "cannot write %s: %s", h->record, strerror(errno));
        unlink(tmp);
    }
}

/* At start: the leases the broker that ran before held, each kept for its
 * uid's pool to claim back for S_RESTORE_MS.  A record that is not the
 * broker's own (another owner, writable by others) is ignored. */
static void s_record_load(s_hostd_t *h, double now)
{
    int fd = open(h->record, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    FILE *f = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022))
        f = fdopen(fd, "r");
    if (!f) {
        ll_warn("hostd", "%s is not the broker's own file: ignored", h->record);
        close(fd);
        return;
    }
    int slot, n = 0;
    unsigned uid;
    while (fscanf(f, "%d %u", &slot, &uid) == 2)
        n += ll_hostd_policy_restore(h->policy, slot, uid, now + S_RESTORE_MS) == 0;
    fclose(f);
    if (n)
        ll_info("hostd", "%d lease(s) of the broker before: held %.0f s for their pools to claim",
                n, S_RESTORE_MS / 1000);
}

/* ------------------------------------------------------------------ */
/* Clients' connections                                               */

/* Write what client C's socket takes now, never waiting. */
static void s_flush(s_hostd_t *h, int c)
{
    s_conn_t *cn = &h->conns[c];
    size_t done = 0;
    while (done < cn->olen && !cn->dead) {
        ssize_t w = send(cn->fd, cn->out + done, cn->olen - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0)
            done += (size_t) w;
        else if (w < 0 && errno == EINTR)
            continue;
        else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        else
            cn->dead = true; /* gone: its EOF says so too */
    }
    if (done) {
        memmove(cn->out, cn->out + done, cn->olen - done);
        cn->olen -= done;
        cn->progress = ll_clock_ms();
    }
}

/* Queue MSG (stolen) for client C and write what its socket takes now. */
static void s_send(s_hostd_t *h, int c, json_t *msg)
{
    s_conn_t *cn = &h->conns[c];
    size_t n = 0;
    char *bytes = cn->fd >= 0 && !cn->dead ? ll_zframe_encode(msg, &n) : NULL;
    json_decref(msg);
    if (!bytes)
        return;
    if (cn->olen + n > S_OUT_MAX) {
        ll_warn_limited(&s_log_dropped, "hostd",
                        "client pid %d (uid %u) does not read what it asked for: dropping it",
                        cn->pid, cn->uid);
        cn->dead = true;
        free(bytes);
        return;
    }
    if (cn->olen + n > cn->ocap) {
        size_t cap = (cn->olen + n) * 2;
        char *nb = realloc(cn->out, cap);
        if (!nb) {
            cn->dead = true;
            free(bytes);
            return;
        }
        cn->out = nb;
        cn->ocap = cap;
    }
    if (cn->olen == 0)
        cn->progress = ll_clock_ms(); /* its stall counts from now */
    memcpy(cn->out + cn->olen, bytes, n);
    cn->olen += n;
    free(bytes);
    s_flush(h, c);
}

static void s_error(s_hostd_t *h, int c, const char *why)
{
    ll_info_limited(&s_log_refused, "hostd", "client pid %d (uid %u): refused: %s", h->conns[c].pid,
                    h->conns[c].uid, why);
    s_send(h, c, json_pack("{s:s, s:s}", "type", "error", "error", why));
}

/* Apply the policy's decisions until it has none. */
static void s_decide(s_hostd_t *h)
{
    ll_hostd_decision_t d;
    while (ll_hostd_policy_next(h->policy, ll_clock_ms(), &d)) {
        switch (d.op) {
        case LL_HOSTD_GRANT:
            ll_info("hostd", "slot %d lent to uid %u (pool pid %d)%s", d.slot, h->conns[d.conn].uid,
                    h->conns[d.conn].pid, d.prefetch ? " for a prefetch" : "");
            s_send(h, d.conn,
                   json_pack("{s:s, s:i, s:b}", "type", "grant", "slot", d.slot, "prefetch",
                             d.prefetch));
            h->record_dirty = true;
            break;
        case LL_HOSTD_REVOKE:
            ll_info("hostd", "slot %d taken back from uid %u for uid %u", d.slot,
                    h->conns[d.conn].uid, h->conns[d.for_conn].uid);
            s_send(h, d.conn, json_pack("{s:s, s:i}", "type", "revoke", "slot", d.slot));
            break;
        case LL_HOSTD_WAIT:
            s_send(h, d.conn,
                   json_pack("{s:s, s:b, s:b}", "type", "wait", "revoking", d.revoking, "prefetch",
                             d.prefetch));
            break;
        }
    }
}

/* Where each slot lies: [{slot, device (null: virtual), cuda_visible,
 * mem_fraction}] (welcome, stats). */
static json_t *s_slot_map(const s_hostd_t *h)
{
    json_t *map = json_array();
    for (int s = 0; s < h->nslots; s++) {
        bool dev = h->plan.slot_dev[s] >= 0;
        json_array_append_new(map, json_pack("{s:i, s:o, s:o, s:f}", "slot", s, "device",
                                             dev ? json_integer(h->plan.slot_dev[s]) : json_null(),
                                             "cuda_visible",
                                             dev ? json_string(h->visible[s]) : json_null(),
                                             "mem_fraction", dev ? h->plan.mem_fraction[s] : 0.0));
    }
    return map;
}

/* "hello" Q from C: it registers; of the slots it claims, those this broker
 * lent its uid before a restart (and nobody holds) are its leases again,
 * the others it gives up (welcome's `adopted` leaves them out). */
static void s_hello(s_hostd_t *h, int c, const ll_hostd_msg_t *q)
{
    if (h->conns[c].pool) {
        s_error(h, c, "hello: already registered");
        return;
    }
    double now = ll_clock_ms();
    if (ll_hostd_policy_open(h->policy, c, h->conns[c].uid, q->nslots, now) < 0) {
        s_error(h, c, "hello: too many users");
        return;
    }
    h->conns[c].pool = true;
    json_t *adopted = json_array();
    for (int i = 0; i < q->nheld; i++) {
        const ll_hostd_lease_msg_t *e = &q->held[i];
        if (ll_hostd_policy_adopt(h->policy, c, e->slot, e->idle, now) < 0) {
            ll_info_limited(&s_log_refused, "hostd",
                            "pool pid %d (uid %u) claims slot %d, which is not its lease: refused",
                            h->conns[c].pid, h->conns[c].uid, e->slot);
            continue;
        }
        ll_hostd_policy_mark(h->policy, c, e->slot, e->idle, e->value, e->pid, e->cells, now);
        ll_hostd_policy_mark_prefetch(h->policy, c, e->slot, e->prefetch);
        json_array_append_new(adopted, json_integer(e->slot));
        h->record_dirty = true;
    }
    ll_info_limited(&s_log_pools, "hostd",
                    "pool pid %d of uid %u registered (%d slots, %zu of %d claimed adopted)",
                    h->conns[c].pid, h->conns[c].uid, q->nslots, json_array_size(adopted),
                    q->nheld);
    s_send(h, c,
           json_pack("{s:s, s:i, s:o, s:b, s:o, s:b, s:I}", "type", "welcome", "slots",
                     ll_hostd_policy_nslots(h->policy), "adopted", adopted, "cuda", h->ngpu > 0,
                     "slot_map", s_slot_map(h), "prefetch_leases", true, "store_cap",
                     (json_int_t) h->store_cap));
}

static json_t *s_stats(s_hostd_t *h);
static json_t *s_user_name(unsigned uid);

static const char *s_lease_user(unsigned uid, void *arg)
{
    json_t *n = s_user_name(uid); /* (a string of its cache, or null) */
    snprintf(arg, 64, "%s", json_is_string(n) ? json_string_value(n) : "");
    json_decref(n);
    return *(char *) arg ? arg : NULL;
}

/* Cluster leases (ll_lease.h): answered to any caller, by its uid.  False:
 * M is not a lease request. */
static bool s_lease_frame(s_hostd_t *h, int c, const json_t *m)
{
    char line[400], name[64];
    json_t *r =
        ll_lease_answer(h->lease, m, h->conns[c].uid, s_lease_user, name, line, sizeof line);
    if (!r)
        return false;
    bool err = strcmp(json_string_value(json_object_get(r, "type")), "error") == 0;
    ll_info_limited(err ? &s_log_refused : &s_log_pools, "hostd", "client pid %d (uid %u): %s",
                    h->conns[c].pid, h->conns[c].uid, line);
    s_send(h, c, r);
    return true;
}

static void s_frame(s_hostd_t *h, int c, json_t *m)
{
    double now = ll_clock_ms();
    ll_hostd_msg_t q;
    char why[256];
    if (s_lease_frame(h, c, m))
        return;
    if (ll_hostd_wire_parse(m, h->nslots, &q, why, sizeof why) < 0) {
        s_error(h, c, why);
    } else if (q.type == LL_HOSTD_MSG_STATS) {
        s_send(h, c, s_stats(h));
    } else if (q.type == LL_HOSTD_MSG_HELLO) {
        s_hello(h, c, &q);
    } else if (!h->conns[c].pool) {
        s_error(h, c, "not registered: send hello first");
    } else if (q.type == LL_HOSTD_MSG_WANT) {
        ll_hostd_policy_want(h->policy, c, q.want, now);
        if (q.has_prefetch)
            ll_hostd_policy_want_prefetch(h->policy, c, q.want_prefetch, now);
    } else {
        const ll_hostd_lease_msg_t *l = &q.lease;
        bool release = q.type == LL_HOSTD_MSG_RELEASE;
        int rc = release ? ll_hostd_policy_release(h->policy, c, l->slot, now)
                         : ll_hostd_policy_mark(h->policy, c, l->slot, l->idle, l->value, l->pid,
                                                l->cells, now);
        if (rc == 0 && !release && l->has_prefetch)
            ll_hostd_policy_mark_prefetch(h->policy, c, l->slot, l->prefetch);
        if (rc < 0) {
            snprintf(why, sizeof why, "%s: this connection holds no lease on slot %d",
                     release ? "release" : "mark", l->slot);
            s_error(h, c, why);
        } else if (release) {
            ll_info("hostd", "slot %d returned by uid %u", l->slot, h->conns[c].uid);
            h->record_dirty = true;
        }
    }
    s_decide(h);
}

static void s_accept(s_hostd_t *h)
{
    int fd;
    while ((fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        struct ucred cred;
        socklen_t cl = sizeof cred;
        int c = -1;
        for (int j = 0; j < LL_HOSTD_MAX_CONNS && c < 0; j++)
            if (h->conns[j].fd < 0)
                c = j;
        if (c < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
            if (c < 0)
                ll_warn_limited(&s_log_conns, "hostd", "%d connections: refusing another",
                                LL_HOSTD_MAX_CONNS);
            close(fd);
            continue;
        }
        int same = 0;
        for (int j = 0; j < LL_HOSTD_MAX_CONNS; j++)
            same += h->conns[j].fd >= 0 && h->conns[j].uid == cred.uid;
        if (same >= S_MAX_PER_UID) {
            ll_warn_limited(&s_log_conns, "hostd",
                            "uid %u already has %d connections: refusing another", cred.uid, same);
            close(fd);
            continue;
        }
        ll_zreader_t *rd = ll_zreader_new_max(fd, LL_HOSTD_FRAME_MAX);
        if (!rd) {
            close(fd);
            continue;
        }
        h->conns[c] = (s_conn_t){.fd = fd, .rd = rd, .uid = cred.uid, .pid = cred.pid};
    }
}

static void s_conn_gone(s_hostd_t *h, int c)
{
    if (h->conns[c].pool) {
        ll_info_limited(&s_log_pools, "hostd", "pool pid %d of uid %u left: its leases end",
                        h->conns[c].pid, h->conns[c].uid);
        ll_hostd_policy_close(h->policy, c, ll_clock_ms());
        h->record_dirty = true;
    }
    close(h->conns[c].fd);
    ll_zreader_destroy(&h->conns[c].rd);
    free(h->conns[c].out);
    memset(&h->conns[c], 0, sizeof h->conns[c]);
    h->conns[c].fd = -1;
    s_decide(h);
}

/* Act on C's frames read so far, while its replies do not back up (the
 * rest waits in its reader, and its socket, until they went). */
static void s_conn_pump(s_hostd_t *h, int c)
{
    json_t *m;
    bool bad = false;
    while (!h->conns[c].dead && h->conns[c].olen < S_OUT_SOFT &&
           (m = ll_zreader_pop(h->conns[c].rd, &bad))) {
        s_frame(h, c, m);
        json_decref(m);
    }
    if (bad) {
        ll_warn_limited(&s_log_dropped, "hostd",
                        "client pid %d (uid %u) sent a malformed frame or one over %d bytes: "
                        "dropping it",
                        h->conns[c].pid, h->conns[c].uid, LL_HOSTD_FRAME_MAX);
        h->conns[c].dead = true;
    }
}

static void s_conn_input(s_hostd_t *h, int c)
{
    int fr = ll_zreader_fill(h->conns[c].rd);
    s_conn_pump(h, c);
    if (fr < 0)
        h->conns[c].dead = true;
}

/* ------------------------------------------------------------------ */
/* What it holds: stats (top) and Prometheus text                     */

/* UID's login name (null when it has none), looked up once per uid: a
 * lookup may go to a directory service (NSS: LDAP, sssd), and any client
 * may ask for stats as often as it likes. */
static json_t *s_user_name(unsigned uid)
{
    static struct {
        unsigned uid;
        bool known, named;
        char name[64];
    } cache[LL_HOSTD_MAX_USERS];
    int k = 0;
    while (k < LL_HOSTD_MAX_USERS && cache[k].known && cache[k].uid != uid)
        k++;
    if (k == LL_HOSTD_MAX_USERS) {
        struct passwd *pw = getpwuid(uid); /* (more users than the policy keeps: not cached) */
        return pw ? json_string(pw->pw_name) : json_null();
    }
    if (!cache[k].known) {
        struct passwd *pw = getpwuid(uid);
        cache[k].uid = uid;
        cache[k].known = true;
        cache[k].named = pw && strlen(pw->pw_name) < sizeof cache[k].name;
        if (cache[k].named)
            strcpy(cache[k].name, pw->pw_name);
    }
    return cache[k].named ? json_string(cache[k].name) : json_null();
}

static json_t *s_stats(s_hostd_t *h)
{
    double now = ll_clock_ms();
    json_t *leases = json_array(), *users = json_array(), *pools = json_array();
    int waiting = 0;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++) {
        const ll_hostd_lease_t *l = ll_hostd_policy_lease(h->policy, i);
        if (l->conn < 0)
            continue;
        json_t *dev =
            h->plan.slot_dev[l->slot] >= 0 ? json_integer(h->plan.slot_dev[l->slot]) : json_null();
        json_array_append_new(leases,
                              json_pack("{s:i, s:o, s:i, s:i, s:s, s:f, s:b, s:b, s:f}", "slot",
                                        l->slot, "device", dev, "uid", (int) l->uid, "pool_pid",
                                        h->conns[l->conn].pid, "state",
                                        l->revoking ? "revoking"
                                        : l->idle   ? "warm"
                                                    : "busy",
                                        "value", l->value, "revoking", l->revoking, "prefetch",
                                        l->prefetch, "held_s", (now - l->t0) / 1000));
    }
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++) {
        unsigned uid;
        int want;
        if (!ll_hostd_policy_conn(h->policy, c, &uid, &want))
            continue;
        waiting += want;
        json_array_append_new(pools, json_pack("{s:i, s:i, s:i}", "uid", (int) uid, "pid",
                                               h->conns[c].pid, "waiting", want));
    }
    for (int i = 0; i < LL_HOSTD_MAX_USERS; i++) {
        const ll_hostd_user_t *u = ll_hostd_policy_user(h->policy, i);
        if (!u->used)
            continue;
        double held, busy;
        ll_hostd_policy_user_times(h->policy, i, now, &held, &busy);
        int nbusy = 0, nwarm = 0, want = 0;
        for (int k = 0; k < LL_HOSTD_MAX_LEASES; k++) {
            const ll_hostd_lease_t *l = ll_hostd_policy_lease(h->policy, k);
            if (l->conn >= 0 && l->uid == u->uid && l->idle)
                nwarm++;
            else if (l->conn >= 0 && l->uid == u->uid)
                nbusy++;
        }
        for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++) {
            unsigned uid;
            int w;
            if (ll_hostd_policy_conn(h->policy, c, &uid, &w) && uid == u->uid)
                want += w;
        }
        json_array_append_new(
            users, json_pack("{s:i, s:o, s:i, s:i, s:i, s:f, s:f, s:I, s:I, s:I, s:I}", "uid",
                             (int) u->uid, "name", s_user_name(u->uid), "busy", nbusy, "warm",
                             nwarm, "waiting", want, "gpu_held_s", held / 1000, "gpu_busy_s",
                             busy / 1000, "grants", (json_int_t) u->grants, "revokes",
                             (json_int_t) u->revokes, "cold_starts", (json_int_t) u->cold_starts,
                             "warm_hits", (json_int_t) u->warm_hits));
    }
    json_t *devs = json_array();
    for (int d = 0; d < h->ngpu; d++)
        json_array_append_new(devs, json_pack("{s:i, s:s, s:f, s:i}", "device", d, "name",
                                              h->gpus.dev[d].name, "mem_bytes",
                                              (double) h->gpus.dev[d].mem_bytes, "slots",
                                              h->plan.per_dev[d]));
    json_t *st =
        json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:o, s:o, s:o}", "type", "hostd_stats",
                  "pid", (int) getpid(), "slots", ll_hostd_policy_nslots(h->policy), "busy_slots",
                  ll_hostd_policy_busy_slots(h->policy), "leases",
                  ll_hostd_policy_nleases(h->policy), "waiting", waiting, "uptime_s",
                  (now - h->started) / 1000, "lease_list", leases, "users", users, "pools", pools);
    if (h->lease)
        json_object_set_new(st, "cluster_leases", ll_lease_ctx_stats(h->lease, ll_lease_now_ms()));
    json_object_set_new(st, "store_cap", json_integer((json_int_t) h->store_cap));
    json_object_set_new(st, "cuda", json_boolean(h->ngpu > 0));
    json_object_set_new(st, "devices", devs);
    json_object_set_new(st, "slot_map", s_slot_map(h));
    json_object_set_new(st, "gpu_via", json_string(h->gpus.via));
    json_object_set_new(st, "gpu_why", json_string(h->gpus.why));
    return st;
}

static void s_http_close(s_http_t *q)
{
    close(q->fd);
    free(q->out);
    memset(q, 0, sizeof *q);
    q->fd = -1;
}

/* Write what metrics connection Q's socket takes now; closed when all went. */
static void s_http_flush(s_http_t *q)
{
    while (q->off < q->olen) {
        ssize_t w = send(q->fd, q->out + q->off, q->olen - q->off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0)
            q->off += (size_t) w;
        else if (w < 0 && errno == EINTR)
            continue;
        else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        else
            break;
    }
    s_http_close(q);
}

/* Bytes from metrics connection K; once its request is in, the answer is
 * made and written as its socket takes it (never waiting: S_HTTP_MS
 * bounds the whole exchange). */
static void s_http_input(s_hostd_t *h, int k)
{
    s_http_t *q = &h->http[k];
    ssize_t n = read(q->fd, q->buf + q->len, sizeof q->buf - 1 - q->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0) {
        q->len += (size_t) n;
        q->buf[q->len] = '\0';
    }
    bool done = strstr(q->buf, "\r\n\r\n") || strstr(q->buf, "\n\n");
    if (!done && n > 0 && q->len < sizeof q->buf - 1)
        return;
    if (!done) {
        s_http_close(q); /* closed, failed or too long before its end */
        return;
    }
    bool metrics = strncmp(q->buf, "GET /metrics", 12) == 0;
    json_t *st = s_stats(h);
    char *body = metrics ? ll_hostd_prometheus(st) : NULL;
    json_decref(st);
    size_t bl = body ? strlen(body) : 0;
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      metrics ? "200 OK" : "404 Not Found", bl);
    q->out = malloc((size_t) hl + bl);
    if (!q->out) {
        free(body);
        s_http_close(q);
        return;
    }
    memcpy(q->out, head, (size_t) hl);
    if (body)
        memcpy(q->out + hl, body, bl);
    q->olen = (size_t) hl + bl;
    free(body);
    s_http_flush(q);
}

/* A metrics connection: into a free entry, else into the oldest one's (it
 * had the longest to ask; a real scraper asks at once). */
static void s_http_accept(s_hostd_t *h)
{
    int fd;
    while ((fd = accept4(h->http_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        int k = -1, oldest = 0;
        for (int j = 0; j < S_MAX_HTTP && k < 0; j++) {
            if (h->http[j].fd < 0)
                k = j;
            else if (h->http[j].t0 < h->http[oldest].t0)
                oldest = j;
        }
        if (k < 0) {
            ll_info_limited(&s_log_http, "hostd", "%d metrics connections open: closing the oldest",
                            S_MAX_HTTP);
            s_http_close(&h->http[oldest]);
            k = oldest;
        }
        h->http[k].fd = fd;
        h->http[k].t0 = ll_clock_ms();
    }
}

/* ------------------------------------------------------------------ */
/* Set-up and the loop                                                */

static int s_listen_unix(s_hostd_t *h)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(h->sock) >= sizeof sa.sun_path)
        return -1;
    strcpy(sa.sun_path, h->sock);
    /* Its dir: created world-searchable (pools of every user connect). */
    char dir[sizeof h->sock];
    snprintf(dir, sizeof dir, "%s", h->sock);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            ll_warn("hostd", "cannot create %s: %s", dir, strerror(errno));
    }
    /* A live broker answers connect(): never take its socket away. */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0 && connect(probe, (struct sockaddr *) &sa, sizeof sa) == 0) {
        close(probe);
        ll_error("hostd", "another broker serves %s", h->sock);
        return -1;
    }
    if (probe >= 0)
        close(probe);
    unlink(h->sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(fd, 64) < 0) {
        ll_error("hostd", "cannot listen on %s: %s", h->sock, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    chmod(h->sock, 0666); /* every user's pool connects; SO_PEERCRED says who */
    return fd;
}

static int s_listen_http(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(fd, 16) < 0) {
        ll_error("hostd", "cannot listen on 127.0.0.1:%d: %s", port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* The host's devices, counted as the host pool counts them (ll_gpu_detect:
 * the CUDA driver asked in a child, LL_CUDA_DRIVER, LL_POOL_GPU_DETECT_MS;
 * none under LL_POOL_NO_CUDA); when CUDA does not answer, the NVIDIA GPUs
 * /proc lists (the driver may not be up yet at boot: one slot per GPU then
 * still keeps two users' cells off one device).  Logged either way. */
static int s_find_gpus(s_hostd_t *h)
{
    ll_gpu_info_t *g = &h->gpus;
    memset(g, 0, sizeof *g);
    if (getenv("LL_POOL_NO_CUDA")) {
        snprintf(g->why, sizeof g->why, "LL_POOL_NO_CUDA is set");
        ll_info("hostd", "CUDA: not looked for (LL_POOL_NO_CUDA): virtual slots");
        return 0;
    }
    const char *ms = getenv("LL_POOL_GPU_DETECT_MS");
    int n = ll_gpu_detect(g, ms && atoi(ms) > 0 ? atoi(ms) : 30000);
    if (n > 0) {
        ll_info("hostd", "CUDA: %d device(s) through %s (driver %d, %.0f ms)", n, g->via,
                g->driver_version, g->ms);
        return n;
    }
    n = s_count_gpus();
    n = n < LL_GPU_MAX ? n : LL_GPU_MAX;
    if (n > 0)
        ll_warn("hostd", "CUDA did not count the devices (%s): %d NVIDIA GPU(s) in /proc", g->why,
                n);
    else
        ll_info("hostd", "CUDA: no device (%s): virtual slots", g->why[0] ? g->why : "none");
    return n;
}

static int s_args(s_hostd_t *h, int argc, char **argv)
{
    ll_hostd_socket_path(h->sock, sizeof h->sock);
    const char *e = getenv("LL_POOL_SLOTS"), *pg = getenv("LL_POOL_GPU_SLOTS");
    const char *fr = getenv("LL_POOL_GPU_MEM_FRACTION");
    int total = e && *e ? atoi(e) : 0, per_gpu = pg && *pg ? atoi(pg) : 0;
    double fraction = fr && *fr ? atof(fr) : -1;
    const char *cap = getenv("LL_HOSTD_STORE_CAP");
    const char *conf = getenv("LL_CLUSTER_CONFIG"), *key = NULL, *host = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--socket") == 0 && v) {
            snprintf(h->sock, sizeof h->sock, "%s", v);
            i++;
        } else if (strcmp(a, "--slots") == 0 && v) {
            total = atoi(v);
            i++;
        } else if (strcmp(a, "--gpu-slots") == 0 && v) {
            per_gpu = atoi(v);
            i++;
        } else if (strcmp(a, "--metrics-port") == 0 && v) {
            h->metrics_port = atoi(v);
            i++;
        } else if (strcmp(a, "--store-cap") == 0 && v) {
            cap = v;
            i++;
        } else if (strcmp(a, "--cluster-config") == 0 && v) {
            conf = argv[++i];
        } else if (strcmp(a, "--cluster-key") == 0 && v) {
            key = argv[++i];
        } else if (strcmp(a, "--host") == 0 && v) {
            host = argv[++i];
        } else {
            fprintf(stderr, "usage: looseleaf hostd [--socket PATH] [--slots N] [--gpu-slots N] "
                            "[--metrics-port PORT] [--store-cap BYTES]\n"
                            "       [--cluster-config PATH] [--cluster-key PATH] [--host NAME]\n"
                            "  PATH default $LL_HOSTD_SOCKET, else " LL_HOSTD_DEFAULT_SOCKET "\n"
                            "  --gpu-slots default $LL_POOL_GPU_SLOTS: slots per GPU, each capped "
                            "at a share of its memory\n"
                            "  --slots default $LL_POOL_SLOTS: the total (spread over the GPUs); "
                            "else one per GPU, else 2\n"
                            "  BYTES (checkpoint store per user: 64G, 512M; 0 none) default "
                            "$LL_HOSTD_STORE_CAP, else none\n");
            return -1;
        }
    }
    if (cap && *cap && ll_store_parse_bytes(cap, &h->store_cap) != 0) {
        fprintf(stderr,
                "looseleaf hostd: --store-cap must be a size such as 64G or 512M (0: none), "
                "not '%s'\n",
                cap);
        return -1;
    }
    if (total < 0 || total > LL_HOSTD_MAX_SLOTS || per_gpu < 0 || per_gpu > LL_HOSTD_MAX_SLOTS ||
        h->metrics_port < 0 || h->metrics_port > 65535 || fraction > 1 ||
        (fraction < 0 && fraction != -1)) {
        fprintf(stderr,
                "looseleaf hostd: --slots and --gpu-slots must be 0..%d, --metrics-port "
                "0..65535, LL_POOL_GPU_MEM_FRACTION 0..1\n",
                LL_HOSTD_MAX_SLOTS);
        return -1;
    }
    h->ngpu = s_find_gpus(h);
    if (ll_hostd_policy_plan(h->ngpu, per_gpu, total, fraction, &h->plan) < 0) {
        fprintf(stderr, "looseleaf hostd: %d GPU(s) x %d slots is more than %d slots\n", h->ngpu,
                per_gpu, LL_HOSTD_MAX_SLOTS);
        return -1;
    }
    h->nslots = h->plan.nslots;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    for (int s = 0; s < h->nslots; s++)
        if (h->plan.slot_dev[s] >= 0)
            ll_gpu_visible_entry(vis, h->plan.slot_dev[s], h->visible[s], sizeof h->visible[s]);
    for (int d = 0; d < h->ngpu && d < LL_GPU_MAX; d++)
        ll_info("hostd", "GPU %d: %s, %.1f GiB: %d slot(s)%s", d,
                h->gpus.dev[d].name[0] ? h->gpus.dev[d].name : "?",
                (double) h->gpus.dev[d].mem_bytes / (1 << 30), h->plan.per_dev[d],
                h->plan.per_dev[d] > 1 ? ", each capped" : "");
    char why[512];
    h->lease = ll_lease_ctx_setup(conf, key, host, ll_lease_now_ms(), why, sizeof why);
    if (!h->lease && why[0])
        fprintf(stderr, "looseleaf hostd: %s\n", why);
    return !h->lease && why[0] ? -1 : 0;
}

/* Ms until the next deadline at NOW (a stalled client, a metrics
 * connection's end, a restored lease's grace), -1 when none. */
static int s_timeout(const s_hostd_t *h, double now)
{
    double next = ll_hostd_policy_deadline(h->policy);
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++)
        if (h->conns[c].fd >= 0 && h->conns[c].olen &&
            (next == 0 || h->conns[c].progress + S_STALL_MS < next))
            next = h->conns[c].progress + S_STALL_MS;
    for (int k = 0; k < S_MAX_HTTP; k++)
        if (h->http[k].fd >= 0 && (next == 0 || h->http[k].t0 + S_HTTP_MS < next))
            next = h->http[k].t0 + S_HTTP_MS;
    if (next == 0)
        return -1;
    return next <= now ? 0 : (int) (next - now) + 1;
}

/* What is due at NOW: stalled clients and spent metrics connections go; a
 * restored lease whose grace ended is free (the policy's next pass). */
static void s_deadlines(s_hostd_t *h, double now)
{
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++) {
        s_conn_t *cn = &h->conns[c];
        if (cn->fd >= 0 && !cn->dead && cn->olen && now >= cn->progress + S_STALL_MS) {
            ll_warn_limited(&s_log_dropped, "hostd",
                            "client pid %d (uid %u) took nothing of %zu bytes for %.0f s: "
                            "dropping it",
                            cn->pid, cn->uid, cn->olen, S_STALL_MS / 1000);
            cn->dead = true;
        }
    }
    for (int k = 0; k < S_MAX_HTTP; k++)
        if (h->http[k].fd >= 0 && now >= h->http[k].t0 + S_HTTP_MS)
            s_http_close(&h->http[k]);
    double due = ll_hostd_policy_deadline(h->policy);
    if (due > 0 && now >= due) {
        s_decide(h);
        h->record_dirty = true;
    }
}

static void s_loop(s_hostd_t *h)
{
    struct pollfd pfd[3 + LL_HOSTD_MAX_CONNS + S_MAX_HTTP];
    int idx[3 + LL_HOSTD_MAX_CONNS + S_MAX_HTTP];
    while (!h->stop) {
        int n = 0;
        pfd[n] = (struct pollfd){h->listen_fd, POLLIN, 0};
        idx[n++] = -1;
        pfd[n] = (struct pollfd){h->sig_fd, POLLIN, 0};
        idx[n++] = -2;
        if (h->http_fd >= 0) {
            pfd[n] = (struct pollfd){h->http_fd, POLLIN, 0};
            idx[n++] = -3;
        }
        for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++)
            if (h->conns[c].fd >= 0) {
                /* Its requests are read while its replies do not back up. */
                short ev = (short) ((h->conns[c].olen < S_OUT_SOFT ? POLLIN : 0) |
                                    (h->conns[c].olen ? POLLOUT : 0));
                pfd[n] = (struct pollfd){h->conns[c].fd, ev, 0};
                idx[n++] = c;
            }
        for (int k = 0; k < S_MAX_HTTP; k++)
            if (h->http[k].fd >= 0) {
                pfd[n] = (struct pollfd){h->http[k].fd, h->http[k].out ? POLLOUT : POLLIN, 0};
                idx[n++] = 1000 + k;
            }
        if (poll(pfd, (nfds_t) n, s_timeout(h, ll_clock_ms())) < 0 && errno != EINTR)
            return;
        for (int i = 0; i < n; i++) {
            short re = pfd[i].revents;
            if (!re)
                continue;
            if (idx[i] == -1) {
                s_accept(h);
            } else if (idx[i] == -2) {
                struct signalfd_siginfo si;
                while (read(h->sig_fd, &si, sizeof si) == sizeof si)
                    h->stop = true;
            } else if (idx[i] == -3) {
                s_http_accept(h);
            } else if (idx[i] >= 1000) {
                s_http_t *q = &h->http[idx[i] - 1000];
                if (q->fd != pfd[i].fd)
                    continue;
                if (q->out)
                    s_http_flush(q);
                else
                    s_http_input(h, idx[i] - 1000);
            } else if (h->conns[idx[i]].fd == pfd[i].fd && !h->conns[idx[i]].dead) {
                int c = idx[i];
                if (h->conns[c].olen && (re & (POLLOUT | POLLERR | POLLHUP))) {
                    s_flush(h, c);
                    s_conn_pump(h, c); /* frames held back while its replies waited */
                }
                if (re & (POLLIN | POLLERR | POLLHUP))
                    s_conn_input(h, c);
            }
        }
        s_deadlines(h, ll_clock_ms());
        for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++)
            if (h->conns[c].fd >= 0 && h->conns[c].dead)
                s_conn_gone(h, c);
        if (h->record_dirty)
            s_record_write(h);
    }
}

int ll_hostd_main(int argc, char **argv)
{
    ll_log_init('H');
    s_hostd_t *h = calloc(1, sizeof *h);
    if (!h)
        return 1;
    h->listen_fd = h->sig_fd = h->http_fd = -1;
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++)
        h->conns[c].fd = -1;
    for (int k = 0; k < S_MAX_HTTP; k++)
        h->http[k].fd = -1;
    int rc = 1;
    if (s_args(h, argc, argv) < 0) {
        free(h);
        return 2;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    h->sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    h->policy = ll_hostd_policy_new(h->nslots);
    h->listen_fd = h->policy ? s_listen_unix(h) : -1;
    if (h->listen_fd >= 0) {
        snprintf(h->record, sizeof h->record, "%s.leases", h->sock);
        s_record_load(h, ll_clock_ms());
    }
    if (h->metrics_port > 0)
        h->http_fd = s_listen_http(h->metrics_port);
    if (h->listen_fd >= 0 && h->sig_fd >= 0 && (h->metrics_port == 0 || h->http_fd >= 0)) {
        h->started = ll_clock_ms();
        ll_info("hostd", "serving %s: %d %s slot(s)%s, store cap %zu MiB per user (0: none)",
                h->sock, h->nslots, h->ngpu > 0 ? "GPU" : "virtual",
                h->metrics_port ? ", metrics on 127.0.0.1" : "", h->store_cap >> 20);
        s_loop(h);
        ll_info("hostd", "stopping");
        unlink(h->sock);
        rc = 0;
    }
    for (int c = 0; c < LL_HOSTD_MAX_CONNS; c++)
        if (h->conns[c].fd >= 0) {
            close(h->conns[c].fd);
            ll_zreader_destroy(&h->conns[c].rd);
            free(h->conns[c].out);
        }
    for (int k = 0; k < S_MAX_HTTP; k++)
        if (h->http[k].fd >= 0)
            s_http_close(&h->http[k]);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    if (h->http_fd >= 0)
        close(h->http_fd);
    if (h->sig_fd >= 0)
        close(h->sig_fd);
    ll_hostd_policy_destroy(&h->policy);
    ll_lease_ctx_destroy(&h->lease);
    free(h);
    return rc;
}

/* ------------------------------------------------------------------ */
/* looseleaf top                                                      */

int ll_hostd_top_main(int argc, char **argv)
{
    char sock[108];
    bool json = false, prom = false;
    ll_hostd_socket_path(sock, sizeof sock);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
            snprintf(sock, sizeof sock, "%s", argv[++i]);
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--prometheus") == 0)
            prom = true;
        else {
            fprintf(stderr, "usage: looseleaf top [--socket PATH] [--json | --prometheus]\n");
            return 2;
        }
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    json_t *req = json_pack("{s:s}", "type", "stats");
    json_t *st = NULL;
    if (fd >= 0 && connect(fd, (struct sockaddr *) &sa, sizeof sa) == 0 &&
        ll_zframe_send(fd, req, -1) == 0)
        st = ll_zframe_recv(fd, NULL, true);
    json_decref(req);
    if (fd >= 0)
        close(fd);
    if (!st) {
        fprintf(stderr, "looseleaf top: no broker answers on %s (pools use their own slots)\n",
                sock);
        return 1;
    }
    if (json || prom) {
        char *s = json ? json_dumps(st, JSON_INDENT(1)) : ll_hostd_prometheus(st);
        printf("%s%s", s ? s : "", json ? "\n" : "");
        free(s);
        json_decref(st);
        return 0;
    }
    printf("looseleaf hostd pid %lld on %s: %lld slot(s), %lld held, %lld lease(s), %lld cell(s) "
           "waiting\n",
           json_integer_value(json_object_get(st, "pid")), sock,
           json_integer_value(json_object_get(st, "slots")),
           json_integer_value(json_object_get(st, "busy_slots")),
           json_integer_value(json_object_get(st, "leases")),
           json_integer_value(json_object_get(st, "waiting")));
    json_int_t cap = json_integer_value(json_object_get(st, "store_cap"));
    if (cap)
        printf("checkpoint store: at most %lld MiB per user\n", (long long) (cap >> 20));
    json_t *cl = json_object_get(st, "cluster_leases");
    if (cl)
        printf("cluster leases (this is host %s): %lld issued, %lld redeemed, %lld refused\n",
               json_string_value(json_object_get(cl, "host")),
               json_integer_value(json_object_get(cl, "issued")),
               json_integer_value(json_object_get(cl, "redeemed")),
               json_integer_value(json_object_get(cl, "refused")));
    json_t *sm;
    size_t k;
    if (json_is_true(json_object_get(st, "cuda"))) {
        printf("slot:GPU");
        json_array_foreach(json_object_get(st, "slot_map"), k, sm) {
            double f = json_number_value(json_object_get(sm, "mem_fraction"));
            printf(" %lld:%lld", json_integer_value(json_object_get(sm, "slot")),
                   json_integer_value(json_object_get(sm, "device")));
            if (f > 0)
                printf("(cap %.3g)", f);
        }
        printf("\n");
    }
    printf("\n%-16s %7s %5s %5s %7s %12s %12s %6s %6s\n", "USER", "UID", "BUSY", "WARM", "WAITING",
           "GPU-HELD-S", "GPU-BUSY-S", "HITS", "COLD");
    json_t *u, *l;
    size_t i;
    json_array_foreach(json_object_get(st, "users"), i, u) {
        const char *name = json_string_value(json_object_get(u, "name"));
        printf("%-16s %7lld %5lld %5lld %7lld %12.1f %12.1f %6lld %6lld\n", name ? name : "?",
               json_integer_value(json_object_get(u, "uid")),
               json_integer_value(json_object_get(u, "busy")),
               json_integer_value(json_object_get(u, "warm")),
               json_integer_value(json_object_get(u, "waiting")),
               json_number_value(json_object_get(u, "gpu_held_s")),
               json_number_value(json_object_get(u, "gpu_busy_s")),
               json_integer_value(json_object_get(u, "warm_hits")),
               json_integer_value(json_object_get(u, "cold_starts")));
    }
    printf("\n%-5s %7s %9s %-9s %-8s %10s\n", "SLOT", "UID", "POOL-PID", "STATE", "FOR", "HELD-S");
    json_array_foreach(json_object_get(st, "lease_list"), i, l)
        printf("%-5lld %7lld %9lld %-9s %-8s %10.1f\n",
               json_integer_value(json_object_get(l, "slot")),
               json_integer_value(json_object_get(l, "uid")),
               json_integer_value(json_object_get(l, "pool_pid")),
               json_string_value(json_object_get(l, "state")),
               json_is_true(json_object_get(l, "prefetch")) ? "prefetch" : "cell",
               json_number_value(json_object_get(l, "held_s")));
    json_decref(st);
    return 0;
}
