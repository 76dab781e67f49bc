/* ll_log: the one logging facility of every LooseLeaf process.
 *
 * Lines go to stderr as   <pid>:<role> <HH:MM:SS.mmm> <level> <module>: message
 * where role is G (kernel/gateway), P (host pool), Z (zygote), W (worker),
 * A (command-line tools).  The level is checked before any formatting, so a
 * debug line in a hot path costs one comparison.  Never log the HMAC key, and
 * log user code only at debug level.
 *
 * The level comes from LOOSELEAF_LOG (error|warn|info|debug), default info.
 *
 * Each line is written with a single write(2) of at most PIPE_BUF bytes
 * (longer messages are cut and end in "..."), so lines from threads and
 * processes sharing one pipe never interleave.  Control characters in a
 * message become spaces: one call, one line.  errno is preserved.  Not
 * async-signal-safe (it formats the local time): never log from a signal
 * handler. */
#ifndef LL_LOG_H
#define LL_LOG_H

#include <stdarg.h>

typedef enum {
    LL_LOG_ERROR = 0,
    LL_LOG_WARN = 1,
    LL_LOG_INFO = 2,
    LL_LOG_DEBUG = 3,
} ll_log_level_t;

/* Current threshold; lines above it are skipped.  Written by ll_log_init (and
 * by self-tests silencing an expected error: -1 silences everything). */
extern int ll_log_level;

/* Set this process's role letter and read LOOSELEAF_LOG.  Call again after a
 * fork to change the role. */
void ll_log_init(char role);

/* Send lines to FD from now on (default 2).  The gateway redirects fds 1 and
 * 2 into capture pipes and points the logger at a dup of the original
 * stderr.  Safe to call while other threads log; the caller owns FD. */
void ll_log_set_fd(int fd);

/* The fd lines currently go to. */
int ll_log_fd(void);

/* "error", "warn"/"warning", "info", "debug" (any case) to a level, else -1. */
int ll_log_parse_level(const char *text);

/* Format and write one line; use the macros below instead. */
void ll_log_write(int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LL_LOG(level, module, ...)                        \
    do {                                                  \
        if ((level) <= ll_log_level)                      \
            ll_log_write((level), (module), __VA_ARGS__); \
    } while (0)

#define ll_error(module, ...) LL_LOG(LL_LOG_ERROR, module, __VA_ARGS__)
#define ll_warn(module, ...)  LL_LOG(LL_LOG_WARN, module, __VA_ARGS__)
#define ll_info(module, ...)  LL_LOG(LL_LOG_INFO, module, __VA_ARGS__)
#define ll_debug(module, ...) LL_LOG(LL_LOG_DEBUG, module, __VA_ARGS__)

#endif
