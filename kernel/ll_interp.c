/* ll_interp: CPython embedded through PyConfig, running IPython's shell from
 * the Python package kernel/py/looseleaf_kernel.
 *
 * Runs in the kernel process (and later in GPU workers).  ll_interp_init,
 * ll_interp_handle and ll_interp_finalize must be called on one thread (the
 * gateway's shell thread): that thread becomes Python's main thread, the only
 * one on which Python runs signal handlers, so it is where KeyboardInterrupt
 * lands.  Between requests the GIL is released, so Python threads started by
 * user code (and IPython's history writer) keep running while the kernel is
 * idle.
 *
 * The outside world is reached only through the hooks (ll_interp_hooks_t),
 * which Python sees as the builtin module `_looseleaf_kernel`.  Nothing here
 * knows about sockets.
 *
 * Interrupts: ll_interp_interrupt trips Python's SIGINT flag
 * (PyErr_SetInterruptEx, async-signal-safe) and then sends LL_WAKE_SIGNAL to
 * the interpreter thread, whose handler does nothing: its only job is to make
 * a blocking system call (time.sleep, select, a read) return EINTR, so Python
 * checks its signal flags and raises KeyboardInterrupt at once instead of
 * after the call.  Python's own SIGINT handler is installed at the Python
 * level only: the process-level SIGINT action stays whatever the program set
 * (the gateway's handler), so a SIGINT that arrives while idle is ignored
 * instead of raising in the next cell.
 *
 * After fork() in a child (multiprocessing, os.fork in a cell) the hooks
 * belong to the parent's threads; the child writes its stream text straight
 * to file descriptors 1 and 2 (which the gateway captures) and drops
 * publications. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernel/ll_interp.h"
#include "kernel/ll_pyenv.h"
#include "base/ll_log.h"
#include "proto/ll_msgtype.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LL_SRCDIR
#define LL_SRCDIR "."
#endif

/* The signal that wakes the interpreter thread out of a blocking call. */
#define LL_WAKE_SIGNAL (SIGRTMIN + 3)

#define LL_MAX_BUILTINS 16

static ll_interp_hooks_t s_hooks;    /* copy of the gateway's hooks */
static bool s_initialized;           /* between init and finalize */
static atomic_bool s_busy;           /* a cell's code is running (set by Python) */
static atomic_bool s_hooks_off;      /* fork()ed child, or finalizing: no hooks */
static pthread_t s_thread;           /* the interpreter (Python main) thread */
static PyThreadState *s_main_tstate; /* its thread state */
static PyObject *s_handle_fn;        /* looseleaf_kernel.handle */
/* ll_interp_debug runs on the gateway's control thread while a cell may run
 * on the interpreter thread; the lock orders it against finalization, which
 * sets s_debug_closed first (never while holding the GIL: a debug call in
 * flight needs the GIL to finish). */
static pthread_mutex_t s_debug_lock = PTHREAD_MUTEX_INITIALIZER;
static bool s_debug_closed; /* under s_debug_lock */
static int s_nbuiltins;     /* builtins registered so far */

/* ------------------------------------------------------------------ */
/* Builtin module _looseleaf_kernel: the hooks as Python functions.   */

static void s_fd_write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        data += n;
        len -= (size_t) n;
    }
}

static void s_stream_out(const char *name, const char *data, size_t len)
{
    if (atomic_load_explicit(&s_hooks_off, memory_order_relaxed) || !s_hooks.stream_write)
        s_fd_write_all(strcmp(name, "stderr") == 0 ? 2 : 1, data, len);
    else
        s_hooks.stream_write(s_hooks.ctx, name, data, len);
}

/* Write the text of the str TEXT to stream NAME; returns len(text) like
 * io.TextIOBase.write. */
static PyObject *s_write_text(const char *name, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "write() argument must be str, not %.100s",
                     Py_TYPE(text)->tp_name);
        return NULL;
    }
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &size);
    PyObject *tmp = NULL;
    if (!utf8) {
        /* Lone surrogates (e.g. from surrogateescape'd file names): keep the
         * text, replacing what UTF-8 cannot carry. */
        PyErr_Clear();
        tmp = PyUnicode_AsEncodedString(text, "utf-8", "replace");
        if (!tmp)
            return NULL;
        utf8 = PyBytes_AS_STRING(tmp);
        size = PyBytes_GET_SIZE(tmp);
    }
    if (size > 0)
        s_stream_out(name, utf8, (size_t) size);
    Py_XDECREF(tmp);
    return PyLong_FromSsize_t(PyUnicode_GET_LENGTH(text));
}

static PyObject *s_py_stream_write(PyObject *self, PyObject *args)
{
    const char *name;
    PyObject *text;
    if (!PyArg_ParseTuple(args, "sO:stream_write", &name, &text))
        return NULL;
    return s_write_text(name, text);
}

static PyObject *s_py_stdout_write(PyObject *self, PyObject *text)
{
    return s_write_text("stdout", text);
}

static PyObject *s_py_stderr_write(PyObject *self, PyObject *text)
{
    return s_write_text("stderr", text);
}

