/* ll_ztree: the host pool's zygote tree (see ll_ztree.h): spawning the base
 * node, growing child nodes, the CUDA-safety probes, evicting nodes.  Run
 * by the pool's one thread.
 *
 * The pool may have the CUDA runtime loaded (it counts devices), which can
 * start threads: between fork and exec a child here only calls
 * async-signal-safe functions, and whatever it needs (argv, the
 * environment) is built before the fork. */
#include "zygote/ll_ztree.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "kernel/ll_pyenv.h"
#include "base/ll_check.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_PROBE_MS 120000.0 /* a probe that hangs this long is killed (verdict: failed) */
/* A base zygote that cannot start is tried again after S_RETRY_FIRST_MS,
 * then twice as long after each failed try, at most S_RETRY_MAX_MS apart:
 * what broke it (a package being reinstalled, a full disk, memory) may
 * mend, and the pool must not stay broken until it exits. */
#define S_RETRY_FIRST_MS 2000.0
#define S_RETRY_MAX_MS   60000.0

typedef struct {
    bool used;        /* entry in use */
    int id;           /* node id (0 = base), unique for the pool's life */
    int parent;       /* index of the parent node, -1 for the base (-2: the base, respawning) */
    int fd;           /* control socket to the zygote */
    ll_zreader_t *rd; /* frames from the zygote */
    pid_t pid;        /* 0 until the zygote said ready (the base: its pid from the start) */
    bool ready;       /* imported its modules, accepts forks */
    json_t *modules;  /* array of top-level module names it imported (or will) */
    double last_used; /* ms, for LRU eviction */
    int forking;      /* forks sent and not yet answered */
} s_node_t;

typedef struct {
    pid_t pid;        /* 0: free */
    int fd;           /* read end of its stdout, -1 once closed */
    char module[128]; /* the package probed */
    int node;         /* id of the node to grow from when safe */
    char out[512];    /* its output */
    size_t outlen;    /* bytes of it */
    double started;   /* ms; a probe that hangs is killed after S_PROBE_MS */
} s_probe_t;

struct ll_ztree_t {
    char exe[PATH_MAX];      /* our binary, exec'd as `zygote` */
    char exe_name[PATH_MAX]; /* its name, for the zygotes' argv[0] */
    char head[1024];         /* comma list of the base node's modules */
    int max_nodes;           /* nodes at most */
    bool grow;               /* grow child nodes for tail packages */
    s_node_t nodes[LL_ZTREE_MAX_NODES];
    s_probe_t probes[LL_ZTREE_MAX_PROBES];
    json_t *safety;         /* {module: true (safe) | false} from probes */
    int next_node_id;       /* the id of the next node */
    int base_respawns;      /* bases started after the first */
    int base_failures;      /* base deaths in a row before it was ready */
    bool base_broken;       /* the base cannot start: retried after base_retry_at */
    double base_retry_at;   /* ms (ll_clock_ms) of the next try while broken, 0: none due */
    double base_backoff;    /* ms to wait after the next failed try */
    ll_ztree_gone_fn *gone; /* hears of every node that goes */
    void *gone_arg;         /* its argument */
};

static void s_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static bool s_has_module(const json_t *arr, const char *name)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
        if (json_is_string(v) && strcmp(json_string_value(v), name) == 0)
            return true;
    return false;
}

ll_ztree_t *ll_ztree_new(const char *exe, const char *exe_name, const char *head, int max_nodes,
                         bool grow, ll_ztree_gone_fn *gone, void *arg)
{
    ll_ztree_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->safety = json_object();
    if (!self->safety) {
        free(self);
        return NULL;
    }
    snprintf(self->exe, sizeof self->exe, "%s", exe);
    snprintf(self->exe_name, sizeof self->exe_name, "%s", exe_name);
    snprintf(self->head, sizeof self->head, "%s", head);
    self->max_nodes = max_nodes;
    self->grow = grow;
    self->gone = gone;
    self->gone_arg = arg;
    return self;
}

/* Close node N's socket and forget it. */
static void s_node_clear(s_node_t *nd)
{
    close(nd->fd);
    ll_zreader_destroy(&nd->rd);
    json_decref(nd->modules);
    memset(nd, 0, sizeof *nd);
}

