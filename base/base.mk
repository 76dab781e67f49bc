# base/: process plumbing every LooseLeaf process shares, below every other
# module (it includes nothing of the tree but itself): the log, the clock,
# base64, fd capture and the stream coalescer.  The kernel and the workers
# stream output through the same code.  GPU detection (ll_gpu) is here too:
# the host pool and the broker both count the host's devices, and neither
# may depend on the other.
BASE_SRCS := base/ll_log.c base/ll_clock.c base/ll_b64.c base/ll_fdcap.c base/ll_stream.c \
             base/ll_gpu.c
LIB_SRCS  += $(BASE_SRCS)
TEST_SRCS += tests/base/ll_log_test.c
SELFTESTS += ll_log ll_clock ll_b64 ll_stream ll_fdcap ll_gpu

# What small programs that link a module or two need from base/.
BASE_OBJS := $(BUILD)/base/ll_log.o $(BUILD)/base/ll_clock.o
