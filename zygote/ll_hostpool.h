/* ll_hostpool: the host pool (`looseleaf pool`), one process per runtime dir
 * (per uid), shared by every kernel on the host: it owns the GPU slots, the
 * zygote tree and the workers, and schedules cells and prefetches onto them.
 * Kernels reach it through zygote/ll_zclient.h, which starts it on demand;
 * zygote/API.md tells the whole story. */
#ifndef LL_HOSTPOOL_H
#define LL_HOSTPOOL_H

/* `looseleaf pool [options]` (argv[0] is "pool"; options: zygote/API.md).
 * Detaches itself unless --foreground.  Returns an exit status. */
int ll_hostpool_main(int argc, char **argv);

#endif