void ll_ztree_destroy(ll_ztree_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_ztree_t *self = *self_p;
    for (int n = 0; n < LL_ZTREE_MAX_NODES; n++)
        if (self->nodes[n].used)
            s_node_clear(&self->nodes[n]);
    for (int i = 0; i < LL_ZTREE_MAX_PROBES; i++)
        if (self->probes[i].pid && self->probes[i].fd >= 0)
            close(self->probes[i].fd);
    json_decref(self->safety);
    free(self);
    *self_p = NULL;
}

static int s_free_node(const ll_ztree_t *self)
{
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        if (!self->nodes[i].used)
            return i;
    return -1;
}

/* A new node entry N for the zygote at the end of socket FD. */
static s_node_t *s_node_init(ll_ztree_t *self, int n, int id, int parent, int fd)
{
    s_node_t *nd = &self->nodes[n];
    memset(nd, 0, sizeof *nd);
    nd->used = true;
    nd->id = id;
    nd->parent = parent;
    nd->fd = fd;
    nd->rd = ll_zreader_new(fd);
    s_nonblock(fd);
    return nd;
}

int ll_ztree_spawn_base(ll_ztree_t *self)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -1;
    int n = s_free_node(self);
    if (n < 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    char fdarg[16], idarg[16];
    int id = self->next_node_id++;
    snprintf(idarg, sizeof idarg, "%d", id);
    int ctl = fcntl(sv[1], F_DUPFD, 3); /* a copy without CLOEXEC for the zygote */
    if (ctl < 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    snprintf(fdarg, sizeof fdarg, "%d", ctl);
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        close(ctl);
        return -1;
    }
    if (pid == 0) {
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        execl(self->exe, self->exe_name, "zygote", "--fd", fdarg, "--head", self->head, "--node",
              idarg, (char *) NULL);
        _exit(127);
    }
    close(sv[1]);
    close(ctl);
    s_node_t *nd = s_node_init(self, n, id, -1, sv[0]);
    nd->pid = pid;
    nd->modules = json_array();
    ll_info("pool", "base zygote node %d started (pid %d, head %s)", id, (int) pid, self->head);
    return n;
}

void ll_ztree_stop(ll_ztree_t *self)
{
    for (int n = 0; n < LL_ZTREE_MAX_NODES; n++)
        if (self->nodes[n].used && self->nodes[n].pid > 0)
            kill(self->nodes[n].pid, SIGTERM);
}

/* ------------------------------------------------------------------ */
/* Nodes                                                              */

static int s_node_count(const ll_ztree_t *self)
{
    int k = 0;
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        k += self->nodes[i].used;
    return k;
}

static bool s_is_leaf(const ll_ztree_t *self, int n)
{
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        if (self->nodes[i].used && self->nodes[i].parent == n)
            return false;
    return true;
}

static int s_node_by_id(const ll_ztree_t *self, int id)
{
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        if (self->nodes[i].used && self->nodes[i].id == id)
            return i;
    return -1;
}

/* The base cannot start now: GPU cells are answered at once (the kernels
 * run them themselves) until a try after back-off brings it up. */
static void s_base_broken(ll_ztree_t *self)
{
    if (!self->base_broken)
        self->base_backoff = S_RETRY_FIRST_MS;
    else
        self->base_backoff =
            self->base_backoff * 2 < S_RETRY_MAX_MS ? self->base_backoff * 2 : S_RETRY_MAX_MS;
    self->base_broken = true;
    self->base_retry_at = ll_clock_ms() + self->base_backoff;
    ll_error("pool",
             "the base zygote cannot be started (see the lines above): GPU cells run in their "
             "kernels; trying again in %.0f s",
             self->base_backoff / 1000.0);
}

