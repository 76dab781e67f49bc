/* ll_hostpool_procs: what the host pool does to its workers as processes:
 * signals to a worker and its process group, whether the group lives on,
 * the host's OOM-kill count (a SIGKILL while it moved was the OOM killer)
 * and signal names for messages.  Run by the pool's one thread. */
#include "zygote/ll_hostpool_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

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
