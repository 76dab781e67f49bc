# Fuzz targets: libFuzzer (clang-14 from Debian, with libclang-rt-14-dev) under AddressSanitizer
# and UndefinedBehaviorSanitizer, for what reads untrusted input: the wire decoder, the HMAC check, the
# connection-file reader, the store's metadata decoder, the cell analysis and what the host's slot broker
# (root) takes from any local user (its frames, applied to its policy).  `make test` runs each for a
# few seconds (tests/fuzz/test_fuzz.py, on the seeds in tests/fuzz/corpus/); `make fuzz` runs each for
# FUZZ_SECONDS (default 300), keeping what it finds in build/fuzz/corpus/ (a crash: build/fuzz/crash-*).
FUZZ_CC      ?= clang-14
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_SECONDS ?= 300
FUZZ_CFLAGS  := -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
                -std=c11 -D_GNU_SOURCE -I. $(PKG_CFLAGS) -DLL_SRCDIR='"$(CURDIR)"' \
                -DLL_PYTHON_EXE='"$(PYTHON)"' -Wno-unused-command-line-argument
FUZZ_LDFLAGS := -fsanitize=fuzzer,address,undefined

FUZZ_TARGETS := wire hmac conn store_meta analysis hostd
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
FUZZ_BASE    := base/ll_log.c base/ll_clock.c
FUZZ_SRCS_wire       := tests/fuzz/fuzz_wire.c proto/ll_wire.c proto/ll_json.c $(FUZZ_BASE)
FUZZ_SRCS_hmac       := tests/fuzz/fuzz_hmac.c proto/ll_wire.c proto/ll_json.c $(FUZZ_BASE)
FUZZ_SRCS_conn       := tests/fuzz/fuzz_conn.c proto/ll_conn.c
FUZZ_SRCS_store_meta := tests/fuzz/fuzz_store_meta.c store/ll_store_ref.c
FUZZ_SRCS_hostd      := tests/fuzz/fuzz_hostd.c hostd/ll_hostd_wire.c policy/ll_hostd_policy.c \
                        policy/ll_gpu_plan.c $(FUZZ_BASE)
FUZZ_SRCS_analysis   := tests/fuzz/fuzz_analysis.c $(ANALYSIS_SRCS) kernel/ll_interp.c kernel/ll_pyenv.c \
                        proto/ll_msgtype.c $(FUZZ_BASE)

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

define FUZZ_LINK
$(FUZZ_DIR)/fuzz_$(1): $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(FUZZ_SRCS_$(1)))
	$$(FUZZ_CC) $$(FUZZ_LDFLAGS) -o $$@ $$^ $$(PKG_LIBS) -lpthread -ldl -lm
endef
$(foreach t,$(FUZZ_TARGETS),$(eval $(call FUZZ_LINK,$(t))))

# Built by `make test` (run by tests/fuzz/test_fuzz.py).
TEST_DEPS += $(FUZZ_BINS)
PYTESTS   += tests/fuzz

.PHONY: fuzz
fuzz: $(FUZZ_BINS)
	@set -e; for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_DIR)/corpus/$$t; \
	    echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	    ASAN_OPTIONS=detect_leaks=$$([ $$t = analysis ] && echo 0 || echo 1) \
	    $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 \
	        -artifact_prefix=$(FUZZ_DIR)/ $(FUZZ_DIR)/corpus/$$t tests/fuzz/corpus/$$t; \
	done
