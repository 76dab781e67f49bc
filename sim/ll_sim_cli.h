/* ll_sim_cli: the fleet simulator's subcommands, dispatched by
 * cli/main.c (the only file outside sim/ that may include a sim/
 * header).  Each runs in its own short-lived process; argv[0] is the
 * subcommand's name.  sim/API.md describes both. */
#ifndef LL_SIM_CLI_H
#define LL_SIM_CLI_H

/* `looseleaf trace [--sessions N] [--seed S] ... NOTEBOOK...`: notebooks
 * into a trace of sessions, JSON lines on stdout (sim/ll_trace_gen.c).
 * Exit status 0, 1 on a notebook that could not be used, 2 on bad usage. */
int ll_trace_main(int argc, char **argv);

/* `looseleaf simulate [--json] TRACE [--hosts N --gpus-per-host 8 ...]`:
 * the trace replayed on a fleet for every design (sim/ll_sim_cli.c).  Exit
 * status 0, 1 on a bad trace, 2 on bad usage. */
int ll_simulate_main(int argc, char **argv);

#endif
