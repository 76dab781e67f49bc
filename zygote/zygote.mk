# zygote/: host pool, zygote import cache, workers (owned by the zygote engineer).  zygote/API.md.
SELFTESTS += ll_zframe ll_gdsf
LIB_SRCS  += zygote/ll_zframe.c zygote/ll_gdsf.c zygote/ll_hostpool.c zygote/ll_zygote.c zygote/ll_zclient.c
EXTRA_TARGETS += $(BUILD)/zygote/ll_zdriver

# The test driver: the pool/zygote subcommands and a JSON-lines client (tests/zygote/).
# (zygote.mk is the last fragment included, so LIB_SRCS is complete here.)
$(BUILD)/zygote/ll_zdriver: $(BUILD)/zygote/ll_zdriver.o $(LIB_SRCS:%.c=$(BUILD)/%.o)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
PYTESTS   += tests/zygote
BENCHES   += tests/bench/bench_zygote.py
