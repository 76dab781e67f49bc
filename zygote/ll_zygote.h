/* ll_zygote: a zygote node (`looseleaf zygote`) and the workers it forks
 * (zygote/API.md tells the whole story).
 *
 *   zygote      started by exec from the host pool (zygote/ll_hostpool.h);
 *               imports the head, then forks workers (and child nodes that
 *               import more) on request.  Single-threaded, no CUDA.
 *   worker      forked from a zygote: restores the cell's closure from the
 *               store, runs the cell with the kernel's IPython engine,
 *               streams its output, saves, then stays warm for its session
 *               (when the pool runs with --warm-idle) until evicted. */
#ifndef LL_ZYGOTE_H
#define LL_ZYGOTE_H

/* `looseleaf zygote --fd N [--head MOD,...] [--node ID]` (argv[0] is
 * "zygote"), started by the pool only.  Returns an exit status. */
int ll_zygote_main(int argc, char **argv);

#endif
