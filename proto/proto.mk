# proto/: logging, connection file, Jupyter wire format (owned by the proto engineer).
LIB_SRCS  += proto/ll_log.c proto/ll_conn.c proto/ll_wire.c
TEST_SRCS += tests/proto/ll_log_test.c tests/proto/ll_conn_test.c tests/proto/ll_wire_test.c
SELFTESTS += ll_log ll_conn ll_wire
