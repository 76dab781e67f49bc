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

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>

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

/* A rate limit for one kind of line that a peer can cause at will (a wire
 * message dropped, a request refused): at most one such line every
 * LL_LOG_LIMIT_MS, and the next line written says how many were left out
 * meanwhile, so a flood of 50,000 junk frames costs a few lines, not
 * 50,000.  One static limit per call site; safe across threads.
 *
 * A limit made with LL_LOG_LIMIT_BURST_INIT(N) lets N lines through at
 * once before that, and earns one back each LL_LOG_LIMIT_MS: for lines a
 * peer can cause but that are worth every copy in normal use (a pool that
 * registers, a pool that leaves), so a few in a row all show while a
 * client that reconnects in a loop still costs one line per interval. */
typedef struct {
    pthread_mutex_t mu;
    double next_ms;           /* monotonic ms: no line before then */
    unsigned long suppressed; /* lines left out since the last one written */
    int burst;                /* 0: one line per interval; N: N at once, one earned per interval */
    double tokens;            /* lines that may go now (burst limits) */
    double last_ms;           /* when TOKENS was last brought up to date (0: never) */
} ll_log_limit_t;
#define LL_LOG_LIMIT_INIT                        \
    {                                            \
        PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, 0 \
    }
#define LL_LOG_LIMIT_BURST_INIT(n)                 \
    {                                              \
        PTHREAD_MUTEX_INITIALIZER, 0, 0, (n), 0, 0 \
    }
#define LL_LOG_LIMIT_MS 5000.0

/* Whether a line may be written at NOW_MS: true (and *SUPPRESSED: lines
 * left out before it; none may follow for INTERVAL_MS), or false (it is
 * counted).  Pure but for the lock; the macros below use it. */
bool ll_log_limit(ll_log_limit_t *lim, double now_ms, double interval_ms,
                  unsigned long *suppressed);

/* Format and write one line under LIM (appending "(N more like it not
 * logged)" after a gap); use the macros below instead. */
void ll_log_write_limited(ll_log_limit_t *lim, int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define LL_LOG_LIMITED(lim, level, module, ...)                          \
    do {                                                                 \
        if ((level) <= ll_log_level)                                     \
            ll_log_write_limited((lim), (level), (module), __VA_ARGS__); \
    } while (0)

#define ll_warn_limited(lim, module, ...) LL_LOG_LIMITED(lim, LL_LOG_WARN, module, __VA_ARGS__)
#define ll_info_limited(lim, module, ...) LL_LOG_LIMITED(lim, LL_LOG_INFO, module, __VA_ARGS__)

#define ll_error(module, ...) LL_LOG(LL_LOG_ERROR, module, __VA_ARGS__)
#define ll_warn(module, ...)  LL_LOG(LL_LOG_WARN, module, __VA_ARGS__)
#define ll_info(module, ...)  LL_LOG(LL_LOG_INFO, module, __VA_ARGS__)
#define ll_debug(module, ...) LL_LOG(LL_LOG_DEBUG, module, __VA_ARGS__)

#endif
