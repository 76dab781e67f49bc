/* ll_zclient: the kernel's side of the host pool (zygote/API.md,
 * zygote/ll_zclient.h).
 *
 * Runs in the kernel process, which has ZeroMQ threads and therefore never
 * forks: a missing pool is started with posix_spawn (exec), and the pool
 * detaches itself.  One thread uses a client at a time.  Requests go out as
 * frames (proto/ll_zframe.h) on a blocking write; events come in through a
 * reader fed from the non-blocking socket. */
#include "zygote/ll_zclient.h"
#include "proto/ll_zframe.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "kernel/ll_pyenv.h"
#include "base/ll_check.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

extern char **environ;

struct ll_zclient_t {
    int fd;           /* connection to the pool */
    ll_zreader_t *rd; /* frames from it */
    bool ok;          /* connection up */
};

/* "-<8 hex digits>" naming the Python environment of this process when it is
 * not the build's (kernel/ll_pyenv.h), else "": kernels of different
 * environments must not share a pool, whose zygotes import one
 * environment's packages. */
static void s_env_suffix(char *out, size_t outlen)
{
    const char *py = getenv("LOOSELEAF_PYTHON");
    out[0] = '\0';
    if (!py || !*py || strcmp(py, ll_pyenv_build_python()) == 0)
        return;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *) py; *p; p++)
        h = (h ^ *p) * 16777619u;
    snprintf(out, outlen, "-%08x", h);
}

/* XXH64 of the bytes of the file open at FD, as 16 hex digits into OUT. */
static int s_hash_fd(int fd, char *out, size_t outlen)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size <= 0)
        return -1;
    void *p = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return -1;
    unsigned long long h = (unsigned long long) XXH64(p, (size_t) st.st_size, 0);
    munmap(p, (size_t) st.st_size);
    snprintf(out, outlen, "%016llx", h);
    return 0;
}

int ll_zclient_build_id(const char *exe, char *out, size_t outlen)
{
    /* This process's own binary does not change under it (/proc/self/exe
     * is the inode that runs, even once a rebuild replaced the path): once. */
    static char self_id[24];
    if (!exe && self_id[0]) {
        snprintf(out, outlen, "%s", self_id);
        return 0;
    }
    int fd = open(exe ? exe : "/proc/self/exe", O_RDONLY | O_CLOEXEC);
    char id[24];
    int rc = fd >= 0 ? s_hash_fd(fd, id, sizeof id) : -1;
    if (fd >= 0)
        close(fd);
    if (rc < 0)
        return -1;
    if (!exe)
        snprintf(self_id, sizeof self_id, "%s", id);
    snprintf(out, outlen, "%s", id);
    return 0;
}

void ll_zclient_default_dir(const char *exe, char *out, size_t outlen)
{
    const char *env = getenv("LOOSELEAF_POOL_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    /* Kernels of two builds of LooseLeaf (two checkouts, an upgrade while a
     * pool runs) must not share a pool: its zygotes exec its binary and
     * import its checkout's Python packages, and both sides speak its
     * protocol.  So the default dir is per build as it is per environment. */
    char suffix[16], build[24] = "unknown";
    s_env_suffix(suffix, sizeof suffix);
    ll_zclient_build_id(exe, build, sizeof build);
    build[8] = '\0';
    if (env && *env)
        snprintf(out, outlen, "%s", env);
    else if (xdg && *xdg)
        snprintf(out, outlen, "%s/looseleaf-pool-%s%s", xdg, build, suffix);
    else
        snprintf(out, outlen, "/tmp/looseleaf-pool-%d-%s%s", (int) getuid(), build, suffix);
}

/* Whether the pool serving DIR runs the build EXE (NULL: ours) is: it
 * writes its build id to DIR/pool.build before it listens.  0, or -1 with
 * ERR saying which builds met (a dir named by LOOSELEAF_POOL_DIR is shared
 * by whoever names it). */
