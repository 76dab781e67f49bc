/* ll_exec: the execution policy behind the dispatcher (see ll_exec.h).
 * Kernel process, shell (main) thread.
 *
 * DESIGN.  Three pieces of state decide what happens around a cell, each a
 * small value with pure functions over it (the caller passes the clock), so
 * the self-test can script them:
 *   s_hint_t     the latest edit-time hint, waiting out its debounce;
 *   s_kept_t     the interpreter's answer to the last prefetch's commit, kept
 *                for the Run of the same code;
 *   s_comms_t    the comms open on the looseleaf.prefetch target (their
 *                messages are hints, and run no user code).
 * Plus two counters: the epoch (interpreter requests that may have run user
 * code: a kept commit is valid only in the epoch it was made) and the time
 * user code last ran (the idle commit is due a while after it, the
 * background commit of slow-to-save values a longer while); and the
 * session's homes (values no store can hold stay where they were made):
 * the names whose live value only a worker holds, which every cell reading
 * one runs on, whatever its label.
 *
 * The interpreter is called in two ways: requests of the frontend
 * (s_interp_call: content, header, metadata, buffers, and for an executed
 * cell its plan) and the kernel's own looseleaf_* requests (s_interp_own).
 * Their contract is kernel/py/looseleaf_kernel/API.md. */
#include "gateway/ll_exec.h"

#include <stdint.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/ll_draft.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "gateway/ll_route.h"
#include "kernel/ll_interp.h"
#include "proto/ll_msgtype.h"
#include "base/ll_check.h"

#define S_PREFETCH_TARGET "looseleaf.prefetch"

/* Knobs, read once (ll_exec.h). */
typedef struct {
    double debounce_ms;    /* a hint waits this long for a newer one */
    double max_wait_ms;    /* ... but no longer than this after the first of a burst */
    double idle_commit_ms; /* idle time before the idle commit; 0: never */
    double slow_commit_ms; /* idle time before the background commit of slow values; 0: never */
    double pool_start_ms;  /* after the kernel starts, connect to (start) the pool; <0: never */
} s_config_t;

/* The pending hint. */
typedef struct {
    char *code;      /* its draft code; NULL when none is pending */
    double at;       /* when it came (ll_clock_ms) */
    double burst_at; /* when the first hint since the last prefetch came */
} s_hint_t;

/* The last prefetch's commit, for the Run of the same code. */
typedef struct {
    char *code;          /* the prefetched code; NULL when nothing is kept */
    json_t *sync;        /* the interpreter's looseleaf_before_gpu answer */
    unsigned long epoch; /* the epoch it was made in */
} s_kept_t;

/* Comm ids open on the looseleaf.prefetch target. */
typedef struct {
    zlist_t *ids; /* of strings (autofree); NULL until the first */
} s_comms_t;

struct ll_exec_t {
    ll_exec_env_t env;   /* the kernel's sockets and callbacks */
    s_config_t cfg;      /* knobs */
    ll_route_t *route;   /* analysis and the pool connection; NULL: routing off */
    s_hint_t hint;       /* edit-time hint waiting out its debounce */
    s_kept_t kept;       /* the last prefetch's commit */
    s_comms_t comms;     /* open looseleaf.prefetch comms */
    unsigned long epoch; /* interpreter requests that may have run user code */
    double commit_at;    /* when user code last ran here (ll_clock_ms), 0 once committed */
    double slow_at;      /* idle since then with slow-to-save values dirty, 0: none left */
    double pool_at;      /* when to start the host pool ahead of the first GPU cell, 0: done */
    json_t *home;        /* {name: {pid, kind, what}}: names living in a worker (coherence.home) */
    pthread_mutex_t dyn_lock; /* guards dyn_pending */
    json_t *dyn_pending;      /* [dynamic] of subshells' cells, for the analysis; dyn_lock */
};

void ll_exec_note_dynamic(ll_exec_t *self, const json_t *dynamic)
{
    if (!self || !json_is_object(dynamic))
        return;
    pthread_mutex_lock(&self->dyn_lock);
    if (!self->dyn_pending)
        self->dyn_pending = json_array();
    json_array_append_new(self->dyn_pending, json_deep_copy(dynamic));
    pthread_mutex_unlock(&self->dyn_lock);
}

/* Main thread, before planning a cell: what subshells' cells bound. */
static void s_take_dynamic(ll_exec_t *self)
{
    pthread_mutex_lock(&self->dyn_lock);
    json_t *pending = self->dyn_pending;
    self->dyn_pending = NULL;
    pthread_mutex_unlock(&self->dyn_lock);
    size_t i;
    json_t *d;
    json_array_foreach(pending, i, d)
        ll_route_note_dynamic(self->route, d);
    json_decref(pending);
}

/* ---- pure pieces ----------------------------------------------------------- */

/* Milliseconds from environment variable NAME, DEF when unset or bad. */
static double s_env_ms(const char *name, double def)
{
    const char *v = getenv(name);
    char *end;
    double ms = v ? strtod(v, &end) : def;
    return v && (end == v || ms < 0) ? def : ms;
}

/* Milliseconds from NOW until DUE, rounded up; 0 once due. */
static long s_ms_until(double due, double now)
{
    double left = due - now;
    return left > 0 ? (long) left + 1 : 0;
}

/* Milliseconds until the background commit of slow-to-save values is due
 * (the kernel idle SLOW_COMMIT_MS since SLOW_AT, and the idle commit done);
 * -1 when none is pending. */
