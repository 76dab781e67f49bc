/* ll_zygote: a zygote node (`looseleaf zygote`) and the workers it forks.
 *
 * A zygote is started by exec from the pool (the base node) or forked from a
 * parent zygote (a child node that imports more).  It embeds the interpreter
 * (kernel/ll_interp.h) without hooks, imports its modules, then waits on its
 * control socket for requests from the pool.  It stays single-threaded: one
 * blocking loop over the control socket and a signalfd for SIGCHLD.
 *
 * Before every fork it checks (s_prefork_check) that it is single-threaded,
 * that the CUDA driver was never initialised here (no cuInit, no /dev/nvidia*
 * descriptor or mapping) and that it holds only descriptors it knows, and it
 * freezes the garbage collector (a child's GC would otherwise touch every
 * page: MEASURED.md).  A failed check refuses the fork and says why; it never
 * forks a zygote in a state a child cannot survive.  The driver library
 * merely being mapped is no reason: a CUDA build of torch maps it at import
 * (cuBLASLt and cuSPARSELt dlopen libcuda.so.1 when they load) without
 * calling it, and a child can initialise the driver it inherited mapped.
 *
 * A worker is the child of a fork, the leader of a process group of its own
 * (the pool kills the group with it): it drops the zygote's descriptors, takes
 * the worker socket passed by the pool, logs as role W, installs its hooks
 * (stream/display/input go to the pool as frames), and runs
 * looseleaf_zygote.worker: prepare (CUDA device, imports, restore), the cell
 * through the kernel's own execute_request, finish (save).  Only then does it
 * send the reply, so the pool can free the slot (or keep the worker warm)
 * after the save committed.  A warm worker then waits for its session's next
 * job (a cell or a prefetch) and prepares again (only what moved).
 * Errors after the fork end the child (_exit), never return into the loop. */
#include "zygote/ll_zygote.h"
#include "proto/ll_zframe.h"
#include "base/ll_fdcap.h"
#include "kernel/ll_interp.h"
#include "base/ll_b64.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "base/ll_stream.h"
#include "store/ll_store.h"
#include "base/ll_check.h"

#include <Python.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

static int s_ctl = -1;   /* control socket to the pool */
static int s_sigfd = -1; /* SIGCHLD of workers and child nodes */
static int s_node_id;    /* this node's id */

/* ------------------------------------------------------------------ */
/* Python calls (module looseleaf_zygote.zyg): JSON text in and out.  */

/* Call looseleaf_zygote.zyg.FN(ARG_JSON) -> malloc'd JSON text, or NULL with
 * the Python error in ERR. */
static char *s_py_call(const char *fn, const char *arg_json, char *err, size_t errlen)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    char *out = NULL;
    PyObject *mod = PyImport_ImportModule("looseleaf_zygote.zyg");
    PyObject *f = mod ? PyObject_GetAttrString(mod, fn) : NULL;
    PyObject *res = f ? PyObject_CallFunction(f, "s", arg_json ? arg_json : "null") : NULL;
    if (res && PyUnicode_Check(res)) {
        const char *u = PyUnicode_AsUTF8(res);
        out = u ? strdup(u) : NULL;
    }
    if (!out) {
        PyObject *type, *val, *tb;
        PyErr_Fetch(&type, &val, &tb);
        PyObject *s = val ? PyObject_Str(val) : NULL;
        snprintf(err, errlen, "%s: %s", fn,
                 s && PyUnicode_AsUTF8(s) ? PyUnicode_AsUTF8(s) : "no result");
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(val);
        Py_XDECREF(tb);
        PyErr_Clear();
    }
    Py_XDECREF(res);
    Py_XDECREF(f);
    Py_XDECREF(mod);
    PyGILState_Release(gil);
    return out;
}

/* ------------------------------------------------------------------ */
/* Pre-fork checks                                                    */