static int s_same_build(const char *dir, const char *exe, char *err, size_t errlen)
{
    char want[24], got[64] = "", path[PATH_MAX + 16];
    if (ll_zclient_build_id(exe, want, sizeof want) < 0)
        return 0; /* our own binary unreadable: nothing to compare */
    snprintf(path, sizeof path, "%s/pool.build", dir);
    FILE *f = fopen(path, "re");
    if (f) {
        if (!fgets(got, sizeof got, f))
            got[0] = '\0';
        fclose(f);
    }
    got[strcspn(got, "\n")] = '\0';
    if (strcmp(got, want) == 0)
        return 0;
    snprintf(err, errlen,
             "the pool at %s runs another build of LooseLeaf (%s; this kernel is build %s): stop "
             "that `looseleaf pool` (it holds %s/pool.lock) or give each build its own "
             "LOOSELEAF_POOL_DIR",
             dir, got[0] ? got : "one from before build ids", want, dir);
    return -1;
}

/* Whether environment entry E ("NAME=value") is one the pool keeps: what
 * configures LooseLeaf, Python, the CUDA stack and the numeric libraries
 * its zygotes import, and the user's own locations.  The rest belongs to
 * the kernel that happened to start the pool (JPY_*, PWD, whatever its
 * notebook server had): each session's own environment reaches its cells
 * anyway, restored in the worker with its process state
 * (store/py/looseleaf_store/procstate.py), and a zygote shared by every
 * kernel of the user must not import its packages in one kernel's. */
bool ll_zclient_env_kept(const char *e)
{
    static const char *const exact[] = {
        "PATH",       "HOME",        "USER",         "LOGNAME",    "SHELL",
        "LANG",       "LANGUAGE",    "TZ",           "TMPDIR",     "LD_LIBRARY_PATH",
        "LD_PRELOAD", "VIRTUAL_ENV", "CONDA_PREFIX", "IPYTHONDIR", "MPLCONFIGDIR"};
    static const char *const prefix[] = {
        "LL_",   "LOOSELEAF_", "PYTHON",   "LC_",     "XDG_", "CUDA_", "NVIDIA_",
        "NCCL_", "TORCH",      "PYTORCH_", "TRITON_", "OMP_", "MKL_",  "OPENBLAS_",
        "KMP_",  "JUPYTER_",   "ASAN_",    "UBSAN_",  "LSAN_"};
    const char *eq = strchr(e, '=');
    size_t n = eq ? (size_t) (eq - e) : strlen(e);
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strlen(exact[i]) == n && strncmp(e, exact[i], n) == 0)
            return true;
    for (size_t i = 0; i < sizeof prefix / sizeof prefix[0]; i++)
        if (strncmp(e, prefix[i], strlen(prefix[i])) == 0)
            return true;
    return false;
}

static int s_connect(const char *sock)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof sa.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* A client on connected socket FD (taken: closed on failure too), or NULL
 * with ERR set. */
static ll_zclient_t *s_client_new(int fd, char *err, size_t errlen)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    ll_zclient_t *self = calloc(1, sizeof *self);
    if (self)
        self->rd = ll_zreader_new(fd);
    if (!self || !self->rd) {
        free(self);
        close(fd);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->fd = fd;
    self->ok = true;
    return self;
}

/* Whether environment entry E goes to the cluster's pool (cluster mode,
 * below): what the host pool keeps, plus Ray's token and the cluster's
 * settings, which the placer (a Ray driver) needs. */
static bool s_env_kept_cluster(const char *e)
{
    return ll_zclient_env_kept(e) || strncmp(e, "RAY_", 4) == 0 ||
           strncmp(e, "PYTHONPATH=", 11) == 0;
}

/* Start the pool serving DIR: ARGV[0] run as EXE with the entries of our
 * environment KEEP accepts (plus EXTRA_ENV, may be NULL), waited for until
 * its launcher exits (it detaches itself).  0, or -1 with ERR set. */
