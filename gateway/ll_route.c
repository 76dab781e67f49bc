/* ll_route: per-cell routing decision and the GPU-cell relay (see
 * ll_route.h).  Kernel process, main thread.
 *
 * The interpreter releases the GIL between requests, so the analysis calls
 * that parse source (ll_analysis_init, ll_analysis_new) take it here with
 * PyGILState_Ensure; sessions and closures never touch Python.
 *
 * The relay of a GPU cell is a poll loop on this thread over the pool
 * connection, the interrupt eventfd and (while the worker waits in input())
 * the stdin socket: the shell thread is where the cell "runs", exactly as
 * when the interpreter runs it, so the dispatcher's busy/idle and reply
 * ordering hold unchanged. */
#include <Python.h>

#include "gateway/ll_route.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "analysis/ll_analysis.h"
#include "base/ll_b64.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "zygote/ll_zclient.h"

struct ll_route_t {
    ll_analysis_session_t *session; /* every executed cell, in order */
    ll_zclient_t *pool;             /* connection to the host pool, made at the first GPU cell */
    unsigned long long cells;       /* GPU cells and prefetches sent: their ids */
    char prefetch_id[48];           /* the last prefetch, until a cell runs or it is cancelled */
    char store_session[64]; /* the store session GPU cells run under ("" before the first) */
    char *prefetch_key;     /* its closure (JSON text), to tell a repeat from a new one */
    json_t
        *gone; /* [{pid, why}]: the session's workers the pool said went (0: all), not yet taken */
    bool restore_all; /* an unanalysed cell ran: workers restore every variable */
};

struct ll_route_plan_t {
    ll_analysis_t *cell;            /* NULL if the analysis failed outright */
    ll_analysis_closure_t *closure; /* NULL when the cell did not parse */
    size_t unanalysed;              /* bytes of a cell too big to analyse (0: analysed) */
    bool unknown;                   /* an unanalysed cell ran before: its closure may be anything */
};

/* The largest cell the analysis parses: LOOSELEAF_ANALYSIS_MAX_BYTES, default
 * 1 MiB.  CPython's AST of a cell costs ~10x its size at the peak (a signed
 * 100 MB cell took the kernel to 1.4 GB); cells this big are data pasted
 * into code, not code whose closure matters. */
static size_t s_analysis_max_bytes(void)
{
    const char *v = getenv("LOOSELEAF_ANALYSIS_MAX_BYTES");
    char *end;
    unsigned long long n = v ? strtoull(v, &end, 10) : 0;
    return v && end != v && *end == 0 && n > 0 ? (size_t) n : (size_t) 1 << 20;
}

/* The session's GPU time as of the pool's latest stats (usage_request):
 * the only state shared with another thread. */
static pthread_mutex_t s_usage_lock = PTHREAD_MUTEX_INITIALIZER;
static json_t *s_usage;

bool ll_route_enabled(void)
{
    const char *v = getenv("LOOSELEAF_GPU_ROUTING");
    return !v || strcmp(v, "0") != 0;
}

ll_route_t *ll_route_new(char *err, size_t errlen)
{
    ll_route_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = ll_analysis_init(err, errlen);
    PyGILState_Release(gil);
    if (rc < 0 || !(self->session = ll_analysis_session_new())) {
        if (rc == 0)
            snprintf(err, errlen, "cannot create the analysis session");
        free(self);
        return NULL;
    }
    return self;
}

void ll_route_destroy(ll_route_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_route_t *self = *self_p;
    ll_zclient_destroy(&self->pool);
    free(self->prefetch_key);
    json_decref(self->gone);
    pthread_mutex_lock(&s_usage_lock);
    json_decref(s_usage);
    s_usage = NULL;
    pthread_mutex_unlock(&s_usage_lock);
    ll_analysis_session_destroy(&self->session);
    PyGILState_STATE gil = PyGILState_Ensure();
    ll_analysis_shutdown();
    PyGILState_Release(gil);
    free(self);
    *self_p = NULL;
}

ll_route_plan_t *ll_route_plan(ll_route_t *self, const char *code, size_t len)
{
    ll_route_plan_t *plan = calloc(1, sizeof *plan);
    if (!plan)
        return NULL;
    plan->unknown = self->restore_all;
    if (len > s_analysis_max_bytes()) {
        /* Not analysed: it runs in the interpreter with a plan that
         * assumes the worst (ll_route_plan_closure), and the session's
         * later GPU cells restore every variable (ll_route_done). */
        plan->unanalysed = len;
        return plan;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    plan->cell = ll_analysis_new(code, len);
    PyGILState_Release(gil);
    if (plan->cell && !ll_analysis_error(plan->cell))
        plan->closure = ll_analysis_session_closure(self->session, plan->cell);
    return plan;
}

bool ll_route_is_gpu(const ll_route_plan_t *plan)
{
    return plan && plan->closure && ll_analysis_closure_label(plan->closure) == LL_ANALYSIS_GPU;
}

bool ll_route_plan_parsed(const ll_route_plan_t *plan)
{
    return plan && (plan->closure || plan->unanalysed);
}

static json_t *s_strs_json(ll_analysis_strs_t strs)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < strs.count; i++)
        json_array_append_new(a, json_string(strs.items[i]));
    return a;
}