static int s_count_tasks(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Whether a line of /proc/self/maps maps an NVIDIA device (the driver maps
 * /dev/nvidia* once it is initialised: its control and UVM regions). */
static bool s_maps_nvidia_dev(const char *line)
{
    return strstr(line, " /dev/nvidia") != NULL;
}

/* The path of the CUDA driver mapped in a line of /proc/self/maps into
 * PATH, or false. */
static bool s_maps_driver(const char *line, char *path, size_t pathlen)
{
    const char *p = strchr(line, '/');
    const char *base = p ? strrchr(p, '/') : NULL;
    if (!base || strncmp(base, "/libcuda.so", 11) != 0)
        return false;
    snprintf(path, pathlen, "%.*s", (int) strcspn(p, "\n"), p);
    return true;
}

/* The driver's own answer on whether it was initialised in this process,
 * asked of an already mapped libcuda (H: dlopen with RTLD_NOLOAD, so
 * nothing is loaded that was not).  cuDeviceGetCount returns
 * CUDA_ERROR_NOT_INITIALIZED (3) until cuInit was called, and does nothing
 * else: the one question that does not initialise what it asks about.
 * True with the reason in WHY when cuInit was called (successfully or not:
 * a failed cuInit is remembered by the driver too). */
static bool s_driver_initialised(void *h, char *why, size_t whylen)
{
    int (*count)(int *) = (int (*)(int *)) dlsym(h, "cuDeviceGetCount");
    if (!count)
        return false;
    int n = 0, rc = count(&n);
    if (rc == 3)
        return false;
    snprintf(why, whylen,
             "the zygote initialised the CUDA driver (cuDeviceGetCount answers CUresult %d, not "
             "CUDA_ERROR_NOT_INITIALIZED): a CUDA context does not survive fork",
             rc);
    return true;
}

/* What an inherited descriptor pointing at TARGET (its /proc/self/fd link)
 * means for a fork. */
typedef enum {
    S_FD_OK,      /* harmless: a regular file (modules' data, IPython's history), /dev/null,
                     /dev/urandom, /dev/random */
    S_FD_CUDA,    /* /dev/nvidia*: CUDA was touched */
    S_FD_FOREIGN, /* a socket, pipe, other device or anything unknown: not ours to share */
} s_fd_verdict_t;

static s_fd_verdict_t s_fd_verdict(const char *target)
{
    if (strncmp(target, "/dev/nvidia", 11) == 0)
        return S_FD_CUDA;
    bool harmless = strcmp(target, "/dev/null") == 0 || strcmp(target, "/dev/urandom") == 0 ||
                    strcmp(target, "/dev/random") == 0;
    if (!harmless && (target[0] != '/' || strncmp(target, "/dev/", 5) == 0))
        return S_FD_FOREIGN;
    return S_FD_OK;
}

/* 0 if this process may fork a child now; else -1 with the reason in WHY.
 * ALLOW is an extra descriptor (the one being passed on), or -1. */
static int s_prefork_check(int allow, char *why, size_t whylen)
{
    int tasks = s_count_tasks();
    if (tasks != 1) {
        snprintf(why, whylen,
                 "the zygote is not single-threaded (%d threads): a forked child could hang",
                 tasks);
        return -1;
    }
    /* The driver, if it is mapped at all (by its soname, else by the path a
     * library loaded it from): initialised or not. */
    char driver[PATH_MAX] = "";
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps) {
        char line[PATH_MAX + 128];
        while (fgets(line, sizeof line, maps)) {
            if (s_maps_nvidia_dev(line)) {
                fclose(maps);
                snprintf(why, whylen,
                         "the zygote maps an NVIDIA device (%.200s): CUDA was initialised here",
                         strchr(line, '/'));
                why[strcspn(why, "\n")] = '\0';
                return -1;
            }
            if (!driver[0])
                s_maps_driver(line, driver, sizeof driver);
        }
        fclose(maps);
    }
    if (driver[0]) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            h = dlopen(driver, RTLD_LAZY | RTLD_NOLOAD);
        bool init = h && s_driver_initialised(h, why, whylen);
        if (h)
            dlclose(h);
        if (init)
            return -1;
    }
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        snprintf(why, whylen, "cannot list /proc/self/fd: %s", strerror(errno));
        return -1;
    }
    int dfd = dirfd(d), rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        int fd = atoi(e->d_name);
        if (fd == dfd || fd <= 2 || fd == s_ctl || fd == s_sigfd || fd == allow ||
            fd == ll_log_fd())
            continue;
        char path[64], target[PATH_MAX];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        s_fd_verdict_t v = s_fd_verdict(target);
        if (v == S_FD_CUDA) {
            snprintf(why, whylen, "the zygote holds %.200s (fd %d): CUDA was touched", target, fd);
            rc = -1;
            break;
        }
        /* Regular files (modules' data files, IPython's history database)
         * are inherited harmlessly; sockets, pipes and devices are not ours
         * to share with every worker. */
        if (v == S_FD_FOREIGN) {
            snprintf(why, whylen, "the zygote holds an unexpected descriptor %d (%.200s)", fd,
                     target);
            rc = -1;
            break;
        }
    }
    closedir(d);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Worker: hooks that turn output into frames to the pool             */

static int s_wfd = -1; /* worker socket */

/* Stream text is coalesced exactly as in the kernel (base/ll_stream.h: the
 * same UTF-8 handling, a character never split across frames), with a
 * shorter interval, since the kernel coalesces again.  Its send lock orders
 * every frame the worker sends: a frame leaves after the text written before
 * it. */
#define S_FLUSH_MS    20
#define S_FLUSH_BYTES (64u << 10)

static ll_stream_t *s_wstream;

/* ll_stream's emit: one stream frame (send lock held). */
static void s_w_emit(void *ctx, const char *name, const char *text, size_t len)
{
    json_t *m = json_pack("{s:s, s:s, s:o}", "type", "stream", "name", name, "text",
                          json_stringn(text, len));
    ll_zframe_send(s_wfd, m, -1);
    json_decref(m);
}

static void s_send_frame(void *msg)
{
    ll_zframe_send(s_wfd, msg, -1);
}

/* Send MSG (stolen) after the stream text written before it. */
static void s_wsend(json_t *msg)
{
    if (s_wstream)
        ll_stream_flush_then(s_wstream, s_send_frame, msg);
    else
        s_send_frame(msg);
    json_decref(msg);
}

