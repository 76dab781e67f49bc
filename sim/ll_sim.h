/* ll_sim: the trace-driven fleet simulator behind `looseleaf simulate`
 * (sim/API.md).  A discrete-event simulation of notebook sessions (a trace,
 * sim/ll_trace.h) on GPU hosts, run for several designs at once over the
 * same sessions: LooseLeaf (with and without edit-time prefetch) and the
 * baselines (session-pinned, keep-alive, NotebookOS, naive serverless).
 * LooseLeaf's hosts run the host pool's own policy code: each host's slots,
 * queue, warm workers and prefetch credit are an ll_sched (policy/ll_sched.h,
 * GreedyDual inside), jobs go to hosts by ll_place and the fleet's size
 * follows ll_provision, the same modules a multi-host service uses.
 *
 * Runs in the `looseleaf simulate` process, single-threaded.  Memory is
 * bounded by the sessions alive at once, not by the trace's length: the
 * trace is read as simulated time reaches each session's arrival, and a
 * session is freed once every design is done with it. */
#ifndef LL_SIM_H
#define LL_SIM_H

#include "sim/ll_cost.h"
#include "sim/ll_trace.h"

#include <stdbool.h>
#include <stdint.h>

/* The designs, in the order of every report. */
typedef enum {
    LL_SIM_PINNED = 0,     /* a GPU per session from connect to close, best-fit hosts */
    LL_SIM_PINNED_PACKED,  /* ... its lower bound: hosts = ceil(sessions / G) at every instant */
    LL_SIM_KEEPALIVE,      /* a GPU container per session, discarded after an idle timeout */
    LL_SIM_NOTEBOOKOS,     /* three replicas per kernel, a GPU bound per cell */
    LL_SIM_NAIVE,          /* a fresh process per GPU cell, the whole namespace in and out */
    LL_SIM_LOOSELEAF_NOPF, /* LooseLeaf without edit-time prefetch */
    /* Ablations: LooseLeaf with one mechanism off each. */
    LL_SIM_LOOSELEAF_NOCLOSURE, /* restores the whole namespace, not the cell's closure */
    LL_SIM_LOOSELEAF_FULLSAVE,  /* saves the whole namespace after a cell, not what it wrote */
    LL_SIM_LOOSELEAF_NOIMPORT,  /* no zygote import cache: a cold worker is a fresh interpreter */
    LL_SIM_LOOSELEAF_NOWARM,    /* no warm workers: every cell in a newly forked worker */
    LL_SIM_LOOSELEAF,           /* LooseLeaf */
    LL_SIM_NDESIGNS
} ll_sim_design_t;

/* What `looseleaf simulate` runs without --designs: the comparison. */
#define LL_SIM_DEFAULT_DESIGNS                                                    \
    (1u << LL_SIM_PINNED | 1u << LL_SIM_PINNED_PACKED | 1u << LL_SIM_KEEPALIVE |  \
     1u << LL_SIM_NOTEBOOKOS | 1u << LL_SIM_NAIVE | 1u << LL_SIM_LOOSELEAF_NOPF | \
     1u << LL_SIM_LOOSELEAF)
/* ... with --ablations: LooseLeaf, each mechanism off, naive serverless. */
#define LL_SIM_ABLATION_DESIGNS                                                            \
    (1u << LL_SIM_NAIVE | 1u << LL_SIM_LOOSELEAF_NOPF | 1u << LL_SIM_LOOSELEAF_NOCLOSURE | \
     1u << LL_SIM_LOOSELEAF_FULLSAVE | 1u << LL_SIM_LOOSELEAF_NOIMPORT |                   \
     1u << LL_SIM_LOOSELEAF_NOWARM | 1u << LL_SIM_LOOSELEAF)

/* Whether D is LooseLeaf or one of its ablations. */
#define LL_SIM_IS_LOOSELEAF(d) ((d) >= LL_SIM_LOOSELEAF_NOPF && (d) <= LL_SIM_LOOSELEAF)

/* The design's report name (JSON key): "pinned", "pinned_packed",
 * "keepalive", "notebookos", "naive", "looseleaf_noprefetch",
 * "looseleaf_noclosure", "looseleaf_fullsave", "looseleaf_noimportcache",
 * "looseleaf_nowarm", "looseleaf". */
const char *ll_sim_design_name(ll_sim_design_t d);

/* The design named NAME ('-' and '_' alike), or -1. */
int ll_sim_design_find(const char *name);