json_t *ll_route_plan_closure(const ll_route_plan_t *plan)
{
    if (plan && plan->unanalysed) /* anything may be read or changed */
        return json_pack("{s:[], s:[], s:[], s:[], s:b}", "state", "writes", "deletes",
                         "import_stmts", "unknown", 1);
    if (!plan || !plan->closure)
        return NULL;
    /* After an unanalysed cell a function the analysis never saw may read
     * or change any variable: "unknown" makes the interpreter refresh all
     * that moved first and count all as changed after. */
    return json_pack(
        "{s:o, s:o, s:o, s:o, s:b}", "state", s_strs_json(ll_analysis_closure_state(plan->closure)),
        "writes", s_strs_json(ll_analysis_closure_writes(plan->closure)), "deletes",
        s_strs_json(ll_analysis_closure_deletes(plan->closure)), "import_stmts",
        s_strs_json(ll_analysis_closure_import_stmts(plan->closure)), "unknown", plan->unknown);
}

/* Whether strings STRS has a key of object NAMES. */
static bool s_strs_any(ll_analysis_strs_t strs, const json_t *names)
{
    for (size_t i = 0; i < strs.count; i++)
        if (json_object_get(names, strs.items[i]))
            return true;
    return false;
}

bool ll_route_plan_reads(const ll_route_plan_t *plan, const json_t *names)
{
    if (!plan || !plan->closure || !json_object_size(names))
        return false;
    return s_strs_any(ll_analysis_closure_state(plan->closure), names) ||
           s_strs_any(ll_analysis_closure_deletes(plan->closure), names);
}

json_t *ll_route_plan_json(const ll_route_plan_t *plan, const char *route)
{
    json_t *out = json_object();
    if (!out || !plan)
        return out;
    json_object_set_new(out, "route", json_string(route));
    json_object_set_new(out, "label", json_string(ll_route_is_gpu(plan) ? "gpu" : "cpu"));
    if (plan->unanalysed)
        json_object_set_new(out, "analysis_skipped",
                            json_sprintf("a cell of %zu bytes is over the analysis limit of %zu "
                                         "(LOOSELEAF_ANALYSIS_MAX_BYTES)",
                                         plan->unanalysed, s_analysis_max_bytes()));
    if (plan->cell) {
        const char *error = ll_analysis_error(plan->cell);
        if (error)
            json_object_set_new(out, "analysis_error", json_string(error));
        else
            json_object_set_new(out, "cell", ll_analysis_json(plan->cell));
    }
    if (plan->closure)
        json_object_set_new(out, "closure", ll_analysis_closure_json(plan->closure));
    return out;
}

void ll_route_plan_free(ll_route_plan_t **plan_p)
{
    if (!plan_p || !*plan_p)
        return;
    ll_analysis_closure_destroy(&(*plan_p)->closure);
    ll_analysis_destroy(&(*plan_p)->cell);
    free(*plan_p);
    *plan_p = NULL;
}

/* The session learns what the namespace showed (ll_route_done's DYNAMIC):
 * names bound by exec, %run, globals()[k] = v and the like are live from
 * now on, so later closures restore them wherever the cell runs. */
static void s_note_dynamic(ll_route_t *self, const json_t *dynamic)
{
    const char *name;
    json_t *v;
    size_t bound = 0, i;
    json_object_foreach((json_t *) json_object_get(dynamic, "bound"), name, v) {
        json_t *jdeps = json_array_get(v, 2);
        size_t n = json_array_size(jdeps), k = 0;
        const char **deps = n ? calloc(n, sizeof *deps) : NULL;
        for (size_t j = 0; deps && j < n; j++)
            if (json_is_string(json_array_get(jdeps, j)))
                deps[k++] = json_string_value(json_array_get(jdeps, j));
        ll_analysis_strs_t d = {deps, k};
        if (ll_analysis_session_bind(self->session, name, json_string_value(json_array_get(v, 0)),
                                     json_string_value(json_array_get(v, 1)), d,
                                     json_is_true(json_array_get(v, 3))) == 0)
            bound++;
        free(deps);
    }
    json_array_foreach(json_object_get(dynamic, "unbound"), i, v)
        if (json_is_string(v))
            ll_analysis_session_unbind(self->session, json_string_value(v));
    if (bound)
        ll_debug("route", "%zu names bound beyond the analysis (exec, globals(), ...)", bound);
}

void ll_route_note_dynamic(ll_route_t *self, const json_t *dynamic)
{
    if (self)
        s_note_dynamic(self, dynamic);
}