static void s_w_stream(void *ctx, const char *name, const char *data, size_t len)
{
    ll_stream_write(s_wstream, name, data, len);
}

/* The cell's own flush(): a character the fd capture cut waits for the
 * drain after the cell (ll_stream_flush_whole). */
static void s_w_flush(void *ctx)
{
    ll_stream_flush_whole(s_wstream);
}

static void s_w_publish(void *ctx, const char *msg_type, const char *content_json,
                        const char *metadata_json, const void *const *bufs, const size_t *buflens,
                        size_t nbufs)
{
    json_error_t jerr;
    json_t *content = json_loads(content_json ? content_json : "{}", 0, &jerr);
    json_t *md = metadata_json ? json_loads(metadata_json, 0, &jerr) : NULL;
    if (!content)
        return;
    json_t *m = json_pack("{s:s, s:s, s:o, s:o}", "type", "iopub", "msg_type", msg_type, "content",
                          content, "metadata", md ? md : json_object());
    if (nbufs) {
        json_t *arr = json_array();
        for (size_t i = 0; i < nbufs; i++) {
            char *text = ll_b64_encode(bufs[i], buflens[i]);
            json_array_append_new(arr, text ? json_string(text) : json_null());
            free(text);
        }
        json_object_set_new(m, "buffers", arr);
    }
    s_wsend(m);
}

static char *s_w_input(void *ctx, const char *prompt, bool password, int *err)
{
    s_wsend(json_pack("{s:s, s:s, s:b}", "type", "input_request", "prompt", prompt ? prompt : "",
                      "password", password));
    for (;;) {
        json_t *m = ll_zframe_recv(s_wfd, NULL, false);
        if (!m) {
            *err = errno == EINTR ? 1 : 2;
            return NULL;
        }
        const char *type = json_string_value(json_object_get(m, "type"));
        if (type && strcmp(type, "input_reply") == 0) {
            const char *v = json_string_value(json_object_get(m, "value"));
            char *line = strdup(v ? v : "");
            json_decref(m);
            return line;
        }
        json_decref(m);
    }
}

static int s_intpipe[2] = {-1, -1}; /* SIGINT that came while no cell code ran */

/* An interrupt while the cell's code runs raises KeyboardInterrupt there;
 * one that comes earlier (during restore, or before the kernel marked the
 * cell busy) is left in a pipe that the worker's run_cell wrapper checks
 * first (looseleaf_zygote.zyg), so no interrupt is lost between the two. */
static void s_w_sigint(int sig)
{
    (void) sig;
    int saved = errno;
    if (ll_interp_busy())
        ll_interp_interrupt();
    else if (s_intpipe[1] >= 0 && write(s_intpipe[1], "i", 1) < 0) {
        /* full pipe: an interrupt is pending already */
    }
    errno = saved;
}

/* A worker whose pool is gone has nobody to report to, and no slot to keep
 * count of: it ends (without this it would run on as an orphan).  The pool
 * closes a worker's socket only after its reply, or by dying. */
static void *s_watchdog(void *arg)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    struct pollfd p = {s_wfd, POLLRDHUP, 0};
    while (poll(&p, 1, -1) < 0 && errno == EINTR)
        ;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR))
        _exit(75);
    return arg;
}

static void s_merge_looseleaf(json_t *md, const char *report_json)
{
    json_error_t jerr;
    json_t *rep = report_json ? json_loads(report_json, 0, &jerr) : NULL;
    json_t *ll = json_object_get(md, "looseleaf");
    if (!ll) {
        ll = json_object();
        json_object_set_new(md, "looseleaf", ll);
    }
    if (json_is_object(rep))
        json_object_update(ll, rep);
    json_decref(rep);
}

/* Whether the worker may stay warm after a cell whose save report is FIN
 * (NULL: the save did not run), when the pool keeps warm workers
 * (KEEP_WARM): only when its namespace is exactly what the store committed
 * (a failed commit or a variable that could not be saved leaves values the
 * store does not have; the caller checks that the preparation did not
 * fail).  A worker that is the session's home (FIN's "home", zyg.py) stays
 * whatever the pool's setting and also when its commit failed: it holds
 * values no store can hold, or that the store could not take, which would
 * go with it.  None stays once its CUDA context broke (FIN's
 * "device_broken": a sticky error fails every later cell here, home or
 * not), so the session's next cell gets a fresh worker. */
static bool s_can_stay(const char *fin, bool keep_warm)
{
    json_error_t jerr;
    json_t *f = fin ? json_loads(fin, 0, &jerr) : NULL;
    bool home = json_object_size(json_object_get(f, "home")) > 0;
    bool ok = json_is_object(f) && !json_object_get(f, "device_broken") &&
              (home || (keep_warm && !json_object_get(f, "save_error") &&
                        !json_object_get(f, "save_failed")));
    const char *broken = json_string_value(json_object_get(f, "device_broken"));
    if (broken)
        ll_warn("worker", "CUDA context broken after the cell (%s): leaving", broken);
    json_decref(f);
    return ok;
}

/* worker_prepare (CUDA, imports, restore) for JOB, shared by a cell and a
 * prefetch: *JOB_JSON_P gets the job as the Python side saw it (the caller
 * frees it); returns the answer (malloc'd) or NULL with ERR set. */