static int s_spawn(const char *exe, const char *const *argv, bool (*keep)(const char *),
                   const char *extra_env, const char *dir, char *err, size_t errlen)
{
    /* The pool outlives this kernel and serves others: its own session
     * (a notebook interrupt signals the kernel's process group), no
     * signal blocked (the kernel's threads block some), and not the
     * kernel's stdout/stderr (they may be the capture pipes that feed the
     * notebook): the pool redirects them to its log as it detaches. */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (ll_log_fd() > 2) {
        posix_spawn_file_actions_adddup2(&fa, ll_log_fd(), 1);
        posix_spawn_file_actions_adddup2(&fa, ll_log_fd(), 2);
    }
    /* Only what the pool needs of this kernel's environment. */
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **envp = calloc(nenv + 2, sizeof *envp);
    if (!envp) {
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (keep(environ[i]) &&
            !(extra_env && strncmp(environ[i], extra_env, strcspn(extra_env, "=") + 1) == 0))
            envp[k++] = environ[i];
    if (extra_env)
        envp[k++] = (char *) extra_env;
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, &attr, (char *const *) argv, envp);
    free(envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the pool (%s): %s", exe, strerror(rc));
        return -1;
    }
    int status;
    waitpid(pid, &status, 0); /* the pool detached; this is its launcher */
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(err, errlen, "the pool failed to start (status %d); see %s/pool.log", status, dir);
        return -1;
    }
    return 0;
}

/* Cluster mode (README "Cluster mode"): LOOSELEAF_CLUSTER names the Ray
 * head (HOST:PORT) of a cluster of GPU hosts.  The kernel then talks to the
 * user's *cluster pool* instead of a host pool: `python -m
 * looseleaf_cluster.remote` (cluster/looseleaf_cluster/remote.py), which
 * speaks the pool's protocol on DIR/pool.sock, places each cell with
 * ll_place's rule and relays it to the user's host pool on the chosen GPU
 * host.  Its dir is the host pool's default dir with "-cluster" (the two
 * never share a socket).  The placer needs Ray, so it runs in the
 * environment's Python (LOOSELEAF_PYTHON, else the build's), with the
 * checkout's cluster/ on its path. */
static int s_spawn_cluster(const char *dir, const char *head, char *err, size_t errlen)
{
    ll_pyenv_t env;
    if (ll_pyenv_find(NULL, &env, err, errlen) < 0)
        return -1;
    char build[24] = "unknown", pypath[PATH_MAX + 64];
    ll_zclient_build_id(NULL, build, sizeof build);
    const char *old = getenv("PYTHONPATH");
    snprintf(pypath, sizeof pypath, "PYTHONPATH=%s/cluster%s%s", LL_SRCDIR, old && *old ? ":" : "",
             old && *old ? old : "");
    const char *argv[] = {env.python,
                          "-m",
                          "looseleaf_cluster.remote",
                          "--runtime-dir",
                          dir,
                          "--address",
                          head,
                          "--build",
                          build,
                          NULL};
    return s_spawn(env.python, argv, s_env_kept_cluster, pypath, dir, err, errlen);
}