int ll_ztree_node_gone(ll_ztree_t *self, int n, const char *why, bool respawn)
{
    s_node_t *nd = &self->nodes[n];
    ll_warn("pool", "zygote node %d (pid %d) gone: %s", nd->id, (int) nd->pid, why);
    if (self->gone)
        self->gone(self->gone_arg, n);
    bool base = nd->parent == -1, was_ready = nd->ready;
    /* Children of a dead node stay (they hold their own sockets) but hang
     * from the base now (-2: from the base about to be respawned). */
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        if (self->nodes[i].used && self->nodes[i].parent == n)
            self->nodes[i].parent = base ? -2 : nd->parent;
    s_node_clear(nd);
    if (!base || !respawn)
        return 0;
    /* A base that dies before it was ever ready (exec failed, the head
     * crashes the interpreter) is not respawned at once forever: after
     * three tries in a row it is tried again with back-off, and meanwhile
     * GPU cells are answered at once (their kernels run them themselves). */
    self->base_failures = was_ready ? 0 : self->base_failures + 1;
    int b = -1;
    if (self->base_failures < 3 && !self->base_broken) {
        self->base_respawns++;
        b = ll_ztree_spawn_base(self);
    }
    if (b < 0)
        s_base_broken(self);
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        if (self->nodes[i].used && self->nodes[i].parent == -2 && b >= 0)
            self->nodes[i].parent = b;
    return b < 0 ? -1 : 0;
}

/* The node to evict: the least recently used leaf that is ready and forks
 * nothing, never the base; -1 when none may go. */
static int s_evict_victim(const ll_ztree_t *self)
{
    int victim = -1;
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++) {
        const s_node_t *nd = &self->nodes[i];
        if (!nd->used || nd->parent == -1 || !nd->ready || nd->forking || !s_is_leaf(self, i))
            continue;
        if (victim < 0 || nd->last_used < self->nodes[victim].last_used)
            victim = i;
    }
    return victim;
}

/* Evict nodes while there are more than max_nodes. */
static void s_evict(ll_ztree_t *self)
{
    while (s_node_count(self) > self->max_nodes) {
        int victim = s_evict_victim(self);
        if (victim < 0)
            return;
        ll_info("pool", "evicting zygote node %d (least recently used leaf)",
                self->nodes[victim].id);
        json_t *m = json_pack("{s:s}", "type", "exit");
        ll_zframe_send(self->nodes[victim].fd, m, -1);
        json_decref(m);
        ll_ztree_node_gone(self, victim, "evicted", false); /* never the base */
    }
}

bool ll_ztree_any_ready(const ll_ztree_t *self)
{
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        if (self->nodes[i].used && self->nodes[i].ready)
            return true;
    return false;
}

int ll_ztree_best(const ll_ztree_t *self, const json_t *imports)
{
    int best = -1, best_score = -1;
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++) {
        const s_node_t *nd = &self->nodes[i];
        if (!nd->used || !nd->ready)
            continue;
        int score = 0;
        size_t k;
        json_t *v;
        json_array_foreach(imports, k, v)
            if (json_is_string(v) && s_has_module(nd->modules, json_string_value(v)))
                score++;
        if (score > best_score ||
            (score == best_score &&
             json_array_size(nd->modules) < json_array_size(self->nodes[best].modules))) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

int ll_ztree_fork(ll_ztree_t *self, int n, json_t *job, int passfd)
{
    s_node_t *nd = &self->nodes[n];
    json_object_set_new(job, "node", json_integer(nd->id));
    json_object_set_new(job, "node_modules", json_copy(nd->modules));
    json_t *m = json_pack("{s:s, s:O}", "type", "fork", "job", job);
    int rc = ll_zframe_send(nd->fd, m, passfd);
    json_decref(m);
    if (rc < 0)
        return -1;
    nd->last_used = ll_clock_ms();
    nd->forking++;
    return 0;
}

void ll_ztree_node_ready(ll_ztree_t *self, int n, const json_t *m)
{
    s_node_t *nd = &self->nodes[n];
    nd->ready = true;
    nd->pid = (pid_t) json_integer_value(json_object_get(m, "pid"));
    json_t *mods = json_object_get(m, "modules");
    if (json_is_array(mods)) {
        json_decref(nd->modules);
        nd->modules = json_copy(mods);
    }
    nd->last_used = ll_clock_ms();
    if (nd->parent == -1 && self->base_broken) {
        ll_warn("pool", "the base zygote is back: GPU cells run on workers again");
        self->base_broken = false;
        self->base_failures = 0;
        self->base_retry_at = 0;
    }
    ll_info("pool", "zygote node %d ready (pid %d, %zu modules, %.0f ms)", nd->id, (int) nd->pid,
            json_array_size(nd->modules), json_number_value(json_object_get(m, "load_ms")));
}

void ll_ztree_fork_answered(ll_ztree_t *self, int n)
{
    if (self->nodes[n].forking > 0)
        self->nodes[n].forking--;
}

/* ------------------------------------------------------------------ */
/* Growth and the CUDA-safety probes                                  */

/* Ask node N's zygote to fork a child node that also imports MODULES. */
static void s_grow(ll_ztree_t *self, int n, json_t *modules)
{
    if (!self->grow || n < 0 || !self->nodes[n].ready)
        return;
    int c = s_free_node(self);
    if (c < 0)
        return;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return;
    int id = self->next_node_id++;
    json_t *m = json_pack("{s:s, s:i, s:O}", "type", "grow", "node", id, "modules", modules);
    int rc = ll_zframe_send(self->nodes[n].fd, m, sv[1]);
    json_decref(m);
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        return;
    }
    s_node_t *nd = s_node_init(self, c, id, n, sv[0]);
    /* What it will hold, until it says what it does hold: a cell arriving
     * meanwhile must not grow the same node again (it is not ready, so no
     * cell forks from it yet). */
    nd->modules = json_copy(self->nodes[n].modules);
    json_array_extend(nd->modules, modules);
    nd->last_used = ll_clock_ms();
    ll_info("pool", "growing node %d from node %d", id, self->nodes[n].id);
    s_evict(self);
}