static char *s_prepare(json_t *job, double fork_ms, bool warm, char **job_json_p, char *err,
                       size_t errlen)
{
    json_object_set_new(job, "fork_ms", json_real(fork_ms));
    json_object_set_new(job, "warm", json_boolean(warm));
    *job_json_p = json_dumps(job, JSON_COMPACT);
    return s_py_call("worker_prepare", *job_json_p, err, errlen);
}

/* One cell on this worker (forked for it, or warm): prepare, run, save,
 * reply.  FORK_MS is 0 on a warm worker.  PREFETCHED: a prefetch prepared
 * this worker since its last cell.  Returns whether the worker may stay warm
 * (the pool asked for it and the namespace is the store's). */
static bool s_worker_cell(json_t *job, double fork_ms, bool warm, bool prefetched, ll_fdcap_t *cap)
{
    char *job_json;
    char err[1024];
    char *prep = s_prepare(job, fork_ms, warm, &job_json, err, sizeof err);
    json_error_t jerr;
    json_t *prep_j = prep ? json_loads(prep, 0, &jerr) : NULL;
    const char *fatal = prep_j ? json_string_value(json_object_get(prep_j, "fatal")) : err;
    char *reply = NULL, *md_text = NULL;
    double t_exec0 = ll_clock_ms(), t_exec1 = t_exec0;
    if (fatal) {
        /* The cell cannot run here (store unreachable, closure not
         * restorable, an interrupt ended the restore): an error reply named
         * as the preparation says (StoreUnavailable, KeyboardInterrupt),
         * nothing saved. */
        ll_error("worker", "cannot prepare the cell: %s", fatal);
        const char *ename =
            prep_j ? json_string_value(json_object_get(prep_j, "fatal_ename")) : NULL;
        json_t *c = json_pack("{s:s, s:s, s:s, s:[s], s:O, s:{}, s:[]}", "status", "error", "ename",
                              ename ? ename : "WorkerPrepareError", "evalue", fatal, "traceback",
                              fatal, "execution_count",
                              json_object_get(job, "execution_count")
                                  ? json_object_get(job, "execution_count")
                                  : json_null(),
                              "user_expressions", "payload");
        reply = json_dumps(c, JSON_COMPACT);
        json_decref(c);
    } else {
        json_t *sh = json_object_get(job, "store_history");
        json_t *content = json_pack(
            "{s:O, s:b, s:b, s:b, s:O}", "code", json_object_get(job, "code"), "silent", 0,
            "store_history", json_is_boolean(sh) ? json_is_true(sh) : 1, "allow_stdin",
            json_is_true(json_object_get(job, "allow_stdin")), "user_expressions",
            json_object_get(job, "user_expressions") ? json_object_get(job, "user_expressions")
                                                     : json_object());
        char *content_text = json_dumps(content, JSON_COMPACT);
        json_t *parent = json_object_get(job, "parent");
        char *parent_text =
            json_dumps(json_is_object(parent) ? parent : json_object(), JSON_COMPACT);
        t_exec0 = ll_clock_ms();
        reply = ll_interp_handle("execute_request", content_text, parent_text, &md_text);
        t_exec1 = ll_clock_ms();
        if (cap) {
            fflush(NULL);
            ll_fdcap_sync(cap);
        }
        free(content_text);
        free(parent_text);
        json_decref(content);
    }
    /* The pool shows the worker as saving (never evictable, as while it runs). */
    if (!fatal)
        s_wsend(json_pack("{s:s}", "type", "saving"));
    char *fin = fatal ? NULL : s_py_call("worker_finish", job_json, err, sizeof err);
    if (cap) {
        fflush(NULL);
        ll_fdcap_sync(cap);
    }
    bool stay = !fatal && s_can_stay(fin, json_is_true(json_object_get(job, "keep_warm")));
    json_t *reply_j = reply ? json_loads(reply, 0, &jerr) : NULL;
    json_t *md = md_text ? json_loads(md_text, 0, &jerr) : NULL;
    if (!json_is_object(md)) {
        json_decref(md);
        md = json_object();
    }
    s_merge_looseleaf(md, prep);
    s_merge_looseleaf(md, fin);
    json_t *ll = json_object_get(md, "looseleaf");
    json_object_set_new(ll, "route", json_string("gpu"));
    json_object_set_new(ll, "worker_pid", json_integer(getpid()));
    json_object_set_new(ll, "zygote_node", json_integer(s_node_id));
    json_object_set_new(ll, "fork_ms", json_real(fork_ms));
    json_object_set_new(ll, "exec_ms", json_real(t_exec1 - t_exec0));
    json_object_set_new(ll, "warm_hit", json_boolean(warm));
    json_object_set_new(ll, "prepared_by_prefetch", json_boolean(prefetched));
    json_object_set_new(ll, "stays_warm", json_boolean(stay));
    if (!fatal && !fin)
        json_object_set_new(ll, "save_error", json_string(err));
    s_wsend(json_pack("{s:s, s:o, s:o}", "type", "reply", "content",
                      reply_j ? reply_j : json_object(), "metadata", md));
    free(prep);
    free(fin);
    free(reply);
    free(md_text);
    free(job_json);
    json_decref(prep_j);
    return stay;
}

