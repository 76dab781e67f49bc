# sim/: the fleet simulator (owned by the fleet-simulation engineer): `looseleaf trace` and
# `looseleaf simulate`.  sim/API.md describes the commands, the trace format and the cost file.  It uses
# the host pool's pure policies (policy/ll_sched, ll_greedydual, ll_place, ll_provision) and the cell analysis;
# nothing depends on it but cli/main.c, which dispatches the two subcommands.
SIM_SRCS  := sim/ll_cost.c sim/ll_trace.c sim/ll_trace_gen.c sim/ll_sim.c sim/ll_sim_fleet.c \
             sim/ll_sim_looseleaf.c sim/ll_sim_baselines.c sim/ll_sim_cli.c \
             sim/ll_sim_designs.c sim/ll_sim_selftest.c
LIB_SRCS  += $(SIM_SRCS)
SELFTESTS += ll_cost ll_trace ll_trace_gen ll_sim

# The interpreter `looseleaf trace` measures notebooks with, and `simulate --out` plots with.
$(BUILD)/sim/ll_trace_gen.o $(BUILD)/sim/ll_sim_cli.o: CFLAGS += -DLL_PYTHON_EXE='"$(PYTHON)"'

# The commands on small traces, the fidelity check against a recorded bench_prefetch run (< 1 minute).
PYTESTS   += tests/sim/test_sim.py tests/sim/test_workload.py
# The paper's frontier at 24/48/72 sessions (plots into docs/sim/) and scale: 10,000 sessions over a day.
BENCHES   += tests/bench/bench_sim.py

# The README's fleet tables over several seeds, each figure with its 95% confidence interval
# (sim/experiments.py): `make sim-tables`, or one of them.  SIM_ARGS adds options
# (e.g. SIM_ARGS="--seeds 10 --out docs/sim").
.PHONY: sim-tables sim-frontier sim-ablations sim-baselines sim-autoscaler sim-fleet sim-paper
sim-frontier sim-ablations sim-baselines sim-autoscaler sim-fleet: $(BUILD)/looseleaf
	$(PYTHON) sim/experiments.py $(@:sim-%=%) $(SIM_ARGS)
sim-tables: $(BUILD)/looseleaf
	$(PYTHON) sim/experiments.py all $(SIM_ARGS)

# The same tables on the paper's workload (sim/workload.py from sim/workload.json; README "The paper's
# workload"): the frontier at 24/48/72 seats, the ablations, the fleet's rules, the autoscaler and the assumed
# session mix swept at 48.
sim-paper: $(BUILD)/looseleaf
	$(PYTHON) sim/experiments.py frontier --workload paper $(SIM_ARGS)
	$(PYTHON) sim/experiments.py ablations --workload paper $(SIM_ARGS)
	$(PYTHON) sim/experiments.py fleet --workload paper $(SIM_ARGS)
	$(PYTHON) sim/experiments.py autoscaler --workload paper $(SIM_ARGS)
	$(PYTHON) sim/experiments.py mix --workload paper $(SIM_ARGS)
