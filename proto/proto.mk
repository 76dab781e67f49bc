# proto/: connection file, JSON writer, Jupyter wire format (owned by
# the proto engineer), and the frames LooseLeaf's own processes speak on
# their unix sockets (ll_zframe: pool, zygotes, workers, clients, the
# broker).  Self-tests live in tests/proto/*_test.c, ll_zframe's in its file.
LIB_SRCS  += proto/ll_conn.c proto/ll_json.c proto/ll_wire.c proto/ll_zframe.c proto/ll_msgtype.c
TEST_SRCS += tests/proto/ll_conn_test.c tests/proto/ll_json_test.c \
             tests/proto/ll_wire_test.c
SELFTESTS += ll_conn ll_json ll_wire ll_zframe

PROTO_OBJS := $(BUILD)/proto/ll_wire.o $(BUILD)/proto/ll_json.o $(BASE_OBJS)

# Wire micro-benchmark against jupyter_client's Session (make bench).
PROTO_BENCH := $(BUILD)/tests/proto/bench_wire
$(PROTO_BENCH): $(BUILD)/tests/proto/bench_wire.o $(PROTO_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Interoperability driver for tests/proto/test_wire_interop.py.
PROTO_ECHO := $(BUILD)/tests/proto/wire_echo
$(PROTO_ECHO): $(BUILD)/tests/proto/wire_echo.o $(PROTO_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

EXTRA_TARGETS += $(PROTO_BENCH) $(PROTO_ECHO)
BENCHES   += $(PROTO_BENCH)

# ll_wire against jupyter_client's Session both ways; bad wire input against
# the real kernel and ipykernel (needs build/looseleaf).
PYTESTS   += tests/proto/test_wire_interop.py tests/integration/test_wire_badinput.py
