# tests/cudastub/: a stub CUDA driver (build/cudastub/libcuda.so.1, soname libcuda.so.1) that exports
# the driver API torch, cudart and the pool's detection touch at import and when counting devices, with
# LL_CUDA_STUB_DEVICES devices, honours CUDA_VISIBLE_DEVICES at cuInit as the real driver does, and records
# "<pid> <call>" lines in LL_CUDA_STUB_LOG.  tests/gpustub/ runs the kernel's GPU paths against it with the
# venv's CUDA build of torch (skipped, saying why, where torch is not a CUDA build).
CUDASTUB := $(BUILD)/cudastub/libcuda.so.1
$(CUDASTUB): tests/cudastub/cudastub.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -g -std=c11 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -fPIC -shared \
	    -fvisibility=hidden -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread
TEST_DEPS += $(CUDASTUB)
PYTESTS   += tests/gpustub