static PyObject *s_py_stream_flush(PyObject *self, PyObject *unused)
{
    if (!atomic_load(&s_hooks_off) && s_hooks.stream_flush)
        s_hooks.stream_flush(s_hooks.ctx);
    Py_RETURN_NONE;
}

static PyObject *s_py_publish(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"msg_type", "content_json", "metadata_json", "buffers", NULL};
    const char *msg_type, *content, *metadata = NULL;
    PyObject *buffers = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|zO:publish", kwlist, &msg_type, &content,
                                     &metadata, &buffers))
        return NULL;
    if (atomic_load(&s_hooks_off) || !s_hooks.publish)
        Py_RETURN_NONE; /* a fork()ed child has no iopub: dropped */

    Py_ssize_t nbufs = 0;
    PyObject *seq = NULL;
    if (buffers != Py_None) {
        seq = PySequence_Fast(buffers, "buffers must be a sequence of bytes-like objects");
        if (!seq)
            return NULL;
        nbufs = PySequence_Fast_GET_SIZE(seq);
    }
    Py_buffer *views = nbufs ? PyMem_Calloc((size_t) nbufs, sizeof(Py_buffer)) : NULL;
    const void **ptrs = nbufs ? PyMem_Calloc((size_t) nbufs, sizeof(void *)) : NULL;
    size_t *lens = nbufs ? PyMem_Calloc((size_t) nbufs, sizeof(size_t)) : NULL;
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (nbufs && (!views || !ptrs || !lens)) {
        PyErr_NoMemory();
        goto out;
    }
    for (; got < nbufs; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got],
                               PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        ptrs[got] = views[got].buf;
        lens[got] = (size_t) views[got].len;
    }
    s_hooks.publish(s_hooks.ctx, msg_type, content, metadata, ptrs, lens, (size_t) nbufs);
    result = Py_NewRef(Py_None);
out:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_XDECREF(seq);
    return result;
}

/* input_request(prompt, password) -> str.  Raises KeyboardInterrupt when
 * interrupted, RuntimeError when no frontend can answer. */
static PyObject *s_py_input_request(PyObject *self, PyObject *args)
{
    const char *prompt;
    int password = 0;
    if (!PyArg_ParseTuple(args, "s|p:input_request", &prompt, &password))
        return NULL;
    if (atomic_load(&s_hooks_off) || !s_hooks.input_request) {
        PyErr_SetString(PyExc_RuntimeError, "no frontend to ask for input");
        return NULL;
    }
    int err = 0;
    char *line;
    Py_BEGIN_ALLOW_THREADS line = s_hooks.input_request(s_hooks.ctx, prompt, password != 0, &err);
    Py_END_ALLOW_THREADS if (!line)
    {
        if (err == 1) {
            /* Make sure a pending trip of the SIGINT flag does not raise a
             * second KeyboardInterrupt later in the cell. */
            if (PyErr_CheckSignals() < 0)
                return NULL;
            PyErr_SetNone(PyExc_KeyboardInterrupt);
        } else {
            PyErr_SetString(PyExc_RuntimeError, "stdin is not available for input requests");
        }
        return NULL;
    }
    PyObject *res = PyUnicode_DecodeUTF8(line, (Py_ssize_t) strlen(line), "replace");
    free(line);
    return res;
}

/* pool_stats() -> str | None: the host pool's state as JSON text (None
 * without a pool connection): what %looseleaf shows. */
static PyObject *s_py_pool_stats(PyObject *self, PyObject *unused)
{
    if (atomic_load(&s_hooks_off) || !s_hooks.pool_stats)
        Py_RETURN_NONE;
    char *text;
    Py_BEGIN_ALLOW_THREADS text = s_hooks.pool_stats(s_hooks.ctx);
    Py_END_ALLOW_THREADS if (!text) Py_RETURN_NONE;
    PyObject *res = PyUnicode_DecodeUTF8(text, (Py_ssize_t) strlen(text), "replace");
    free(text);
    return res;
}

/* request_waiting() -> bool: a request waits on shell (the background
 * commit stops for it: coherence.commit_slow). */
static PyObject *s_py_request_waiting(PyObject *self, PyObject *unused)
{
    if (atomic_load(&s_hooks_off) || !s_hooks.request_waiting)
        Py_RETURN_FALSE;
    return PyBool_FromLong(s_hooks.request_waiting(s_hooks.ctx));
}

static _Atomic bool s_store_opened; /* ll_interp_store_opened */

bool ll_interp_store_opened(void)
{
    return atomic_load(&s_store_opened);
}

/* store_opened(): the session's checkpoint store is open (see
 * ll_interp_store_opened). */
static PyObject *s_py_store_opened(PyObject *self, PyObject *unused)
{
    atomic_store(&s_store_opened, true);
    Py_RETURN_NONE;
}

static _Atomic int s_interrupt_fd = -1; /* ll_interp_set_interrupt_fd */

void ll_interp_set_interrupt_fd(int fd)
{
    atomic_store(&s_interrupt_fd, fd);
}