void ll_route_done(ll_route_t *self, ll_route_plan_t **plan_p, const json_t *dynamic)
{
    if (!plan_p || !*plan_p)
        return;
    ll_route_plan_t *plan = *plan_p;
    /* A cell the session cannot record may have defined anything (a
     * function whose body later cells reach): from now on the closure of a
     * GPU cell is every variable. */
    if (plan->unanalysed && !self->restore_all) {
        ll_info("route", "a cell of %zu bytes ran unanalysed: GPU cells restore every variable",
                plan->unanalysed);
        self->restore_all = true;
    }
    /* The session mirrors what ran: errors and silent cells included. */
    if (plan->cell && ll_analysis_session_record(self->session, plan->cell) < 0)
        ll_warn("route", "cannot record a cell in the analysis session");
    s_note_dynamic(self, dynamic);
    ll_route_plan_free(plan_p);
}

/* ---- the GPU-cell relay -------------------------------------------------- */

/* Append the decoded base64 TEXT to MSG as a new frame.  0, or -1 when TEXT
 * is not base64. */
static int s_b64_frame(zmsg_t *msg, const char *text)
{
    size_t len;
    unsigned char *raw = ll_b64_decode(text, strlen(text), &len);
    if (!raw)
        return -1;
    int rc = zmsg_addmem(msg, raw, len);
    free(raw);
    return rc;
}

/* A reply content shaped like an ipykernel error, for failures of the GPU
 * path itself (the worker's own errors come in its reply). */
static json_t *s_error_reply(const char *ename, const char *evalue, json_int_t count)
{
    return json_pack("{s:s, s:s, s:s, s:[s], s:I, s:{}, s:[]}", "status", "error", "ename", ename,
                     "evalue", evalue, "traceback", evalue, "execution_count", count,
                     "user_expressions", "payload");
}

static json_t *s_run_request(ll_route_plan_t *plan, const ll_msg_t *req, const json_t *sync,
                             const char *id)
{
    json_t *content = req->content;
    json_t *r = json_pack(
        "{s:s, s:O, s:O, s:O, s:O, s:o, s:o, s:o, s:o, s:o, s:O, s:O, s:b}", "id", id, "session",
        json_object_get(sync, "session"), "store_dir", json_object_get(sync, "store_dir"),
        "redis_url", json_object_get(sync, "redis_url"), "code", json_object_get(content, "code"),
        "state_closure", s_strs_json(ll_analysis_closure_state(plan->closure)), "import_closure",
        s_strs_json(ll_analysis_closure_imports(plan->closure)), "import_stmts",
        s_strs_json(ll_analysis_closure_import_stmts(plan->closure)), "defines",
        s_strs_json(ll_analysis_closure_writes(plan->closure)), "deletes",
        s_strs_json(ll_analysis_closure_deletes(plan->closure)), "parent", req->header,
        "execution_count", json_object_get(sync, "execution_count"), "allow_stdin",
        json_is_true(json_object_get(content, "allow_stdin")));
    json_t *ue = json_object_get(content, "user_expressions");
    if (r && json_is_object(ue))
        json_object_set(r, "user_expressions", ue);
    json_t *sh = json_object_get(content, "store_history");
    if (r && json_is_boolean(sh))
        json_object_set(r, "store_history", sh);
    json_t *cells = json_object_get(sync, "cells_dir"); /* where the session's cell sources are */
    if (r && json_is_string(cells))
        json_object_set(r, "cells_dir", cells);
    /* What the worker must know of values that lived in other workers
     * (coherence.py: lost names it reads, notices of lost graphs), and
     * whether the session's debugger is on (debug: ll_exec asks). */
    const char *homes[] = {"lost", "notices", "debug"};
    for (size_t i = 0; r && i < sizeof homes / sizeof homes[0]; i++)
        if (json_object_get(sync, homes[i]))
            json_object_set(r, homes[i], json_object_get(sync, homes[i]));
    /* Fault tests (tests/routing): with LOOSELEAF_TEST_FAULTS=1 in the
     * kernel's environment, execute_request metadata "looseleaf_fault"
     * ("restore", "save", "stop_redis@restore", ...: zyg.py's _fault)
     * makes the worker do something bad there. */
    const char *faults = getenv("LOOSELEAF_TEST_FAULTS");
    json_t *fault = json_object_get(req->metadata, "looseleaf_fault");
    if (r && faults && strcmp(faults, "1") == 0 && json_is_string(fault)) {
        json_object_set(r, "fault", fault);
        json_object_set_new(r, "kernel_pid", json_integer(getpid()));
    }
    return r;
}

/* A worker's events dropped: at most one line per interval (its user's code
 * may make them by the thousand). */
static ll_log_limit_t s_drop_event = LL_LOG_LIMIT_INIT;

