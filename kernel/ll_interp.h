/* ll_interp: the persistent embedded Python interpreter that runs CPU cells
 * (and, in workers, GPU cells) with IPython's InteractiveShell.
 *
 * This is the contract between the gateway (C: sockets, signing, threads) and
 * the interpreter (CPython embedded through PyConfig + the Python package
 * kernel/py/looseleaf_kernel).  Requests cross as JSON text so neither side
 * depends on the other's object model; the hot path (stream output) crosses
 * as raw bytes.
 *
 * Threads: ll_interp_init/handle/finalize run on one thread, the gateway's
 * shell thread; it becomes Python's main thread (where signal handlers, hence
 * KeyboardInterrupt, run).  ll_interp_call may also run on a subshell's
 * thread, concurrently (the GIL is shared): interrupts never reach it and it
 * leaves the busy flag to the interpreter thread.  Between requests the GIL is released, so Python
 * threads of the user keep running while the kernel is idle.
 * ll_interp_interrupt may be called from any thread or from a signal handler.
 * The hooks are called by Python code on whatever thread it runs (user
 * threads too), so they must be thread-safe.
 *
 * Signals: ll_interp_init ignores SIGPIPE if it was at its default, and
 * installs a no-op handler for SIGRTMIN+3, which ll_interp_interrupt sends to
 * the shell thread so a blocking call there (time.sleep, and the gateway's
 * own wait inside input_request) returns EINTR at once.  The SIGINT action
 * of the process stays the caller's.
 *
 * After fork() in a child (multiprocessing, os.fork in a cell), and once
 * ll_interp_finalize has run the exit handlers, the hooks are not called:
 * stream text goes straight to fds 1/2, publications are dropped, input
 * requests fail.  So the caller may free what its hooks use after
 * ll_interp_finalize returns, even if Python threads live on. */
#ifndef LL_INTERP_H
#define LL_INTERP_H

#include <stdbool.h>
#include <stddef.h>

/* How the interpreter reaches the outside world; implemented by the gateway. */
typedef struct {
    void *ctx; /* passed back to every hook */

    /* Append DATA to stream NAME ("stdout" or "stderr").  Coalesced and sent
     * by the gateway; never blocks on the network.  Thread-safe. */
    void (*stream_write)(void *ctx, const char *name, const char *data, size_t len);

    /* Send any buffered stream text now (called before a display/result so
     * output keeps its order, and at the end of each cell). */
    void (*stream_flush)(void *ctx);

    /* Publish an iopub message (display_data, update_display_data,
     * clear_output, execute_result, error, comm_open/msg/close, ...) under the
     * current request's parent header.  CONTENT_JSON and METADATA_JSON are
     * JSON object texts (METADATA_JSON may be NULL).  Flushes streams first.
     * BUFS/BUFLENS/NBUFS are optional binary buffers.  Thread-safe. */
    void (*publish)(void *ctx, const char *msg_type, const char *content_json,
                    const char *metadata_json, const void *const *bufs, const size_t *buflens,
                    size_t nbufs);

    /* Ask the frontend for one line on the stdin channel and block until the
     * reply.  Called with the GIL released, on the thread that runs the cell
     * (ll_interp_interrupt makes its blocking wait return EINTR).  Returns a
     * malloc'd string (the frontend's "\x04" means EOF), or NULL with
     * *ERR = 1 (interrupted) or 2 (stdin not allowed / no frontend). */
    char *(*input_request)(void *ctx, const char *prompt, bool password, int *err);

    /* The host pool's state for this kernel (for %looseleaf): a
     * malloc'd JSON object text (the pool's `stats` answer), or NULL when
     * there is no pool connection.  Called on the interpreter's thread with
     * the GIL released.  May be NULL. */
    char *(*pool_stats)(void *ctx);

    /* Whether a request waits on shell (read ahead, never taken): the
     * background commit of slow-to-save values gives way to it.  Called on
     * the interpreter's thread (the main thread, which owns shell) with the
     * GIL held; must not block.  May be NULL (then: never). */
    bool (*request_waiting)(void *ctx);
} ll_interp_hooks_t;

/* FD (an eventfd of interrupts, borrowed: it must outlive the interpreter)
 * becomes readable when the running cell is interrupted: code that waits
 * outside Python (the checkpoint store waiting for Redis) ends its wait on
 * it.  Python sees it as _looseleaf_kernel.interrupt_fd(); -1 (the
 * default): none. */
void ll_interp_set_interrupt_fd(int fd);

/* Whether the interpreter opened the session's checkpoint store (Python's
 * _looseleaf_kernel.store_opened(), from coherence.py): then the gateway
 * commits what CPU cells change when idle, even in a session that never
 * connected to the host pool (one restored after a crash). */
bool ll_interp_store_opened(void);

/* Register a builtin extension module (PyImport_AppendInittab) so Python
 * code in the interpreter can import it.  Only before ll_interp_init; NAME
 * must stay valid for the life of the process (a string literal).  INITFUNC
 * is the module's PyInit function (returns PyObject *). */
int ll_interp_add_builtin(const char *name, void *(*initfunc)(void) );

