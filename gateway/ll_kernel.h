/* ll_kernel: the kernel process (`looseleaf -f CONNECTION_FILE`): sockets,
 * threads, the handlers that reach the interpreter (the dispatcher that
 * calls them is gateway/ll_dispatch.h), and the interpreter hooks.
 *
 * Threads of the kernel process and what each owns:
 *   main       the shell ROUTER socket and the interpreter: every shell
 *              request, hence all Python, runs here (CPython's signal
 *              handling and most C extensions expect the main thread);
 *   control    the control ROUTER: interrupt, shutdown and kernel_info are
 *              answered while a cell runs;
 *   heartbeat  the REP echo, answering however long a cell runs;
 *   stream     ll_stream's flusher (iopub text every ~50 ms);
 *   welcome    ll_iopub's watcher: answers iopub subscriptions (XPUB) with
 *              iopub_welcome while nothing else is published;
 *   fdcap      the reader of the fd 1/2 capture pipes.
 * The iopub socket is shared under one lock (ll_iopub); the stdin socket is
 * used only by whichever thread calls input(), under its own lock.  SIGINT
 * and SIGTERM are blocked in every thread but main, so a signal interrupts
 * the main thread's blocking system call (time.sleep, select, input). */
#ifndef LL_KERNEL_H
#define LL_KERNEL_H

#include <stdbool.h>

#define LL_VERSION "0.1.0"

/* What the kernel accepts that it refuses by default (command-line flags). */
typedef struct {
    bool allow_insecure_file; /* --allow-insecure-connection-file: a symlink, or a
                               * file others may read */
    bool allow_empty_key;     /* --allow-empty-key: no signatures at all */
} ll_kernel_opts_t;

/* Run the kernel on CONNECTION_FILE until shutdown or SIGTERM (OPTS may be
 * NULL: the defaults).  Returns the process exit status (0 after a clean
 * shutdown, 1 when the connection file or start-up fails, with the reason
 * printed on stderr). */
int ll_kernel_run(const char *connection_file, const ll_kernel_opts_t *opts);

int ll_kernel_selftest(bool verbose);

#endif