/* interrupt_fd() -> int: the interrupt eventfd, -1 without one (or after a
 * fork in a cell: the child is no kernel). */
static PyObject *s_py_interrupt_fd(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(atomic_load(&s_hooks_off) ? -1 : atomic_load(&s_interrupt_fd));
}

/* log(level, module, text): one line through ll_log (the kernel's log on
 * its original stderr, not the notebook).  LEVEL is an ll_log_level_t. */
static PyObject *s_py_log(PyObject *self, PyObject *args)
{
    int level;
    const char *module, *text;
    if (!PyArg_ParseTuple(args, "iss:log", &level, &module, &text))
        return NULL;
    if (level < LL_LOG_ERROR)
        level = LL_LOG_ERROR;
    LL_LOG(level, module, "%s", text);
    Py_RETURN_NONE;
}

static PyObject *s_py_log_level(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(ll_log_level);
}

static void s_drop_pending_interrupt(void);

/* Interrupt delivery.  A signal cannot end a blocking call that its thread
 * enters after the handler ran: an interrupt landing between the eval loop's
 * last check and the system call (time.sleep between its call and
 * clock_nanosleep; a loaded machine preempts the thread right there now and
 * then) would raise only when the call returns, e.g. after sleep(60).  So a
 * nudger thread sees each interrupt through: it sends the wake signal again,
 * spaced out, until the interpreter thread has run a pending call queued
 * after the trip (CPython runs those on the main thread only, after handling
 * tripped signals at the same check), or the cell ended.  Only the first
 * wake of an interrupt trips the flag; the others only make a blocking call
 * return EINTR (retried by Python when nothing is tripped): a cell that
 * catches KeyboardInterrupt gets no second one.  The thread starts with the
 * first cell (a zygote, which runs none, stays single-threaded). */
static atomic_uint s_intr_gen;      /* interrupts that tripped the flag */
static atomic_uint s_intr_seen;     /* the latest of them the interpreter thread ran past */
static atomic_bool s_intr_retrip;   /* the next wake trips the flag (once per interrupt) */
static _Atomic int s_nudge_fd = -1; /* eventfd: an interrupt to see through, or stop */
static atomic_bool s_nudge_stop;
static pthread_t s_nudger;
static bool s_nudger_started; /* interpreter thread */

static int s_intr_ran_past(void *arg)
{
    unsigned gen = (unsigned) (uintptr_t) arg, seen = atomic_load(&s_intr_seen);
    while ((int) (gen - seen) > 0 && !atomic_compare_exchange_weak(&s_intr_seen, &seen, gen))
        ;
    return 0;
}

static void *s_nudger_main(void *arg)
{
    int fd = (int) (intptr_t) arg;
    uint64_t n;
    while (read(fd, &n, sizeof n) == (ssize_t) sizeof n && !atomic_load(&s_nudge_stop)) {
        unsigned gen = atomic_load(&s_intr_gen);
        bool queued = false; /* Py_AddPendingCall needs no GIL; fails while its queue is full */
        for (long ms = 10; !atomic_load(&s_nudge_stop) && atomic_load(&s_busy) &&
                           (int) (atomic_load(&s_intr_seen) - gen) < 0;
             ms = ms < 160 ? ms * 2 : 250) {
            if (!queued)
                queued = Py_AddPendingCall(s_intr_ran_past, (void *) (uintptr_t) gen) == 0;
            nanosleep(&(struct timespec){0, ms * 1000000L}, NULL);
            if (atomic_load(&s_busy) && (int) (atomic_load(&s_intr_seen) - gen) < 0)
                pthread_kill(s_thread, LL_WAKE_SIGNAL);
        }
    }
    return NULL;
}

static void s_nudger_start(void)
{
    int fd = eventfd(0, EFD_CLOEXEC);
    if (fd < 0)
        return; /* interrupts still work, without the nudges */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    atomic_store(&s_nudge_stop, false);
    s_nudger_started = pthread_create(&s_nudger, NULL, s_nudger_main, (void *) (intptr_t) fd) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (s_nudger_started)
        atomic_store(&s_nudge_fd, fd);
    else
        close(fd);
}

static void s_nudger_stop(void)
{
    if (!s_nudger_started)
        return;
    int fd = atomic_exchange(&s_nudge_fd, -1);
    atomic_store(&s_nudge_stop, true);
    uint64_t one = 1;
    if (write(fd, &one, sizeof one) < 0)
        ll_warn("interp", "cannot stop the interrupt nudger: %s", strerror(errno));
    pthread_join(s_nudger, NULL);
    close(fd);
    s_nudger_started = false;
}

/* set_busy(flag): the user's code runs from now on (True) / no longer
 * (False).  Only then may an interrupt land; turning it off also swallows
 * an interrupt that tripped just too late, so it cannot hit the kernel's own
 * code (reply building) instead of the cell. */
