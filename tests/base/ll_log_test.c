/* Self-test of base/ll_log (run by build/ll_selftest): line format, level
 * filtering, redirection with ll_log_set_fd, one line per call, truncation
 * at PIPE_BUF, errno preserved. */
#include "base/ll_log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int s_failures;

static void s_check(bool ok, const char *what, int line)
{
    if (!ok) {
        fprintf(stderr, "\n  ll_log_test.c:%d: check failed: %s", line, what);
        s_failures++;
    }
}
#define LL_CHECK(cond) s_check((cond), #cond, __LINE__)

/* Read what is in the pipe now (the writes happened before, so no waiting). */
static size_t s_drain(int fd, char *buf, size_t len)
{
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, len - 1 - got);
        if (n <= 0)
            break;
        got += (size_t) n;
    }
    buf[got] = '\0';
    return got;
}

/* "<pid>:<role> HH:MM:SS.mmm LEVEL module: message" */
static bool s_well_formed(const char *line, char role, const char *level, const char *rest)
{
    char expect[64];
    snprintf(expect, sizeof expect, "%d:%c ", (int) getpid(), role);
    if (strncmp(line, expect, strlen(expect)) != 0)
        return false;
    const char *t = line + strlen(expect);
    for (int i = 0; i < 12; i++) {
        bool colon = i == 2 || i == 5, dot = i == 8;
        if (colon ? t[i] != ':' : dot ? t[i] != '.' : (t[i] < '0' || t[i] > '9'))
            return false;
    }
    if (t[12] != ' ' || strncmp(t + 13, level, strlen(level)) != 0)
        return false;
    t += 13 + strlen(level);
    return *t == ' ' && strcmp(t + 1, rest) == 0;
}

