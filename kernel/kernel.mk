# kernel/: the embedded interpreter and the Python environment it runs in.
LIB_SRCS  += kernel/ll_interp.c kernel/ll_pyenv.c
SELFTESTS += ll_interp ll_pyenv
# ll_interp's self-test: a real interpreter through the public API.
TEST_SRCS += kernel/ll_interp_selftest.c
PYTESTS   += tests/kernel/test_interp.py tests/kernel/test_modindex.py
EXTRA_TARGETS += $(BUILD)/tests/kernel/embed_driver

# The Python the build is for (make PYTHON=...): the environment the kernel
# runs in unless its kernelspec names another (kernel/ll_pyenv.h).
$(BUILD)/kernel/ll_pyenv.o: CFLAGS += -DLL_PYTHON_EXE='"$(PYTHON)"'

# The embedding-scenario driver that tests/kernel/test_interp.py runs.
$(BUILD)/tests/kernel/embed_driver: $(BUILD)/tests/kernel/embed_driver.o \
		$(BUILD)/kernel/ll_interp.o $(BUILD)/kernel/ll_pyenv.o $(BUILD)/proto/ll_msgtype.o \
		$(BASE_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
