/* ll_usage: usage_reply content from /proc (see ll_usage.h).  Kernel
 * process, control thread.
 *
 * The kernel's "children" are found by walking /proc for processes whose
 * parent chain reaches us (what psutil's children(recursive=True) does):
 * shell commands and subprocesses a cell started count towards the kernel. */
#include "gateway/ll_usage.h"
#include "base/ll_clock.h"

#include <ctype.h>
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LL_USAGE_MAX_PROCS 4096

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static double s_prev_wall = -1; /* seconds, monotonic, of the previous request */
static double s_prev_proc_cpu;  /* kernel+children CPU seconds then */
static uint64_t s_prev_host_busy, s_prev_host_total; /* /proc/stat jiffies then */

/* ppid and utime+stime (clock ticks) of PID from /proc/PID/stat. */
static int s_proc_stat(int pid, int *ppid, uint64_t *ticks)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may contain spaces and parentheses: fields start
     * after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    unsigned long long ut = 0, st = 0;
    int pp = 0;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 1, " %*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &pp, &ut, &st) != 3)
        return -1;
    *ppid = pp;
    *ticks = ut + st;
    return 0;
}

/* Resident memory of PID in bytes: PSS where the kernel reports it. */
static uint64_t s_proc_memory(int pid)
{
    char path[64], line[256];
    uint64_t pss = 0, rss = 0;
    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", pid);
    FILE *f = fopen(path, "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "Pss: %" SCNu64, &pss) == 1)
                break;
        fclose(f);
        if (pss)
            return pss * 1024;
    }
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    f = fopen(path, "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmRSS: %" SCNu64, &rss) == 1)
                break;
        fclose(f);
    }
    return rss * 1024;
}

/* CPU seconds and memory of the kernel and all its descendants. */
static void s_tree_usage(double *cpu_s, uint64_t *mem)
{
    static int pids[LL_USAGE_MAX_PROCS], ppids[LL_USAGE_MAX_PROCS];
    static uint64_t ticks[LL_USAGE_MAX_PROCS];
    static bool in_tree[LL_USAGE_MAX_PROCS];
    int n = 0, self = (int) getpid();
    DIR *d = opendir("/proc");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && n < LL_USAGE_MAX_PROCS) {
            if (!isdigit((unsigned char) e->d_name[0]))
                continue;
            int pid = atoi(e->d_name);
            if (s_proc_stat(pid, &ppids[n], &ticks[n]) == 0) {
                pids[n] = pid;
                in_tree[n] = pid == self;
                n++;
            }
        }
        closedir(d);
    }
    /* Mark descendants: repeat until no new member (trees are shallow). */
    for (bool grew = true; grew;) {
        grew = false;
        for (int i = 0; i < n; i++) {
            if (in_tree[i])
                continue;
            for (int j = 0; j < n; j++)
                if (in_tree[j] && pids[j] == ppids[i]) {
                    in_tree[i] = grew = true;
                    break;
                }
        }
    }
    long hz = sysconf(_SC_CLK_TCK);
    uint64_t total_ticks = 0;
    *mem = 0;
    for (int i = 0; i < n; i++)
        if (in_tree[i]) {
            total_ticks += ticks[i];
            *mem += s_proc_memory(pids[i]);
        }
    *cpu_s = hz > 0 ? (double) total_ticks / (double) hz : 0;
}

/* Busy and total jiffies of the whole host (first line of /proc/stat). */
static int s_host_cpu(uint64_t *busy, uint64_t *total)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    unsigned long long v[8] = {0};
    int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                     &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (got < 4)
        return -1;
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++)
        sum += v[i];
    *total = sum;
    *busy = sum - v[3] - v[4]; /* minus idle and iowait */
    return 0;
}

