/* ll_hostpool: the host pool (`looseleaf pool`), one process per runtime dir
 * (per uid), shared by every kernel on the host: its set-up, its poll loop
 * and the clients' connections.  What clients ask and workers say is
 * ll_hostpool_jobs.c's; which job gets a slot or a warm worker and whom to
 * evict is ll_sched.h's; the zygote tree is ll_ztree.h's.
 *
 * Runs single-threaded: one poll loop over the listening socket, the clients,
 * the zygote nodes, the workers, the CUDA-safety probes and a signalfd for
 * SIGCHLD.  It never forks a Python process: zygotes are started by exec,
 * workers and child nodes are forked by zygotes.  It is a child subreaper,
 * so a worker whose zygote died is reaped here and its fate still reported.
 *
 * What must stay true:
 * - one pool per runtime dir (pool.lock), which is ours and private (0700),
 *   and only our own uid may connect (SO_PEERCRED);
 * - the pool detaches from the kernel that started it (it serves others):
 *   its own session, no descriptor of the starter's (they would reach every
 *   zygote and fail its pre-fork check), its output to pool.log;
 * - a client that stops reading stalls only itself: its frames are queued,
 *   and past 512 MiB it is dropped;
 * - the pool exits --idle-exit seconds after its last client and job left,
 *   and on SIGTERM/SIGINT, killing its workers. */
#include "zygote/ll_hostpool.h"
#include "zygote/ll_hostpool_internal.h"
#include "zygote/ll_zclient.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Clients' connections                                               */