/* Publish a worker's iopub event; returns its msg_type (borrowed) or NULL. */
static const char *s_publish(const ll_route_io_t *io, json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "msg_type"));
    json_t *content = json_object_get(ev, "content");
    if (!type || !json_is_object(content)) {
        ll_warn_limited(&s_drop_event, "route",
                        "a worker published without a type or content: dropped");
        return NULL;
    }
    json_t *md = json_object_get(ev, "metadata");
    json_t *b64 = json_object_get(ev, "buffers");
    zmsg_t *buffers = NULL;
    if (json_array_size(b64)) {
        buffers = zmsg_new();
        size_t i;
        json_t *b;
        json_array_foreach(b64, i, b) {
            if (!buffers || !json_is_string(b) || s_b64_frame(buffers, json_string_value(b)) < 0) {
                ll_warn_limited(&s_drop_event, "route",
                                "a worker's %.64s has a bad buffer: dropped", type);
                zmsg_destroy(&buffers);
                return NULL;
            }
        }
    }
    ll_iopub_send(io->iopub, type, NULL, json_incref(content),
                  json_is_object(md) ? json_incref(md) : NULL, &buffers);
    return type;
}

/* A cell that failed outside the user's code (the worker died, could not
 * restore, the pool went away) has no error on iopub yet: publish what
 * ipykernel would have, so every frontend shows it. */
static void s_publish_failure(const ll_route_io_t *io, const char *code, json_t *content,
                              bool saw_input)
{
    if (!saw_input)
        ll_iopub_send(io->iopub, "execute_input", NULL,
                      json_pack("{s:s, s:O}", "code", code ? code : "", "execution_count",
                                json_object_get(content, "execution_count")),
                      NULL, NULL);
    ll_iopub_send(io->iopub, "error", NULL,
                  json_pack("{s:O, s:O, s:O}", "ename", json_object_get(content, "ename"), "evalue",
                            json_object_get(content, "evalue"), "traceback",
                            json_object_get(content, "traceback")),
                  NULL, NULL);
}

/* How long a cancelled cell (the kernel is shutting down) may take to
 * answer before the relay gives up on it. */
#define S_CANCEL_GRACE_MS 3000

/* Connect to the host pool when not connected (starting it on demand). */
static int s_connect(ll_route_t *self, char *err, size_t errlen)
{
    if (self->pool && !ll_zclient_ok(self->pool))
        ll_zclient_destroy(&self->pool);
    if (!self->pool) {
        /* Warm workers (no fork before a session's next GPU cell) unless the
         * user set the pool up otherwise. */
        setenv("LL_POOL_WARM_IDLE_S", "300", 0);
        self->pool = ll_zclient_connect(NULL, NULL, NULL, err, errlen);
        self->prefetch_id[0] = '\0';
    }
    return self->pool ? 0 : -1;
}

int ll_route_connect(ll_route_t *self, char *err, size_t errlen)
{
    if (!self) {
        snprintf(err, errlen, "GPU routing is off");
        return -1;
    }
    return s_connect(self, err, errlen);
}

int ll_route_fd(ll_route_t *self)
{
    return self && self->pool && ll_zclient_ok(self->pool) ? ll_zclient_fd(self->pool) : -1;
}

json_t *ll_route_usage(void)
{
    pthread_mutex_lock(&s_usage_lock);
    json_t *u = s_usage ? json_deep_copy(s_usage) : NULL;
    pthread_mutex_unlock(&s_usage_lock);
    return u;
}

static void s_keep_usage(ll_route_t *self, json_t *stats)
{
    size_t i;
    json_t *se;
    json_array_foreach(json_object_get(stats, "sessions"), i, se) {
        const char *name = json_string_value(json_object_get(se, "session"));
        if (!name || strcmp(name, self->store_session) != 0)
            continue;
        json_t *u = json_pack("{s:O, s:O, s:O}", "gpu_held_s", json_object_get(se, "gpu_held_s"),
                              "connected_s", json_object_get(se, "connected_s"), "held_share",
                              json_object_get(se, "held_share"));
        pthread_mutex_lock(&s_usage_lock);
        json_decref(s_usage);
        s_usage = u;
        pthread_mutex_unlock(&s_usage_lock);
        return;
    }
}

/* A worker of this session went, WHY (PID 0: every worker, the pool went
 * away): kept for ll_route_take_gone. */
static void s_note_gone(ll_route_t *self, json_int_t pid, const char *why)
{
    if (!self->gone)
        self->gone = json_array();
    json_array_append_new(self->gone, json_pack("{s:I, s:s}", "pid", pid, "why", why));
}

/* The pool connection broke: every worker of the session went with it. */
static void s_pool_went(ll_route_t *self)
{
    char at[16], why[64];
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(at, sizeof at, "%H:%M:%S", &tm))
        snprintf(at, sizeof at, "?");
    snprintf(why, sizeof why, "which went with the GPU pool at %s", at);
    s_note_gone(self, 0, why);
}

