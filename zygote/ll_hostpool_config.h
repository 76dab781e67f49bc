/* ll_hostpool_config: what the host pool (`looseleaf pool`) is told, read
 * once at its start from the LL_POOL_* environment variables and then the
 * command line (which wins), and passed to whatever needs it.  Run by the
 * pool's one thread; no I/O but the usage text, so a self-test scripts it.
 *
 * The options and variables are documented in zygote/API.md ("Subcommands"). */
#ifndef LL_HOSTPOOL_CONFIG_H
#define LL_HOSTPOOL_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#define LL_HOSTPOOL_MAX_SLOTS 64  /* --slots at most (and CUDA devices used) */
#define LL_HOSTPOOL_MAX_NODES 256 /* --max-nodes at most */

typedef struct {
    char dir[PATH_MAX]; /* runtime dir (--runtime-dir; default ll_zclient_default_dir) */
    char head[1024];    /* comma list of the base node's modules (--head, LL_POOL_HEAD) */
    char log[PATH_MAX]; /* log file of a detached pool (--log; "": DIR/pool.log) */
    int nslots;         /* slots (--slots, LL_POOL_SLOTS): virtual ones without CUDA; with CUDA
                           devices the total spread over them, when given (slots_given) */
    bool slots_given;   /* --slots or LL_POOL_SLOTS was set */
    int gpu_detect_ms;  /* the driver may take this long to count the devices
                           (LL_POOL_GPU_DETECT_MS; cuInit on many GPUs takes seconds) */
    int gpu_slots;      /* workers per CUDA device (--gpu-slots, LL_POOL_GPU_SLOTS); 0: not set */
    double gpu_mem_fraction; /* each worker's cap, a share of its device's memory
                                (LL_POOL_GPU_MEM_FRACTION); -1: 0.95 / workers on the device, none
                                when alone; 0: no cap */
    int idle_exit_s;         /* exit this long after the last client left (--idle-exit) */
    int max_nodes;           /* zygote nodes at most (--max-nodes, LL_POOL_MAX_NODES) */
    int max_staged;    /* staged workers at most, pool-wide (LL_POOL_MAX_STAGED); -1: 2 x slots */
    int warm_idle_s;   /* a warm worker unused this long leaves; 0: no warm workers (--warm-idle) */
    int spec_s;        /* a speculative worker outranks completed ones this long (--spec-window) */
    bool grow;         /* grow child nodes for tail packages (--no-grow: off) */
    bool foreground;   /* do not detach (--foreground) */
    bool no_cuda;      /* do not look for CUDA devices (LL_POOL_NO_CUDA) */
    bool staged_defer; /* staged workers only import, even without CUDA (LL_POOL_STAGED_DEFER=1) */
} ll_hostpool_config_t;

/* The built-in defaults (DIR empty: the caller fills it in). */
void ll_hostpool_config_defaults(ll_hostpool_config_t *cfg);

/* Apply the LL_POOL_* variables, read through GETENV (getenv, or a fake in
 * the self-test). */
void ll_hostpool_config_env(ll_hostpool_config_t *cfg, char *(*get)(const char *name));

/* Apply the command line ARGV[1..ARGC-1] (ARGV[0] is "pool") and check the
 * whole.  Returns 0, or -1 with the reason in ERR (an unknown option: the
 * usage text; a value out of range: which). */
int ll_hostpool_config_args(ll_hostpool_config_t *cfg, int argc, char **argv, char *err,
                            size_t errlen);

#endif