/* A prefetch on this worker: the preparation of a cell without the cell
 * (CUDA, imports, restore of the closure), reported as "prepared".  Returns
 * whether the worker may stay (a failed preparation leaves it unusable). */
static bool s_worker_prefetch(json_t *job, double fork_ms, bool warm)
{
    char *job_json;
    char err[1024];
    char *prep = s_prepare(job, fork_ms, warm, &job_json, err, sizeof err);
    json_error_t jerr;
    json_t *rep = prep ? json_loads(prep, 0, &jerr) : NULL;
    if (!json_is_object(rep)) {
        json_decref(rep);
        rep = json_pack("{s:s}", "fatal", err);
    }
    /* cuda_refork: a staged worker whose imports initialised CUDA with no
     * device visible (zyg.py): it cannot use a slot, so it goes. */
    const char *refork = json_string_value(json_object_get(rep, "cuda_refork"));
    bool ok = !json_object_get(rep, "fatal") && !refork;
    if (refork)
        ll_warn("worker", "staged worker leaves: %s", refork);
    json_object_set_new(rep, "worker_pid", json_integer(getpid()));
    json_object_set_new(rep, "zygote_node", json_integer(s_node_id));
    json_object_set_new(rep, "fork_ms", json_real(fork_ms));
    json_object_set_new(rep, "stays_warm", json_boolean(ok));
    s_wsend(json_pack("{s:s, s:o}", "type", "prepared", "report", rep));
    free(prep);
    free(job_json);
    return ok;
}

/* Leave: close the store (its leases), then exit without interpreter
 * teardown (the pages are the zygote's, copy-on-write). */
static void s_worker_leave(int status)
{
    char err[256];
    free(s_py_call("worker_exit", "null", err, sizeof err));
    fflush(NULL);
    _exit(status);
}

/* The child after fork: never returns.  It serves jobs until the pool lets
 * it go: the first one (a cell, or a prefetch) came with the fork; after it
 * the worker stays warm, holding its slot and namespace, and waits on its
 * socket for the next job of its session ("run" / "prefetch") or "exit".
 * The pool closing the socket ends it too (the watchdog). */
static void s_worker_main(int wfd, json_t *job, double t_before_fork)
{
    double t_child = ll_clock_ms();
    ll_log_init('W');
    close(s_ctl);
    close(s_sigfd);
    signal(SIGCHLD, SIG_DFL);
    s_wfd = wfd;
    ll_interp_hooks_t hooks = {NULL, s_w_stream, s_w_flush, s_w_publish, s_w_input, NULL, NULL};
    if (ll_interp_set_hooks(&hooks) < 0)
        _exit(70);
    if (!(s_wstream = ll_stream_new(s_w_emit, NULL, S_FLUSH_MS, S_FLUSH_BYTES)))
        _exit(72);
    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, s_watchdog, NULL) != 0)
        _exit(72);
    pthread_detach(watchdog);
    /* What C code and subprocesses write to fds 1/2 is cell output too (as in
     * the kernel, base/ll_fdcap.h); the log keeps the original stderr. */
    static const int cap_fds[2] = {1, 2};
    static const char *const cap_names[2] = {"stdout", "stderr"};
    char cap_err[256];
    ll_fdcap_t *cap =
        ll_fdcap_new(cap_fds, cap_names, 2, s_w_stream, NULL, cap_err, sizeof cap_err);
    if (cap)
        ll_log_set_fd(ll_fdcap_original(cap, 1));
    else
        ll_warn("worker", "fd output of this cell is not captured: %s", cap_err);
    if (pipe2(s_intpipe, O_CLOEXEC | O_NONBLOCK) < 0)
        _exit(71);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_w_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    /* SIGINT was blocked across the fork (s_fork_request): one sent as soon
     * as the pool learnt our pid is delivered now, to the handler above. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    double fork_ms = t_child - t_before_fork;
    bool warm = false, prefetched = false;
    for (;;) {
        bool prefetch = json_is_true(json_object_get(job, "prefetch"));
        json_object_set_new(job, "int_fd", json_integer(s_intpipe[0]));
        s_wsend(json_pack("{s:s, s:i, s:f, s:b}", "type", "ready", "pid", (int) getpid(), "fork_ms",
                          fork_ms, "warm", warm));
        bool stay = prefetch ? s_worker_prefetch(job, fork_ms, warm)
                             : s_worker_cell(job, fork_ms, warm, prefetched, cap);
        prefetched = prefetch; /* a cell consumes what a prefetch prepared */
        json_decref(job);
        job = NULL;
        if (!stay)
            s_worker_leave(0);
        /* Warm: wait for the next job of the session. */
        while (!job) {
            json_t *m = ll_zframe_recv(s_wfd, NULL, true);
            if (!m)
                s_worker_leave(0); /* the pool closed the socket */
            const char *type = json_string_value(json_object_get(m, "type"));
            if (type && (strcmp(type, "run") == 0 || strcmp(type, "prefetch") == 0) &&
                json_is_object(json_object_get(m, "job"))) {
                job = json_incref(json_object_get(m, "job"));
                json_object_set_new(job, "prefetch", json_boolean(type[0] == 'p'));
            } else if (type && strcmp(type, "exit") == 0) {
                json_decref(m);
                s_worker_leave(0);
            }
            json_decref(m);
        }
        /* An interrupt that reached us after the last cell (the pool sends
         * none to an idle worker; one for the last cell may arrive late) must
         * not interrupt the next: drop it before saying ready, after which
         * the pool forwards the new cell's interrupts. */
        char junk[64];
        while (read(s_intpipe[0], junk, sizeof junk) > 0)
            ;
        warm = true;
        fork_ms = 0;
    }
}