static PyObject *s_py_set_busy(PyObject *self, PyObject *flag)
{
    int on = PyObject_IsTrue(flag);
    if (on < 0)
        return NULL;
    if (on && !s_nudger_started)
        s_nudger_start();
    atomic_store(&s_intr_retrip, false); /* a wake still in flight is not this cell's */
    atomic_store(&s_busy, on != 0);
    if (!on)
        s_drop_pending_interrupt();
    Py_RETURN_NONE;
}

/* murmur2(data: bytes, seed: int) -> int: MurmurHash2 (32-bit) as
 * ipykernel names cells with it in pure Python.  JupyterLab's debugger
 * computes a cell's file name itself with that hash (debugInfo's hashMethod
 * "Murmur2" is the only one it knows), so every cell is compiled under it;
 * here in C because the interpreter hashes every cell it compiles. */
static PyObject *s_py_murmur2(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    unsigned long seed;
    if (!PyArg_ParseTuple(args, "y*k", &buf, &seed))
        return NULL;
    const unsigned char *data = buf.buf;
    size_t len = (size_t) buf.len;
    const uint32_t m = 0x5BD1E995u;
    uint32_t h = (uint32_t) seed ^ (uint32_t) len;
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
        uint32_t k = (uint32_t) data[i] | (uint32_t) data[i + 1] << 8 |
                     (uint32_t) data[i + 2] << 16 | (uint32_t) data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (len & 3) {
    case 3: h ^= (uint32_t) data[i + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t) data[i + 1] << 8;  /* fall through */
    case 1: h ^= (uint32_t) data[i]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(h);
}

static PyObject *s_py_hooks_off(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(atomic_load(&s_hooks_off));
}

/* The request types the interpreter serves (proto/ll_msgtype.c): the Kernel
 * builds its handler table from them, so the two cannot disagree. */
static PyObject *s_py_request_types(PyObject *self, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    for (const ll_msgtype_t *t = ll_msgtype_table(); out && t->msg_type; t++) {
        if (!(t->flags & LL_MSG_INTERP))
            continue;
        PyObject *name = PyUnicode_FromString(t->msg_type);
        if (!name || PyList_Append(out, name) < 0) {
            Py_XDECREF(name);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(name);
    }
    if (!out)
        return NULL;
    PyObject *tuple = PyList_AsTuple(out);
    Py_DECREF(out);
    return tuple;
}

static PyMethodDef s_methods[] = {
    {"stream_write", s_py_stream_write, METH_VARARGS,
     "stream_write(name, text) -> int: send text to stream NAME now."},
    {"stdout_write", s_py_stdout_write, METH_O, "stdout_write(text) -> int"},
    {"stderr_write", s_py_stderr_write, METH_O, "stderr_write(text) -> int"},
    {"stream_flush", s_py_stream_flush, METH_NOARGS, "stream_flush(): send buffered text now."},
    {"publish", (PyCFunction) (void (*)(void)) s_py_publish, METH_VARARGS | METH_KEYWORDS,
     "publish(msg_type, content_json, metadata_json=None, buffers=None): iopub message."},
    {"input_request", s_py_input_request, METH_VARARGS,
     "input_request(prompt, password=False) -> str: ask the frontend for a line."},
    {"log", s_py_log, METH_VARARGS, "log(level, module, text): a line in the kernel's log."},
    {"interrupt_fd", s_py_interrupt_fd, METH_NOARGS,
     "interrupt_fd() -> int: an fd readable once the running cell is interrupted, -1 if none."},
    {"pool_stats", s_py_pool_stats, METH_NOARGS,
     "pool_stats() -> str | None: the host pool's state (JSON), None without a pool."},
    {"request_waiting", s_py_request_waiting, METH_NOARGS,
     "request_waiting() -> bool: a request waits on shell (work in idle time gives way)."},
    {"store_opened", s_py_store_opened, METH_NOARGS,
     "store_opened(): the session's checkpoint store is open (idle commits are due from now on)."},
    {"log_level", s_py_log_level, METH_NOARGS, "log_level() -> int: the kernel's log threshold."},
    {"set_busy", s_py_set_busy, METH_O,
     "set_busy(flag): whether user code runs now (interrupts land only then)."},
    {"murmur2", s_py_murmur2, METH_VARARGS,
     "murmur2(data, seed) -> int: MurmurHash2 of DATA (bytes), as ipykernel names cells."},
    {"request_types", s_py_request_types, METH_NOARGS,
     "request_types() -> tuple[str]: the request types the interpreter serves."},
    {"hooks_off", s_py_hooks_off, METH_NOARGS,
     "hooks_off() -> bool: whether the hooks are off (a fork()ed child, or finalizing)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef s_module = {PyModuleDef_HEAD_INIT,
                                      "_looseleaf_kernel",
                                      "The LooseLeaf kernel process, as seen from Python (hooks).",
                                      -1,
                                      s_methods,
                                      NULL,
                                      NULL,
                                      NULL,
                                      NULL};

static PyObject *s_module_init(void)
{
    return PyModule_Create(&s_module);
}

/* ------------------------------------------------------------------ */
/* Signals and fork.                                                  */

/* Runs on the interpreter thread.  Besides making a blocking call return
 * EINTR, it trips the SIGINT flag again from this thread: Python only arms
 * its eval-loop breaker when the flag is tripped on the main thread, so a
 * trip from another thread alone would never stop a pure-Python loop. */
static void s_wake_handler(int sig)
{
    (void) sig;
    if (atomic_load(&s_busy) && atomic_exchange(&s_intr_retrip, false))
        PyErr_SetInterruptEx(SIGINT);
}

static void s_atfork_child(void)
{
    atomic_store(&s_hooks_off, true);
    atomic_store(&s_busy, false);
    /* The nudger is the parent's (its eventfd too): the child starts its own. */
    atomic_store(&s_nudge_fd, -1);
    s_nudger_started = false;
}

/* Install the wake handler, keep SIGPIPE from killing the process (Python
 * normally ignores it; we asked Python not to install handlers). */
static void s_setup_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_wake_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: the point is EINTR */
    sigaction(LL_WAKE_SIGNAL, &sa, NULL);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, LL_WAKE_SIGNAL);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);

    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL) {
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_IGN;
        sigaction(SIGPIPE, &sa, NULL);
    }
}

