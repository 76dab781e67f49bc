/* ll_gpu: CUDA devices counted in a short-lived child (see ll_gpu.h).  Run
 * by the pool's or the broker's one thread at its start (the detection
 * forks once; the parsing is pure and scripted by the self-test). */
#include "base/ll_gpu.h"
#include "base/ll_clock.h"
#include "base/ll_check.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* The child: ask the driver, print the answer, exit                  */

typedef int (*s_cu_int_fn)(unsigned int);
typedef int (*s_cu_intp_fn)(int *);
typedef int (*s_cu_get_fn)(int *, int);
typedef int (*s_cu_name_fn)(char *, int, int);
typedef int (*s_cu_mem_fn)(size_t *, int);
typedef int (*s_cu_err_fn)(int, const char **);

/* The driver API's answer, through library H (loaded from LIB), to OUT. */
static void s_ask_driver(void *h, const char *lib, FILE *out)
{
    s_cu_int_fn init = (s_cu_int_fn) dlsym(h, "cuInit");
    s_cu_intp_fn count = (s_cu_intp_fn) dlsym(h, "cuDeviceGetCount");
    s_cu_intp_fn version = (s_cu_intp_fn) dlsym(h, "cuDriverGetVersion");
    s_cu_get_fn get = (s_cu_get_fn) dlsym(h, "cuDeviceGet");
    s_cu_name_fn name = (s_cu_name_fn) dlsym(h, "cuDeviceGetName");
    s_cu_mem_fn mem = (s_cu_mem_fn) dlsym(h, "cuDeviceTotalMem_v2");
    s_cu_err_fn errstr = (s_cu_err_fn) dlsym(h, "cuGetErrorString");
    fprintf(out, "via %s\n", lib);
    if (!init || !count) {
        fprintf(out, "error %s has no cuInit / cuDeviceGetCount\n", lib);
        return;
    }
    int v = 0;
    if (version && version(&v) == 0)
        fprintf(out, "version %d\n", v);
    int rc = init(0);
    if (rc != 0) {
        const char *s = NULL;
        if (errstr)
            errstr(rc, &s);
        /* 100: CUDA_ERROR_NO_DEVICE (a driver, no device) */
        fprintf(out, "count 0\nerror cuInit: %s (CUresult %d)\n", s ? s : "failed", rc);
        return;
    }
    int n = 0;
    rc = count(&n);
    if (rc != 0) {
        fprintf(out, "error cuDeviceGetCount: CUresult %d\n", rc);
        return;
    }
    fprintf(out, "count %d\n", n);
    for (int i = 0; i < n && i < LL_GPU_MAX; i++) {
        int d = i;
        char nm[96] = "?";
        size_t bytes = 0;
        if (get && get(&d, i) != 0)
            continue;
        if (name)
            name(nm, (int) sizeof nm, d);
        if (mem)
            mem(&bytes, d);
        nm[sizeof nm - 1] = '\0';
        fprintf(out, "dev %d %zu %s\n", i, bytes, nm);
    }
}

/* The runtime's count (no names: its property struct changes between
 * versions), through library H (loaded from LIB), to OUT. */
static void s_ask_runtime(void *h, const char *lib, FILE *out)
{
    s_cu_intp_fn count = (s_cu_intp_fn) dlsym(h, "cudaGetDeviceCount");
    s_cu_intp_fn version = (s_cu_intp_fn) dlsym(h, "cudaDriverGetVersion");
    fprintf(out, "via %s\n", lib);
    int v = 0, n = 0;
    if (version && version(&v) == 0)
        fprintf(out, "version %d\n", v);
    int rc = count ? count(&n) : -1;
    if (rc != 0)
        fprintf(out, "count 0\nerror cudaGetDeviceCount: cudaError %d\n", rc);
    else
        fprintf(out, "count %d\n", n);
}

