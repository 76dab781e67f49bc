/* ll_hostd: `looseleaf hostd`, the host's slot broker (a system service,
 * normally root, one per host), and `looseleaf top`, which prints what it
 * holds.  hostd/API.md describes both, the protocol and the policy
 * (ll_hostd_policy.h).  The broker runs no user code: each user's cells run
 * in that user's own host pool (`looseleaf pool`), which borrows slots from
 * the broker (zygote/ll_hostpool_hostd.c). */
#ifndef LL_HOSTD_H
#define LL_HOSTD_H

/* `looseleaf hostd [--socket PATH] [--slots N] [--metrics-port PORT]`
 * (ARGV[0] = "hostd"): serve until SIGTERM/SIGINT.  Exit status. */
int ll_hostd_main(int argc, char **argv);

/* `looseleaf top [--socket PATH] [--json]` (ARGV[0] = "top"): print the
 * broker's slots, users, leases and waiting cells once.  Exit status (1:
 * no broker answers). */
int ll_hostd_top_main(int argc, char **argv);

#endif