/* ------------------------------------------------------------------ */
/* Initialisation.                                                    */

int ll_interp_add_builtin(const char *name, void *(*initfunc)(void) )
{
    if (s_initialized || !name || !initfunc || s_nbuiltins >= LL_MAX_BUILTINS)
        return -1;
    if (PyImport_AppendInittab(name, (PyObject * (*) (void) ) initfunc) < 0)
        return -1;
    s_nbuiltins++;
    return 0;
}

static void s_set_err(char *err, size_t errlen, const char *what, const char *detail)
{
    if (err && errlen)
        snprintf(err, errlen, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
}

static void s_status_err(char *err, size_t errlen, const char *what, PyStatus status)
{
    char detail[256];
    snprintf(detail, sizeof detail, "%s%s%s", status.func ? status.func : "",
             status.func ? ": " : "", status.err_msg ? status.err_msg : "exit requested");
    s_set_err(err, errlen, what, detail);
}

/* Describe the pending Python exception into ERR and clear it. */
static void s_pyerr_to(char *err, size_t errlen, const char *what)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const char *msg = NULL;
    PyObject *str = value ? PyObject_Str(value) : NULL;
    if (str)
        msg = PyUnicode_AsUTF8(str);
    PyErr_Clear();
    char detail[512];
    snprintf(detail, sizeof detail, "%s: %s", type ? ((PyTypeObject *) type)->tp_name : "error",
             msg ? msg : "?");
    s_set_err(err, errlen, what, detail);
    Py_XDECREF(str);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* Directories holding the looseleaf_kernel package (and the store's and the
 * zygote's: the kernel keeps process state coherent with workers), as a
 * ':'-separated list: LOOSELEAF_PYTHONPATH if set, else the source tree the
 * binary was built from (the kernel runs from its build tree). */
static void s_package_path(char *out, size_t outlen)
{
    const char *env = getenv("LOOSELEAF_PYTHONPATH");
    if (env && *env)
        snprintf(out, outlen, "%s", env);
    else
        snprintf(out, outlen, "%s/kernel/py:%s/store/py:%s/zygote/py", LL_SRCDIR, LL_SRCDIR,
                 LL_SRCDIR);
}

/* Python code run once after start: sys.path, SIGINT handler at the Python
 * level only.  %s is the package path. */
static const char s_bootstrap[] =
    "import sys, os, signal\n"
    "_pp = [p for p in os.environ.get('PYTHONPATH', '').split(':') if p]\n"
    "_ll = [p for p in %s.split(':') if p]\n"
    "sys.path[:0] = [''] + _ll + _pp\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "del _pp, _ll\n";

/* The PyConfig part of ll_interp_init, alone: standalone programs (the
 * analysis CLI, its benchmark and self-test) get the same interpreter the
 * kernel runs, without the shell. */
int ll_interp_start_python(const char *argv0, char *err, size_t errlen)
{
    if (Py_IsInitialized())
        return 0;
    PyStatus status;
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    /* The environment may belong to another Python (pyenv sets PYTHONHOME
     * and friends): ignore PYTHON* variables; PYTHONPATH is added back by
     * the bootstrap, ahead of the standard library as Python does. */
    config.use_environment = 0;
    config.parse_argv = 0;
    /* The gateway owns the process's signal handling. */
    config.install_signal_handlers = 0;
    config.safe_path = 1;

    /* sys.executable is the environment's Python (kernel/ll_pyenv.h): what
     * the prefix, hence the standard library and the site-packages, come
     * from, and a real Python for multiprocessing's spawn, %pip and
     * subprocess.run([sys.executable, ...]). */
    ll_pyenv_t env;
    if (ll_pyenv_find(NULL, &env, err, errlen) < 0) {
        PyConfig_Clear(&config);
        return -1;
    }
    status = PyConfig_SetBytesString(&config, &config.program_name, env.python);
    if (PyStatus_Exception(status))
        goto fail_status;
    status = PyConfig_SetBytesString(&config, &config.executable, env.python);
    if (PyStatus_Exception(status))
        goto fail_status;
    char *argv[1] = {(char *) (argv0 ? argv0 : "looseleaf")};
    status = PyConfig_SetBytesArgv(&config, 1, argv);
    if (PyStatus_Exception(status))
        goto fail_status;
    status = Py_InitializeFromConfig(&config);
    if (PyStatus_Exception(status))
        goto fail_status;
    PyConfig_Clear(&config);
    return 0;

fail_status:
    s_status_err(err, errlen, "Python initialization failed", status);
    PyConfig_Clear(&config);
    return -1;
}

int ll_interp_init(const char *argv0, const ll_interp_hooks_t *hooks, char *err, size_t errlen)
{
    if (s_initialized) {
        s_set_err(err, errlen, "interpreter already initialized", NULL);
        return -1;
    }
    if (!hooks) {
        s_set_err(err, errlen, "no hooks given", NULL);
        return -1;
    }
    s_hooks = *hooks;
    s_thread = pthread_self();
    atomic_store(&s_hooks_off, false);

    static bool inittab_done;
    if (!inittab_done) {
        if (PyImport_AppendInittab("_looseleaf_kernel", s_module_init) < 0) {
            s_set_err(err, errlen, "cannot register _looseleaf_kernel", NULL);
            return -1;
        }
        pthread_atfork(NULL, NULL, s_atfork_child);
        inittab_done = true;
    }

    if (ll_interp_start_python(argv0, err, errlen) != 0)
        return -1;
    s_initialized = true;

    char pkgpath[3 * PATH_MAX];
    s_package_path(pkgpath, sizeof pkgpath);
    PyObject *pkg = PyUnicode_DecodeFSDefault(pkgpath);
    PyObject *pkg_repr = pkg ? PyObject_Repr(pkg) : NULL;
    Py_XDECREF(pkg);
    if (!pkg_repr) {
        s_pyerr_to(err, errlen, "package path");
        goto fail_py;
    }
    size_t codelen = sizeof s_bootstrap + strlen(PyUnicode_AsUTF8(pkg_repr));
    char *code = malloc(codelen);
    if (!code) {
        Py_DECREF(pkg_repr);
        s_set_err(err, errlen, "out of memory", NULL);
        goto fail_py;
    }
    snprintf(code, codelen, s_bootstrap, PyUnicode_AsUTF8(pkg_repr));
    Py_DECREF(pkg_repr);
    /* signal.signal() in the bootstrap sets the process-level SIGINT
     * action too; give the caller's back, keeping only Python's table
     * entry (what PyErr_SetInterruptEx needs). */
    struct sigaction caller_sigint;
    sigaction(SIGINT, NULL, &caller_sigint);
    PyObject *globals = PyDict_New();
    PyObject *res = globals ? PyRun_String(code, Py_file_input, globals, globals) : NULL;
    sigaction(SIGINT, &caller_sigint, NULL);
    free(code);
    Py_XDECREF(globals);
    if (!res) {
        s_pyerr_to(err, errlen, "bootstrap");
        goto fail_py;
    }
    Py_DECREF(res);

    PyObject *mod = PyImport_ImportModule("looseleaf_kernel");
    if (!mod) {
        s_pyerr_to(err, errlen, "import looseleaf_kernel");
        goto fail_py;
    }
    PyObject *start = PyObject_GetAttrString(mod, "start");
    s_handle_fn = PyObject_GetAttrString(mod, "handle");
    Py_DECREF(mod);
    if (!start || !s_handle_fn) {
        Py_XDECREF(start);
        s_pyerr_to(err, errlen, "looseleaf_kernel lacks start/handle");
        goto fail_py;
    }
    res = PyObject_CallNoArgs(start);
    Py_DECREF(start);
    if (!res) {
        s_pyerr_to(err, errlen, "looseleaf_kernel.start");
        goto fail_py;
    }
    Py_DECREF(res);

    s_setup_signals();
    s_main_tstate = PyEval_SaveThread();
    ll_debug("interp", "interpreter ready");
    return 0;

fail_py:
    /* Python is up but unusable; leave it (finalizing a half-built shell can
     * hang) and let the caller exit. */
    Py_CLEAR(s_handle_fn);
    s_main_tstate = PyEval_SaveThread();
    return -1;
}

/* ------------------------------------------------------------------ */
/* Requests.                                                          */

/* Swallow an interrupt that arrived too late to hit the cell it was meant
 * for, so it does not raise in whatever runs next. */
static void s_drop_pending_interrupt(void)
{
    if (PyErr_CheckSignals() < 0)
        PyErr_Clear();
}

static char *s_internal_error_reply(const char *why)
{
    ll_error("interp", "internal error: %s", why);
    const char *fmt = "{\"status\": \"error\", \"ename\": \"LooseLeafInternalError\", "
                      "\"evalue\": \"%s\", \"traceback\": []}";
    /* WHY may quote a Python exception: keep it JSON-safe and ASCII (the
     * cut at the buffer's end must not split a UTF-8 sequence). */
    char clean[200];
    size_t j = 0;
    for (size_t i = 0; why[i] && j < sizeof clean - 1; i++) {
        unsigned char c = (unsigned char) why[i];
        clean[j++] = (c == '"' || c == '\\' || c < 0x20) ? ' ' : c >= 0x80 ? '?' : (char) c;
    }
    clean[j] = '\0';
    size_t len = strlen(fmt) + j + 1;
    char *out = malloc(len);
    if (out)
        snprintf(out, len, fmt, clean);
    return out;
}

static char *s_strdup_utf8(PyObject *str)
{
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(str, &size);
    if (!utf8)
        return NULL;
    char *out = malloc((size_t) size + 1);
    if (out)
        memcpy(out, utf8, (size_t) size + 1);
    return out;
}

char *ll_interp_handle(const char *msg_type, const char *content_json, const char *parent_json,
                       char **reply_metadata_json)
{
    ll_interp_request_t req = {
        .msg_type = msg_type, .content_json = content_json, .parent_json = parent_json};
    return ll_interp_call(&req, reply_metadata_json);
}

/* The buffers as a list of bytes (copies: Python code may keep them). */
static PyObject *s_buffers_list(const void *const *bufs, const size_t *buflens, size_t nbufs)
{
    PyObject *list = PyList_New((Py_ssize_t) nbufs);
    for (size_t i = 0; list && i < nbufs; i++) {
        PyObject *b = PyBytes_FromStringAndSize(bufs[i], (Py_ssize_t) buflens[i]);
        if (!b)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t) i, b);
    }
    return list;
}

