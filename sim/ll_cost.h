/* ll_cost: the numbers the fleet simulator charges for what a host does
 * (a fork, an import, a restore, a save, a CUDA start, a host boot...),
 * read from a cost file (sim/costs.json: every number with the source it
 * came from) and the command line (--set NAME=VALUE).  Runs in the
 * `looseleaf simulate` process, single-threaded.
 *
 * Every cost is a double; the table in ll_cost.c lists the names, which
 * are the cost file's keys.  Times are seconds, sizes bytes, bandwidths
 * bytes per second. */
#ifndef LL_COST_H
#define LL_COST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    /* The kernel (CPU machine) */
    double kernel_route_s; /* a GPU cell's analysis, routing and relay in the kernel */
    double first_commit_s; /* a session's first GPU job: the kernel opens its store, commits */
    double debounce_s;     /* an edit-time hint waits this long for a newer one */
    double max_wait_s;     /* ... but a burst of hints prefetches this long after its first */
    double rehint_s;       /* a user typing in a long edit window pauses (hints) this often */
    /* A LooseLeaf host's workers */
    double fork_s;           /* fork of a worker from a zygote */
    double warm_prep_s;      /* a warm worker takes a job (re-checks versions) */
    double restore_fixed_s;  /* restore of a closure: fixed part */
    double restore_bw;       /* restore: bytes/s into host memory (mapped, first read) */
    double save_fixed_s;     /* save after a cell: fixed part (commit) */
    double save_bw;          /* save: bytes/s of what the cell wrote */
    double worker_exit_s;    /* an evicted or released worker is gone */
    double import_default_s; /* import of a package the trace gives no time for */
    double zygote_start_s;   /* a booted host's base zygote imports the head */
    double warm_idle_s;      /* a warm worker unused this long leaves */
    double spec_window_s;    /* a speculative worker outranks completed ones this long */
    double staged_per_slot;  /* staged workers at most, per slot */
    /* GPU hosts (the paper's A100s; --gpu none zeroes the CUDA start) */
    double cuda_init_s;    /* a process starts CUDA on its GPU */
    double h2d_bw;         /* restore into GPU memory, bytes/s */
    double d2h_bw;         /* save from GPU memory, bytes/s */
    double net_bw;         /* payload bytes host to host, bytes/s */
    double host_boot_s;    /* a powered-off host until it can run work */
    double host_mem_bytes; /* a host's payload pool */
    /* A fresh process (naive serverless, keep-alive cold starts, NotebookOS migration) */
    double python_start_s; /* a fresh interpreter */
    double pickle_load_bw; /* the whole namespace unpickled, bytes/s */
    double pickle_dump_bw; /* ... and pickled after the cell */
    /* Baselines' own parameters */
    double keepalive_idle_s;  /* keep-alive: a container idle this long is discarded */
    double nbos_replicas;     /* NotebookOS: replicas per kernel */
    double nbos_subscription; /* NotebookOS: replica GPU requests per physical GPU at most */
    /* LooseLeaf's provisioning controller (ll_provision.h) */
    double target_util;   /* share of provisioned GPUs the load fills */
    double p_wait;        /* target probability that a cell finds no GPU */
    double load_window_s; /* the load's averaging time constant */
    double down_hold_s;   /* the target stays lower this long before hosts drain */
    double control_s;     /* the controller looks this often */
    double min_hosts;     /* hosts kept powered */
    /* 1: every design on the elastic fleet (LooseLeaf, keep-alive, naive)
     * gets a serverless provider's shared capacity instead: a host ready
     * at once when a job finds no room, powered off once it holds nothing,
     * no controller (the knobs above unused).  0: the controller above. */
    double fleet_shared;
} ll_cost_t;

/* COSTS from the cost file at PATH (NULL: the tree's sim/costs.json).
 * Every cost must be there.  0, or -1 with ERR set. */
int ll_cost_load(ll_cost_t *costs, const char *path, char *err, size_t errlen);

/* Set cost NAME to VALUE (from "NAME=VALUE").  0, or -1 with ERR set
 * (unknown name, bad number). */
int ll_cost_set(ll_cost_t *costs, const char *assignment, char *err, size_t errlen);

/* No GPU (this project's own machines): no CUDA start, restores and saves
 * at host-memory speed. */
void ll_cost_no_gpu(ll_cost_t *costs);

/* The names of the costs, NULL-terminated (for --help and the tests). */
const char *const *ll_cost_names(void);

/* The tree's cost file (LL_SRCDIR/sim/costs.json). */
const char *ll_cost_default_path(void);

#endif
