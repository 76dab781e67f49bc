# Cell analysis (owned by the analysis engineer): per-cell facts from
# CPython's AST, the session's def-use graph and closures, `looseleaf analyze`.
# analysis/API.md describes the module and its files.
ANALYSIS_SRCS := analysis/ll_analysis.c analysis/ll_analysis_ast.c analysis/ll_analysis_ipython.c \
                 analysis/ll_analysis_magic.c analysis/ll_analysis_modules.c \
                 analysis/ll_analysis_names.c analysis/ll_analysis_replay.c \
                 analysis/ll_analysis_scope.c analysis/ll_analysis_session.c analysis/ll_analysis_walk.c \
                 analysis/ll_analysis_walk_state.c \
                 analysis/ll_analyze_cli.c analysis/ll_draft.c
LIB_SRCS  += $(ANALYSIS_SRCS)
TEST_SRCS += analysis/ll_analysis_selftest.c
SELFTESTS += ll_analysis ll_analysis_modules ll_analysis_magic ll_analysis_scope \
             ll_analysis_session ll_draft

# What a program that only analyses links: the module, the interpreter's
# start-up (kernel/ll_interp.c) and base's log and clock.  (This fragment is
# read before base/base.mk, so base's objects are named here rather than
# taken from BASE_OBJS.)
ANALYSIS_OBJS := $(ANALYSIS_SRCS:%.c=$(BUILD)/%.o) $(BUILD)/kernel/ll_interp.o $(BUILD)/kernel/ll_pyenv.o \
                 $(BUILD)/proto/ll_msgtype.o $(BUILD)/base/ll_log.o $(BUILD)/base/ll_clock.o

# Benchmark: analysis of a 30-line cell and closures in a 500-cell session,
# against the same analysis in pure Python (tests/analysis/pyoracle.py).
ANALYSIS_BENCH := $(BUILD)/tests/bench/bench_analysis
$(ANALYSIS_BENCH): $(BUILD)/tests/bench/bench_analysis.o $(ANALYSIS_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

EXTRA_TARGETS += $(ANALYSIS_BENCH)

# The corpus (>= 150 hand-checked cells), soundness on real notebooks, bad input.
PYTESTS   += tests/analysis/test_analysis_corpus.py tests/analysis/test_analysis_soundness.py \
             tests/analysis/test_analysis_bad_input.py tests/analysis/test_analysis_differential.py
BENCHES   += tests/bench/bench_analysis.py