/* A thread other than the interpreter's (a subshell's, the control thread
 * for debug requests) keeps one Python thread state from its first call to
 * ll_interp_thread_end, not one per call (PyGILState_Release would delete it
 * after each): torch frees a tensor through pybind11's gil_scoped_acquire,
 * which can hold on to the thread state it saw, and took the GIL with a
 * freed one on a subshell's next cell (a crash in take_gil). */
static _Thread_local PyThreadState *s_pinned;

static void s_pin_thread_state(void)
{
    if (s_pinned || pthread_equal(pthread_self(), s_thread))
        return;
    PyGILState_STATE st = PyGILState_Ensure(); /* a new state: counter 1 */
    s_pinned = PyThreadState_Get();
    if (st == PyGILState_UNLOCKED)
        PyEval_SaveThread();
}

void ll_interp_thread_end(void)
{
    if (!s_pinned || !s_initialized)
        return;
    PyEval_RestoreThread(s_pinned);
    s_pinned = NULL;
    PyGILState_Release(PyGILState_UNLOCKED); /* counter 0: cleared, deleted, GIL released */
}

char *ll_interp_call(const ll_interp_request_t *req, char **reply_metadata_json)
{
    if (reply_metadata_json)
        *reply_metadata_json = NULL;
    if (!s_initialized || !s_handle_fn)
        return s_internal_error_reply("interpreter not initialized");
    const char *msg_type = req->msg_type;
    if (!msg_type)
        return s_internal_error_reply("no message type");
    /* Another thread (a subshell's) runs its request alongside the
     * interpreter thread's: the busy flag and a pending interrupt belong to
     * the cell there, so they are left alone, and interrupts do not reach
     * this request (as in ipykernel, whose subshells are threads too). */
    bool main = pthread_equal(pthread_self(), s_thread);

    s_pin_thread_state();
    PyGILState_STATE gil = PyGILState_Ensure();
    if (main)
        s_drop_pending_interrupt();

    char *reply = NULL;
    PyObject *buffers = req->nbufs && req->bufs && req->buflens
                            ? s_buffers_list(req->bufs, req->buflens, req->nbufs)
                            : PyList_New(0);
    PyObject *res = buffers ? PyObject_CallFunction(s_handle_fn, "ssssOz", msg_type,
                                                    req->content_json ? req->content_json : "{}",
                                                    req->parent_json ? req->parent_json : "{}",
                                                    req->metadata_json ? req->metadata_json : "{}",
                                                    buffers, req->route_json)
                            : NULL;
    Py_XDECREF(buffers);
    if (main)
        atomic_store(&s_busy, false); /* in case Python did not get to say so */
    if (!res) {
        char why[512];
        s_pyerr_to(why, sizeof why, "looseleaf_kernel.handle raised");
        reply = s_internal_error_reply(why);
        goto out;
    }
    /* handle() returns (reply_json or None, metadata_json or None). */
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
        reply = s_internal_error_reply("looseleaf_kernel.handle returned no pair");
        goto out;
    }
    PyObject *r = PyTuple_GET_ITEM(res, 0), *md = PyTuple_GET_ITEM(res, 1);
    if (PyUnicode_Check(r)) {
        reply = s_strdup_utf8(r);
        if (!reply) {
            PyErr_Clear();
            reply = s_internal_error_reply("reply is not UTF-8");
        }
    }
    if (reply && reply_metadata_json && PyUnicode_Check(md)) {
        *reply_metadata_json = s_strdup_utf8(md);
        if (!*reply_metadata_json)
            PyErr_Clear();
    }