static void s_child(int wfd)
{
    FILE *out = fdopen(wfd, "w");
    if (!out)
        _exit(1);
    const char *override = getenv("LL_CUDA_DRIVER");
    static const char *const drivers[] = {"libcuda.so.1", "libcuda.so", NULL};
    static const char *const runtimes[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so", NULL};
    void *h = NULL;
    if (override && *override) {
        h = dlopen(override, RTLD_NOW | RTLD_LOCAL);
        if (h)
            s_ask_driver(h, override, out);
        else
            fprintf(out, "error LL_CUDA_DRIVER=%s does not load: %s\n", override, dlerror());
        fflush(out);
        _exit(0);
    }
    for (int i = 0; drivers[i] && !h; i++)
        if ((h = dlopen(drivers[i], RTLD_NOW | RTLD_LOCAL)))
            s_ask_driver(h, drivers[i], out);
    for (int i = 0; runtimes[i] && !h; i++)
        if ((h = dlopen(runtimes[i], RTLD_NOW | RTLD_LOCAL)))
            s_ask_runtime(h, runtimes[i], out);
    if (!h)
        fprintf(out, "error no CUDA driver (libcuda.so.1) or runtime on the loader path\n");
    fflush(out);
    _exit(0);
}

/* ------------------------------------------------------------------ */
/* The pool's side                                                    */

int ll_gpu_parse(const char *text, ll_gpu_info_t *out)
{
    bool counted = false;
    const char *line = text;
    while (line && *line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t) (end - line) : strlen(line);
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int) (len < sizeof buf ? len : sizeof buf - 1), line);
        int n = 0, i = 0, off = 0;
        size_t bytes = 0;
        if (sscanf(buf, "count %d", &n) == 1 && n >= 0) {
            out->count = n < LL_GPU_MAX ? n : LL_GPU_MAX;
            counted = true;
        } else if (sscanf(buf, "version %d", &n) == 1) {
            out->driver_version = n;
        } else if (strncmp(buf, "via ", 4) == 0) {
            snprintf(out->via, sizeof out->via, "%.127s", buf + 4);
        } else if (strncmp(buf, "error ", 6) == 0) {
            snprintf(out->why, sizeof out->why, "%.255s", buf + 6);
        } else if (sscanf(buf, "dev %d %zu %n", &i, &bytes, &off) == 2 && i >= 0 &&
                   i < LL_GPU_MAX && off > 0) {
            snprintf(out->dev[i].name, sizeof out->dev[i].name, "%s", buf + off);
            out->dev[i].mem_bytes = bytes;
        }
        line = end ? end + 1 : NULL;
    }
    if (!counted) {
        out->count = 0;
        if (!out->why[0])
            snprintf(out->why, sizeof out->why, "the detection said nothing");
        return -1;
    }
    return 0;
}