static long s_slow_due_in(double slow_at, double commit_at, const s_config_t *cfg, double now)
{
    if (slow_at <= 0 || commit_at > 0 || cfg->slow_commit_ms <= 0)
        return -1;
    return s_ms_until(slow_at + cfg->slow_commit_ms, now);
}

/* Requests whose handling in the interpreter runs no user code and changes
 * no variable (an edit-time hint, introspection): they leave a kept
 * prefetch commit valid and need no idle commit.  proto/ll_msgtype.c says
 * which. */
static bool s_read_only_request(const char *msg_type)
{
    return ll_msgtype_has(msg_type, LL_MSG_READ_ONLY);
}

/* A newer hint replaces the pending one; the burst starts with the first. */
static void s_hint_note(s_hint_t *h, const char *code, double now)
{
    if (!code)
        return;
    if (!h->code)
        h->burst_at = now;
    free(h->code);
    h->code = strdup(code);
    h->at = now;
}

/* Milliseconds until the pending hint is due; -1 when none is pending. */
static long s_hint_due_in(const s_hint_t *h, const s_config_t *cfg, double now)
{
    if (!h->code)
        return -1;
    double due = h->at + cfg->debounce_ms, cap = h->burst_at + cfg->max_wait_ms;
    return s_ms_until(due < cap ? due : cap, now);
}

/* The pending hint's code (the caller frees it); none is pending after. */
static char *s_hint_take(s_hint_t *h)
{
    char *code = h->code;
    h->code = NULL;
    return code;
}

static void s_hint_drop(s_hint_t *h)
{
    free(s_hint_take(h));
}

/* Milliseconds until the idle commit is due; -1 when none is pending. */
static long s_idle_due_in(double commit_at, const s_config_t *cfg, double now)
{
    if (commit_at <= 0 || cfg->idle_commit_ms <= 0)
        return -1;
    return s_ms_until(commit_at + cfg->idle_commit_ms, now);
}

/* Keep SYNC (a new reference is taken) as the commit for CODE in EPOCH. */
static void s_kept_set(s_kept_t *k, const char *code, json_t *sync, unsigned long epoch)
{
    free(k->code);
    json_decref(k->sync);
    k->code = strdup(code);
    k->sync = json_incref(sync);
    k->epoch = epoch;
}

static void s_kept_forget(s_kept_t *k)
{
    free(k->code);
    k->code = NULL;
    json_decref(k->sync);
    k->sync = NULL;
}

/* The Run of CODE right after its prefetch: when the prefetch was for the
 * same code and no interpreter request since could have changed a variable
 * or the process state (EPOCH unmoved), the kernel's commit for it is still
 * the store's state, so the prefetch's answer serves the Run (a new
 * looseleaf_before_gpu would find nothing to commit, at ~5-20 ms on the
 * visible path).  Returns that answer as the Run reports it (a new object),
 * NULL otherwise.  What was kept is used once either way. */
static json_t *s_kept_take(s_kept_t *k, const char *code, unsigned long epoch)
{
    json_t *sync = NULL;
    if (k->sync && code && k->code && strcmp(code, k->code) == 0 && k->epoch == epoch) {
        sync = json_deep_copy(k->sync);
        json_object_del(sync, "closure_bytes");
        json_object_set_new(sync, "kernel_save_ms", json_real(0));
        json_object_set_new(sync, "kernel_saved", json_array());
        json_object_set_new(sync, "kernel_bytes_saved", json_integer(0));
        json_object_set_new(sync, "kernel_commit_by_prefetch", json_true());
    }
    s_kept_forget(k);
    return sync;
}

/* The entry of COMM_ID among the open prefetch comms, or NULL. */
static char *s_comms_find(s_comms_t *c, const char *comm_id)
{
    for (char *id = c->ids && comm_id ? zlist_first(c->ids) : NULL; id; id = zlist_next(c->ids))
        if (strcmp(id, comm_id) == 0)
            return id;
    return NULL;
}

/* Whether a message of TYPE on COMM_ID (TARGET: a comm_open's target_name)
 * is on a looseleaf.prefetch comm: its comm_open, or a comm_msg / comm_close
 * on one that is open. */
static bool s_comms_is_prefetch(s_comms_t *c, const char *type, const char *comm_id,
                                const char *target)
{
    if (!comm_id)
        return false;
    if (strcmp(type, "comm_open") == 0)
        return target && strcmp(target, S_PREFETCH_TARGET) == 0;
    return (strcmp(type, "comm_msg") == 0 || strcmp(type, "comm_close") == 0) &&
           s_comms_find(c, comm_id);
}

/* Note the open or close of a prefetch comm (TYPE, COMM_ID as above). */
static void s_comms_update(s_comms_t *c, const char *type, const char *comm_id)
{
    if (strcmp(type, "comm_open") == 0) {
        if (!c->ids && (c->ids = zlist_new()))
            zlist_autofree(c->ids);
        if (c->ids)
            zlist_append(c->ids, (void *) comm_id);
    } else if (strcmp(type, "comm_close") == 0) {
        zlist_remove(c->ids, s_comms_find(c, comm_id));
    }
}

/* ---- the interpreter ------------------------------------------------------- */

