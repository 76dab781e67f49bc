# zygote/: host pool, zygote import cache, workers (owned by the zygote engineer).  zygote/API.md.
SELFTESTS += ll_ztree ll_hostpool_config ll_hostpool_clients ll_hostpool_schedule \
             ll_zclient ll_zygote
LIB_SRCS  += zygote/ll_ztree.c \
             zygote/ll_hostpool_config.c zygote/ll_hostpool.c zygote/ll_hostpool_jobs.c \
             zygote/ll_hostpool_clients.c zygote/ll_hostpool_runs.c zygote/ll_hostpool_schedule.c \
             zygote/ll_hostpool_stats.c zygote/ll_hostpool_homes.c zygote/ll_hostpool_procs.c \
             zygote/ll_hostpool_hostd.c zygote/ll_zygote.c zygote/ll_zclient.c
EXTRA_TARGETS += $(BUILD)/zygote/ll_zdriver

# The test driver: a JSON-lines client of the host pool (tests/zygote/, tests/prefetch/).  The pool it
# starts is build/looseleaf's (LL_POOL_EXE), so it links only the client.
$(BUILD)/zygote/ll_zdriver: $(BUILD)/zygote/ll_zdriver.o $(BUILD)/zygote/ll_zclient.o \
                            $(BUILD)/proto/ll_zframe.o $(BUILD)/kernel/ll_pyenv.o $(BASE_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
PYTESTS   += tests/zygote
BENCHES   += tests/bench/bench_zygote.py
