# cli/: the `looseleaf` program's main, the dispatcher of its subcommands: the kernel and `install`
# (gateway/), `pool` and `zygote` (zygote/), `hostd` and `top` (hostd/), `analyze` (analysis/), `trace` and
# `simulate` (sim/), and `cluster` / `top --cluster`, which run the Python module looseleaf_cluster.cli
# (ll_cluster_cmd.c).  The top of the tree: it may include every module and nothing includes it (tests/tree),
# so no module sits above another for the dispatcher's sake.
BIN_SRCS  += cli/main.c cli/ll_cluster_cmd.c