/* Accept every client waiting on the listening socket. */
static void s_accept(ll_hostpool_t *pool)
{
    int fd;
    while ((fd = accept4(pool->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        int c = -1;
        for (int j = 0; j < LL_HOSTPOOL_MAX_CLIENTS && c < 0; j++)
            if (pool->clients[j].fd < 0)
                c = j;
        if (c < 0) {
            close(fd);
            continue;
        }
        /* The dir is 0700; still, only our own uid may use the pool. */
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0 || cred.uid != getuid()) {
            ll_warn("pool", "refusing a client of another uid");
            close(fd);
            continue;
        }
        memset(&pool->clients[c], 0, sizeof pool->clients[c]);
        pool->clients[c].fd = fd;
        pool->clients[c].rd = ll_zreader_new(fd);
        pool->clients[c].connected = ll_clock_ms();
        ll_info("pool", "client %d connected", c);
    }
}

/* Client C goes: its jobs and sessions (ll_hostpool_client_left), then its
 * connection. */
static void s_client_gone(ll_hostpool_t *pool, int c)
{
    ll_hostpool_client_left(pool, c);
    close(pool->clients[c].fd);
    ll_zreader_destroy(&pool->clients[c].rd);
    free(pool->clients[c].out);
    memset(&pool->clients[c], 0, sizeof pool->clients[c]);
    pool->clients[c].fd = -1;
    ll_info("pool", "client %d left", c);
}

/* Client C's socket is ready (REVENTS): write what is queued, read frames. */
static void s_client_input(ll_hostpool_t *pool, int c, short revents)
{
    if (revents & POLLOUT)
        ll_hostpool_flush(pool, c);
    if (!(revents & (POLLIN | POLLHUP | POLLERR)))
        return;
    int fr = ll_zreader_fill(pool->clients[c].rd);
    json_t *m;
    bool bad = false;
    while ((m = ll_zreader_pop(pool->clients[c].rd, &bad))) {
        ll_hostpool_client_frame(pool, c, m);
        json_decref(m);
    }
    if (bad)
        ll_warn("pool", "client %d sent a malformed frame: dropped", c);
    if (fr < 0 || bad)
        s_client_gone(pool, c);
}

/* ------------------------------------------------------------------ */
/* Set-up                                                             */

/* The CUDA devices (ll_gpu.h: asked of the driver in a child) and the
 * slots over them; logged either way, so pool.log says why a GPU host got
 * no CUDA slot.  Returns the slots (0: no device, virtual slots). */
static int s_find_gpus(ll_hostpool_t *pool)
{
    ll_gpu_info_t *g = &pool->gpus;
    if (pool->cfg.no_cuda) {
        memset(g, 0, sizeof *g);
        snprintf(g->why, sizeof g->why, "LL_POOL_NO_CUDA is set");
        ll_info("pool", "CUDA: not looked for (LL_POOL_NO_CUDA)");
        return 0;
    }
    int n = ll_gpu_detect(g, pool->cfg.gpu_detect_ms);
    if (n <= 0 || ll_gpu_plan(n, pool->cfg.gpu_slots, pool->cfg.slots_given ? pool->cfg.nslots : 0,
                              pool->cfg.gpu_mem_fraction, &pool->plan) < 0) {
        /* Workers will see no device at all (CUDA_VISIBLE_DEVICES=""): no
         * GPU work ever runs without a slot. */
        ll_info("pool", "CUDA: no device (%s; %.0f ms): virtual slots, workers see no GPU",
                g->why[0] ? g->why : "none counted", g->ms);
        return 0;
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(pool->visible, sizeof pool->visible, "%s", vis ? vis : "");
    ll_info("pool", "CUDA: %d device(s) through %s (driver %d, %.0f ms); %d slot(s)", n, g->via,
            g->driver_version, g->ms, pool->plan.nslots);
    for (int d = 0; d < n; d++)
        ll_info("pool", "CUDA device %d: %s, %.1f GiB, %d worker(s)", d, g->dev[d].name,
                (double) g->dev[d].mem_bytes / (1 << 30), pool->plan.per_dev[d]);
    return pool->plan.nslots;
}

/* The options: defaults, LL_POOL_*, the command line.  Returns -1 to go
 * on, else the exit status. */
static int s_parse(ll_hostpool_t *pool, int argc, char **argv)
{
    ll_hostpool_config_defaults(&pool->cfg);
    ll_zclient_default_dir(NULL, pool->cfg.dir, sizeof pool->cfg.dir);
    ll_hostpool_config_env(&pool->cfg, getenv);
    char err[1024];
    if (ll_hostpool_config_args(&pool->cfg, argc, argv, err, sizeof err) < 0) {
        fputs(err, stderr);
        return 2;
    }
    return -1;
}

static int s_prepare_dir(ll_hostpool_t *pool)
{
    if (mkdir(pool->cfg.dir, 0700) < 0 && errno != EEXIST) {
        ll_error("pool", "cannot create %s: %s", pool->cfg.dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(pool->cfg.dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
        (st.st_mode & 077)) {
        ll_error("pool", "%s must be a directory owned by uid %d with mode 0700", pool->cfg.dir,
                 (int) getuid());
        return -1;
    }
    return 0;
}

/* Keep nothing of the starting kernel but what the pool needs (a daemon
 * that serves every kernel of the user): its working directory goes to "/"
 * (a kernel's may be a temporary directory, deleted once it shut down: a
 * zygote started later in it could not even import), its environment to
 * what ll_zclient_env_kept says (the kernel started it with no more), its
 * umask to 022.  Why 022 and not 077: what the pool writes itself is
 * private by its own modes (the dir 0700, its log, lock and socket 0600),
 * while zygotes write the user's caches (__pycache__, torch's and
 * matplotlib's) as any process of the user would; a worker takes its
 * session's umask with the rest of the process state, so files a cell
 * writes get the kernel's. */
static void s_daemon_hygiene(void)
{
    if (chdir("/") < 0)
        ll_warn("pool", "cannot change to /: %s", strerror(errno));
    umask(022);
    extern char **environ;
    size_t n = 0;
    while (environ[n])
        n++;
    char **keep = calloc(n + 1, sizeof *keep);
    if (!keep)
        return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ll_zclient_env_kept(environ[i]) && (keep[k] = strdup(environ[i])))
            k++;
    clearenv();
    for (size_t i = 0; i < k; i++)
        putenv(keep[i]); /* (putenv keeps the string: it is never freed) */
    free(keep);
}

/* Detach: the client that started us must not be our parent (it would have
 * to reap us) nor share our output pipes.  Returns 1 in the parent (which
 * exits), 0 in the detached pool, -1 when the fork failed. */
static int s_detach(ll_hostpool_t *pool)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid > 0)
        return 1;
    setsid();
    /* Descriptors the starting process leaked (not close-on-exec) would
     * live on in every zygote and fail its pre-fork check. */
    close_range(3, ~0U, 0);
    char logpath[PATH_MAX + 16];
    snprintf(logpath, sizeof logpath, "%s/pool.log", pool->cfg.dir);
    int lfd = open(pool->cfg.log[0] ? pool->cfg.log : logpath,
                   O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int nfd = open("/dev/null", O_RDONLY);
    if (nfd >= 0) {
        dup2(nfd, 0);
        close(nfd);
    }
    if (lfd >= 0) {
        dup2(lfd, 1);
        dup2(lfd, 2);
        close(lfd);
    }
    ll_log_init('P');
    return 0;
}

/* Our build id in pool.build, before the socket exists: a client that
 * connects reads it and refuses a pool of another build (ll_zclient.h). */
static int s_write_build(ll_hostpool_t *pool)
{
    char id[24], path[PATH_MAX + 16], tmp[PATH_MAX + 24];
    if (ll_zclient_build_id(NULL, id, sizeof id) < 0) {
        ll_error("pool", "cannot read its own binary for its build id: %s", strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/pool.build", pool->cfg.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    bool ok = f && fprintf(f, "%s\n", id) > 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok || rename(tmp, path) < 0) {
        ll_error("pool", "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    ll_info("pool", "build %s (pid %d)", id, (int) getpid());
    return 0;
}

static int s_listen(ll_hostpool_t *pool)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(pool->sock) >= sizeof sa.sun_path) {
        ll_error("pool", "socket path too long: %s", pool->sock);
        return -1;
    }
    strcpy(sa.sun_path, pool->sock);
    unlink(pool->sock); /* stale: we hold the lock, so no pool listens there */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(fd, 64) < 0) {
        ll_error("pool", "cannot listen on %s: %s", pool->sock, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    chmod(pool->sock, 0600);
    return fd;
}

/* The schedule (slots: on CUDA devices, else the configured virtual ones) and
 * the tree with its base zygote.  0, or -1 (logged). */
static int s_start_serving(ll_hostpool_t *pool)
{
    int nslots = pool->cfg.nslots, max_staged = pool->cfg.max_staged;
    int cuda_slots = s_find_gpus(pool);
    if (cuda_slots > 0) {
        pool->cuda = true;
        nslots = cuda_slots < LL_SCHED_MAX_SLOTS ? cuda_slots : LL_SCHED_MAX_SLOTS;
    }
    /* Staged workers (a prefetch finding no slot prepares one without):
     * twice as many as slots unless set.  Without a GPU there is no device
     * memory, so they restore everything; on CUDA hosts (or when tests ask,
     * LL_POOL_STAGED_DEFER=1) only imports and the state's restore waits for
     * the slot: variables may hold device tensors. */
    if (max_staged < 0)
        max_staged = 2 * nslots;
    pool->staged_defer = pool->cuda || pool->cfg.staged_defer;
    pool->sched =
        ll_sched_new(nslots, max_staged, pool->cfg.spec_s * 1000.0, pool->cfg.warm_idle_s > 0);
    if (!pool->sched)
        return -1;
    ll_info("pool", "serving %s: %d %s slot(s), up to %d zygote nodes, idle exit %d s",
            pool->cfg.dir, nslots, pool->cuda ? "CUDA" : "virtual", pool->cfg.max_nodes,
            pool->cfg.idle_exit_s);
    pool->tree = ll_ztree_new(pool->exe, pool->exe_name, pool->cfg.head, pool->cfg.max_nodes,
                              pool->cfg.grow, ll_hostpool_node_lost, pool);
    if (!pool->tree || ll_ztree_spawn_base(pool->tree) < 0) {
        ll_error("pool", "cannot start the base zygote: %s", strerror(errno));
        return -1;
    }
    pool->idle_since = ll_clock_ms();
    ll_hostpool_hostd_start(pool); /* hostd: slots borrowed from the host's broker, if any */
    return 0;
}

/* Everything before the loop: the runtime dir, detaching, the lock, the
 * signals, the socket, the schedule and the base zygote.  Returns -1 to go
 * on, else the exit status (0 in the parent that detached, and when
 * another pool serves the dir). */
static int s_setup(ll_hostpool_t *pool)
{
    if (ll_zframe_self_exe(pool->exe, sizeof pool->exe, pool->exe_name, sizeof pool->exe_name) <
        0) {
        fprintf(stderr, "looseleaf pool: cannot find its own binary: %s\n", strerror(errno));
        return 1;
    }
    if (s_prepare_dir(pool) < 0)
        return 1;
    char lockpath[PATH_MAX + 16];
    snprintf(lockpath, sizeof lockpath, "%s/pool.lock", pool->cfg.dir);
    snprintf(pool->sock, sizeof pool->sock, "%s/pool.sock", pool->cfg.dir);
    int detached = pool->cfg.foreground ? 0 : s_detach(pool);
    if (detached != 0)
        return detached > 0 ? 0 : 1;
    s_daemon_hygiene(); /* the options (LL_POOL_*) were read already */
    pool->lock_fd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (pool->lock_fd < 0 || flock(pool->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        ll_info("pool", "another pool already serves %s", pool->cfg.dir);
        return 0;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    pool->sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (s_write_build(pool) < 0)
        return 1;
    pool->listen_fd = s_listen(pool);
    if (pool->listen_fd < 0 || pool->sig_fd < 0)
        return 1;
    return s_start_serving(pool) < 0 ? 1 : -1;
}

/* ------------------------------------------------------------------ */
/* The loop                                                           */

enum { K_LISTEN, K_SIG, K_CLIENT, K_NODE, K_WORKER, K_PROBE, K_HOSTD };

#define S_MAX_POLL \
    (3 + LL_HOSTPOOL_MAX_CLIENTS + LL_ZTREE_MAX_NODES + LL_SCHED_MAX_JOBS + LL_ZTREE_MAX_PROBES)

/* What one turn of the loop polls: each descriptor with its kind and the
 * entry it belongs to. */
typedef struct {
    struct pollfd pfd[S_MAX_POLL];
    int kind[S_MAX_POLL]; /* K_* */
    int idx[S_MAX_POLL];  /* the client, node, job or probe entry */
    int n;                /* descriptors */
} s_pollset_t;

static void s_poll_add(s_pollset_t *ps, int fd, short events, int kind, int idx)
{
    ps->pfd[ps->n] = (struct pollfd){fd, events, 0};
    ps->kind[ps->n] = kind;
    ps->idx[ps->n++] = idx;
}

/* Every descriptor the pool waits on.  Returns whether a client is
 * connected. */
static bool s_pollset(ll_hostpool_t *pool, s_pollset_t *ps)
{
    ps->n = 0;
    s_poll_add(ps, pool->listen_fd, POLLIN, K_LISTEN, 0);
    s_poll_add(ps, pool->sig_fd, POLLIN, K_SIG, 0);
    if (ll_hostpool_hostd_fd(pool) >= 0)
        s_poll_add(ps, ll_hostpool_hostd_fd(pool), POLLIN, K_HOSTD, 0);
    bool clients = false;
    for (int c = 0; c < LL_HOSTPOOL_MAX_CLIENTS; c++)
        if (pool->clients[c].fd >= 0) {
            clients = true;
            s_poll_add(ps, pool->clients[c].fd,
                       (short) (POLLIN | (pool->clients[c].olen ? POLLOUT : 0)), K_CLIENT, c);
        }
    for (int n = 0; n < LL_ZTREE_MAX_NODES; n++)
        if (ll_ztree_node_fd(pool->tree, n) >= 0)
            s_poll_add(ps, ll_ztree_node_fd(pool->tree, n), POLLIN, K_NODE, n);
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        const ll_hostpool_run_t *run = &pool->runs[r];
        if (ll_sched_job(pool->sched, r)->state && run->worker.fd >= 0 && !run->worker.eof)
            s_poll_add(ps, run->worker.fd, POLLIN, K_WORKER, r);
    }
    for (int i = 0; i < LL_ZTREE_MAX_PROBES; i++)
        if (ll_ztree_probe_fd(pool->tree, i) >= 0)
            s_poll_add(ps, ll_ztree_probe_fd(pool->tree, i), POLLIN, K_PROBE, i);
    return clients;
}

/* The signalfd: SIGTERM/SIGINT stop the pool; SIGCHLD reaps probes and
 * orphaned workers (a node's exit is its socket closing). */
static void s_signals(ll_hostpool_t *pool)
{
    struct signalfd_siginfo si;
    while (read(pool->sig_fd, &si, sizeof si) == sizeof si)
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
            pool->stop = true;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        if (!ll_ztree_reaped(pool->tree, pid, status)) {
            ll_hostpool_worker_exited(pool, pid, status); /* orphaned worker, or a node (ignored) */
            pool->sweep = true; /* (a stray killed: its own orphans are ours now) */
        }
}

/* Node N's socket FD is readable: its frames, or its end. */
static void s_node_input(ll_hostpool_t *pool, int n, int fd)
{
    if (ll_ztree_node_fd(pool->tree, n) != fd)
        return;
    int fr = ll_zreader_fill(ll_ztree_node_reader(pool->tree, n));
    json_t *m;
    bool bad = false;
    while (ll_ztree_node_fd(pool->tree, n) == fd &&
           (m = ll_zreader_pop(ll_ztree_node_reader(pool->tree, n), &bad))) {
        ll_hostpool_node_frame(pool, n, m);
        json_decref(m);
    }
    if (ll_ztree_node_fd(pool->tree, n) == fd && (fr < 0 || bad) &&
        ll_ztree_node_gone(pool->tree, n, bad ? "malformed frame" : "its socket closed",
                           !pool->stop) < 0)
        ll_hostpool_fail_queued(pool);
}

/* Serve until stopped, or idle for --idle-exit seconds. */
static void s_loop(ll_hostpool_t *pool)
{
    s_pollset_t ps;
    while (!pool->stop) {
        bool clients = s_pollset(pool, &ps);
        double now = ll_clock_ms();
        if (clients || ll_hostpool_busy(pool))
            pool->idle_since = 0;
        else if (!pool->idle_since)
            pool->idle_since = now;
        int timeout = ll_ztree_timeout(pool->tree, now);
        timeout = ll_hostpool_worker_timers(pool, now, timeout);
        bool pass;
        timeout = ll_hostpool_hostd_timer(pool, now, timeout, &pass);
        if (pass)
            ll_hostpool_schedule(pool); /* the broker given up: our own slots */
        if (pool->idle_since) {
            double left = pool->idle_since + pool->cfg.idle_exit_s * 1000.0 - now;
            if (left <= 0) {
                ll_info("pool", "no client for %d s: exiting", pool->cfg.idle_exit_s);
                return;
            }
            timeout = timeout < 0 || (int) left + 1 < timeout ? (int) left + 1 : timeout;
        }
        int rc = poll(ps.pfd, (nfds_t) ps.n, timeout);
        if (rc < 0 && errno != EINTR)
            return;
        for (int i = 0; i < ps.n && rc > 0; i++) {
            if (!ps.pfd[i].revents)
                continue;
            int k = ps.idx[i], fd = ps.pfd[i].fd;
            switch (ps.kind[i]) {
            case K_LISTEN: s_accept(pool); break;
            case K_SIG: s_signals(pool); break;
            case K_CLIENT:
                if (pool->clients[k].fd == fd)
                    s_client_input(pool, k, ps.pfd[i].revents);
                break;
            case K_NODE: s_node_input(pool, k, fd); break;
            case K_WORKER: ll_hostpool_worker_input(pool, k, fd); break;
            case K_PROBE: ll_ztree_probe_input(pool->tree, k); break;
            case K_HOSTD:
                if (ll_hostpool_hostd_fd(pool) == fd && ll_hostpool_hostd_input(pool))
                    ll_hostpool_schedule(pool); /* what it lent or took back */
                break;
            }
        }
        ll_hostpool_schedule(pool);
        /* A worker went: what its cells started in sessions of their own
         * came to us (the zygote reaped the worker; its orphans are ours). */
        if (pool->sweep) {
            pool->sweep = false;
            ll_hostpool_kill_strays(pool, false);
        }
        for (int c = 0; c < LL_HOSTPOOL_MAX_CLIENTS; c++)
            if (pool->clients[c].fd >= 0 && pool->clients[c].dead)
                s_client_gone(pool, c);
    }
}

/* Free what the pool holds (its processes are the teardown's). */
static void s_destroy(ll_hostpool_t *pool)
{
    for (int c = 0; c < LL_HOSTPOOL_MAX_CLIENTS; c++) {
        ll_zreader_destroy(&pool->clients[c].rd);
        free(pool->clients[c].out);
    }
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        ll_zreader_destroy(&pool->runs[r].worker.rd);
        free(pool->runs[r].id);
        json_decref(pool->runs[r].req);
    }
    ll_hostpool_hostd_stop(pool);
    ll_sched_destroy(&pool->sched);
    ll_ztree_destroy(&pool->tree);
    free(pool);
}

int ll_hostpool_main(int argc, char **argv)
{
    ll_log_init('P');
    ll_hostpool_t *pool = calloc(1, sizeof *pool);
    if (!pool)
        return 1;
    pool->listen_fd = pool->sig_fd = pool->lock_fd = -1;
    for (int c = 0; c < LL_HOSTPOOL_MAX_CLIENTS; c++)
        pool->clients[c].fd = -1;
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++) {
        pool->runs[r].worker.fd = -1;
        pool->runs[r].worker.node = -1;
    }
    int rc = s_parse(pool, argc, argv);
    if (rc < 0)
        rc = s_setup(pool);
    if (rc < 0) {
        s_loop(pool);
        ll_info("pool", "stopping");
        ll_hostpool_runs_stop(pool);
        unlink(pool->sock);
        rc = 0;
    }
    s_destroy(pool);
    return rc;
}