/* ------------------------------------------------------------------ */
/* The zygote loop                                                    */

static int s_announce(double t0, const char *loaded)
{
    json_error_t jerr;
    json_t *l = loaded ? json_loads(loaded, 0, &jerr) : NULL;
    json_t *m =
        json_pack("{s:s, s:i, s:i, s:O, s:O, s:f}", "type", "ready", "pid", (int) getpid(), "node",
                  s_node_id, "modules", l ? json_object_get(l, "modules") : json_array(), "failed",
                  l ? json_object_get(l, "failed") : json_object(), "load_ms", ll_clock_ms() - t0);
    int rc = ll_zframe_send(s_ctl, m, -1);
    json_decref(m);
    json_decref(l);
    return rc;
}

static void s_reap(void)
{
    struct signalfd_siginfo si;
    while (read(s_sigfd, &si, sizeof si) == sizeof si)
        ;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        json_t *m =
            json_pack("{s:s, s:i, s:i}", "type", "exited", "pid", (int) pid, "status", status);
        ll_zframe_send(s_ctl, m, -1);
        json_decref(m);
    }
}

/* Fork for request M (a worker, or a child node when GROW).  Returns in the
 * zygote (parent) and in a child node; a worker never returns. */
static void s_fork_request(json_t *m, int passfd, bool grow)
{
    json_t *job = json_object_get(m, "job");
    char why[512];
    if (s_prefork_check(passfd, why, sizeof why) < 0) {
        ll_error("zygote", "refusing to fork: %s", why);
        json_t *r = json_pack("{s:s, s:O, s:O, s:s}", "type", "refused", "run",
                              job ? json_object_get(job, "id") : json_null(), "client",
                              job && json_object_get(job, "client") ? json_object_get(job, "client")
                                                                    : json_integer(-1),
                              "why", why);
        ll_zframe_send(s_ctl, r, -1);
        json_decref(r);
        close(passfd);
        return;
    }
    char err[512];
    char *ok = s_py_call("prefork", "null", err, sizeof err);
    free(ok);
    double t0 = ll_clock_ms();
    /* Block SIGINT until the worker has its own handler: the pool may
     * interrupt the worker the moment it hears of its pid. */
    sigset_t intmask, oldmask;
    sigemptyset(&intmask);
    sigaddset(&intmask, SIGINT);
    sigprocmask(SIG_BLOCK, &intmask, &oldmask);
    int pid = ll_interp_fork();
    if (pid != 0)
        sigprocmask(SIG_SETMASK, &oldmask, NULL);
    if (pid < 0) {
        json_t *r = json_pack("{s:s, s:O, s:O, s:s}", "type", "refused", "run",
                              job ? json_object_get(job, "id") : json_null(), "client",
                              job && json_object_get(job, "client") ? json_object_get(job, "client")
                                                                    : json_integer(-1),
                              "why", strerror(errno));
        ll_zframe_send(s_ctl, r, -1);
        json_decref(r);
        close(passfd);
        return;
    }
    if (pid == 0) {
        if (!grow) {
            /* A worker leads its own process group, which the pool kills
             * whole: children of its cells (DataLoader workers) hold the
             * device too.  Both sides set it, so it holds before the pool
             * can learn the pid. */
            setpgid(0, 0);
            /* And it adopts what its cells start and orphan (a double
             * fork, `setsid -f`): a process in a session of its own is out
             * of the group, but stays under the worker, where the pool
             * finds it once the worker is gone (ll_hostpool_kill_strays).
             * Such an orphan that exits before the worker stays a zombie
             * until then. */
            prctl(PR_SET_CHILD_SUBREAPER, 1);
            s_worker_main(passfd, json_incref(job), t0);
        }
        /* A child node: the passed socket is its control socket now. */
        sigprocmask(SIG_SETMASK, &oldmask, NULL);
        close(s_ctl);
        s_ctl = passfd;
        s_node_id = (int) json_integer_value(json_object_get(m, "node"));
        ll_log_init('Z');
        char *mods = json_dumps(json_object_get(m, "modules"), JSON_COMPACT);
        char *loaded = s_py_call("grow", mods, err, sizeof err);
        free(mods);
        if (!loaded)
            ll_error("zygote", "child node %d: %s", s_node_id, err);
        s_announce(t0, loaded);
        free(loaded);
        return;
    }
    close(passfd);
    if (!grow) {
        setpgid(pid, pid);
        json_t *r = json_pack(
            "{s:s, s:O, s:O, s:i}", "type", "forked", "run", json_object_get(job, "id"), "client",
            json_object_get(job, "client") ? json_object_get(job, "client") : json_integer(-1),
            "pid", pid);
        ll_zframe_send(s_ctl, r, -1);
        json_decref(r);
    }
}