/* Grow node N towards MODULE (one package). */
static void s_grow_one(ll_ztree_t *self, int n, const char *module)
{
    json_t *mods = json_pack("[s]", module);
    s_grow(self, n, mods);
    json_decref(mods);
}

static bool s_probing(const ll_ztree_t *self, const char *module)
{
    for (int i = 0; i < LL_ZTREE_MAX_PROBES; i++)
        if (self->probes[i].pid && strcmp(self->probes[i].module, module) == 0)
            return true;
    return false;
}

/* Start a probe of MODULE for node N: `python -m looseleaf_zygote.probe
 * MODULE` with zygote/py first on PYTHONPATH (built before the fork), in
 * the session's environment: its own Python (kernel/ll_pyenv.h), whose
 * packages are the ones a zygote would import. */
static void s_start_probe(ll_ztree_t *self, const char *module, int n)
{
    int slot = -1;
    for (int i = 0; i < LL_ZTREE_MAX_PROBES && slot < 0; i++)
        if (!self->probes[i].pid)
            slot = i;
    if (slot < 0 || strlen(module) >= sizeof self->probes[0].module)
        return;
    char err[512];
    ll_pyenv_t pyenv;
    if (ll_pyenv_find(NULL, &pyenv, err, sizeof err) < 0) {
        ll_warn("ztree", "cannot probe %s: %s", module, err);
        return;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return;
    extern char **environ;
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **envp = calloc(nenv + 2, sizeof *envp);
    const char *pp = getenv("PYTHONPATH");
    char path[3 * PATH_MAX];
    snprintf(path, sizeof path, "PYTHONPATH=%s/zygote/py%s%s", LL_SRCDIR, pp && *pp ? ":" : "",
             pp ? pp : "");
    if (!envp) {
        close(pfd[0]);
        close(pfd[1]);
        return;
    }
    size_t k = 0;
    envp[k++] = path;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "PYTHONPATH=", 11) != 0)
            envp[k++] = environ[i];
    envp[k] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        free(envp);
        close(pfd[0]);
        close(pfd[1]);
        return;
    }
    if (pid == 0) {
        dup2(pfd[1], 1);
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        /* argv[0] is the interpreter's absolute path: CPython derives
         * sys.executable, hence its prefix and site-packages, from argv[0],
         * and a bare "python3" is looked up on PATH, which may name another
         * Python than the environment's (the probe would then judge the
         * package in the wrong environment). */
        execle(pyenv.python, pyenv.python, "-m", "looseleaf_zygote.probe", module, (char *) NULL,
               envp);
        _exit(127);
    }
    free(envp);
    close(pfd[1]);
    s_nonblock(pfd[0]);
    s_probe_t *pr = &self->probes[slot];
    memset(pr, 0, sizeof *pr);
    pr->pid = pid;
    pr->fd = pfd[0];
    pr->node = self->nodes[n].id;
    snprintf(pr->module, sizeof pr->module, "%s", module);
    pr->started = ll_clock_ms();
    ll_info("pool", "probing whether importing %s touches CUDA (pid %d)", module, (int) pid);
}

