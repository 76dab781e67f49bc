/* ll_hostpool_config: the host pool's options, read once (see
 * ll_hostpool_config.h).  Run by the pool's one thread at its start. */
#include "zygote/ll_hostpool_config.h"
#include "base/ll_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_DEFAULT_HEAD "numpy,torch,IPython,looseleaf_kernel,looseleaf_store"

static const char s_usage[] =
    "usage: looseleaf pool [--runtime-dir DIR] [--slots N] [--gpu-slots N] [--idle-exit SECONDS]\n"
    "                      [--head MOD,MOD,...] [--max-nodes N] [--no-grow] [--foreground]\n"
    "                      [--warm-idle SECONDS] [--spec-window SECONDS]\n";

void ll_hostpool_config_defaults(ll_hostpool_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->head, sizeof cfg->head, "%s", S_DEFAULT_HEAD);
    cfg->nslots = 2;
    cfg->gpu_mem_fraction = -1;
    cfg->gpu_detect_ms = 30000;
    cfg->idle_exit_s = 300;
    cfg->max_nodes = 50;
    cfg->max_staged = -1;
    /* Warm workers are off unless asked for: the kernel asks (300 s,
     * gateway/ll_route.c); bare pools (tests/zygote) fork per cell. */
    cfg->warm_idle_s = 0;
    cfg->spec_s = 30;
    cfg->grow = true;
}

/* VAR read through GET as an int into *OUT, when set. */
static void s_env_int(char *(*get)(const char *), const char *var, int *out)
{
    const char *v = get(var);
    if (v)
        *out = atoi(v);
}

void ll_hostpool_config_env(ll_hostpool_config_t *cfg, char *(*get)(const char *name))
{
    const char *head = get("LL_POOL_HEAD");
    if (head)
        snprintf(cfg->head, sizeof cfg->head, "%s", head);
    cfg->slots_given = get("LL_POOL_SLOTS") != NULL;
    s_env_int(get, "LL_POOL_SLOTS", &cfg->nslots);
    s_env_int(get, "LL_POOL_GPU_SLOTS", &cfg->gpu_slots);
    s_env_int(get, "LL_POOL_GPU_DETECT_MS", &cfg->gpu_detect_ms);
    const char *frac = get("LL_POOL_GPU_MEM_FRACTION");
    if (frac && *frac)
        cfg->gpu_mem_fraction = atof(frac);
    s_env_int(get, "LL_POOL_IDLE_EXIT", &cfg->idle_exit_s);
    s_env_int(get, "LL_POOL_MAX_NODES", &cfg->max_nodes);
    s_env_int(get, "LL_POOL_MAX_STAGED", &cfg->max_staged);
    s_env_int(get, "LL_POOL_WARM_IDLE_S", &cfg->warm_idle_s);
    s_env_int(get, "LL_POOL_SPEC_S", &cfg->spec_s);
    cfg->no_cuda = get("LL_POOL_NO_CUDA") != NULL; /* set at all, whatever its value */
    const char *defer = get("LL_POOL_STAGED_DEFER");
    cfg->staged_defer = defer && strcmp(defer, "1") == 0;
}