/* The head HEAD ("numpy,torch,...") as a JSON array text (malloc'd). */
static char *s_head_json(const char *head)
{
    json_t *hl = json_array();
    char *dup = strdup(head);
    for (char *tok = dup ? strtok(dup, ",") : NULL; tok; tok = strtok(NULL, ","))
        if (*tok)
            json_array_append_new(hl, json_string(tok));
    free(dup);
    char *hj = json_dumps(hl, JSON_COMPACT);
    json_decref(hl);
    return hj;
}

/* Libraries that start worker threads when imported: numpy 2.x wheels
 * bundle an OpenBLAS that does, so would BLIS.  A zygote must stay
 * single-threaded (it forks workers), so they start with one thread here;
 * a worker gives the session its own settings back after the fork (its
 * environment comes with the session's process state, and
 * looseleaf_zygote.zyg sets the libraries' thread counts from it). */
static void s_single_threaded_libraries(void)
{
    /* (Not OMP_NUM_THREADS nor MKL_NUM_THREADS: torch takes its default
     * intra-op thread count from them, and starts no thread at import.) */
    static const char *const vars[] = {"OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        setenv(vars[i], "1", 1);
}

int ll_zygote_main(int argc, char **argv)
{
    ll_log_init('Z');
    const char *head = "numpy,torch,IPython,looseleaf_kernel,looseleaf_store";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--fd") == 0 && i + 1 < argc)
            s_ctl = atoi(argv[++i]);
        else if (strcmp(argv[i], "--head") == 0 && i + 1 < argc)
            head = argv[++i];
        else if (strcmp(argv[i], "--node") == 0 && i + 1 < argc)
            s_node_id = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: looseleaf zygote --fd N [--head MOD,...] [--node ID]  (started "
                            "by the pool)\n");
            return 2;
        }
    }
    if (s_ctl < 3) {
        fprintf(stderr, "looseleaf zygote: --fd names the control socket from the pool\n");
        return 2;
    }
    double t0 = ll_clock_ms();
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    s_sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    s_single_threaded_libraries();
    ll_interp_add_builtin("_llstore", ll_store_pyinit);
    ll_interp_hooks_t none = {0};
    char err[1024];
    if (ll_interp_init(argv[0], &none, err, sizeof err) < 0) {
        ll_error("zygote", "interpreter: %s", err);
        return 1;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    /* (Run in __main__, the workers' user namespace: bind nothing there.) */
    int prc = PyRun_SimpleString("import sys as _ll_sys\n_ll_sys.path.insert(1, "
                                 "'" LL_SRCDIR "/zygote/py')\ndel _ll_sys\n");
    PyGILState_Release(gil);
    char *hj = s_head_json(head);
    char *loaded = prc == 0 ? s_py_call("load_head", hj, err, sizeof err) : NULL;
    free(hj);
    if (!loaded) {
        ll_error("zygote", "cannot load the head: %s", err);
        return 1;
    }
    s_announce(t0, loaded);
    free(loaded);

    for (;;) {
        struct pollfd p[2] = {{s_ctl, POLLIN, 0}, {s_sigfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            s_reap();
        if (!p[0].revents)
            continue;
        int passfd = -1;
        json_t *m = ll_zframe_recv(s_ctl, &passfd, true);
        if (!m) {
            if (errno == 0)
                ll_info("zygote", "pool closed the control socket: exiting");
            else
                ll_error("zygote", "control socket: %s", strerror(errno));
            break;
        }
        const char *type = json_string_value(json_object_get(m, "type"));
        if (type && strcmp(type, "fork") == 0 && passfd >= 0)
            s_fork_request(m, passfd, false);
        else if (type && strcmp(type, "grow") == 0 && passfd >= 0)
            s_fork_request(m, passfd, true);
        else if (type && strcmp(type, "exit") == 0) {
            json_decref(m);
            break;
        } else {
            ll_warn("zygote", "unexpected request %s", type ? type : "(no type)");
            if (passfd >= 0)
                close(passfd);
        }
        json_decref(m);
    }
    /* Exit without finalizing: workers we forked live on (reparented). */
    _exit(0);
}

/* ------------------------------------------------------------------ */
/* Self-test: the pure pieces (what a pre-fork check makes of what it   */
/* reads, the head, the reports), without forking or Python.           */

int ll_zygote_selftest(bool verbose)
{
    int fails = 0;
    /* /proc/self/maps: a mapped NVIDIA device refuses a fork (the driver was
     * initialised); the driver's or NVIDIA's libraries mapped do not (a CUDA
     * build of torch maps libcuda at import without initialising it): the
     * driver, once found, is asked (s_driver_initialised). */
    S_CHECK(s_maps_nvidia_dev("7f00-7f01 rw-s 00000000 00:05 9 /dev/nvidiactl"));
    S_CHECK(s_maps_nvidia_dev("7f00-7f01 rw-s 00000000 00:05 9 /dev/nvidia0\n"));
    S_CHECK(s_maps_nvidia_dev("7f00-7f01 rw-s 00000000 00:05 9 /dev/nvidia-uvm"));
    S_CHECK(!s_maps_nvidia_dev("7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/libcuda.so.1"));
    S_CHECK(!s_maps_nvidia_dev("7f00-7f01 r--p 00000000 08:01 43 /usr/lib/libnvidia-ml.so.535"));
    char drv[PATH_MAX];
    S_CHECK(
        s_maps_driver("7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libcuda.so.1\n",
                      drv, sizeof drv) &&
        strcmp(drv, "/usr/lib/x86_64-linux-gnu/libcuda.so.1") == 0);
    S_CHECK(s_maps_driver("7f00-7f01 r--p 00000000 08:01 42 /opt/t/libcuda.so.580.65.06", drv,
                          sizeof drv) &&
            strcmp(drv, "/opt/t/libcuda.so.580.65.06") == 0);
    S_CHECK(!s_maps_driver("7f00-7f01 r-xp 00000000 08:01 45 /usr/lib/libcudart.so.13", drv,
                           sizeof drv));
    S_CHECK(!s_maps_driver("7f00-7f01 r-xp 00000000 08:01 45 /v/libcuda.so.1/libc.so.6", drv,
                           sizeof drv));
    S_CHECK(!s_maps_driver("7f00-7f01 rw-p 00000000 00:00 0 [heap]", drv, sizeof drv));
    /* Inherited descriptors: regular files and the harmless devices pass. */
    S_CHECK(s_fd_verdict("/dev/nvidia0") == S_FD_CUDA &&
            s_fd_verdict("/dev/nvidiactl") == S_FD_CUDA);
    S_CHECK(s_fd_verdict("/dev/nvidia-uvm") == S_FD_CUDA);
    S_CHECK(s_fd_verdict("/dev/null") == S_FD_OK && s_fd_verdict("/dev/urandom") == S_FD_OK);
    S_CHECK(s_fd_verdict("/dev/random") == S_FD_OK);
    S_CHECK(s_fd_verdict("/home/u/.ipython/profile_default/history.sqlite") == S_FD_OK);
    S_CHECK(s_fd_verdict("socket:[123]") == S_FD_FOREIGN &&
            s_fd_verdict("pipe:[7]") == S_FD_FOREIGN);
    S_CHECK(s_fd_verdict("anon_inode:[eventfd]") == S_FD_FOREIGN);
    S_CHECK(s_fd_verdict("/dev/pts/0") == S_FD_FOREIGN &&
            s_fd_verdict("/dev/shm/x") == S_FD_FOREIGN);
    S_CHECK(s_fd_verdict("") == S_FD_FOREIGN); /* readlink failed */
    /* The head: a comma list, empty items skipped. */
    char *hj = s_head_json("numpy,,torch,");
    S_CHECK(hj && strcmp(hj, "[\"numpy\",\"torch\"]") == 0);
    free(hj);
    hj = s_head_json("");
    S_CHECK(hj && strcmp(hj, "[]") == 0);
    free(hj);
    /* A worker stays warm only when its save committed everything ... */
    S_CHECK(s_can_stay("{}", true) && s_can_stay("{\"saved\": [\"x\"]}", true));
    S_CHECK(!s_can_stay(NULL, true) && !s_can_stay("not json", true) && !s_can_stay("[]", true));
    S_CHECK(!s_can_stay("{\"save_error\": \"redis down\"}", true));
    S_CHECK(!s_can_stay("{\"save_failed\": {\"f\": \"cannot pickle\"}}", true));
    S_CHECK(!s_can_stay("{}", false) && !s_can_stay("{\"home\": {}}", false));
    /* ... but the home of values no store holds stays, warm workers or not. */
    const char *home =
        "{\"home\": {\"it\": {\"pid\": 7, \"kind\": \"held\"}}, \"save_failed\": {}}";
    S_CHECK(s_can_stay(home, false) && s_can_stay(home, true));
    /* A failed commit too: the home holds what the store could not take. */
    S_CHECK(s_can_stay("{\"home\": {\"it\": {}}, \"save_error\": \"x\"}", false));
    S_CHECK(!s_can_stay("{\"home\": {}, \"save_error\": \"x\"}", true));
    /* Reports merge into metadata.looseleaf, whatever was there stays. */
    json_t *md = json_object();
    s_merge_looseleaf(md, "{\"restore_ms\": 3}");
    s_merge_looseleaf(md, NULL);
    s_merge_looseleaf(md, "not json");
    s_merge_looseleaf(md, "{\"save_ms\": 5, \"restore_ms\": 4}");
    json_t *ll = json_object_get(md, "looseleaf");
    S_CHECK(json_integer_value(json_object_get(ll, "restore_ms")) == 4);
    S_CHECK(json_integer_value(json_object_get(ll, "save_ms")) == 5 && json_object_size(ll) == 2);
    json_decref(md);
    if (verbose)
        fprintf(stderr, "ll_zygote: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
