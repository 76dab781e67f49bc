/* ll_hostpool_procs: what the host pool does to its workers as processes:
 * signals to a worker and its process group, whether the group lives on,
 * what its cells started out of that group (ll_hostpool_kill_strays),
 * the host's OOM-kill count (a SIGKILL while it moved was the OOM killer)
 * and signal names for messages.  Run by the pool's one thread. */
#include "zygote/ll_hostpool_internal.h"

#include "base/ll_log.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* SIG's name without "SIG" ("KILL"), "?" when unknown. */
const char *ll_hostpool_signame(int sig)
{
    const char *d = sigabbrev_np(sig);
    return d ? d : "?";
}

/* Signal SIG to worker PID; SIGKILL goes to its whole process group (its
 * own since the fork: whatever its cells started dies with it). */
void ll_hostpool_signal_worker(pid_t pid, int sig)
{
    if (pid <= 0)
        return;
    if (sig == SIGKILL)
        kill(-pid, SIGKILL);
    kill(pid, sig);
}

/* Whether a process of worker PID's group still exists (a zombie too: it
 * is reaped here, as their subreaper). */
bool ll_hostpool_group_alive(pid_t pid)
{
    return pid > 0 && (kill(-pid, 0) == 0 || errno == EPERM);
}

/* The processes the kernel's OOM killer has ended on this host so far
 * (/proc/vmstat; 0 when unknown).  A worker killed by SIGKILL while this
 * moved was, in all likelihood, one of them: another process of the host
 * killed by it at the same moment would be counted too, which only makes
 * the report blame memory for a kill that had another cause. */
unsigned long long ll_hostpool_oom_kills(void)
{
    FILE *f = fopen("/proc/vmstat", "re");
    char line[128];
    unsigned long long n = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "oom_kill %llu", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

/* One process as /proc/PID/stat tells it. */
typedef struct {
    pid_t pid, ppid, pgid;
    bool zombie;
    bool mark; /* to be killed */
} s_proc_t;

/* Every process of the host (a table the caller frees), *N_P of them. */
static s_proc_t *s_procs(size_t *n_p)
{
    *n_p = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return NULL;
    size_t n = 0, cap = 256;
    s_proc_t *t = malloc(cap * sizeof *t);
    struct dirent *e;
    while (t && (e = readdir(d))) {
        char path[300], buf[512];
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = '\0';
        const char *rp = strrchr(buf, ')'); /* the command may hold spaces and ')' */
        char state;
        int ppid, pgid;
        if (!rp || sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgid) != 3)
            continue;
        if (n == cap) {
            s_proc_t *nt = realloc(t, (cap *= 2) * sizeof *t);
            if (!nt)
                break;
            t = nt;
        }
        t[n++] = (s_proc_t){(pid_t) atoi(e->d_name), ppid, pgid, state == 'Z', false};
    }
    closedir(d);
    *n_p = t ? n : 0;
    return t;
}

/* Whether PID is the worker of a job. */
static bool s_is_worker(const ll_hostpool_t *pool, pid_t pid)
{
    for (int r = 0; r < LL_SCHED_MAX_JOBS; r++)
        if (pool->runs[r].worker.pid == pid && pid > 0)
            return true;
    return false;
}

int ll_hostpool_kill_strays(ll_hostpool_t *pool, bool workers_too)
{
    size_t n;
    s_proc_t *t = s_procs(&n);
    if (!t)
        return 0;
    pid_t self = getpid(), group = getpgrp();
    /* The roots: our children that are not ours to keep (a zygote, a
     * probe or the GPU count share our group; a worker leads its own and
     * is known), and with WORKERS_TOO every worker. */
    for (size_t i = 0; i < n; i++) {
        bool worker = s_is_worker(pool, t[i].pid);
        t[i].mark = (t[i].ppid == self && t[i].pgid != group && !worker) || (workers_too && worker);
    }
    /* And everything under them (a worker adopts its cells' orphans). */
    for (bool grew = true; grew;) {
        grew = false;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n && !t[i].mark; j++)
                if (t[j].mark && t[i].ppid == t[j].pid && t[i].pid != self)
                    t[i].mark = grew = true;
    }
    int killed = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t[i].mark || t[i].zombie)
            continue;
        if (!s_is_worker(pool, t[i].pid)) {
            ll_warn("pool",
                    "process %d (group %d), started by a cell outside its worker's group, "
                    "outlived it: killed",
                    (int) t[i].pid, (int) t[i].pgid);
            killed++;
        }
        if (t[i].pgid > 1 && t[i].pgid != group)
            kill(-t[i].pgid, SIGKILL);
        kill(t[i].pid, SIGKILL);
    }
    free(t);
    return killed;
}
