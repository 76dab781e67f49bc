# store/: the checkpoint store's C half (owned by the store-C engineer):
# payload pool, Redis metadata, the _llstore Python extension, its tests and
# benchmark.  See store/API.md.
STORE_SRCS := store/ll_pool.c store/ll_redis.c store/ll_redis_server.c store/ll_store.c store/ll_store_py.c \
              store/ll_store_ref.c store/ll_store_put.c store/ll_store_commit.c store/ll_history.c \
              store/ll_store_call.c store/ll_history_selftest.c \
              store/ll_pool_reserve.c store/ll_pool_reclaim.c store/ll_pagekind.c store/ll_quota.c \
              store/ll_hash.c store/ll_hash_avx2.c
# A region's memory below the pool, and the self-tests that drive a whole part (each above what it tests).
STORE_SRCS += store/ll_pool_pages.c store/ll_pool_selftest.c store/ll_redis_selftest.c store/ll_store_selftest.c
LIB_SRCS   += $(STORE_SRCS)
SELFTESTS  += ll_pagekind ll_pool ll_pool_reclaim ll_quota ll_redis ll_store ll_store_put ll_history
PYTESTS    += tests/store_c
BENCHES    += $(BUILD)/ll_store_bench

# The same sources as a standalone extension module for /usr/bin/python3
# (tests put build/py on sys.path).  Objects built apart: -DLL_STORE_PY_STANDALONE.
STORE_PYEXT   := $(BUILD)/py/_llstore$(PY_EXT)
STORE_PY_OBJS := $(patsubst %.c,$(BUILD)/pyext/%.o,$(STORE_SRCS) base/ll_log.c base/ll_clock.c)
STORE_PY_LIBS := $(STORE_DEPS_LIBS) -lpthread
EXTRA_TARGETS += $(STORE_PYEXT) $(BUILD)/ll_store_bench $(BUILD)/tests/store_c/embed_llstore

# Only this file may use AVX2 instructions; ll_hash.c checks the CPU first.
$(BUILD)/store/ll_hash_avx2.o $(BUILD)/pyext/store/ll_hash_avx2.o: CFLAGS += -mavx2

$(BUILD)/pyext/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DLL_STORE_PY_STANDALONE -fvisibility=hidden -MMD -MP -c $< -o $@

$(STORE_PYEXT): $(STORE_PY_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -shared -o $@ $^ $(STORE_PY_LIBS)

$(BUILD)/ll_store_bench: $(BUILD)/store/ll_store_bench.o $(patsubst %.c,$(BUILD)/%.o,$(STORE_SRCS) base/ll_log.c base/ll_clock.c)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The builtin flavour (as linked into build/looseleaf), for tests/store_c/test_llstore_embedded.py.
$(BUILD)/tests/store_c/embed_llstore: $(BUILD)/tests/store_c/embed_llstore.o $(patsubst %.c,$(BUILD)/%.o,$(STORE_SRCS) base/ll_log.c base/ll_clock.c)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