json_t *ll_route_take_gone(ll_route_t *self)
{
    json_t *gone = self ? self->gone : NULL;
    if (self)
        self->gone = NULL;
    return gone;
}

/* Events nobody waits for: prefetch answers (logged), stats, a broken pool,
 * a worker of the session gone. */
static void s_idle_event(ll_route_t *self, json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *id = json_string_value(json_object_get(ev, "id"));
    if (type && strcmp(type, "stats") == 0)
        s_keep_usage(self, ev);
    else if (type && strcmp(type, "prefetched") == 0) {
        /* The id stays: until a cell takes the prepared worker, an abort or
         * interrupt cancels it (the pool then lets a speculative worker go). */
        ll_debug("route", "prefetch %s: ok %d warm %d", id ? id : "?",
                 json_is_true(json_object_get(ev, "ok")),
                 json_is_true(json_object_get(ev, "warm_hit")));
    } else if (type && strcmp(type, "pool_gone") == 0) {
        self->prefetch_id[0] = '\0';
        s_pool_went(self);
    } else if (type && strcmp(type, "worker_gone") == 0) {
        const char *session = json_string_value(json_object_get(ev, "session"));
        const char *why = json_string_value(json_object_get(ev, "why"));
        if (session && strcmp(session, self->store_session) == 0)
            s_note_gone(self, json_integer_value(json_object_get(ev, "pid")), why ? why : "gone");
    }
}

void ll_route_poll(ll_route_t *self)
{
    if (!self || !self->pool)
        return;
    json_t *ev;
    while ((ev = ll_zclient_next(self->pool, 0))) {
        s_idle_event(self, ev);
        json_decref(ev);
    }
    if (!ll_zclient_ok(self->pool))
        ll_zclient_destroy(&self->pool);
}

json_t *ll_route_stats(ll_route_t *self, int timeout_ms)
{
    if (!self || !self->pool || !ll_zclient_ok(self->pool) || ll_zclient_stats(self->pool) < 0)
        return NULL;
    double deadline = ll_clock_ms() + timeout_ms;
    for (;;) {
        double left = deadline - ll_clock_ms();
        if (left <= 0)
            return NULL;
        json_t *ev = ll_zclient_next(self->pool, (int) left + 1);
        if (!ev)
            continue;
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (type && strcmp(type, "stats") == 0) {
            s_keep_usage(self, ev);
            return ev;
        }
        s_idle_event(self, ev);
        json_decref(ev);
        if (!ll_zclient_ok(self->pool))
            return NULL;
    }
}

void ll_route_cancel_prefetch(ll_route_t *self)
{
    if (!self || !self->pool || !self->prefetch_id[0])
        return;
    ll_zclient_cancel(self->pool, self->prefetch_id);
    self->prefetch_id[0] = '\0';
    free(self->prefetch_key);
    self->prefetch_key = NULL;
}

