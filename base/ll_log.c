/* ll_log: the logging facility shared by every LooseLeaf process (any thread).
 *
 * Each line is formatted into a stack buffer and written with one write(2),
 * so lines from concurrent threads and processes sharing a pipe never
 * interleave: a line is capped at PIPE_BUF bytes, the size the kernel
 * promises to write atomically.  The destination fd is an atomic so the
 * gateway can repoint the logger (at a dup of the original stderr) after it
 * redirects fds 1 and 2 to its capture pipes, while other threads log. */
#include "base/ll_log.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int ll_log_level = LL_LOG_INFO;

static char s_role = 'G';
static atomic_int s_fd = 2;

static const char *const s_level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

int ll_log_parse_level(const char *text)
{
    if (!text)
        return -1;
    for (int i = LL_LOG_ERROR; i <= LL_LOG_DEBUG; i++)
        if (strcasecmp(text, s_level_names[i]) == 0)
            return i;
    if (strcasecmp(text, "warning") == 0)
        return LL_LOG_WARN;
    return -1;
}

void ll_log_init(char role)
{
    s_role = role;
    const char *env = getenv("LOOSELEAF_LOG");
    if (env && *env) {
        int level = ll_log_parse_level(env);
        if (level >= 0)
            ll_log_level = level;
        else
            ll_log_write(LL_LOG_WARN, "log",
                         "LOOSELEAF_LOG=%.32s is not one of "
                         "error|warn|info|debug; keeping %s",
                         env, s_level_names[ll_log_level]);
    }
}

void ll_log_set_fd(int fd)
{
    atomic_store(&s_fd, fd);
}

int ll_log_fd(void)
{
    return atomic_load(&s_fd);
}

/* Write all of BUF, retrying on EINTR and short writes (a short write can
 * only happen on a full non-pipe fd; pipes get PIPE_BUF bytes atomically). */
static void s_write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere left to report a logging failure */
        }
        buf += n;
        len -= (size_t) n;
    }
}

void ll_log_write(int level, const char *module, const char *fmt, ...)
{
    if (level < LL_LOG_ERROR)
        level = LL_LOG_ERROR;
    if (level > LL_LOG_DEBUG)
        level = LL_LOG_DEBUG;
    int saved_errno = errno; /* callers often log strerror(errno) after us */

    char line[PIPE_BUF];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%d:%c %02d:%02d:%02d.%03ld %s %s: ", (int) getpid(),
                     s_role, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                     s_level_names[level], module ? module : "?");
    if (n < 0)
        n = 0;
    size_t head = (size_t) n < sizeof line ? (size_t) n : sizeof line - 1;

    va_list ap;
    va_start(ap, fmt);
    errno = saved_errno; /* so %m in FMT reports the caller's errno */
    int m = vsnprintf(line + head, sizeof line - head, fmt, ap);
    va_end(ap);
    size_t len = head;
    if (m > 0)
        len += (size_t) m < sizeof line - head ? (size_t) m : sizeof line - head - 1;

    /* One record is one line: a newline or other control byte inside the
     * message (say, from a msg_type received off the wire) must not forge a
     * second log line. */
    while (len > head && line[len - 1] == '\n')
        len--;
    for (size_t i = head; i < len; i++) {
        unsigned char c = (unsigned char) line[i];
        if (c < 0x20 && c != '\t')
            line[i] = ' ';
    }
    if (m > 0 && (size_t) m >= sizeof line - head) {
        /* Truncated: mark it so nobody mistakes the cut line for the whole. */
        memcpy(line + sizeof line - 5, "...", 3);
        len = sizeof line - 2;
    }
    line[len++] = '\n';
    s_write_all(atomic_load(&s_fd), line, len);
    errno = saved_errno;
}

bool ll_log_limit(ll_log_limit_t *lim, double now_ms, double interval_ms, unsigned long *suppressed)
{
    pthread_mutex_lock(&lim->mu);
    bool ok;
    if (lim->burst > 0) {
        if (lim->last_ms == 0)
            lim->tokens = lim->burst;
        else if (now_ms > lim->last_ms)
            lim->tokens += (now_ms - lim->last_ms) / interval_ms;
        if (lim->tokens > lim->burst)
            lim->tokens = lim->burst;
        lim->last_ms = now_ms;
        ok = lim->tokens >= 1;
        if (ok)
            lim->tokens -= 1;
    } else {
        ok = now_ms >= lim->next_ms;
        if (ok)
            lim->next_ms = now_ms + interval_ms;
    }
    if (ok) {
        *suppressed = lim->suppressed;
        lim->suppressed = 0;
    } else {
        lim->suppressed++;
    }
    pthread_mutex_unlock(&lim->mu);
    return ok;
}

void ll_log_write_limited(ll_log_limit_t *lim, int level, const char *module, const char *fmt, ...)
{
    int saved_errno = errno;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long left_out = 0;
    /* The first line of a burst always goes out (the monotonic clock
     * starts above 0 ms after boot, so next_ms 0 never holds one back). */
    if (!ll_log_limit(lim, (double) ts.tv_sec * 1000.0 + (double) ts.tv_nsec / 1e6, LL_LOG_LIMIT_MS,
                      &left_out)) {
        errno = saved_errno;
        return;
    }
    char msg[PIPE_BUF];
    va_list ap;
    va_start(ap, fmt);
    errno = saved_errno;
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (left_out)
        ll_log_write(level, module, "%s (and %lu more like it in the last %.0f s, not logged)", msg,
                     left_out, LL_LOG_LIMIT_MS / 1000);
    else
        ll_log_write(level, module, "%s", msg);
    errno = saved_errno;
}