ll_zclient_t *ll_zclient_connect(const char *runtime_dir, const char *exe,
                                 const char *const *extra_args, char *err, size_t errlen)
{
    char dir[PATH_MAX], sock[PATH_MAX + 16];
    const char *cluster = getenv("LOOSELEAF_CLUSTER");
    if (cluster && !*cluster)
        cluster = NULL;
    if (runtime_dir) {
        snprintf(dir, sizeof dir, "%s", runtime_dir);
        cluster = NULL; /* a named dir is a host pool (the tests' drivers) */
    } else {
        ll_zclient_default_dir(exe, dir, sizeof dir);
        if (cluster && strlen(dir) + 9 < sizeof dir)
            strcat(dir, "-cluster");
    }
    snprintf(sock, sizeof sock, "%s/pool.sock", dir);
    const char *build_exe = exe; /* (EXE becomes /proc/self/exe below) */
    int fd = s_connect(sock);
    if (fd < 0) {
        if (cluster) {
            if (s_spawn_cluster(dir, cluster, err, errlen) < 0)
                return NULL;
        } else {
            char self[PATH_MAX], name[PATH_MAX];
            const char *argv0 = exe;
            if (!exe) {
                /* Our own binary, even when a rebuild replaced it on disk. */
                if (ll_zframe_self_exe(self, sizeof self, name, sizeof name) < 0) {
                    snprintf(err, errlen, "cannot find the looseleaf binary: %s", strerror(errno));
                    return NULL;
                }
                exe = self;
                argv0 = name;
            }
            const char *argv[64] = {argv0, "pool", "--runtime-dir", dir};
            int na = 4;
            for (int i = 0; extra_args && extra_args[i] && na < 62; i++)
                argv[na++] = extra_args[i];
            argv[na] = NULL;
            if (s_spawn(exe, argv, ll_zclient_env_kept, NULL, dir, err, errlen) < 0)
                return NULL;
        }
        /* The detached pool binds its socket within milliseconds (the
         * cluster's within a second or two: Python); wait for it
         * (connecting is the condition, there is nothing else to watch). */
        for (int i = 0; i < 3000 && fd < 0; i++) {
            fd = s_connect(sock);
            if (fd < 0) {
                struct timespec ts = {0, 10 * 1000000};
                nanosleep(&ts, NULL);
            }
        }
        if (fd < 0) {
            snprintf(err, errlen, "the pool did not come up at %s: %s (see %s/pool.log)", sock,
                     strerror(errno), dir);
            return NULL;
        }
    }
    if (s_same_build(dir, build_exe, err, errlen) < 0) {
        close(fd);
        return NULL;
    }
    return s_client_new(fd, err, errlen);
}

void ll_zclient_destroy(ll_zclient_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_zclient_t *self = *self_p;
    close(self->fd);
    ll_zreader_destroy(&self->rd);
    free(self);
    *self_p = NULL;
}

int ll_zclient_fd(ll_zclient_t *self)
{
    return self->fd;
}

bool ll_zclient_ok(ll_zclient_t *self)
{
    return self->ok;
}

static int s_send(ll_zclient_t *self, json_t *msg)
{
    int rc = self->ok ? ll_zframe_send(self->fd, msg, -1) : -1;
    if (rc < 0)
        self->ok = false;
    json_decref(msg);
    return rc;
}