int ll_hostpool_config_args(ll_hostpool_config_t *cfg, int argc, char **argv, char *err,
                            size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool nx = i + 1 < argc;
        if (strcmp(a, "--runtime-dir") == 0 && nx)
            snprintf(cfg->dir, sizeof cfg->dir, "%s", argv[++i]);
        else if (strcmp(a, "--slots") == 0 && nx) {
            cfg->nslots = atoi(argv[++i]);
            cfg->slots_given = true;
        } else if (strcmp(a, "--gpu-slots") == 0 && nx)
            cfg->gpu_slots = atoi(argv[++i]);
        else if (strcmp(a, "--idle-exit") == 0 && nx)
            cfg->idle_exit_s = atoi(argv[++i]);
        else if (strcmp(a, "--head") == 0 && nx)
            snprintf(cfg->head, sizeof cfg->head, "%s", argv[++i]);
        else if (strcmp(a, "--max-nodes") == 0 && nx)
            cfg->max_nodes = atoi(argv[++i]);
        else if (strcmp(a, "--warm-idle") == 0 && nx)
            cfg->warm_idle_s = atoi(argv[++i]);
        else if (strcmp(a, "--spec-window") == 0 && nx)
            cfg->spec_s = atoi(argv[++i]);
        else if (strcmp(a, "--log") == 0 && nx)
            snprintf(cfg->log, sizeof cfg->log, "%s", argv[++i]);
        else if (strcmp(a, "--no-grow") == 0)
            cfg->grow = false;
        else if (strcmp(a, "--foreground") == 0)
            cfg->foreground = true;
        else {
            snprintf(err, errlen, "%s", s_usage);
            return -1;
        }
    }
    if (cfg->nslots < 1 || cfg->nslots > LL_HOSTPOOL_MAX_SLOTS || cfg->max_nodes < 1 ||
        cfg->max_nodes > LL_HOSTPOOL_MAX_NODES || cfg->idle_exit_s < 0 || cfg->warm_idle_s < 0 ||
        cfg->spec_s < 0 || cfg->gpu_slots < 0 || cfg->gpu_slots > LL_HOSTPOOL_MAX_SLOTS ||
        cfg->gpu_mem_fraction > 1 || (cfg->gpu_mem_fraction < 0 && cfg->gpu_mem_fraction != -1)) {
        snprintf(err, errlen,
                 "looseleaf pool: --slots must be 1..%d, --max-nodes 1..%d, --idle-exit, "
                 "--warm-idle and --spec-window >= 0, --gpu-slots 0..%d, "
                 "LL_POOL_GPU_MEM_FRACTION 0..1\n",
                 LL_HOSTPOOL_MAX_SLOTS, LL_HOSTPOOL_MAX_NODES, LL_HOSTPOOL_MAX_SLOTS);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Self-test: a scripted environment and command lines.               */

static const char *const *s_fake_env; /* NAME=VALUE strings, NULL-terminated */

static char *s_fake_getenv(const char *name)
{
    size_t n = strlen(name);
    for (int i = 0; s_fake_env && s_fake_env[i]; i++)
        if (strncmp(s_fake_env[i], name, n) == 0 && s_fake_env[i][n] == '=')
            return (char *) s_fake_env[i] + n + 1;
    return NULL;
}

int ll_hostpool_config_selftest(bool verbose)
{
    int fails = 0;
    ll_hostpool_config_t cfg;
    char err[512];

    /* Defaults: 2 virtual slots, warm workers off, growth on. */
    ll_hostpool_config_defaults(&cfg);
    s_fake_env = NULL;
    ll_hostpool_config_env(&cfg, s_fake_getenv);
    char *none[] = {"pool", NULL};
    S_CHECK(ll_hostpool_config_args(&cfg, 1, none, err, sizeof err) == 0);
    S_CHECK(cfg.nslots == 2 && cfg.idle_exit_s == 300 && cfg.max_nodes == 50);
    S_CHECK(cfg.max_staged == -1 && cfg.warm_idle_s == 0 && cfg.spec_s == 30);
    S_CHECK(cfg.grow && !cfg.foreground && !cfg.no_cuda && !cfg.staged_defer);
    S_CHECK(!cfg.slots_given && cfg.gpu_slots == 0 && cfg.gpu_mem_fraction == -1 &&
            cfg.gpu_detect_ms == 30000);
    S_CHECK(strcmp(cfg.head, S_DEFAULT_HEAD) == 0 && cfg.dir[0] == '\0' && cfg.log[0] == '\0');

    /* The environment sets defaults; the command line wins over it. */
    static const char *const env[] = {"LL_POOL_HEAD=numpy,IPython", "LL_POOL_SLOTS=3",
                                      "LL_POOL_IDLE_EXIT=60",       "LL_POOL_MAX_NODES=7",
                                      "LL_POOL_MAX_STAGED=5",       "LL_POOL_WARM_IDLE_S=300",
                                      "LL_POOL_SPEC_S=10",          "LL_POOL_NO_CUDA=",
                                      "LL_POOL_STAGED_DEFER=1",     NULL};
    ll_hostpool_config_defaults(&cfg);
    s_fake_env = env;
    ll_hostpool_config_env(&cfg, s_fake_getenv);
    S_CHECK(strcmp(cfg.head, "numpy,IPython") == 0 && cfg.nslots == 3 && cfg.idle_exit_s == 60);
    S_CHECK(cfg.max_nodes == 7 && cfg.max_staged == 5 && cfg.warm_idle_s == 300 &&
            cfg.spec_s == 10);
    S_CHECK(cfg.no_cuda && cfg.staged_defer); /* NO_CUDA counts when set, even empty */
    S_CHECK(cfg.slots_given);
    char *args[] = {"pool",
                    "--runtime-dir",
                    "/tmp/d",
                    "--slots",
                    "4",
                    "--idle-exit",
                    "0",
                    "--head",
                    "IPython",
                    "--max-nodes",
                    "9",
                    "--warm-idle",
                    "1",
                    "--spec-window",
                    "0",
                    "--log",
                    "/tmp/l",
                    "--no-grow",
                    "--foreground",
                    NULL};
    S_CHECK(ll_hostpool_config_args(&cfg, 19, args, err, sizeof err) == 0);
    S_CHECK(strcmp(cfg.dir, "/tmp/d") == 0 && strcmp(cfg.log, "/tmp/l") == 0);
    S_CHECK(cfg.nslots == 4 && cfg.idle_exit_s == 0 && strcmp(cfg.head, "IPython") == 0);
    S_CHECK(cfg.max_nodes == 9 && cfg.warm_idle_s == 1 && cfg.spec_s == 0);
    S_CHECK(!cfg.grow && cfg.foreground && cfg.max_staged == 5);

    /* Workers per CUDA device and their memory cap. */
    static const char *const envg[] = {"LL_POOL_GPU_SLOTS=3", "LL_POOL_GPU_MEM_FRACTION=0.25",
                                       "LL_POOL_GPU_DETECT_MS=500", NULL};
    ll_hostpool_config_defaults(&cfg);
    s_fake_env = envg;
    ll_hostpool_config_env(&cfg, s_fake_getenv);
    S_CHECK(cfg.gpu_slots == 3 && cfg.gpu_mem_fraction == 0.25 && !cfg.slots_given &&
            cfg.gpu_detect_ms == 500);
    char *gargs[] = {"pool", "--gpu-slots", "2", NULL};
    S_CHECK(ll_hostpool_config_args(&cfg, 3, gargs, err, sizeof err) == 0 && cfg.gpu_slots == 2);
    static const char *const envg2[] = {"LL_POOL_GPU_MEM_FRACTION=1.5", NULL};
    ll_hostpool_config_defaults(&cfg);
    s_fake_env = envg2;
    ll_hostpool_config_env(&cfg, s_fake_getenv);
    S_CHECK(ll_hostpool_config_args(&cfg, 1, none, err, sizeof err) == -1 &&
            strstr(err, "LL_POOL_GPU_MEM_FRACTION 0..1"));

    /* LL_POOL_STAGED_DEFER asks only with "1". */
    static const char *const env2[] = {"LL_POOL_STAGED_DEFER=yes", NULL};
    ll_hostpool_config_defaults(&cfg);
    s_fake_env = env2;
    ll_hostpool_config_env(&cfg, s_fake_getenv);
    S_CHECK(!cfg.staged_defer && !cfg.no_cuda);

    /* An unknown option, or one missing its value: the usage text. */
    char *bad[] = {"pool", "--slots", NULL};
    ll_hostpool_config_defaults(&cfg);
    S_CHECK(ll_hostpool_config_args(&cfg, 2, bad, err, sizeof err) == -1 &&
            strncmp(err, "usage: looseleaf pool", 21) == 0);
    char *bad2[] = {"pool", "--bogus", NULL};
    S_CHECK(ll_hostpool_config_args(&cfg, 2, bad2, err, sizeof err) == -1 &&
            strncmp(err, "usage:", 6) == 0);

    /* Values out of range, from the command line or the environment. */
    char *range[][3] = {{"pool", "--slots", "0"},        {"pool", "--slots", "65"},
                        {"pool", "--max-nodes", "0"},    {"pool", "--max-nodes", "257"},
                        {"pool", "--idle-exit", "-1"},   {"pool", "--warm-idle", "-1"},
                        {"pool", "--spec-window", "-1"}, {"pool", "--gpu-slots", "-1"},
                        {"pool", "--gpu-slots", "65"}};
    for (size_t i = 0; i < sizeof range / sizeof range[0]; i++) {
        ll_hostpool_config_defaults(&cfg);
        S_CHECK(ll_hostpool_config_args(&cfg, 3, range[i], err, sizeof err) == -1 &&
                strstr(err, "--slots must be 1..64, --max-nodes 1..256"));
    }
    char *edge[] = {"pool", "--slots", "64", "--max-nodes", "256", NULL};
    ll_hostpool_config_defaults(&cfg);
    S_CHECK(ll_hostpool_config_args(&cfg, 5, edge, err, sizeof err) == 0);
    static const char *const env3[] = {"LL_POOL_SLOTS=0", NULL};
    ll_hostpool_config_defaults(&cfg);
    s_fake_env = env3;
    ll_hostpool_config_env(&cfg, s_fake_getenv);
    S_CHECK(ll_hostpool_config_args(&cfg, 1, none, err, sizeof err) == -1);
    s_fake_env = NULL;
    if (verbose)
        fprintf(stderr, "ll_hostpool_config: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