static bool s_on_prefetch_comm(ll_exec_t *self, const ll_msg_t *req)
{
    return s_comms_is_prefetch(&self->comms, req->msg_type, ll_msg_content_str(req, "comm_id"),
                               ll_msg_content_str(req, "target_name"));
}

/* Hand REQ to the interpreter: content, header and metadata as JSON text,
 * binary buffers (comm messages from widgets) as they came, and ROUTE (an
 * executed cell's plan, JSON text; NULL for other requests).  Returns the
 * reply text (the caller frees it) or NULL; *MD_TEXT gets the reply
 * metadata text or NULL. */
static char *s_interp_call(ll_exec_t *self, const ll_msg_t *req, const char *route, char **md_text)
{
    enum { S_MAX_BUFS = 64 };
    const void *bufs[S_MAX_BUFS];
    size_t lens[S_MAX_BUFS];
    size_t nbufs = 0;
    *md_text = NULL;
    if (req->buffers)
        for (zframe_t *f = zmsg_first(req->buffers); f && nbufs < S_MAX_BUFS;
             f = zmsg_next(req->buffers)) {
            bufs[nbufs] = zframe_data(f);
            lens[nbufs++] = zframe_size(f);
        }
    if (req->buffers && zmsg_size(req->buffers) > S_MAX_BUFS)
        ll_warn("exec", "%s carries %zu buffers; only the first %d are passed on", req->msg_type,
                zmsg_size(req->buffers), S_MAX_BUFS);
    bool user_code = !s_read_only_request(req->msg_type) && !s_on_prefetch_comm(self, req);
    if (user_code)
        self->epoch++;
    char *content = json_dumps(req->content, JSON_COMPACT);
    char *header = json_dumps(req->header, JSON_COMPACT);
    char *metadata = req->metadata ? json_dumps(req->metadata, JSON_COMPACT) : NULL;
    char *reply = NULL;
    if (content && header) {
        ll_interp_request_t r = {.msg_type = req->msg_type,
                                 .content_json = content,
                                 .parent_json = header,
                                 .metadata_json = metadata,
                                 .bufs = bufs,
                                 .buflens = lens,
                                 .nbufs = nbufs,
                                 .route_json = route};
        reply = ll_interp_call(&r, md_text);
    } else {
        ll_error("exec", "cannot serialize a %.64s for the interpreter", req->msg_type);
    }
    /* The idle commit, once the kernel stays idle; only in a session that
     * has a store (it used the host pool, or a restore opened one): a
     * CPU-only notebook's cells cost no extra interpreter call. */
    if (user_code && (ll_route_fd(self->route) >= 0 || ll_interp_store_opened()))
        self->commit_at = self->slow_at = ll_clock_ms();
    free(content);
    free(header);
    free(metadata);
    return reply;
}

/* One of the interpreter's own requests (looseleaf_before_gpu, ...) with
 * CONTENT (borrowed) under REQ's header (REQ NULL: none); the answer as a
 * new object, NULL when it failed (logged). */
static json_t *s_interp_own(const char *msg_type, const json_t *content, const ll_msg_t *req)
{
    char *ctext = json_dumps(content, JSON_COMPACT);
    char *htext = req ? json_dumps(req->header, JSON_COMPACT) : strdup("{}");
    char *out = ctext && htext ? ll_interp_handle(msg_type, ctext, htext, NULL) : NULL;
    free(ctext);
    free(htext);
    json_error_t jerr;
    json_t *reply = out ? json_loads(out, JSON_ALLOW_NUL, &jerr) : NULL;
    free(out);
    if (!json_is_object(reply) || json_object_get(reply, "ename")) {
        ll_error("exec", "%s failed in the interpreter: %s", msg_type,
                 json_string_value(json_object_get(reply, "evalue")));
        json_decref(reply);
        return NULL;
    }
    return reply;
}

/* ---- edit-time prefetch ----------------------------------------------------
 *
 * Requests that carry draft code are hints: complete, inspect and
 * is_complete requests, messages on a looseleaf.prefetch comm, and
 * execute_requests read ahead while a CPU cell is about to run.  The latest
 * hint wins; once its debounce is over (s_hint_due_in) a GPU-labelled hint
 * makes the interpreter commit what CPU cells changed and the host pool
 * prepare the session's worker.  The run re-checks versions, so a stale
 * prefetch costs time, never correctness; abort, stop_on_error and
 * interrupt cancel it. */

void ll_exec_cancel_prefetch(ll_exec_t *self)
{
    ll_route_cancel_prefetch(self->route);
    s_kept_forget(&self->kept);
}

/* The plan of draft CODE: as typed, else (it does not parse: the user is
 * mid-call) with its brackets closed, else without its last line
 * (analysis/ll_draft.c).  The caller frees it. */
static ll_route_plan_t *s_draft_plan(ll_exec_t *self, const char *code)
{
    ll_route_plan_t *plan = ll_route_plan(self->route, code, strlen(code));
    if (ll_route_plan_parsed(plan))
        return plan;
    char *guesses[2] = {ll_draft_closed(code), ll_draft_without_last_line(code)};
    for (int i = 0; i < 2; i++) {
        if (!guesses[i] || ll_route_is_gpu(plan))
            continue;
        ll_route_plan_t *guess = ll_route_plan(self->route, guesses[i], strlen(guesses[i]));
        if (ll_route_is_gpu(guess)) {
            ll_route_plan_free(&plan);
            plan = guess;
        } else {
            ll_route_plan_free(&guess);
        }
    }
    free(guesses[0]);
    free(guesses[1]);
    return plan;
}