/* Start CPython from PyConfig exactly as ll_interp_init does (every status
 * checked; PYTHON* environment variables ignored, so another interpreter's
 * PYTHONHOME cannot break us; sys.executable and the prefix are the system
 * Python the build used; ARGV0 becomes sys.argv[0], "looseleaf" when NULL),
 * but nothing more: no IPython, no hooks, no package path, PYTHONPATH not
 * added.  For programs that only need Python (`looseleaf analyze`, the
 * analysis benchmark).  Returns with the GIL held; 0 at once when Python is
 * already running.  0, or -1 with a reason in ERR. */
int ll_interp_start_python(const char *argv0, char *err, size_t errlen);

/* Start CPython (ll_interp_start_python), import looseleaf_kernel and
 * create the shell.  ARGV0 becomes sys.argv[0]; sys.executable is the system
 * Python the build used.  PYTHON* environment variables are ignored (another
 * interpreter's PYTHONHOME cannot break us) except PYTHONPATH, which is added
 * to sys.path.  The package comes from LOOSELEAF_PYTHONPATH (':'-separated)
 * if set, else the source tree (kernel/py, store/py, zygote/py).  HOOKS is copied; its
 * functions may be NULL (a zygote: text to fds 1/2, no publications, no
 * input).  Takes a few hundred ms (IPython's import).  Returns 0, or -1 with
 * a reason in ERR. */
int ll_interp_init(const char *argv0, const ll_interp_hooks_t *hooks, char *err, size_t errlen);

/* One request for the interpreter (kernel/py/looseleaf_kernel/API.md).
 * Every pointer is borrowed for the call. */
typedef struct {
    const char *msg_type;      /* the Jupyter request type (execute_request,
                                * complete_request, comm_msg, ...) or one of
                                * the kernel's own (looseleaf_before_gpu, ...) */
    const char *content_json;  /* the request's content, a JSON object text */
    const char *parent_json;   /* the request's full header; NULL: {} */
    const char *metadata_json; /* the request's metadata; NULL: {} */
    const void *const *bufs;   /* binary buffers (a comm_msg from ipywidgets' */
    const size_t *buflens;     /*   FileUpload carries the file), copied; */
    size_t nbufs;              /*   NBUFS may be 0 */
    const char *route_json;    /* execute_request under GPU routing: the cell's
                                * plan (closure, notice) for coherence.py;
                                * NULL otherwise */
} ll_interp_request_t;

/* Handle REQ in Python.  Returns the reply's content as JSON text the
 * caller frees (NULL for messages that have no reply, e.g. comm_msg), and
 * when *REPLY_METADATA_JSON is non-NULL on return, a JSON object text for the
 * reply's metadata, which the caller frees too (REPLY_METADATA_JSON may be
 * NULL).  Never lets a
 * Python exception escape: an internal failure becomes an error reply. */
char *ll_interp_call(const ll_interp_request_t *req, char **reply_metadata_json);

/* ll_interp_call of a request with only MSG_TYPE, CONTENT_JSON and
 * PARENT_JSON. */
char *ll_interp_handle(const char *msg_type, const char *content_json, const char *parent_json,
                       char **reply_metadata_json);

/* Serve one debug_request (the Debug Adapter Protocol request REQUEST_JSON,
 * a debug_request's content) with looseleaf_kernel.debugger: the gateway's
 * control thread calls it while a cell may run, or be stopped at a
 * breakpoint, on the interpreter thread (it takes the GIL the way any Python
 * thread does; the DAP traffic itself waits with the GIL released).  Returns
 * the debug_reply content as JSON text the caller frees, or NULL when the
 * interpreter is gone or failed (logged). */
char *ll_interp_debug(const char *request_json);

/* A thread other than the interpreter's that called ll_interp_call is
 * ending: the Python thread state it kept since its first call goes.  Call
 * it on that thread, before Python is finalized. */
void ll_interp_thread_end(void);

/* Make the code now running raise KeyboardInterrupt; a no-op when idle.
 * Async-signal-safe. */
void ll_interp_interrupt(void);

/* Whether a cell is running right now. */
bool ll_interp_busy(void);

/* Fork the process that runs the interpreter, the way CPython needs it done
 * (GIL taken, PyOS_BeforeFork, fork, PyOS_AfterFork_Parent/Child): for a
 * zygote making a worker.  The calling thread becomes the child's Python
 * main thread.  In the child the hooks stay off (as after any fork) until
 * ll_interp_set_hooks.  Returns fork()'s result (-1 with errno on failure). */
int ll_interp_fork(void);

/* Make HOOKS this process's hooks and the calling thread the interpreter
 * thread (interrupts land there): in a child made by ll_interp_fork, before
 * it starts other threads or runs requests.  Returns 0, -1 if not started. */
int ll_interp_set_hooks(const ll_interp_hooks_t *hooks);

/* Stop the interpreter (atexit handlers run, history saved). */
void ll_interp_finalize(void);

/* The shutdown_request that ends the kernel asked for a restart: the
 * finalization tells looseleaf_kernel.shutdown(restart=True), which keeps a
 * notebook's store for the next kernel (keep.py).  Any thread. */
void ll_interp_set_restart(bool restart);

#endif