int ll_log_selftest(bool verbose)
{
    s_failures = 0;
    int saved_level = ll_log_level;
    int saved_fd = ll_log_fd();
    int fds[2];
    if (pipe2(fds, O_NONBLOCK) != 0)
        return -1;
    /* The pipe must hold a whole test's output without a reader. */
    fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    ll_log_set_fd(fds[1]);
    LL_CHECK(ll_log_fd() == fds[1]);

    char *buf = malloc(1 << 20);
    ll_log_init('T');
    ll_log_level = LL_LOG_INFO;
    ll_info("mod", "hello %d", 42);
    s_drain(fds[0], buf, 1 << 20);
    LL_CHECK(s_well_formed(buf, 'T', "INFO", "mod: hello 42\n"));

    /* Below the threshold: nothing at all. */
    ll_debug("mod", "hidden");
    LL_CHECK(s_drain(fds[0], buf, 1 << 20) == 0);
    ll_log_level = LL_LOG_DEBUG;
    ll_debug("mod", "shown");
    s_drain(fds[0], buf, 1 << 20);
    LL_CHECK(s_well_formed(buf, 'T', "DEBUG", "mod: shown\n"));
    ll_log_level = LL_LOG_ERROR;
    ll_warn("mod", "hidden");
    ll_error("mod", "bad");
    s_drain(fds[0], buf, 1 << 20);
    LL_CHECK(s_well_formed(buf, 'T', "ERROR", "mod: bad\n"));
    ll_log_level = LL_LOG_INFO;

    /* Embedded newlines cannot forge a second line; a trailing one is dropped. */
    ll_info("wire", "type %s", "evil\n99:G 00:00:00.000 ERROR fake: x");
    ll_info("wire", "trailing\n");
    s_drain(fds[0], buf, 1 << 20);
    LL_CHECK(strstr(buf, "evil 99:G") != NULL);
    int lines = 0;
    for (char *p = buf; *p; p++)
        lines += *p == '\n';
    LL_CHECK(lines == 2);

    /* Long messages are cut to one atomic write ending in "...". */
    char *big = malloc(3 * PIPE_BUF);
    memset(big, 'x', 3 * PIPE_BUF - 1);
    big[3 * PIPE_BUF - 1] = '\0';
    ll_info("big", "%s", big);
    size_t n = s_drain(fds[0], buf, 1 << 20);
    LL_CHECK(n <= PIPE_BUF && n > PIPE_BUF - 100);
    LL_CHECK(n >= 4 && strcmp(buf + n - 4, "...\n") == 0);
    free(big);

    /* errno survives logging, and %m sees the caller's errno. */
    errno = ENOENT;
    ll_info("mod", "err %m");
    LL_CHECK(errno == ENOENT);
    s_drain(fds[0], buf, 1 << 20);
    LL_CHECK(strstr(buf, "No such file") != NULL);

    /* A limited line: the first of a burst goes out, the rest are counted
     * and said on the next line an interval later (pure part, then the
     * writer). */
    {
        ll_log_limit_t lim = LL_LOG_LIMIT_INIT;
        unsigned long left = 99;
        LL_CHECK(ll_log_limit(&lim, 1000, 100, &left) && left == 0);
        for (int i = 0; i < 50000; i++)
            LL_CHECK(!ll_log_limit(&lim, 1000 + i * 0.001, 100, &left));
        LL_CHECK(!ll_log_limit(&lim, 1099, 100, &left));
        LL_CHECK(ll_log_limit(&lim, 1100, 100, &left) && left == 50001);
        LL_CHECK(!ll_log_limit(&lim, 1150, 100, &left));
        /* A burst limit: three at once, then one earned per interval. */
        ll_log_limit_t b = LL_LOG_LIMIT_BURST_INIT(3);
        for (int i = 0; i < 3; i++)
            LL_CHECK(ll_log_limit(&b, 2000 + i, 100, &left) && left == 0);
        LL_CHECK(!ll_log_limit(&b, 2003, 100, &left));
        LL_CHECK(!ll_log_limit(&b, 2050, 100, &left));
        LL_CHECK(ll_log_limit(&b, 2103, 100, &left) && left == 2);
        LL_CHECK(!ll_log_limit(&b, 2110, 100, &left));
        LL_CHECK(ll_log_limit(&b, 9000, 100, &left) && left == 1); /* idle long: full again */
        LL_CHECK(ll_log_limit(&b, 9000, 100, &left) && ll_log_limit(&b, 9000, 100, &left));
        LL_CHECK(!ll_log_limit(&b, 9000, 100, &left));
        ll_log_limit_t w = LL_LOG_LIMIT_INIT;
        ll_log_level = LL_LOG_INFO;
        for (int i = 0; i < 1000; i++)
            ll_warn_limited(&w, "mod", "dropped junk %d", i);
        s_drain(fds[0], buf, 1 << 20);
        LL_CHECK(strstr(buf, "dropped junk 0") && !strstr(buf, "dropped junk 1"));
        LL_CHECK(strchr(buf, '\n') == strrchr(buf, '\n')); /* one line */
        w.next_ms = 0;                                     /* the interval is over */
        ll_warn_limited(&w, "mod", "dropped junk again");
        s_drain(fds[0], buf, 1 << 20);
        LL_CHECK(strstr(buf, "dropped junk again (and 999 more like it"));
    }

    /* Level names. */
    LL_CHECK(ll_log_parse_level("debug") == LL_LOG_DEBUG);
    LL_CHECK(ll_log_parse_level("WARNING") == LL_LOG_WARN);
    LL_CHECK(ll_log_parse_level("Error") == LL_LOG_ERROR);
    LL_CHECK(ll_log_parse_level("loud") == -1);
    LL_CHECK(ll_log_parse_level(NULL) == -1);

    /* LOOSELEAF_LOG sets the level; a bad value warns and keeps it. */
    char *old_env = getenv("LOOSELEAF_LOG") ? strdup(getenv("LOOSELEAF_LOG")) : NULL;
    setenv("LOOSELEAF_LOG", "warn", 1);
    ll_log_init('G');
    LL_CHECK(ll_log_level == LL_LOG_WARN);
    setenv("LOOSELEAF_LOG", "shouting", 1);
    ll_log_init('G');
    LL_CHECK(ll_log_level == LL_LOG_WARN);
    s_drain(fds[0], buf, 1 << 20);
    LL_CHECK(strstr(buf, "LOOSELEAF_LOG") != NULL);
    if (old_env)
        setenv("LOOSELEAF_LOG", old_env, 1);
    else
        unsetenv("LOOSELEAF_LOG");
    free(old_env);

    ll_log_set_fd(saved_fd);
    ll_log_level = saved_level;
    ll_log_init('G');
    ll_log_level = saved_level;
    close(fds[0]);
    close(fds[1]);
    free(buf);
    if (s_failures)
        fprintf(stderr, "\n");
    return s_failures ? -1 : 0;
}