/* Prefetch for CODE now, if it is a GPU cell (or, a draft, looks like one). */
static void s_prefetch(ll_exec_t *self, const char *code)
{
    ll_route_plan_t *plan = s_draft_plan(self, code);
    if (ll_route_is_gpu(plan)) {
        json_t *closure = ll_route_plan_closure(plan);
        if (closure) {
            json_object_set_new(closure, "code", json_string(code));
            json_object_set_new(closure, "prefetch", json_true());
        }
        json_t *sync = closure ? s_interp_own("looseleaf_before_gpu", closure, NULL) : NULL;
        json_decref(closure);
        char err[256];
        s_kept_forget(&self->kept);
        if (sync && !json_object_get(sync, "fallback") && !json_object_get(sync, "error")) {
            if (ll_route_prefetch(self->route, plan, sync, err, sizeof err) < 0)
                ll_info("exec", "prefetch not sent: %s", err);
            else
                s_kept_set(&self->kept, code, sync, self->epoch);
        }
        json_decref(sync);
    }
    ll_route_plan_free(&plan);
}

/* Hints carried by REQ, a request the interpreter served. */
static void s_hint_from(ll_exec_t *self, const ll_msg_t *req)
{
    const char *t = req->msg_type;
    if (!self->route)
        return;
    if (strcmp(t, "complete_request") == 0 || strcmp(t, "inspect_request") == 0 ||
        strcmp(t, "is_complete_request") == 0) {
        s_hint_note(&self->hint, ll_msg_content_str(req, "code"), ll_clock_ms());
        return;
    }
    if (!s_on_prefetch_comm(self, req))
        return;
    json_t *data = json_object_get(req->content, "data");
    const char *code = json_string_value(json_object_get(data, "code"));
    s_comms_update(&self->comms, t, ll_msg_content_str(req, "comm_id"));
    if (strcmp(t, "comm_close") != 0)
        s_hint_note(&self->hint, code, ll_clock_ms());
}

/* Before a CPU cell runs: the first execute_request queued behind it ("Run
 * all") gets its worker prepared while this cell runs, if a GPU cell. */
static void s_hint_queued(ll_exec_t *self)
{
    const ll_msg_t *q =
        self->env.next_queued_execute ? self->env.next_queued_execute(self->env.ctx) : NULL;
    const char *code = q ? ll_msg_content_str(q, "code") : NULL;
    if (code && !json_is_true(json_object_get(q->content, "silent")))
        s_prefetch(self, code);
}

/* ---- idle commit -------------------------------------------------------------
 *
 * Once a session has a store (a GPU cell or a prefetch ran), what user code
 * in the interpreter changes (a CPU cell, a widget's callback) is committed
 * when the kernel has stayed idle LOOSELEAF_IDLE_COMMIT_MS after it, so that
 * the next GPU cell's Run finds nothing to commit even when its edit window
 * was too short for a prefetch.  The interpreter leaves out what would make
 * it slow (coherence.commit_idle): those values are committed by the
 * background commit below, a prefetch or the Run.  Runs no user code: a kept prefetch commit stays
 * valid. */

static void s_idle_commit(ll_exec_t *self)
{
    self->commit_at = 0;
    json_t *content = json_object();
    json_t *reply = s_interp_own("looseleaf_commit_idle", content, NULL);
    /* What it left out as slow to save waits for the background commit. */
    if (!json_array_size(json_object_get(reply, "slow")))
        self->slow_at = 0;
    json_decref(reply);
    json_decref(content);
}

/* ---- background commit of slow-to-save values ---------------------------------
 *
 * Once the kernel has stayed idle LOOSELEAF_SLOW_COMMIT_IDLE_S after user
 * code ran, what the idle commit left out as slow to save (big arrays, models,
 * nested containers) is committed too, so that a crash loses nothing a
 * GPU cell's Run would have saved.  It must never delay a cell, so it runs
 * here, on the main thread, in the interpreter (coherence.commit_slow), and
 * gives way: between variables and payloads, and between the 64 MiB pieces
 * of a large payload (each piece a store copy, ~10 ms), it asks the request_waiting
 * hook whether shell has a request, and if so abandons the commit before it
 * is published (a put is private until the commit lists it: store/API.md),
 * giving back what it wrote.  Why not a thread: the cell that arrives would
 * run user code against the very values being copied, so a version could mix
 * old and new bytes; abandoning on the thread that owns shell needs no lock
 * and leaves no window.  Abandoned, it waits for another idle spell. */

static void s_slow_commit(ll_exec_t *self)
{
    json_t *content = json_object();
    json_t *reply = s_interp_own("looseleaf_commit_slow", content, NULL);
    json_decref(content);
    if (reply && json_is_true(json_object_get(reply, "abandoned")))
        self->slow_at = ll_clock_ms(); /* a request came: after it, a fresh idle spell */
    else
        self->slow_at = 0; /* done, or failed: the Run commits those, as before */
    json_decref(reply);
}

/* ---- homes -------------------------------------------------------------------
 *
 * A value a worker made that no store can hold lives on in that worker, the
 * session's home for it (zygote/py/looseleaf_zygote/zyg.py); the
 * interpreter's coherence keeps which names those are and tells us with
 * every answer that may change them (looseleaf_after_gpu, a CPU cell's
 * metadata, looseleaf_home_lost).  A cell that reads one runs there. */

