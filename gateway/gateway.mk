# gateway/: the kernel process, the gateway between Jupyter and the workers (owned by the gateway engineer).
# The `looseleaf` command's dispatcher, which also starts the other roles, is cli/main.c (cli/cli.mk).
LIB_SRCS  += gateway/ll_iopub.c gateway/ll_stdin.c gateway/ll_exec.c \
             gateway/ll_kernelspec.c gateway/ll_usage.c gateway/ll_route.c gateway/ll_dispatch.c \
             gateway/ll_kernel.c gateway/ll_curve.c
SELFTESTS += ll_iopub ll_stdin ll_exec ll_kernelspec ll_usage ll_route ll_dispatch ll_kernel ll_curve
# The dispatcher against an in-memory transport, with stub handlers (no Python).
TEST_SRCS += gateway/ll_dispatch_selftest.c

# The edit-time hints extension for JupyterLab (gateway/ll_labext.js, hand-written, no npm build), embedded in
# the binary as a C string that `looseleaf install` writes out (ll_kernelspec.c).  (No "??" in the script: C11
# would read it as a trigraph.)
$(BUILD)/gateway/ll_labext_js.h: gateway/ll_labext.js
	@mkdir -p $(dir $@)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $< > $@.tmp && mv $@.tmp $@
$(BUILD)/gateway/ll_kernelspec.o: $(BUILD)/gateway/ll_labext_js.h
$(BUILD)/gateway/ll_kernelspec.o: CFLAGS += -I$(BUILD)

# A kernelspec directory for `jupyter kernelspec install build/kernelspec/looseleaf [--user]`,
# written by the binary itself so kernel.json has one source of truth.
GATEWAY_KERNELSPEC := $(BUILD)/kernelspec/looseleaf/kernel.json
EXTRA_TARGETS += $(GATEWAY_KERNELSPEC)
$(GATEWAY_KERNELSPEC): $(BUILD)/looseleaf
	$(BUILD)/looseleaf install --dir $(BUILD)/kernelspec/looseleaf >/dev/null

# Command line, kernelspec, connection-file errors, signals, shutdown, log/stream behaviour.
PYTESTS   += tests/gateway
