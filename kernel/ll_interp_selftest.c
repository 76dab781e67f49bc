/* Self-test of kernel/ll_interp (run by build/ll_selftest): a real
 * interpreter through the public API only, in a forked child so the runner
 * process stays free of Python (another module's test may embed it too).
 * Checked: the caller's SIGINT action kept, execute (stream, result, reply
 * metadata, errors), input(), an interrupt landing just before a blocking
 * call, kernel_info, unknown and malformed requests. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernel/ll_interp.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char s_st_out[1 << 16]; /* stream text received */
static size_t s_st_outlen;
static char s_st_pub[1 << 16]; /* "msg_type content\n" per publish */
static size_t s_st_publen;

static void s_st_append(char *buf, size_t *len, size_t cap, const char *data, size_t n)
{
    if (*len + n >= cap)
        n = cap - *len - 1;
    memcpy(buf + *len, data, n);
    *len += n;
    buf[*len] = '\0';
}

static void s_st_stream(void *ctx, const char *name, const char *data, size_t len)
{
    s_st_append(s_st_out, &s_st_outlen, sizeof s_st_out, data, len);
}

static void s_st_flush(void *ctx)
{
}

static void s_st_publish(void *ctx, const char *msg_type, const char *content, const char *md,
                         const void *const *bufs, const size_t *buflens, size_t nbufs)
{
    s_st_append(s_st_pub, &s_st_publen, sizeof s_st_pub, msg_type, strlen(msg_type));
    s_st_append(s_st_pub, &s_st_publen, sizeof s_st_pub, " ", 1);
    s_st_append(s_st_pub, &s_st_publen, sizeof s_st_pub, content, strlen(content));
    s_st_append(s_st_pub, &s_st_publen, sizeof s_st_pub, "\n", 1);
}

static char *s_st_input(void *ctx, const char *prompt, bool password, int *err)
{
    return strdup("forty-two");
}

static int s_st_check(bool verbose, bool ok, const char *what)
{
    if (verbose || !ok)
        fprintf(stderr, "  %s: %s\n", what, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

/* _ll_interp_st.trip_then_sleep(secs) -> bool: an interrupt lands in the
 * worst place, after the eval loop's last check and before time.sleep's
 * system call (C calling C, no check between); True if the sleep ended with
 * KeyboardInterrupt, False if it ran its course (the interrupt then raises
 * right after the call). */
static PyObject *s_st_trip_then_sleep(PyObject *self, PyObject *secs)
{
    PyObject *time = PyImport_ImportModule("time");
    if (!time)
        return NULL;
    ll_interp_interrupt(); /* on this thread: the wake handler has run when it returns */
    PyObject *res = PyObject_CallMethod(time, "sleep", "O", secs);
    Py_DECREF(time);
    if (res) {
        Py_DECREF(res);
        Py_RETURN_FALSE;
    }
    if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
        return NULL;
    PyErr_Clear();
    Py_RETURN_TRUE;
}

static PyMethodDef s_st_methods[] = {{"trip_then_sleep", s_st_trip_then_sleep, METH_O, NULL},
                                     {NULL, NULL, 0, NULL}};
static struct PyModuleDef s_st_module = {
    PyModuleDef_HEAD_INIT, "_ll_interp_st", NULL, -1, s_st_methods, NULL, NULL, NULL, NULL};

static void *s_st_module_init(void)
{
    return PyModule_Create(&s_st_module);
}

static int s_st_child(bool verbose)
{
    ll_interp_hooks_t hooks = {NULL, s_st_stream, s_st_flush, s_st_publish, s_st_input, NULL, NULL};
    char err[512];
    int fails = 0;
    struct sigaction ign, after;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGINT, &ign, NULL);
    ll_interp_add_builtin("_ll_interp_st", s_st_module_init);
    if (ll_interp_init("ll_selftest", &hooks, err, sizeof err) != 0) {
        fprintf(stderr, "  init: %s\n", err);
        return 1;
    }
    sigaction(SIGINT, NULL, &after);
    fails += s_st_check(verbose, after.sa_handler == SIG_IGN, "caller's SIGINT action kept");
    fails += s_st_check(verbose, !ll_interp_busy(), "idle after init");
    ll_interp_interrupt(); /* idle: must be a no-op */

    char *md = NULL;
    char *reply =
        ll_interp_handle("execute_request", "{\"code\": \"print('hi'); 6*7\", \"silent\": false}",
                         "{\"msg_id\": \"t1\", \"msg_type\": \"execute_request\"}", &md);
    fails += s_st_check(verbose, reply && strstr(reply, "\"status\": \"ok\""), "execute ok");
    fails += s_st_check(verbose, strstr(s_st_out, "hi\n") != NULL, "stream text");
    fails += s_st_check(verbose, strstr(s_st_pub, "execute_result") && strstr(s_st_pub, "\"42\""),
                        "execute_result 42");
    fails += s_st_check(verbose, md && strstr(md, "\"status\""), "reply metadata");
    free(reply);
    free(md);

    reply = ll_interp_handle("execute_request", "{\"code\": \"1/0\"}", "{}", NULL);
    fails += s_st_check(verbose, reply && strstr(reply, "ZeroDivisionError"), "error reply");
    free(reply);

    reply = ll_interp_handle(
        "execute_request", "{\"code\": \"x = input('? ')\\nprint(x * 2)\", \"allow_stdin\": true}",
        "{}", NULL);
    fails += s_st_check(verbose, reply && strstr(s_st_out, "forty-twoforty-two"), "input()");
    free(reply);

    /* An interrupt just before a blocking call still ends it (the nudger);
     * without it this sleep would run its 20 s. */
    s_st_outlen = 0;
    reply = ll_interp_handle("execute_request",
                             "{\"code\": \"import _ll_interp_st\\ntry:\\n"
                             "    r = _ll_interp_st.trip_then_sleep(20)\\n"
                             "except KeyboardInterrupt:\\n    r = 'late'\\n"
                             "print('sleep interrupted:', r)\"}",
                             "{}", NULL);
    fails += s_st_check(verbose, reply && strstr(s_st_out, "sleep interrupted: True"),
                        "interrupt just before a blocking call");
    free(reply);

    reply = ll_interp_handle("kernel_info_request", "{}", "{}", NULL);
    fails += s_st_check(verbose, reply && strstr(reply, "\"implementation\": \"looseleaf\""),
                        "kernel_info");
    free(reply);

    reply = ll_interp_handle("no_such_request", "{}", "{}", NULL);
    fails += s_st_check(verbose, reply == NULL || strstr(reply, "error"), "unknown request");
    free(reply);

    reply = ll_interp_handle("execute_request", "not json", "{}", NULL);
    fails += s_st_check(verbose, reply && strstr(reply, "\"status\": \"error\""), "bad JSON");
    free(reply);

    ll_interp_finalize();
    return fails ? 1 : 0;
}

int ll_interp_selftest(bool verbose)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        /* A private IPython directory: no history of the user's touched. */
        char dir[] = "/tmp/ll-interp-selftest-XXXXXX";
        if (!mkdtemp(dir))
            _exit(1);
        setenv("IPYTHONDIR", dir, 1);
        int rc = s_st_child(verbose);
        char cmd[sizeof dir + 16];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            rc = rc ? rc : 0;
        fflush(NULL);
        _exit(rc);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