int ll_zclient_run(ll_zclient_t *self, const json_t *request, char *err, size_t errlen)
{
    if (!json_is_object(request) || !json_is_string(json_object_get(request, "id")) ||
        !json_is_string(json_object_get(request, "code")) ||
        !json_is_string(json_object_get(request, "session")) ||
        !json_is_string(json_object_get(request, "store_dir"))) {
        snprintf(err, errlen, "a run request needs string fields id, code, session and store_dir");
        return -1;
    }
    json_t *m = json_copy((json_t *) request);
    json_object_set_new(m, "type", json_string("run"));
    if (s_send(self, m) < 0) {
        snprintf(err, errlen, "the pool connection is gone: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int ll_zclient_prefetch(ll_zclient_t *self, const json_t *request, char *err, size_t errlen)
{
    if (!json_is_object(request) || !json_is_string(json_object_get(request, "id")) ||
        !json_is_string(json_object_get(request, "session")) ||
        !json_is_string(json_object_get(request, "store_dir"))) {
        snprintf(err, errlen, "a prefetch request needs string fields id, session and store_dir");
        return -1;
    }
    json_t *m = json_copy((json_t *) request);
    json_object_set_new(m, "type", json_string("prefetch"));
    if (s_send(self, m) < 0) {
        snprintf(err, errlen, "the pool connection is gone: %s", strerror(errno));
        return -1;
    }
    return 0;
}

json_t *ll_zclient_next(ll_zclient_t *self, int timeout_ms)
{
    bool bad = false;
    json_t *m = ll_zreader_pop(self->rd, &bad);
    if (m || bad || !self->ok)
        goto out;
    double t0 = ll_clock_ms();
    for (;;) {
        struct pollfd p = {self->fd, POLLIN, 0};
        int left = timeout_ms;
        if (timeout_ms > 0) {
            left = timeout_ms - (int) (ll_clock_ms() - t0);
            if (left < 0)
                left = 0;
        }
        int rc = poll(&p, 1, left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return NULL;
        int fr = ll_zreader_fill(self->rd);
        m = ll_zreader_pop(self->rd, &bad);
        if (m || bad)
            break;
        if (fr < 0) {
            self->ok = false;
            return json_pack("{s:s}", "type", "pool_gone");
        }
        if (timeout_ms == 0)
            return NULL;
    }
out:
    if (bad) {
        self->ok = false;
        return json_pack("{s:s}", "type", "pool_gone");
    }
    return m;
}

int ll_zclient_input_reply(ll_zclient_t *self, const char *id, const char *value)
{
    return s_send(self, json_pack("{s:s, s:s, s:s}", "type", "input_reply", "id", id, "value",
                                  value ? value : ""));
}

int ll_zclient_interrupt(ll_zclient_t *self, const char *id)
{
    return s_send(self, json_pack("{s:s, s:s}", "type", "interrupt", "id", id));
}

int ll_zclient_cancel(ll_zclient_t *self, const char *id)
{
    return s_send(self, json_pack("{s:s, s:s}", "type", "cancel", "id", id));
}

int ll_zclient_stats(ll_zclient_t *self)
{
    return s_send(self, json_pack("{s:s}", "type", "stats"));
}

/* ------------------------------------------------------------------ */
/* Self-test: a client on a socketpair whose other end plays the pool   */
/* (frames out, events in, the pool gone), and the default dir.        */

/* The next frame the client sent, as the pool reads it (caller owns it). */
static json_t *s_test_recv(int pool_fd)
{
    return ll_zframe_recv(pool_fd, NULL, true);
}

/* A frame's "type", and a string field. */
static bool s_test_is(const json_t *m, const char *type, const char *key, const char *value)
{
    const char *t = json_string_value(json_object_get(m, "type"));
    const char *v = key ? json_string_value(json_object_get(m, key)) : NULL;
    return t && strcmp(t, type) == 0 && (!key || (v && strcmp(v, value) == 0));
}

/* Set environment variable NAME to VALUE (NULL: unset). */
static void s_test_setenv(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* The default runtime dir: LOOSELEAF_POOL_DIR, else under XDG_RUNTIME_DIR,
 * else per uid in /tmp (empty values do not count), with a suffix for a
 * Python environment other than the build's.  Returns the failures. */
static int s_test_default_dir(void)
{
    int fails = 0;
    char *saved[3] = {getenv("LOOSELEAF_POOL_DIR"), getenv("XDG_RUNTIME_DIR"),
                      getenv("LOOSELEAF_PYTHON")};
    for (int i = 0; i < 3; i++)
        saved[i] = saved[i] ? strdup(saved[i]) : NULL;
    s_test_setenv("LOOSELEAF_PYTHON", NULL);
    char dir[PATH_MAX], want[96];
    s_test_setenv("LOOSELEAF_POOL_DIR", "/tmp/pd");
    s_test_setenv("XDG_RUNTIME_DIR", "/run/user/7");
    ll_zclient_default_dir(NULL, dir, sizeof dir);
    S_CHECK(strcmp(dir, "/tmp/pd") == 0);
    s_test_setenv("LOOSELEAF_POOL_DIR", "");
    char build[24];
    S_CHECK(ll_zclient_build_id(NULL, build, sizeof build) == 0 && strlen(build) == 16);
    build[8] = '\0';
    ll_zclient_default_dir(NULL, dir, sizeof dir);
    snprintf(want, sizeof want, "/run/user/7/looseleaf-pool-%s", build);
    S_CHECK(strcmp(dir, want) == 0);
    /* Another build (here: a file of other bytes) gets a pool of its own. */
    char other[] = "/tmp/ll-zclient-build-XXXXXX";
    int ofd = mkstemp(other);
    S_CHECK(ofd >= 0 && write(ofd, "not this build", 14) == 14);
    if (ofd >= 0)
        close(ofd);
    char odir[PATH_MAX];
    ll_zclient_default_dir(other, odir, sizeof odir);
    S_CHECK(strncmp(odir, "/run/user/7/looseleaf-pool-", 27) == 0 && strcmp(odir, dir) != 0);
    unlink(other);
    s_test_setenv("XDG_RUNTIME_DIR", NULL);
    ll_zclient_default_dir(NULL, dir, sizeof dir);
    snprintf(want, sizeof want, "/tmp/looseleaf-pool-%d-%s", (int) getuid(), build);
    S_CHECK(strcmp(dir, want) == 0);
    /* Another environment's kernels get a pool of their own; the build's
     * Python named explicitly is the default pool. */
    s_test_setenv("LOOSELEAF_PYTHON", "/home/u/venv/bin/python");
    ll_zclient_default_dir(NULL, dir, sizeof dir);
    S_CHECK(strncmp(dir, want, strlen(want)) == 0 && strlen(dir) == strlen(want) + 9 &&
            dir[strlen(want)] == '-');
    s_test_setenv("LOOSELEAF_PYTHON", ll_pyenv_build_python());
    ll_zclient_default_dir(NULL, dir, sizeof dir);
    S_CHECK(strcmp(dir, want) == 0);
    s_test_setenv("LOOSELEAF_POOL_DIR", saved[0]);
    s_test_setenv("XDG_RUNTIME_DIR", saved[1]);
    s_test_setenv("LOOSELEAF_PYTHON", saved[2]);
    for (int i = 0; i < 3; i++)
        free(saved[i]);
    return fails;
}

int ll_zclient_selftest(bool verbose)
{
    int fails = 0;
    char err[256];
    int sv[2];
    S_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    ll_zclient_t *c = s_client_new(sv[0], err, sizeof err);
    S_CHECK(c && ll_zclient_ok(c) && ll_zclient_fd(c) == sv[0]);
    S_CHECK(fcntl(sv[0], F_GETFL) & O_NONBLOCK);

    /* Requests are checked before they go: a run needs id, code, session
     * and store_dir; a prefetch no code.  The request is only borrowed. */
    json_t *req = json_pack("{s:s, s:s, s:s, s:[s]}", "id", "c1", "session", "s1", "store_dir",
                            "/tmp/st", "state_closure", "x");
    S_CHECK(ll_zclient_run(c, req, err, sizeof err) == -1 && strstr(err, "id, code, session"));
    S_CHECK(ll_zclient_run(c, NULL, err, sizeof err) == -1);
    S_CHECK(ll_zclient_prefetch(c, req, err, sizeof err) == 0);
    json_object_set_new(req, "code", json_string("x = 1"));
    S_CHECK(ll_zclient_run(c, req, err, sizeof err) == 0);
    S_CHECK(!json_object_get(req, "type") && json_object_size(req) == 5);
    json_t *nosession = json_pack("{s:s, s:s}", "id", "p", "store_dir", "/tmp/st");
    S_CHECK(ll_zclient_prefetch(c, nosession, err, sizeof err) == -1 && strstr(err, "session"));
    json_decref(nosession);
    S_CHECK(ll_zclient_input_reply(c, "c1", "yes") == 0 &&
            ll_zclient_input_reply(c, "c1", NULL) == 0);
    S_CHECK(ll_zclient_interrupt(c, "c1") == 0 && ll_zclient_cancel(c, "c1") == 0);
    S_CHECK(ll_zclient_stats(c) == 0);

    /* The pool reads them as frames, in order. */
    json_t *m = s_test_recv(sv[1]);
    S_CHECK(s_test_is(m, "prefetch", "id", "c1") && !json_object_get(m, "code"));
    S_CHECK(json_equal(json_object_get(m, "state_closure"), json_object_get(req, "state_closure")));
    json_decref(m);
    m = s_test_recv(sv[1]);
    S_CHECK(s_test_is(m, "run", "code", "x = 1") && s_test_is(m, "run", "session", "s1"));
    json_decref(m);
    m = s_test_recv(sv[1]);
    S_CHECK(s_test_is(m, "input_reply", "value", "yes") && s_test_is(m, "input_reply", "id", "c1"));
    json_decref(m);
    m = s_test_recv(sv[1]);
    S_CHECK(s_test_is(m, "input_reply", "value", "")); /* NULL: an empty line */
    json_decref(m);
    m = s_test_recv(sv[1]);
    S_CHECK(s_test_is(m, "interrupt", "id", "c1"));
    json_decref(m);
    m = s_test_recv(sv[1]);
    S_CHECK(s_test_is(m, "cancel", "id", "c1"));
    json_decref(m);
    m = s_test_recv(sv[1]);
    S_CHECK(s_test_is(m, "stats", NULL, NULL));
    json_decref(m);
    json_decref(req);

    /* Events: none yet (at once, and after a short wait); then what the
     * pool sends, in order, also when a frame arrives in pieces. */
    S_CHECK(ll_zclient_next(c, 0) == NULL);
    double t0 = ll_clock_ms();
    S_CHECK(ll_zclient_next(c, 30) == NULL && ll_clock_ms() - t0 >= 25);
    json_t *ev = json_pack("{s:s, s:s, s:s, s:s}", "type", "stream", "id", "c1", "name", "stdout",
                           "text", "hi\n");
    S_CHECK(ll_zframe_send(sv[1], ev, -1) == 0);
    json_decref(ev);
    ev = json_pack("{s:s, s:s, s:i}", "type", "wait", "id", "c2", "slots", 2);
    size_t len = 0;
    char *bytes = ll_zframe_encode(ev, &len);
    json_decref(ev);
    S_CHECK(bytes && write(sv[1], bytes, 3) == 3); /* a partial length */
    json_t *got = ll_zclient_next(c, 1000);
    S_CHECK(s_test_is(got, "stream", "text", "hi\n"));
    json_decref(got);
    S_CHECK(ll_zclient_next(c, 0) == NULL); /* half a frame is no event */
    S_CHECK(bytes && write(sv[1], bytes + 3, len - 3) == (ssize_t) (len - 3));
    free(bytes);
    got = ll_zclient_next(c, 1000);
    S_CHECK(s_test_is(got, "wait", "id", "c2") && ll_zclient_ok(c));
    json_decref(got);

    /* The pool goes: a last event still arrives, then pool_gone once; from
     * then on the client says so and sends nothing. */
    ev = json_pack("{s:s, s:s}", "type", "reply", "id", "c1");
    S_CHECK(ll_zframe_send(sv[1], ev, -1) == 0);
    json_decref(ev);
    close(sv[1]);
    got = ll_zclient_next(c, 1000);
    S_CHECK(s_test_is(got, "reply", "id", "c1"));
    json_decref(got);
    got = ll_zclient_next(c, 1000);
    S_CHECK(s_test_is(got, "pool_gone", NULL, NULL) && !ll_zclient_ok(c));
    json_decref(got);
    S_CHECK(ll_zclient_next(c, 0) == NULL && ll_zclient_next(c, 50) == NULL);
    req = json_pack("{s:s, s:s, s:s, s:s}", "id", "c3", "code", "1", "session", "s1", "store_dir",
                    "/tmp/st");
    S_CHECK(ll_zclient_run(c, req, err, sizeof err) == -1 && strstr(err, "connection is gone"));
    json_decref(req);
    S_CHECK(ll_zclient_interrupt(c, "c3") == -1 && ll_zclient_stats(c) == -1);
    ll_zclient_destroy(&c);
    S_CHECK(c == NULL);
    ll_zclient_destroy(&c); /* safe twice */

    /* A malformed frame from the pool is the pool gone too. */
    S_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    c = s_client_new(sv[0], err, sizeof err);
    static const char bad[] = {0, 0, 0, 3, 'a', 'b', 'c'};
    S_CHECK(write(sv[1], bad, sizeof bad) == (ssize_t) sizeof bad);
    got = ll_zclient_next(c, 1000);
    S_CHECK(s_test_is(got, "pool_gone", NULL, NULL) && !ll_zclient_ok(c));
    json_decref(got);
    ll_zclient_destroy(&c);
    close(sv[1]);

    fails += s_test_default_dir();
    if (verbose)
        fprintf(stderr, "ll_zclient: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