int ll_route_prefetch(ll_route_t *self, ll_route_plan_t *plan, const json_t *sync, char *err,
                      size_t errlen)
{
    if (!plan || !plan->closure) {
        snprintf(err, errlen, "the cell has no closure");
        return -1;
    }
    if (s_connect(self, err, errlen) < 0)
        return -1;
    json_t *request = json_pack(
        "{s:O, s:O, s:O, s:o, s:o, s:o}", "session", json_object_get(sync, "session"), "store_dir",
        json_object_get(sync, "store_dir"), "redis_url", json_object_get(sync, "redis_url"),
        "state_closure", s_strs_json(ll_analysis_closure_state(plan->closure)), "import_closure",
        s_strs_json(ll_analysis_closure_imports(plan->closure)), "import_stmts",
        s_strs_json(ll_analysis_closure_import_stmts(plan->closure)));
    if (request && self->restore_all)
        json_object_set_new(request, "state_all", json_true());
    char *key = request ? json_dumps(request, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    /* (after the key: the same closure grown in bytes is still the same prefetch) */
    json_t *bytes = json_object_get(sync, "closure_bytes");
    if (request && json_is_integer(bytes))
        json_object_set(request, "closure_bytes", bytes);
    if (!key) {
        json_decref(request);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* A newer hint for another closure replaces the one in flight; the same
     * closure again is still worth sending (versions may have moved), and
     * the pool does not renew a worker's priority for a prefetch that
     * changed nothing. */
    if (self->prefetch_id[0] && (!self->prefetch_key || strcmp(self->prefetch_key, key) != 0))
        ll_route_cancel_prefetch(self);
    snprintf(self->prefetch_id, sizeof self->prefetch_id, "pf-%llu", ++self->cells);
    json_object_set_new(request, "id", json_string(self->prefetch_id));
    int rc = ll_zclient_prefetch(self->pool, request, err, errlen);
    json_decref(request);
    free(self->prefetch_key);
    self->prefetch_key = key;
    if (rc < 0)
        self->prefetch_id[0] = '\0';
    return rc;
}

/* One GPU cell's relay: what its event loop keeps track of. */
typedef struct {
    ll_route_t *route;       /* its pool connection */
    const ll_route_io_t *io; /* the kernel's sockets */
    const char *id;          /* the cell's id on the pool connection */
    json_int_t count;        /* its execution_count, for error replies */
    bool asking;             /* the worker waits in input(); we hold the stdin channel */
    double cancelled;        /* when the cell was cancelled (kernel shutting down), 0 if not */
    bool waited;             /* the "every GPU slot is in use" line went out */
    bool saw_input;          /* the worker published the cell's execute_input */
    bool saw_error;          /* ... and an error */
    double visible_wait;     /* Run to the cell's execute_input (the worker starts executing) */
    bool heard;              /* the pool said something of this cell (it took it) */
    bool resend;             /* the pool went before it took the cell: send it to a new one */
    json_t *content, *md;    /* the reply, once there is one */
} s_relay_t;

/* Send the run request of the cell; a pool that went away since the last
 * GPU cell is replaced by a new one (started on demand): try twice.  0, or
 * -1 with ERR. */
static int s_send_run(ll_route_t *self, json_t *request, char *err, size_t errlen)
{
    int sent = -1;
    for (int attempt = 0; attempt < 2 && sent < 0; attempt++) {
        if (s_connect(self, err, errlen) < 0)
            continue;
        if ((sent = ll_zclient_run(self->pool, request, err, errlen)) < 0)
            ll_zclient_destroy(&self->pool);
    }
    return sent;
}

/* The interrupt eventfd fired: a SIGINT for the cell, or the kernel going. */
static void s_relay_signal(s_relay_t *r)
{
    uint64_t v;
    ssize_t n = read(r->io->intr_fd, &v, sizeof v);
    (void) n;
    if (r->io->stopping()) {
        if (!r->cancelled) {
            ll_zclient_cancel(r->route->pool, r->id);
            r->cancelled = ll_clock_ms();
        }
    } else {
        ll_info("route", "interrupt: to the worker of %s", r->id);
        ll_zclient_interrupt(r->route->pool, r->id);
    }
    if (r->asking) { /* the worker's input() ends with KeyboardInterrupt */
        r->asking = false;
        ll_stdin_release(r->io->stdin_chan);
    }
}

/* The stdin channel is readable while the worker waits in input(). */
static void s_relay_stdin(s_relay_t *r)
{
    char *value = ll_stdin_take(r->io->stdin_chan);
    if (value) {
        ll_zclient_input_reply(r->route->pool, r->id, value);
        free(value);
        r->asking = false;
        ll_stdin_release(r->io->stdin_chan);
    }
}

/* The worker asks for a line: relay its input_request to the frontend. */
static void s_relay_input_request(s_relay_t *r, json_t *ev)
{
    if (r->asking) {
        ll_stdin_release(r->io->stdin_chan);
        r->asking = false;
    }
    r->asking = ll_stdin_ask(r->io->stdin_chan, json_string_value(json_object_get(ev, "prompt")),
                             json_is_true(json_object_get(ev, "password")));
    if (!r->asking)
        ll_zclient_input_reply(r->route->pool, r->id, "\x04"); /* EOF: EOFError in the cell */
}

static bool s_str_is(const json_t *v, const char *text)
{
    return json_is_string(v) && strcmp(json_string_value(v), text) == 0;
}

/* One event from the pool (EV borrowed). */
static void s_relay_event(s_relay_t *r, json_t *ev)
{
    const ll_route_io_t *io = r->io;
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *evid = json_string_value(json_object_get(ev, "id"));
    if (!type)
        return;
    if (evid && strcmp(evid, r->id) == 0)
        r->heard = true; /* the pool took the cell */
    if (strcmp(type, "pool_gone") == 0) {
        s_pool_went(r->route);
        if (!r->heard && !r->cancelled) {
            /* Gone before it said anything of the cell (it was going down
             * as the request came: a pool killed a moment ago): nothing of
             * the cell ran, so it goes to a new pool instead. */
            r->resend = true;
            return;
        }
        r->content = s_error_reply("PoolGone",
                                   "the GPU pool went away while this cell ran; the session "
                                   "continues from the last committed versions of its variables",
                                   r->count);
    } else if (!evid || strcmp(evid, r->id) != 0) {
        s_idle_event(r->route, ev); /* a prefetch answer, an earlier cell's late event */
    } else if (strcmp(type, "stream") == 0) {
        const char *name = json_string_value(json_object_get(ev, "name"));
        json_t *text = json_object_get(ev, "text");
        /* The worker coalesced its text already (base/ll_stream, 20 ms): out
         * at once, so a flushed print reaches the frontend as promptly as
         * from a CPU cell, not another coalescing interval later. */
        if (name && json_is_string(text)) {
            ll_iopub_stream_write(io->iopub, name, json_string_value(text),
                                  json_string_length(text));
            ll_iopub_stream_flush(io->iopub);
        }
    } else if (strcmp(type, "iopub") == 0 &&
               s_str_is(json_object_get(ev, "msg_type"), "looseleaf_debug_worker")) {
        /* The kernel's, not the frontend's: the cell waits until the
         * kernel's debugger has attached (zygote/py/looseleaf_zygote/debug.py). */
        if (io->debug_worker)
            io->debug_worker(json_object_get(ev, "content"));
    } else if (strcmp(type, "iopub") == 0) {
        const char *t = s_publish(io, ev);
        bool input = t && strcmp(t, "execute_input") == 0;
        if (input && !r->saw_input)
            r->visible_wait = ll_clock_ms() - io->t_run;
        r->saw_input |= input;
        r->saw_error |= t && strcmp(t, "error") == 0;
    } else if (strcmp(type, "input_request") == 0) {
        s_relay_input_request(r, ev);
    } else if (strcmp(type, "wait") == 0 && !r->waited) {
        r->waited = true;
        char line[200];
        snprintf(line, sizeof line,
                 "LooseLeaf: every GPU slot is in use (%lld slots, %lld cells waiting); "
                 "this cell starts when one is free\n",
                 (long long) json_integer_value(json_object_get(ev, "slots")),
                 (long long) json_integer_value(json_object_get(ev, "queued")));
        ll_iopub_stream_write(io->iopub, "stderr", line, strlen(line));
    } else if (strcmp(type, "reply") == 0) {
        r->content = json_incref(json_object_get(ev, "content"));
        r->md = json_incref(json_object_get(ev, "metadata"));
        if (!json_is_object(r->content)) {
            json_decref(r->content);
            r->content = s_error_reply("WorkerError", "the worker sent no valid reply", r->count);
        }
    } else if (strcmp(type, "error") == 0) {
        const char *why = json_string_value(json_object_get(ev, "error"));
        r->content = s_error_reply("WorkerRequestError", why ? why : "bad request", r->count);
    }
}

/* Relay the cell's events until its reply (or the pool's end). */
static void s_relay(s_relay_t *r)
{
    ll_route_t *self = r->route;
    const ll_route_io_t *io = r->io;
    while (!r->content && !r->resend) {
        zmq_pollitem_t items[4] = {{NULL, ll_zclient_fd(self->pool), ZMQ_POLLIN, 0},
                                   {NULL, io->intr_fd, ZMQ_POLLIN, 0}};
        int n = 2, stdin_i = -1, shell_i = -1;
        if (r->asking) {
            items[n] =
                (zmq_pollitem_t){zsock_resolve(ll_stdin_sock(io->stdin_chan)), 0, ZMQ_POLLIN, 0};
            stdin_i = n++;
        }
        /* Requests on shell while the cell runs (jupyter_server's kernel_info nudge). */
        if (io->shell_handle && io->shell_readable) {
            items[n] = (zmq_pollitem_t){io->shell_handle, 0, ZMQ_POLLIN, 0};
            shell_i = n++;
        }
        int rc = zmq_poll(items, n, r->cancelled ? 100 : -1);
        if (rc < 0 && errno != EINTR) {
            r->content = s_error_reply("PoolGone", "cannot wait for the GPU worker", r->count);
            break;
        }
        if (rc > 0 && items[1].revents)
            s_relay_signal(r);
        if (rc > 0 && stdin_i >= 0 && items[stdin_i].revents)
            s_relay_stdin(r);
        if (rc > 0 && shell_i >= 0 && items[shell_i].revents)
            io->shell_readable(io->ctx);
        json_t *ev;
        while (!r->content && !r->resend && (ev = ll_zclient_next(self->pool, 0))) {
            s_relay_event(r, ev);
            json_decref(ev);
        }
        if (!r->content && r->cancelled && ll_clock_ms() - r->cancelled > S_CANCEL_GRACE_MS)
            r->content = s_error_reply("Cancelled", "the kernel is shutting down", r->count);
    }
    if (r->asking)
        ll_stdin_release(r->io->stdin_chan);
}

/* What the worker's account changes in its reply, before anything is
 * published: a preparation that failed because the store did not answer or
 * an interrupt ended its wait is named so (StoreUnavailable,
 * KeyboardInterrupt), not WorkerPrepareError; a cell whose results the
 * store could not take (the save is all or nothing: a full pool, Redis
 * gone, an interrupt) ends in that error although its code ran, naming the
 * variables; when the cell failed on its own, the save's failure is said
 * on stderr. */
static void s_settle_reply(s_relay_t *r)
{
    json_t *ll = json_object_get(r->md, "looseleaf");
    const char *status = json_string_value(json_object_get(r->content, "status"));
    bool failed = status && strcmp(status, "error") == 0;
    const char *fatal_ename = json_string_value(json_object_get(ll, "fatal_ename"));
    if (failed && fatal_ename)
        json_object_set_new(r->content, "ename", json_string(fatal_ename));
    const char *save_error = json_string_value(json_object_get(ll, "save_error"));
    if (!save_error || !json_is_object(r->content))
        return;
    const char *save_ename = json_string_value(json_object_get(ll, "save_ename"));
    if (failed) {
        char *line = NULL;
        if (asprintf(&line, "LooseLeaf: %s\n", save_error) > 0)
            ll_iopub_stream_write(r->io->iopub, "stderr", line, strlen(line));
        free(line);
        return;
    }
    json_t *e = s_error_reply(save_ename ? save_ename : "SaveError", save_error, r->count);
    json_object_set(e, "execution_count", json_object_get(r->content, "execution_count"));
    json_decref(r->content);
    r->content = e;
    r->saw_error = false; /* the error goes out on iopub too */
}

int ll_route_run_gpu(ll_route_t *self, ll_route_plan_t *plan, const ll_msg_t *req,
                     const json_t *sync, const ll_route_io_t *io, json_t **content_p, json_t **md_p,
                     char *err, size_t errlen)
{
    *content_p = *md_p = NULL;
    if (!plan || !plan->closure) {
        snprintf(err, errlen, "the cell has no closure");
        return -1;
    }
    self->prefetch_id[0] = '\0'; /* this cell takes the prepared worker, if any */
    char id[48];
    snprintf(id, sizeof id, "cell-%llu", ++self->cells);
    const char *session = json_string_value(json_object_get(sync, "session"));
    snprintf(self->store_session, sizeof self->store_session, "%s", session ? session : "");
    json_t *request = s_run_request(plan, req, sync, id);
    if (request && self->restore_all)
        json_object_set_new(request, "state_all", json_true());
    if (!request) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int sent = s_send_run(self, request, err, errlen);
    if (sent < 0) {
        json_decref(request);
        return -1;
    }

    s_relay_t r = {.route = self,
                   .io = io,
                   .id = id,
                   .count = json_integer_value(json_object_get(sync, "execution_count")),
                   .visible_wait = -1};
    s_relay(&r);
    if (r.resend) { /* once: to the pool that starts now */
        ll_info("route", "%s: the pool went before it took the cell: sent to a new pool", id);
        ll_zclient_destroy(&self->pool);
        r.resend = false;
        if (s_send_run(self, request, err, errlen) == 0)
            s_relay(&r);
        if (!r.content)
            r.content = s_error_reply("PoolGone",
                                      "the GPU pool went away twice before it took this cell; "
                                      "the session continues from the last committed versions of "
                                      "its variables",
                                      r.count);
    }
    json_decref(request);
    /* The pool could fork no worker (its base zygote cannot start; it
     * tries again with back-off) and nothing of the cell ran: the kernel
     * runs it itself, with the one-line notice of a pool that cannot
     * start, rather than fail a cell for the pool's state. */
    if (json_is_true(json_object_get(json_object_get(r.md, "looseleaf"), "unavailable"))) {
        const char *why = json_string_value(json_object_get(r.content, "evalue"));
        snprintf(err, errlen, "%s", why ? why : "the pool has no zygote");
        json_decref(r.content);
        json_decref(r.md);
        return -1;
    }
    s_settle_reply(&r);
    const char *status = json_string_value(json_object_get(r.content, "status"));
    if (!r.saw_error && status && strcmp(status, "error") == 0 &&
        json_is_string(json_object_get(r.content, "ename")))
        s_publish_failure(io, json_string_value(json_object_get(req->content, "code")), r.content,
                          r.saw_input);
    if (!ll_zclient_ok(self->pool))
        ll_zclient_destroy(&self->pool); /* the next GPU cell starts a new pool */
    else
        ll_zclient_stats(self->pool); /* GPU time for usage_request, answered while idle */
    if (!json_is_object(r.md)) {
        json_decref(r.md);
        r.md = json_object();
    }
    json_t *ll = json_object_get(r.md, "looseleaf");
    if (json_is_object(ll) && r.visible_wait >= 0)
        json_object_set_new(ll, "visible_wait_ms", json_real(r.visible_wait));
    *content_p = r.content;
    *md_p = r.md;
    return 0;
}

/* ---- self-test ----------------------------------------------------------- */

int ll_route_selftest(bool verbose)
{
    json_t *e = s_error_reply("PoolGone", "x", 3);
    bool ok = e && json_integer_value(json_object_get(e, "execution_count")) == 3 &&
              json_array_size(json_object_get(e, "traceback")) == 1;
    json_decref(e);
    if (verbose)
        printf("(error reply) ");
    return ok ? 0 : -1;
}
