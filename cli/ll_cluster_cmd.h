/* ll_cluster_cmd: `looseleaf cluster ...` and `looseleaf top --cluster`,
 * the cluster administrator's commands.  They need Ray, which the C
 * program does not link: both run the Python module looseleaf_cluster.cli
 * (cluster/looseleaf_cluster/cli.py) in the environment that has Ray. */
#ifndef LL_CLUSTER_CMD_H
#define LL_CLUSTER_CMD_H

#include <stdbool.h>

/* ARGV[0] = "cluster" (or "top" when CLUSTER_TOP: `looseleaf top --cluster
 * ...`, the --cluster dropped): exec the Python command.  Returns only on
 * failure (exit status, the reason on stderr). */
int ll_cluster_cmd_main(int argc, char **argv, bool cluster_top);

/* Whether `looseleaf top ARGV` asks for the cluster (--cluster). */
bool ll_cluster_cmd_is_top(int argc, char **argv);

#endif