/* psutil.virtual_memory() from /proc/meminfo (bytes). */
static json_t *s_host_memory(void)
{
    uint64_t total = 0, free_ = 0, avail = 0, buffers = 0, cached = 0, shared = 0, active = 0,
             inactive = 0, slab = 0, sreclaim = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return json_object();
    while (fgets(line, sizeof line, f)) {
        uint64_t kb;
        char key[64];
        if (sscanf(line, "%63[^:]: %" SCNu64, key, &kb) != 2)
            continue;
        kb *= 1024;
        if (!strcmp(key, "MemTotal"))
            total = kb;
        else if (!strcmp(key, "MemFree"))
            free_ = kb;
        else if (!strcmp(key, "MemAvailable"))
            avail = kb;
        else if (!strcmp(key, "Buffers"))
            buffers = kb;
        else if (!strcmp(key, "Cached"))
            cached = kb;
        else if (!strcmp(key, "Shmem"))
            shared = kb;
        else if (!strcmp(key, "Active"))
            active = kb;
        else if (!strcmp(key, "Inactive"))
            inactive = kb;
        else if (!strcmp(key, "Slab"))
            slab = kb;
        else if (!strcmp(key, "SReclaimable"))
            sreclaim = kb;
    }
    fclose(f);
    cached += sreclaim; /* psutil counts reclaimable slab as cache */
    uint64_t used = total > free_ + buffers + cached ? total - free_ - buffers - cached : 0;
    double percent = total ? 100.0 * (double) (total - avail) / (double) total : 0;
    percent = (double) (int64_t) (percent * 10 + 0.5) / 10; /* psutil rounds to one decimal */
    return json_pack("{s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "total",
                     (json_int_t) total, "available", (json_int_t) avail, "percent", percent,
                     "used", (json_int_t) used, "free", (json_int_t) free_, "active",
                     (json_int_t) active, "inactive", (json_int_t) inactive, "buffers",
                     (json_int_t) buffers, "cached", (json_int_t) cached, "shared",
                     (json_int_t) shared, "slab", (json_int_t) slab);
}

json_t *ll_usage_reply(void)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    double cpu_s;
    uint64_t mem;
    s_tree_usage(&cpu_s, &mem);
    uint64_t busy = 0, total = 0;
    bool have_host = s_host_cpu(&busy, &total) == 0;
    double now = ll_clock_s();

    pthread_mutex_lock(&s_lock);
    double kernel_cpu = 0, host_cpu = -1;
    if (s_prev_wall >= 0 && now > s_prev_wall)
        kernel_cpu = 100.0 * (cpu_s - s_prev_proc_cpu) / (now - s_prev_wall);
    if (s_prev_wall >= 0 && have_host && total > s_prev_host_total)
        host_cpu =
            100.0 * (double) (busy - s_prev_host_busy) / (double) (total - s_prev_host_total);
    s_prev_wall = now;
    s_prev_proc_cpu = cpu_s;
    if (have_host) {
        s_prev_host_busy = busy;
        s_prev_host_total = total;
    }
    pthread_mutex_unlock(&s_lock);

    if (kernel_cpu < 0)
        kernel_cpu = 0; /* a child that exited took its ticks with it */
    /* One decimal, as psutil reports percentages. */
    kernel_cpu = (double) (int64_t) (kernel_cpu * 10 + 0.5) / 10;
    host_cpu = host_cpu > 0 ? (double) (int64_t) (host_cpu * 10 + 0.5) / 10 : host_cpu;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    json_t *reply =
        json_pack("{s:s, s:i, s:f, s:I, s:i, s:o}", "hostname", host, "pid", (int) getpid(),
                  "kernel_cpu", kernel_cpu, "kernel_memory", (json_int_t) mem, "cpu_count",
                  (int) (ncpu > 0 ? ncpu : 1), "host_virtual_memory", s_host_memory());
    /* ipykernel leaves host_cpu_percent out when psutil reports 0.0 (first call). */
    if (reply && host_cpu > 0)
        json_object_set_new(reply, "host_cpu_percent", json_real(host_cpu));
    return reply;
}

int ll_usage_selftest(bool verbose)
{
    json_t *a = ll_usage_reply();
    /* Burn a little CPU so the second sample has something to measure. */
    volatile double x = 0;
    for (int i = 0; i < 3000000; i++)
        x += i * 0.5;
    json_t *b = ll_usage_reply();
    int rc = -1;
    if (!a || !b)
        goto out;
    json_t *vm = json_object_get(b, "host_virtual_memory");
    if (json_integer_value(json_object_get(b, "pid")) != getpid() ||
        json_integer_value(json_object_get(b, "kernel_memory")) <= 0 ||
        json_integer_value(json_object_get(b, "cpu_count")) < 1 ||
        !json_is_real(json_object_get(b, "kernel_cpu")) ||
        json_real_value(json_object_get(b, "kernel_cpu")) < 0 ||
        json_integer_value(json_object_get(vm, "total")) <= 0 ||
        json_integer_value(json_object_get(vm, "available")) >
            json_integer_value(json_object_get(vm, "total")) ||
        !json_is_string(json_object_get(b, "hostname")))
        goto out;
    if (verbose)
        printf("(kernel_memory %lld, kernel_cpu %.1f%%) ",
               (long long) json_integer_value(json_object_get(b, "kernel_memory")),
               json_real_value(json_object_get(b, "kernel_cpu")));
    rc = 0;
out:
    json_decref(a);
    json_decref(b);
    return rc;
}