/* What node N should do about MODULE, a package a cell forked from it
 * imports. */
typedef enum {
    S_GROWTH_NONE,  /* N has it, it is unsafe (imported after the fork), or a child of N has it */
    S_GROWTH_GROW,  /* known safe: grow a child of N that imports it */
    S_GROWTH_PROBE, /* not known: probe it (unless a probe of it runs) */
} s_growth_t;

static s_growth_t s_growth(const ll_ztree_t *self, int n, const char *m)
{
    if (!m || !*m || s_has_module(self->nodes[n].modules, m))
        return S_GROWTH_NONE;
    json_t *known = json_object_get(self->safety, m);
    if (json_is_false(known))
        return S_GROWTH_NONE; /* touches CUDA or fails: imported after the fork */
    if (!json_is_true(known))
        return S_GROWTH_PROBE;
    /* Safe but missing here: a child of N may have it already. */
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++)
        if (self->nodes[i].used && self->nodes[i].parent == n &&
            s_has_module(self->nodes[i].modules, m))
            return S_GROWTH_NONE;
    return S_GROWTH_GROW;
}

void ll_ztree_consider_growth(ll_ztree_t *self, int n, const json_t *imports)
{
    if (!self->grow)
        return;
    size_t k;
    json_t *v;
    json_array_foreach(imports, k, v) {
        const char *m = json_string_value(v);
        s_growth_t g = s_growth(self, n, m);
        if (g == S_GROWTH_GROW)
            s_grow_one(self, n, m);
        else if (g == S_GROWTH_PROBE && !s_probing(self, m))
            s_start_probe(self, m, n);
    }
}

void ll_ztree_probe_input(ll_ztree_t *self, int i)
{
    s_probe_t *pr = &self->probes[i];
    ssize_t r = read(pr->fd, pr->out + pr->outlen, sizeof pr->out - 1 - pr->outlen);
    if (r > 0)
        pr->outlen += (size_t) r;
    else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(pr->fd); /* its exit (SIGCHLD) finishes the probe */
        pr->fd = -1;
    }
}

/* Probe I ended with STATUS: its verdict, and a child node when safe. */
static void s_probe_done(ll_ztree_t *self, int i, int status)
{
    s_probe_t *pr = &self->probes[i];
    /* Drain what is left of its output. */
    for (; pr->fd >= 0;) {
        ssize_t r = read(pr->fd, pr->out + pr->outlen, sizeof pr->out - 1 - pr->outlen);
        if (r <= 0)
            break;
        pr->outlen += (size_t) r;
    }
    pr->out[pr->outlen] = '\0';
    if (pr->fd >= 0)
        close(pr->fd);
    json_error_t jerr;
    json_t *res = json_loads(pr->out, 0, &jerr);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && res &&
              json_is_true(json_object_get(res, "imported"));
    bool safe = ok && json_is_true(json_object_get(res, "safe"));
    json_object_set_new(self->safety, pr->module, json_boolean(safe));
    const char *why = res ? json_string_value(json_object_get(res, "why")) : NULL;
    ll_info("pool", "probe of %s: %s%s%s", pr->module,
            safe ? "CUDA-safe"
            : ok ? "touches CUDA"
                 : "import failed",
            why ? ": " : "", why ? why : "");
    if (safe) {
        int n = s_node_by_id(self, pr->node);
        if (n >= 0)
            s_grow_one(self, n, pr->module);
    }
    json_decref(res);
    memset(pr, 0, sizeof *pr);
}