out:
    Py_XDECREF(res);
    if (main)
        s_drop_pending_interrupt();
    PyGILState_Release(gil);
    return reply;
}

char *ll_interp_debug(const char *request_json)
{
    pthread_mutex_lock(&s_debug_lock);
    if (s_debug_closed || !s_initialized) {
        pthread_mutex_unlock(&s_debug_lock);
        return NULL;
    }
    /* No s_busy or pending-interrupt handling here, unlike ll_interp_call:
     * those belong to the cell that may be running on the interpreter thread
     * meanwhile. */
    PyGILState_STATE gil = PyGILState_Ensure();
    char *reply = NULL;
    PyObject *mod = PyImport_ImportModule("looseleaf_kernel.kernel");
    PyObject *res = mod ? PyObject_CallMethod(mod, "debug_request", "s", request_json) : NULL;
    if (res && PyUnicode_Check(res)) {
        reply = s_strdup_utf8(res);
    } else if (!res) {
        char why[512];
        s_pyerr_to(why, sizeof why, "looseleaf_kernel.kernel.debug_request raised");
        ll_error("interp", "%s", why);
    }
    if (!reply)
        PyErr_Clear();
    Py_XDECREF(res);
    Py_XDECREF(mod);
    PyGILState_Release(gil);
    pthread_mutex_unlock(&s_debug_lock);
    return reply;
}