typedef struct {
    ll_cost_t cost;    /* what each step costs (copied) */
    int gpus_per_host; /* slots per host (8) */
    int max_hosts;     /* the fleet's size at most; 0: unbounded */
    bool gpu;          /* hosts have GPUs: CUDA starts, staged workers defer their restore */
    unsigned designs;  /* bit d: run design d */
    double sample_s;   /* the timeline's step (provisioned and busy GPUs) */
    const char *head;  /* the zygote head's packages (commas); NULL: numpy,torch,IPython */
} ll_sim_config_t;

#define LL_SIM_LAT_DECADES 10  /* latencies from 1e-5 s to 1e5 s ... */
#define LL_SIM_LAT_PER_DEC 100 /* ... in bins of 1/100 decade (2.3%) */
#define LL_SIM_LAT_BINS    (LL_SIM_LAT_DECADES * LL_SIM_LAT_PER_DEC + 2)

/* One design's figures after a run. */
typedef struct {
    bool ran;                /* the design was simulated */
    double span_s;           /* first arrival to its last session's end */
    double host_s;           /* host-seconds powered (booting and draining included) */
    int peak_hosts;          /* hosts powered at once, at most */
    double busy_gpu_s;       /* GPU-seconds of slots holding a job (preparing, running, saving) */
    double exec_gpu_s;       /* GPU-seconds of cells executing */
    double held_gpu_s;       /* GPU-seconds held, idle warm workers and containers included */
    long sessions;           /* sessions that ended */
    long gpu_cells;          /* GPU cells that started */
    long within_1s;          /* ... within 1 s of Run */
    long within_50ms;        /* ... within 50 ms of Run */
    long warm_hits;          /* ... on a process that held the session's state */
    long prefetched;         /* ... on a worker a prefetch prepared */
    long staged;             /* ... on a staged worker (prepared without a slot) */
    double connected_s;      /* sessions' connected time, summed */
    double session_held_s;   /* LooseLeaf: the pool's per-session bill (slot-held time), summed */
    double pool_connected_s; /* ... over the time its sessions were connected to a pool */
    double lat_sum_s;        /* start latencies summed */
    double lat_max_s;        /* ... and the largest */
    uint32_t lat_bins[LL_SIM_LAT_BINS]; /* start latencies: [0] below 1e-5 s, then log bins */
    int nsamples;                       /* timeline points */
    float *t_s;                         /* sample times (owned by the simulator) */
    float *powered_gpus;                /* provisioned GPUs (powered hosts x slots) */
    float *busy_gpus;                   /* slots holding a job */
} ll_sim_result_t;

typedef struct ll_sim_t ll_sim_t;

/* A simulator for CFG (copied; the cost table too).  NULL with ERR set on
 * a bad configuration or no memory.  The caller destroys it. */
ll_sim_t *ll_sim_new(const ll_sim_config_t *cfg, char *err, size_t errlen);

/* Destroy *SELF_P and null it.  Safe on NULL and twice. */
void ll_sim_destroy(ll_sim_t **self_p);

/* Run every configured design over the sessions READER gives, to the end.
 * 0, or -1 with ERR set (a bad trace line, no memory).  Once per
 * simulator. */
int ll_sim_run(ll_sim_t *self, ll_trace_reader_t *reader, char *err, size_t errlen);

/* Design D's figures (owned by the simulator). */
const ll_sim_result_t *ll_sim_result(const ll_sim_t *self, ll_sim_design_t d);

/* GPU-hours at whole-host granularity: host-seconds x slots / 3600. */
double ll_sim_gpu_hours(const ll_sim_t *self, ll_sim_design_t d);

/* The Q-quantile (0..1) of R's start latencies, seconds (from the bins:
 * within 2.3%); 0 without cells. */
double ll_sim_latency_quantile(const ll_sim_result_t *r, double q);

/* The share of R's GPU cells that started within T seconds (from the bins,
 * but exact at 1 s and 50 ms). */
double ll_sim_latency_share(const ll_sim_result_t *r, double t);

/* The upper edge of latency bin B, seconds. */
double ll_sim_latency_bin_edge(int b);

/* Events simulated so far (for the scale figure). */
uint64_t ll_sim_events(const ll_sim_t *self);

/* The configuration the simulator runs (its copy). */
const ll_sim_config_t *ll_sim_config(const ll_sim_t *self);

#endif