/* The interpreter's answer OBJ (borrowed) carries the session's homes:
 * they replace ours. */
static void s_home_set(ll_exec_t *self, const json_t *obj)
{
    json_t *home = json_object_get(obj, "home");
    if (json_is_object(home)) {
        json_decref(self->home);
        self->home = json_incref(home);
    }
}

/* The pool said workers of the session went: the interpreter marks what
 * they held as lost (a later read raises LostVariable naming why). */
static void s_home_sync(ll_exec_t *self)
{
    json_t *gone = ll_route_take_gone(self->route);
    if (!gone)
        return;
    json_t *content = json_pack("{s:o}", "gone", gone);
    json_t *reply = content ? s_interp_own("looseleaf_home_lost", content, NULL) : NULL;
    s_home_set(self, reply);
    json_decref(reply);
    json_decref(content);
}

/* ---- execute ---------------------------------------------------------------- */

/* A GPU cell's worker listens for the debugger (CONTENT: where): the
 * kernel's debugger attaches and replays the session's breakpoints, on this
 * thread, while the cell waits for it. */
static void s_debug_worker(const json_t *content)
{
    json_decref(s_interp_own("looseleaf_debug_worker", content, NULL));
}

/* Run a GPU-labelled cell on a worker.  True with *REPLY_P / *MD_P set when
 * it ran there; false when it must run in the interpreter instead, *WHY_P
 * saying why (for the notice and the metadata), or must fail there without
 * running, *FAIL_P its error ({ename, evalue}: the store did not answer, an
 * interrupt came while the kernel committed). */