void ll_interp_interrupt(void)
{
    if (!atomic_load(&s_busy))
        return;
    /* All async-signal-safe.  The wake handler trips the flag again, on the
     * interpreter thread; the nudger sees the interrupt through (above). */
    atomic_fetch_add(&s_intr_gen, 1);
    atomic_store(&s_intr_retrip, true);
    PyErr_SetInterruptEx(SIGINT);
    pthread_kill(s_thread, LL_WAKE_SIGNAL);
    int fd = atomic_load(&s_nudge_fd);
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof one) < 0) {
        /* counter full: the nudger has interrupts to see through already */
    }
}

bool ll_interp_busy(void)
{
    return atomic_load(&s_busy);
}

int ll_interp_fork(void)
{
    if (!s_initialized) {
        errno = EINVAL;
        return -1;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    PyOS_BeforeFork();
    pid_t pid = fork();
    int saved = errno;
    if (pid == 0) {
        /* Only this thread survives; it is Python's main thread now. */
        PyOS_AfterFork_Child();
        s_thread = pthread_self();
    } else {
        PyOS_AfterFork_Parent();
    }
    PyGILState_Release(gil);
    errno = saved;
    return (int) pid;
}

int ll_interp_set_hooks(const ll_interp_hooks_t *hooks)
{
    if (!s_initialized || !hooks)
        return -1;
    s_hooks = *hooks;
    s_thread = pthread_self();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, LL_WAKE_SIGNAL);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    atomic_store(&s_hooks_off, false);
    return 0;
}

static atomic_bool s_restart; /* ll_interp_set_restart */

void ll_interp_set_restart(bool restart)
{
    atomic_store(&s_restart, restart);
}

void ll_interp_finalize(void)
{
    if (!s_initialized)
        return;
    s_nudger_stop();                   /* it queues pending calls: not into a finalized Python */
    pthread_mutex_lock(&s_debug_lock); /* waits for a debug request in flight */
    s_debug_closed = true;
    pthread_mutex_unlock(&s_debug_lock);
    PyGILState_STATE gil = PyGILState_Ensure();
    (void) gil; /* Py_FinalizeEx below ends the thread state for good */
    bool finalize = true;
    PyObject *mod = PyImport_ImportModule("looseleaf_kernel");
    PyObject *res = mod ? PyObject_CallMethod(mod, "shutdown", "(O)",
                                              atomic_load(&s_restart) ? Py_True : Py_False)
                        : NULL;
    if (!res) {
        char why[512];
        s_pyerr_to(why, sizeof why, "looseleaf_kernel.shutdown");
        ll_warn("interp", "%s", why);
    } else {
        /* shutdown() returns whether Python may be finalized: a live
         * non-daemon user thread would make Py_FinalizeEx wait forever. */
        finalize = PyObject_IsTrue(res) == 1;
    }
    Py_XDECREF(res);
    Py_XDECREF(mod);
    Py_CLEAR(s_handle_fn);
    /* The caller tears its side down after we return, while Python threads
     * that outlive us (daemons, or the non-daemon ones below) may still
     * print: from here on their text goes to the file descriptors. */
    atomic_store(&s_hooks_off, true);
    if (finalize) {
        if (Py_FinalizeEx() < 0)
            ll_warn("interp", "errors while finalizing Python");
    } else {
        ll_warn("interp", "user threads still running; not finalizing Python");
        PyEval_SaveThread();
    }
    s_initialized = false;
}
