/* ll_ztree: the host pool's zygote tree (zygote/API.md, "Guarantees and
 * limits").  Run by the pool's one thread; the pool polls the descriptors it
 * lists and hands over what comes (frames from a node, a probe's output, a
 * reaped pid).
 *
 * The base node is a zygote started by exec (`looseleaf zygote`) that
 * imports the head; it is respawned when it dies, up to three deaths in a
 * row before it was ever ready, after which the tree is broken (GPU cells
 * fail until the pool restarts).  A cell forks from the ready node that
 * covers most of its import closure (ties: the node with the fewest
 * modules).  For each top-level package a cell imports that its node lacks,
 * the tree probes once whether importing it touches CUDA (`python3 -m
 * looseleaf_zygote.probe PKG`, killed after 120 s: then unsafe); a safe one
 * grows a child node that imports it too, forked by the zygote.  At most
 * MAX_NODES nodes exist: least-recently-used leaves that fork nothing go
 * first, the base never. */
#ifndef LL_ZTREE_H
#define LL_ZTREE_H

#include "proto/ll_zframe.h"

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#define LL_ZTREE_MAX_NODES  256 /* node entries (max_nodes is at most this) */
#define LL_ZTREE_MAX_PROBES 32  /* probes at once */

typedef struct ll_ztree_t ll_ztree_t;

/* Called with node entry N when the node goes (it died, or the tree
 * evicted it), before the tree forgets it: the pool fails the cells whose
 * worker it was forking. */
typedef void(ll_ztree_gone_fn)(void *arg, int n);

/* A tree whose zygotes run EXE (argv[0] EXE_NAME) `zygote --head HEAD`;
 * MAX_NODES nodes at most; GROW: grow child nodes for tail packages; GONE
 * (with ARG) hears of every node that goes.  Starts nothing
 * (ll_ztree_spawn_base).  NULL when out of memory.  The caller destroys
 * it. */
ll_ztree_t *ll_ztree_new(const char *exe, const char *exe_name, const char *head, int max_nodes,
                         bool grow, ll_ztree_gone_fn *gone, void *arg);

/* Close the tree's sockets and forget it (the processes are left to
 * ll_ztree_stop); null *SELF_P.  Safe on NULL and twice. */
void ll_ztree_destroy(ll_ztree_t **self_p);

/* Start the base node.  Returns its entry, or -1 with errno. */
int ll_ztree_spawn_base(ll_ztree_t *self);

/* Ask every node's zygote to stop (SIGTERM). */
void ll_ztree_stop(ll_ztree_t *self);

/* ---- forks ---- */

/* Whether some node is ready to fork (then ll_ztree_best finds one). */
bool ll_ztree_any_ready(const ll_ztree_t *self);

/* The ready node for a cell importing IMPORTS (array of str), or -1 when
 * none is ready. */
int ll_ztree_best(const ll_ztree_t *self, const json_t *imports);

/* Send node N the fork of JOB (borrowed; "node" and "node_modules" are
 * added to it) with PASSFD (the worker's socket, borrowed).  Returns 0, or
 * -1 with errno. */
int ll_ztree_fork(ll_ztree_t *self, int n, json_t *job, int passfd);

/* After a fork from node N for a cell importing IMPORTS: grow towards the
 * packages N lacks (probing those not probed yet). */
void ll_ztree_consider_growth(ll_ztree_t *self, int n, const json_t *imports);

/* ---- what the pool hands over ---- */

/* Node N said "ready" (frame M): it accepts forks. */
void ll_ztree_node_ready(ll_ztree_t *self, int n, const json_t *m);

/* Node N answered a fork ("forked" or "refused"). */
void ll_ztree_fork_answered(ll_ztree_t *self, int n);

/* Node N is gone (its socket closed, or a bad frame: WHY).  Its children
 * stay (they hold their own sockets).  The base is respawned when RESPAWN
 * (the pool is not stopping).  Returns -1 when the base cannot be started
 * any more (the tree is broken from now on), else 0. */
int ll_ztree_node_gone(ll_ztree_t *self, int n, const char *why, bool respawn);

/* Probe I's output is readable. */
void ll_ztree_probe_input(ll_ztree_t *self, int i);

/* PID was reaped with STATUS: if it was a probe, its verdict (and a child
 * node grown when safe).  Returns whether it was a probe. */
bool ll_ztree_reaped(ll_ztree_t *self, pid_t pid, int status);

/* At NOW: kill probes that hang; try a base that could not start again
 * once its back-off passed (ll_ztree_broken until it is ready).  Returns
 * the ms until the tree wants a look again, -1 for never. */
int ll_ztree_timeout(ll_ztree_t *self, double now);

/* ---- reading ---- */

/* Node N's control socket (-1: no node N) and its frame reader (both the
 * tree's); its id. */
int ll_ztree_node_fd(const ll_ztree_t *self, int n);
ll_zreader_t *ll_ztree_node_reader(const ll_ztree_t *self, int n);
int ll_ztree_node_id(const ll_ztree_t *self, int n);

/* Probe I's output pipe (-1: none). */
int ll_ztree_probe_fd(const ll_ztree_t *self, int i);

/* For the pool's stats: the nodes (a new array the caller owns), the
 * probes' verdicts {module: safe} (the tree's), base respawns, whether the
 * tree is broken. */
json_t *ll_ztree_nodes_json(const ll_ztree_t *self);
const json_t *ll_ztree_safety(const ll_ztree_t *self);
int ll_ztree_base_respawns(const ll_ztree_t *self);
bool ll_ztree_broken(const ll_ztree_t *self);

#endif
