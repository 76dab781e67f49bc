# kernel/: the embedded interpreter (owned by the interpreter engineer).
LIB_SRCS  += kernel/ll_interp.c
SELFTESTS += ll_interp
PYTESTS   += tests/kernel/test_interp.py
EXTRA_TARGETS += $(BUILD)/tests/kernel/embed_driver

# sys.executable of the embedded interpreter: the Python we build against.
$(BUILD)/kernel/ll_interp.o: CFLAGS += -DLL_PYTHON_EXE='"$(PYTHON)"'

# The embedding-scenario driver that tests/kernel/test_interp.py runs.
$(BUILD)/tests/kernel/embed_driver: $(BUILD)/tests/kernel/embed_driver.o \
		$(BUILD)/kernel/ll_interp.o $(BASE_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