static bool s_execute_on_worker(ll_exec_t *self, ll_msg_t *req, ll_route_plan_t *plan, double t_run,
                                json_t **reply_p, json_t **md_p, json_t **why_p, json_t **fail_p)
{
    const char *code = json_string_value(json_object_get(req->content, "code"));
    json_t *sync = s_kept_take(&self->kept, code, self->epoch);
    if (!sync) {
        json_t *closure = ll_route_plan_closure(plan);
        if (closure)
            json_object_set(closure, "code", json_object_get(req->content, "code"));
        sync = closure ? s_interp_own("looseleaf_before_gpu", closure, req) : NULL;
        json_decref(closure);
    }
    if (!sync) {
        *why_p = json_string("the kernel could not prepare the cell's variables");
        return false;
    }
    json_t *fail = json_object_get(sync, "error");
    if (json_is_object(fail)) {
        *fail_p = json_incref(fail);
        json_decref(sync);
        return false;
    }
    const char *fallback = json_string_value(json_object_get(sync, "fallback"));
    if (fallback) {
        *why_p = json_string(fallback);
        json_decref(sync);
        return false;
    }
    /* The session's debugger on: the worker runs the cell under it, the
     * kernel's debugger attached (looseleaf_kernel/debugger.py). */
    json_t *none = json_object();
    json_t *dbg = s_interp_own("looseleaf_debug_gpu", none, req);
    json_decref(none);
    if (json_is_object(json_object_get(dbg, "debug")))
        json_object_set(sync, "debug", json_object_get(dbg, "debug"));
    json_decref(dbg);
    ll_route_io_t io = {.iopub = self->env.iopub,
                        .stdin_chan = self->env.stdin_chan,
                        .intr_fd = self->env.intr_fd,
                        .stopping = self->env.stopping,
                        .t_run = t_run,
                        .shell_handle = self->env.shell_handle,
                        .shell_readable = self->env.shell_readable,
                        .ctx = self->env.ctx,
                        .debug_worker = s_debug_worker};
    char err[512];
    uint64_t v; /* an interrupt from before this cell is not for it */
    ssize_t r = read(self->env.intr_fd, &v, sizeof v);
    (void) r;
    if (ll_route_run_gpu(self->route, plan, req, sync, &io, reply_p, md_p, err, sizeof err) < 0) {
        *why_p = json_sprintf("the GPU pool is unavailable (%s)", err);
        json_decref(sync);
        return false;
    }
    /* History, counter and deletions follow the worker (coherence.after_gpu). */
    json_t *wmd = json_object_get(*md_p, "looseleaf");
    json_t *sh = json_object_get(req->content, "store_history");
    json_t *saved = json_object_get(wmd, "saved"), *deleted = json_object_get(wmd, "deleted");
    json_t *after =
        json_pack("{s:b, s:O, s:O, s:O, s:O}", "store_history", !sh || json_is_true(sh), "code",
                  json_object_get(req->content, "code"), "execution_count",
                  json_object_get(sync, "execution_count"), "saved", saved ? saved : json_array(),
                  "deleted", deleted ? deleted : json_array());
    /* The commit the store must hold from now on (coherence._lost_data). */
    if (json_is_integer(json_object_get(wmd, "committed")))
        json_object_set(after, "committed", json_object_get(wmd, "committed"));
    /* What the worker is the session's home for, now. */
    if (json_is_object(json_object_get(wmd, "home"))) {
        json_object_set(after, "home", json_object_get(wmd, "home"));
        json_object_set(after, "worker_pid", json_object_get(wmd, "worker_pid"));
    }
    /* The saved values' types and dir() lists, for completion without a
     * restore (coherence.complete_view); kept out of the reply's metadata. */
    if (json_is_object(json_object_get(wmd, "shapes")))
        json_object_set(after, "shapes", json_object_get(wmd, "shapes"));
    json_object_del(wmd, "shapes");
    /* Without the worker's account of what it committed (it died, the pool
     * went away), the kernel compares versions before its next CPU cell. */
    json_object_set_new(after, "unknown", json_boolean(!json_is_array(saved)));
    self->epoch++; /* history, counter, the worker's commit: a kept prefetch commit is stale */
    json_t *done = s_interp_own("looseleaf_after_gpu", after, req);
    s_home_set(self, done);
    json_decref(done);
    /* The idle commit also brings the cell's result into the output history,
     * in idle time rather than before this reply (coherence.install_outputs). */
    self->commit_at = ll_clock_ms();
    json_decref(after);
    /* store_history=False: the counter did not move, as the interpreter
     * would reply (the worker's IPython counted the cell). */
    json_t *count = json_object_get(sync, "execution_count");
    if (sh && !json_is_true(sh) && json_is_integer(count) && json_is_object(*reply_p))
        json_object_set_new(*reply_p, "execution_count",
                            json_integer(json_integer_value(count) - 1));
    /* The kernel's part of the preparation, next to the worker's. */
    json_t *ll = ll_route_plan_json(plan, "gpu");
    if (json_is_object(wmd))
        json_object_update(ll, wmd);
    const char *keys[] = {"kernel_save_ms", "kernel_bytes_saved", "kernel_saved",
                          "kernel_commit_by_prefetch"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (json_object_get(sync, keys[i]))
            json_object_set(ll, keys[i], json_object_get(sync, keys[i]));
    json_object_set_new(*md_p, "looseleaf", ll);
    json_decref(sync);
    return true;
}

/* The plan the interpreter gets with a CPU cell (JSON text, the caller
 * frees it; NULL without a plan): the closure, and when a cell meant for a
 * worker (a GPU cell, or one reading what a worker holds) runs here
 * instead (WHY_NOT), the one-line notice it prints after its
 * execute_input, or when it must fail without running (FAIL), its error. */
static char *s_route_text(const ll_route_plan_t *plan, const json_t *why_not, json_t *fail)
{
    json_t *closure = plan ? ll_route_plan_closure(plan) : NULL;
    if (!closure)
        return NULL;
    if (fail)
        json_object_set(closure, "raise", fail);
    if (why_not)
        json_object_set_new(closure, "notice",
                            json_sprintf("LooseLeaf: %s; this %scell runs in the kernel\n",
                                         json_string_value(why_not),
                                         ll_route_is_gpu(plan) ? "GPU " : ""));
    char *text = json_dumps(closure, JSON_COMPACT);
    json_decref(closure);
    return text;
}

void ll_exec_execute(ll_exec_t *self, ll_msg_t *req, json_t **reply_p, json_t **md_p)
{
    json_t *code = json_object_get(req->content, "code");
    bool silent = json_is_true(json_object_get(req->content, "silent"));
    double t_run = ll_clock_ms();
    s_hint_drop(&self->hint); /* the Run itself supersedes a hint still waiting */
    self->commit_at = 0;      /* and commits itself what an idle commit would have */
    s_take_dynamic(self);
    ll_route_plan_t *plan =
        self->route ? ll_route_plan(self->route, json_string_value(code), json_string_length(code))
                    : NULL;
    json_t *reply = NULL, *md = NULL, *why_not = NULL, *fail = NULL;
    ll_route_poll(self->route); /* the pool's news first: a home worker that went */
    s_home_sync(self);
    /* A cell reading a name whose value lives in the session's home worker
     * runs there, whatever its label.  Silent cells are the frontend's own
     * (%config, widget set-up): they stay in the interpreter. */
    bool to_home = plan && ll_route_plan_reads(plan, self->home);
    bool on_worker = plan && (ll_route_is_gpu(plan) || to_home) && !silent &&
                     s_execute_on_worker(self, req, plan, t_run, &reply, &md, &why_not, &fail);
    if (!on_worker) {
        if (plan && !silent && !fail)
            s_hint_queued(self);
        /* execute_input is published by the interpreter, which knows
         * IPython's execution_count before the cell runs. */
        char *route = s_route_text(plan, why_not, fail);
        char *md_text = NULL;
        char *reply_text = s_interp_call(self, req, route, &md_text);
        free(route);
        json_error_t jerr;
        reply = reply_text ? json_loads(reply_text, JSON_ALLOW_NUL, &jerr) : NULL;
        md = md_text ? json_loads(md_text, 0, &jerr) : NULL;
        free(reply_text);
        free(md_text);
    }
    if (plan) {
        if (!json_is_object(md)) {
            json_decref(md);
            md = json_object();
        }
        if (!on_worker) {
            /* The plan, plus the interpreter's refresh and timing. */
            json_t *ll = ll_route_plan_json(plan, fail ? "none" : "cpu");
            json_t *interp_ll = json_object_get(md, "looseleaf");
            if (json_is_object(interp_ll))
                json_object_update_missing(ll, interp_ll);
            if (why_not)
                json_object_set(ll, "fallback", why_not);
            if (fail)
                json_object_set(ll, "failed", fail);
            json_object_set_new(md, "looseleaf", ll);
            s_home_set(self, ll); /* the cell may have bound a name a worker held */
        } else if (to_home) {
            json_object_set_new(json_object_get(md, "looseleaf"), "to_home", json_true());
        }
        /* What the namespace showed the cell bound beyond its analysis:
         * for the session, not for the frontend. */
        json_t *ll = json_object_get(md, "looseleaf");
        json_t *dynamic = json_incref(json_object_get(ll, "dynamic"));
        json_object_del(ll, "dynamic");
        ll_route_done(self->route, &plan, dynamic);
        json_decref(dynamic);
    }
    json_decref(why_not);
    json_decref(fail);
    *reply_p = reply;
    *md_p = md;
}

char *ll_exec_request(ll_exec_t *self, const ll_msg_t *req, char **md_text)
{
    char *reply = s_interp_call(self, req, NULL, md_text);
    s_hint_from(self, req);
    return reply;
}

/* ---- the shell loop's side ---------------------------------------------------- */

void ll_exec_interrupted(ll_exec_t *self)
{
    s_hint_drop(&self->hint);
    ll_exec_cancel_prefetch(self);
}

int ll_exec_fd(ll_exec_t *self)
{
    return ll_route_fd(self->route);
}

long ll_exec_timeout(ll_exec_t *self)
{
    double now = ll_clock_ms();
    long h = s_hint_due_in(&self->hint, &self->cfg, now);
    long c = s_idle_due_in(self->commit_at, &self->cfg, now);
    long sl = s_slow_due_in(self->slow_at, self->commit_at, &self->cfg, now);
    if (sl >= 0 && (c < 0 || sl < c))
        c = sl;
    long p = self->pool_at > 0 ? s_ms_until(self->pool_at, now) : -1;
    long t = h < 0 ? c : c < 0 ? h : h < c ? h : c;
    return t < 0 ? p : p < 0 ? t : p < t ? p : t;
}

void ll_exec_on_fd(ll_exec_t *self)
{
    ll_route_poll(self->route); /* prefetch answers, stats */
}

bool ll_exec_on_timer(ll_exec_t *self, bool shell_waiting)
{
    double now = ll_clock_ms();
    if (s_hint_due_in(&self->hint, &self->cfg, now) == 0) {
        char *code = s_hint_take(&self->hint);
        s_prefetch(self, code);
        free(code);
        return true;
    }
    if (!shell_waiting && s_idle_due_in(self->commit_at, &self->cfg, now) == 0) {
        s_idle_commit(self);
        return true;
    }
    if (!shell_waiting && s_slow_due_in(self->slow_at, self->commit_at, &self->cfg, now) == 0) {
        s_slow_commit(self);
        return true;
    }
    if (!shell_waiting && self->pool_at > 0 && s_ms_until(self->pool_at, now) == 0) {
        /* The pool's base zygote imports torch and the rest of its head
         * (seconds) while the user writes the first GPU cell. */
        self->pool_at = 0;
        char err[256];
        if (ll_route_connect(self->route, err, sizeof err) < 0)
            ll_info("exec", "host pool not started ahead: %s", err);
        return true;
    }
    return false;
}

json_t *ll_exec_pool_stats(ll_exec_t *self, int timeout_ms)
{
    return self ? ll_route_stats(self->route, timeout_ms) : NULL;
}

json_t *ll_exec_usage(void)
{
    return ll_route_usage();
}

/* ---- life ------------------------------------------------------------------------ */

static s_config_t s_config_read(void)
{
    s_config_t cfg = {.debounce_ms = s_env_ms("LOOSELEAF_PREFETCH_DEBOUNCE_MS", 250),
                      .max_wait_ms = s_env_ms("LOOSELEAF_PREFETCH_MAX_WAIT_MS", 1000),
                      .idle_commit_ms = s_env_ms("LOOSELEAF_IDLE_COMMIT_MS", 250),
                      .slow_commit_ms = 1000 * s_env_ms("LOOSELEAF_SLOW_COMMIT_IDLE_S", 5),
                      .pool_start_ms = s_env_ms("LOOSELEAF_POOL_START_MS", -1)};
    return cfg;
}

ll_exec_t *ll_exec_new(const ll_exec_env_t *env)
{
    ll_exec_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->env = *env;
    pthread_mutex_init(&self->dyn_lock, NULL);
    self->cfg = s_config_read();
    if (ll_route_enabled()) {
        char err[256];
        self->route = ll_route_new(err, sizeof err);
        if (!self->route)
            ll_warn("exec", "GPU routing is off: the cell analysis cannot start: %s", err);
    }
    if (self->route && self->cfg.pool_start_ms >= 0)
        self->pool_at = ll_clock_ms() + self->cfg.pool_start_ms + 1;
    return self;
}

void ll_exec_destroy(ll_exec_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_exec_t *self = *self_p;
    json_decref(self->dyn_pending);
    pthread_mutex_destroy(&self->dyn_lock);
    ll_route_destroy(&self->route);
    s_hint_drop(&self->hint);
    s_kept_forget(&self->kept);
    zlist_destroy(&self->comms.ids);
    json_decref(self->home);
    free(self);
    *self_p = NULL;
}

/* ---- self-test: the decisions, scripted ------------------------------------------- */

int ll_exec_selftest(bool verbose)
{
    s_hint_t h = {0};
    s_kept_t k = {0};
    s_comms_t c = {0};
    json_t *sync = NULL, *got = NULL;
    const s_config_t cfg = {.debounce_ms = 250, .max_wait_ms = 1000, .idle_commit_ms = 250};

    /* Which requests may run user code. */
    S_REQUIRE(s_read_only_request("complete_request") && s_read_only_request("history_request"),
              fail);
    S_REQUIRE(!s_read_only_request("execute_request") && !s_read_only_request("comm_msg"), fail);

    /* A hint waits out the debounce; a newer one restarts it ... */
    S_REQUIRE(s_hint_due_in(&h, &cfg, 0) == -1, fail);
    s_hint_note(&h, "a", 1000);
    S_REQUIRE(s_hint_due_in(&h, &cfg, 1000) == 251, fail);
    S_REQUIRE(s_hint_due_in(&h, &cfg, 1249.5) == 1 && s_hint_due_in(&h, &cfg, 1250) == 0, fail);
    s_hint_note(&h, "b", 1200);
    S_REQUIRE(s_hint_due_in(&h, &cfg, 1250) > 0 && s_hint_due_in(&h, &cfg, 1450) == 0, fail);
    /* ... but a burst that never pauses is due MAX_WAIT after its first hint. */
    for (double t = 1300; t <= 1900; t += 100)
        s_hint_note(&h, "typing", t);
    S_REQUIRE(s_hint_due_in(&h, &cfg, 1999) == 2 && s_hint_due_in(&h, &cfg, 2000) == 0, fail);
    char *code = s_hint_take(&h);
    S_REQUIRE(code && strcmp(code, "typing") == 0 && s_hint_due_in(&h, &cfg, 2000) == -1, fail);
    free(code);
    s_hint_note(&h, "next", 5000); /* a new burst */
    S_REQUIRE(s_hint_due_in(&h, &cfg, 5000) == 251, fail);
    s_hint_note(&h, NULL, 5100); /* a request without code changes nothing */
    S_REQUIRE(s_hint_due_in(&h, &cfg, 5000) == 251, fail);
    s_hint_drop(&h);

    /* The idle commit: only after user code ran, never when switched off. */
    S_REQUIRE(s_idle_due_in(0, &cfg, 100) == -1, fail);
    S_REQUIRE(s_idle_due_in(100, &cfg, 100) == 251 && s_idle_due_in(100, &cfg, 350) == 0, fail);
    const s_config_t off = {.idle_commit_ms = 0};
    S_REQUIRE(s_idle_due_in(100, &off, 1000) == -1, fail);
    /* The background commit: after the idle commit, SLOW_COMMIT_MS idle. */
    const s_config_t sc = {.idle_commit_ms = 250, .slow_commit_ms = 5000};
    S_REQUIRE(s_slow_due_in(0, 0, &sc, 100) == -1 && s_slow_due_in(100, 100, &sc, 9000) == -1,
              fail);
    S_REQUIRE(s_slow_due_in(100, 0, &sc, 200) == 4901 && s_slow_due_in(100, 0, &sc, 5100) == 0,
              fail);
    S_REQUIRE(s_slow_due_in(100, 0, &off, 9000) == -1, fail);

    /* A kept prefetch commit serves the Run of the same code in the same
     * epoch, once; another code or a moved epoch finds nothing. */
    sync = json_pack("{s:s, s:i, s:i}", "session", "s1", "execution_count", 3, "closure_bytes", 9);
    s_kept_set(&k, "x = t * 2", sync, 7);
    S_REQUIRE(!s_kept_take(&k, "x = t * 3", 7) && !k.sync, fail); /* used once, even unmatched */
    s_kept_set(&k, "x = t * 2", sync, 7);
    S_REQUIRE(!s_kept_take(&k, "x = t * 2", 8), fail);
    s_kept_set(&k, "x = t * 2", sync, 7);
    got = s_kept_take(&k, "x = t * 2", 7);
    S_REQUIRE(got && json_is_true(json_object_get(got, "kernel_commit_by_prefetch")), fail);
    S_REQUIRE(!json_object_get(got, "closure_bytes") &&
                  json_integer_value(json_object_get(got, "execution_count")) == 3,
              fail);
    S_REQUIRE(!s_kept_take(&k, "x = t * 2", 7), fail);

    /* Prefetch comms: the open on the target, then messages on that comm
     * only, until it closes. */
    S_REQUIRE(!s_comms_is_prefetch(&c, "comm_open", "c1", "jupyter.widget"), fail);
    S_REQUIRE(s_comms_is_prefetch(&c, "comm_open", "c1", S_PREFETCH_TARGET), fail);
    s_comms_update(&c, "comm_open", "c1");
    S_REQUIRE(s_comms_is_prefetch(&c, "comm_msg", "c1", NULL), fail);
    S_REQUIRE(!s_comms_is_prefetch(&c, "comm_msg", "c2", NULL), fail);
    S_REQUIRE(!s_comms_is_prefetch(&c, "comm_msg", NULL, NULL), fail);
    S_REQUIRE(s_comms_is_prefetch(&c, "comm_close", "c1", NULL), fail);
    s_comms_update(&c, "comm_close", "c1");
    S_REQUIRE(!s_comms_is_prefetch(&c, "comm_msg", "c1", NULL), fail);

    json_decref(got);
    json_decref(sync);
    zlist_destroy(&c.ids);
    if (verbose)
        printf("(hints, idle commit, kept commit, prefetch comms) ");
    return 0;
fail:
    s_hint_drop(&h);
    s_kept_forget(&k);
    json_decref(got);
    json_decref(sync);
    zlist_destroy(&c.ids);
    return -1;
}
