# Cell analysis (issue 3; owned by the analysis engineer): per-cell facts from
# CPython's AST, the session's def-use graph and closures, `looseleaf analyze`.
LIB_SRCS  += gateway/ll_analysis.c gateway/ll_analysis_ipython.c gateway/ll_analysis_names.c \
             gateway/ll_analysis_session.c gateway/ll_analyze_cli.c
TEST_SRCS += gateway/ll_analysis_selftest.c
SELFTESTS += ll_analysis

ANALYSIS_OBJS := $(BUILD)/gateway/ll_analysis.o $(BUILD)/gateway/ll_analysis_ipython.o \
                 $(BUILD)/gateway/ll_analysis_names.o \
                 $(BUILD)/gateway/ll_analysis_session.o $(BUILD)/gateway/ll_analyze_cli.o \
                 $(BASE_OBJS)

# A standalone `analyze` (the same code as `looseleaf analyze`) so the analysis
# tests do not depend on the rest of the kernel building.
ANALYZE_BIN := $(BUILD)/ll_analyze
$(ANALYZE_BIN): $(BUILD)/gateway/ll_analysis_driver.o $(ANALYSIS_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Benchmark: analysis of a 30-line cell and closures in a 500-cell session,
# against the same analysis in pure Python (tests/bench/bench_analysis_py.py).
ANALYSIS_BENCH := $(BUILD)/tests/bench/bench_analysis
$(ANALYSIS_BENCH): $(BUILD)/tests/bench/bench_analysis.o $(ANALYSIS_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

EXTRA_TARGETS += $(ANALYZE_BIN) $(ANALYSIS_BENCH)

# The corpus (>= 150 hand-checked cells), soundness on real notebooks, bad input.
PYTESTS   += tests/analysis/test_analysis_corpus.py tests/analysis/test_analysis_soundness.py \
             tests/analysis/test_analysis_bad_input.py tests/analysis/test_analysis_differential.py
BENCHES   += tests/bench/bench_analysis.py