int ll_gpu_detect(ll_gpu_info_t *out, int timeout_ms)
{
    memset(out, 0, sizeof *out);
    double t0 = ll_clock_ms();
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        snprintf(out->why, sizeof out->why, "pipe: %s", strerror(errno));
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(out->why, sizeof out->why, "fork: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        return 0;
    }
    if (pid == 0) {
        close(p[0]);
        s_child(p[1]);
    }
    close(p[1]);
    char text[8192];
    size_t len = 0;
    bool timed_out = false;
    for (;;) {
        int left = timeout_ms - (int) (ll_clock_ms() - t0);
        struct pollfd pfd = {p[0], POLLIN, 0};
        int rc = left > 0 ? poll(&pfd, 1, left) : 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) {
            timed_out = true;
            break;
        }
        ssize_t r = read(p[0], text + len, sizeof text - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t) r;
        if (len == sizeof text - 1)
            break;
    }
    text[len] = '\0';
    close(p[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    ll_gpu_parse(text, out);
    if (timed_out) {
        out->count = 0;
        snprintf(out->why, sizeof out->why, "no answer from %s within %d ms: killed",
                 out->via[0] ? out->via : "the CUDA driver", timeout_ms);
    } else if (WIFSIGNALED(status)) {
        out->count = 0;
        snprintf(out->why, sizeof out->why, "the detection died of signal %d in %s",
                 WTERMSIG(status), out->via[0] ? out->via : "the CUDA driver");
    }
    out->ms = ll_clock_ms() - t0;
    return out->count;
}

void ll_gpu_visible_entry(const char *visible, int dev, char *buf, size_t len)
{
    snprintf(buf, len, "%d", dev);
    if (!visible || !*visible)
        return;
    const char *p = visible;
    for (int i = 0; i < dev && p; i++) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    if (!p || !*p)
        return;
    size_t n = strcspn(p, ",");
    snprintf(buf, len, "%.*s", (int) n, p);
}

/* ------------------------------------------------------------------ */
/* Self-test: the child's answers parsed, the visible list.            */

int ll_gpu_selftest(bool verbose)
{
    int fails = 0;
    ll_gpu_info_t g;
    memset(&g, 0, sizeof g);
    S_CHECK(
        ll_gpu_parse("via libcuda.so.1\nversion 13000\ncount 2\n"
                     "dev 0 150754820096 NVIDIA H200\ndev 1 85899345920 NVIDIA A100-SXM4-80GB\n",
                     &g) == 0);
    S_CHECK(g.count == 2 && g.driver_version == 13000 && strcmp(g.via, "libcuda.so.1") == 0);
    S_CHECK(strcmp(g.dev[0].name, "NVIDIA H200") == 0 && g.dev[0].mem_bytes == 150754820096ULL);
    S_CHECK(strcmp(g.dev[1].name, "NVIDIA A100-SXM4-80GB") == 0 && !g.why[0]);
    /* A driver without a device: counted 0, with the reason. */
    memset(&g, 0, sizeof g);
    S_CHECK(ll_gpu_parse("via libcuda.so.1\ncount 0\nerror cuInit: no CUDA-capable device is "
                         "detected (CUresult 100)\n",
                         &g) == 0);
    S_CHECK(g.count == 0 && strstr(g.why, "CUresult 100"));
    /* Nothing usable (no driver; a child that died before it said anything). */
    memset(&g, 0, sizeof g);
    S_CHECK(ll_gpu_parse("error no CUDA driver (libcuda.so.1) or runtime on the loader path\n",
                         &g) == -1);
    S_CHECK(g.count == 0 && strstr(g.why, "no CUDA driver"));
    memset(&g, 0, sizeof g);
    S_CHECK(ll_gpu_parse("", &g) == -1 && strstr(g.why, "said nothing"));
    memset(&g, 0, sizeof g);
    S_CHECK(ll_gpu_parse("count 1\ndev 99 5 X\ndev 0 7\ngarbage\n", &g) == 0 && g.count == 1 &&
            g.dev[0].name[0] == '\0');

    /* The pool's own CUDA_VISIBLE_DEVICES maps device indices to its entries. */
    char b[64];
    ll_gpu_visible_entry(NULL, 1, b, sizeof b);
    S_CHECK(strcmp(b, "1") == 0);
    ll_gpu_visible_entry("", 0, b, sizeof b);
    S_CHECK(strcmp(b, "0") == 0);
    ll_gpu_visible_entry("2,3", 1, b, sizeof b);
    S_CHECK(strcmp(b, "3") == 0);
    ll_gpu_visible_entry("GPU-aa,GPU-bb,GPU-cc", 0, b, sizeof b);
    S_CHECK(strcmp(b, "GPU-aa") == 0);
    ll_gpu_visible_entry("5", 3, b, sizeof b); /* beyond the list: the index itself */
    S_CHECK(strcmp(b, "3") == 0);

    /* The detection itself, with a driver that does not load: no device, said why, no hang. */
    const char *was = getenv("LL_CUDA_DRIVER");
    char *saved = was ? strdup(was) : NULL;
    setenv("LL_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    S_CHECK(ll_gpu_detect(&g, 5000) == 0 && strstr(g.why, "does not load"));
    if (saved)
        setenv("LL_CUDA_DRIVER", saved, 1);
    else
        unsetenv("LL_CUDA_DRIVER");
    free(saved);
    if (verbose)
        fprintf(stderr, "ll_gpu: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