bool ll_ztree_reaped(ll_ztree_t *self, pid_t pid, int status)
{
    bool known = false;
    for (int j = 0; j < LL_ZTREE_MAX_PROBES; j++)
        if (self->probes[j].pid == pid) {
            s_probe_done(self, j, status);
            known = true;
        }
    return known;
}

int ll_ztree_timeout(ll_ztree_t *self, double now)
{
    int timeout = -1;
    if (self->base_broken && self->base_retry_at > 0) {
        if (now >= self->base_retry_at) {
            self->base_retry_at = 0;
            self->base_respawns++;
            ll_warn("pool", "trying the base zygote again");
            if (ll_ztree_spawn_base(self) < 0)
                s_base_broken(self);
            else
                timeout = 0; /* its socket joins the next poll */
        }
        if (self->base_retry_at > 0) {
            int left = (int) (self->base_retry_at - now) + 1;
            timeout = timeout < 0 || left < timeout ? left : timeout;
        }
    }
    for (int j = 0; j < LL_ZTREE_MAX_PROBES; j++)
        if (self->probes[j].pid) {
            if (now - self->probes[j].started > S_PROBE_MS) {
                ll_warn("pool", "probe of %s hangs: killed (the package stays out of zygotes)",
                        self->probes[j].module);
                kill(self->probes[j].pid, SIGKILL); /* reaped through SIGCHLD: verdict "failed" */
                self->probes[j].started = now;
            }
            timeout = 1000;
        }
    return timeout;
}

/* ------------------------------------------------------------------ */
/* Reading                                                            */

int ll_ztree_node_fd(const ll_ztree_t *self, int n)
{
    return self->nodes[n].used ? self->nodes[n].fd : -1;
}

ll_zreader_t *ll_ztree_node_reader(const ll_ztree_t *self, int n)
{
    return self->nodes[n].rd;
}

int ll_ztree_node_id(const ll_ztree_t *self, int n)
{
    return self->nodes[n].id;
}

int ll_ztree_probe_fd(const ll_ztree_t *self, int i)
{
    return self->probes[i].pid ? self->probes[i].fd : -1;
}

json_t *ll_ztree_nodes_json(const ll_ztree_t *self)
{
    json_t *nodes = json_array();
    for (int i = 0; i < LL_ZTREE_MAX_NODES; i++) {
        const s_node_t *nd = &self->nodes[i];
        if (nd->used)
            json_array_append_new(
                nodes, json_pack("{s:i, s:i, s:i, s:b, s:O, s:f}", "id", nd->id, "parent",
                                 nd->parent >= 0 ? self->nodes[nd->parent].id : nd->parent, "pid",
                                 (int) nd->pid, "ready", nd->ready, "modules", nd->modules,
                                 "last_used", nd->last_used));
    }
    return nodes;
}

const json_t *ll_ztree_safety(const ll_ztree_t *self)
{
    return self->safety;
}

int ll_ztree_base_respawns(const ll_ztree_t *self)
{
    return self->base_respawns;
}

bool ll_ztree_broken(const ll_ztree_t *self)
{
    return self->base_broken;
}

/* ------------------------------------------------------------------ */
/* Self-test: the tree's choices on a scripted table of nodes (no       */
/* process is started; the nodes' sockets are -1).                     */

static int s_test_gone[4], s_test_ngone;

static void s_test_on_gone(void *arg, int n)
{
    (void) arg;
    if (s_test_ngone < 4)
        s_test_gone[s_test_ngone++] = n;
}

/* Node entry N: id N, PARENT, READY, MODULES (a JSON array text). */
static void s_test_node(ll_ztree_t *t, int n, int parent, bool ready, const char *modules,
                        double last_used)
{
    s_node_t *nd = &t->nodes[n];
    memset(nd, 0, sizeof *nd);
    nd->used = true;
    nd->id = n;
    nd->parent = parent;
    nd->fd = -1;
    nd->ready = ready;
    nd->modules = json_loads(modules, 0, NULL);
    nd->last_used = last_used;
}

