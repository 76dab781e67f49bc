# proto/: logging, connection file, Jupyter wire format (owned by the proto engineer).
LIB_SRCS  += proto/ll_log.c proto/ll_conn.c proto/ll_json.c proto/ll_wire.c
TEST_SRCS += tests/proto/ll_log_test.c tests/proto/ll_conn_test.c tests/proto/ll_json_test.c \
             tests/proto/ll_wire_test.c
SELFTESTS += ll_log ll_conn ll_json ll_wire

# Wire micro-benchmark against jupyter_client's Session (make bench).
PROTO_BENCH := $(BUILD)/tests/proto/bench_wire
$(PROTO_BENCH): $(BUILD)/tests/proto/bench_wire.o $(BUILD)/proto/ll_wire.o $(BUILD)/proto/ll_json.o $(BUILD)/proto/ll_log.o
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
EXTRA_TARGETS += $(PROTO_BENCH)
BENCHES   += $(PROTO_BENCH)

# Bad wire input against the real kernel and ipykernel (needs build/looseleaf).
PYTESTS   += tests/integration/test_wire_badinput.py