int ll_ztree_selftest(bool verbose)
{
    int fails = 0;
    ll_ztree_t *t =
        ll_ztree_new("/nonexistent", "looseleaf", "numpy", 3, true, s_test_on_gone, NULL);
    S_CHECK(t && !ll_ztree_any_ready(t));
    json_t *torch = json_pack("[s]", "torch"), *numpy = json_pack("[s]", "numpy");
    json_t *pandas = json_pack("[s]", "pandas"), *none = json_array();
    S_CHECK(ll_ztree_best(t, torch) == -1 && ll_ztree_node_fd(t, 0) == -1);

    /* The base and two children; child 2 is not ready yet. */
    s_test_node(t, 0, -1, true, "[\"numpy\", \"IPython\"]", 10);
    s_test_node(t, 1, 0, true, "[\"numpy\", \"IPython\", \"torch\"]", 20);
    s_test_node(t, 2, 0, false, "[\"numpy\", \"IPython\", \"pandas\"]", 5);
    S_CHECK(ll_ztree_any_ready(t));
    /* The node covering most of the closure; ties to the fewest modules; a
     * node not ready never. */
    S_CHECK(ll_ztree_best(t, torch) == 1);
    S_CHECK(ll_ztree_best(t, numpy) == 0 && ll_ztree_best(t, none) == 0);
    S_CHECK(ll_ztree_best(t, pandas) == 0);

    /* Growth: unknown packages are probed, known safe ones grown (unless a
     * child has them), unsafe ones and those the node has left alone. */
    S_CHECK(s_growth(t, 0, "scipy") == S_GROWTH_PROBE);
    json_object_set_new(t->safety, "scipy", json_true());
    json_object_set_new(t->safety, "torch", json_true());
    json_object_set_new(t->safety, "cupy", json_false());
    S_CHECK(s_growth(t, 0, "scipy") == S_GROWTH_GROW);
    S_CHECK(s_growth(t, 0, "torch") == S_GROWTH_NONE); /* child 1 has it */
    S_CHECK(s_growth(t, 1, "scipy") == S_GROWTH_GROW);
    S_CHECK(s_growth(t, 0, "cupy") == S_GROWTH_NONE && s_growth(t, 0, "numpy") == S_GROWTH_NONE);
    S_CHECK(s_growth(t, 0, "") == S_GROWTH_NONE && s_growth(t, 0, NULL) == S_GROWTH_NONE);

    /* Eviction: the least recently used ready leaf that forks nothing,
     * never the base. */
    S_CHECK(s_evict_victim(t) == 1); /* 2 is not ready */
    t->nodes[1].forking = 1;
    S_CHECK(s_evict_victim(t) == -1);
    t->nodes[1].forking = 0;
    s_test_node(t, 3, 1, true, "[\"numpy\", \"IPython\", \"torch\", \"scipy\"]", 30);
    S_CHECK(s_evict_victim(t) == 3); /* 1 is no leaf now */
    t->nodes[2].ready = true;
    S_CHECK(s_evict_victim(t) == 2); /* used least recently */

    /* A node that goes is reported, its children hang from its parent; the
     * base's children wait for the next base (-2) when it is not respawned.
     * (Quietly: the pool logs each node that goes.) */
    int level = ll_log_level;
    ll_log_level = LL_LOG_ERROR;
    S_CHECK(ll_ztree_node_gone(t, 1, "test", true) == 0);
    S_CHECK(s_test_ngone == 1 && s_test_gone[0] == 1 && !t->nodes[1].used);
    S_CHECK(t->nodes[3].parent == 0);
    S_CHECK(ll_ztree_node_gone(t, 0, "test", false) == 0 && s_test_gone[1] == 0);
    S_CHECK(t->nodes[2].parent == -2 && t->nodes[3].parent == -2 && !ll_ztree_broken(t));
    ll_log_level = level;
    json_t *nodes = ll_ztree_nodes_json(t);
    S_CHECK(json_array_size(nodes) == 2);
    json_decref(nodes);

    json_decref(torch);
    json_decref(numpy);
    json_decref(pandas);
    json_decref(none);
    ll_ztree_destroy(&t);
    S_CHECK(t == NULL);
    ll_ztree_destroy(&t); /* safe twice */
    if (verbose)
        fprintf(stderr, "ll_ztree: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
