# LooseLeaf build.  One binary (build/looseleaf) built from every module's
# library sources plus the gateway's main; one C self-test runner
# (build/ll_selftest) that runs each module's self-test from a generated table.
#
# Each module owns one or more `<dir>/*.mk` fragments that append to:
#   LIB_SRCS   sources linked into the binary and the self-test runner
#   BIN_SRCS   sources only the binary needs (main)
#   TEST_SRCS  sources only the self-test runner needs
#   SELFTESTS  names N with a function `int N_selftest(bool verbose)`
#   PYTESTS    pytest paths run by `make test`
#   BENCHES    commands run by `make bench`
#   EXTRA_TARGETS  further build outputs (e.g. a Python extension)
#   TEST_DEPS  what `make test` builds besides `all` (e.g. the fuzz targets)
# so that modules never edit each other's build rules.

CC      ?= gcc
PYTHON  := /usr/bin/python3
PKGS    := libzmq libczmq openssl jansson python3-embed hiredis libxxhash
BUILD   := build

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))

CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -Wno-unused-parameter -Wshadow -fPIC \
           -D_GNU_SOURCE -I. $(PKG_CFLAGS) \
           -DLL_SRCDIR='"$(CURDIR)"'
LDLIBS  += $(PKG_LIBS) -lpthread -ldl -lm

LIB_SRCS  :=
BIN_SRCS  :=
TEST_SRCS :=
SELFTESTS :=
PYTESTS   :=
BENCHES   :=
EXTRA_TARGETS :=
TEST_DEPS :=

include $(sort $(wildcard */*.mk))

LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o)
BIN_OBJS  := $(BIN_SRCS:%.c=$(BUILD)/%.o)
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o)

.PHONY: all test selftest pytest bench clean deps deps-test setup run kernelspec format format-check
all: $(BUILD)/looseleaf $(BUILD)/ll_selftest $(EXTRA_TARGETS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/looseleaf: $(LIB_OBJS) $(BIN_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The self-test table is generated from SELFTESTS so no module edits a shared file.
$(BUILD)/selftest_table.h: Makefile $(wildcard */*.mk)
	@mkdir -p $(BUILD)
	@{ for t in $(SELFTESTS); do echo "int $${t}_selftest(bool verbose);"; done; \
	   echo "static const ll_selftest_t s_selftests[] = {"; \
	   for t in $(SELFTESTS); do echo "    {\"$$t\", $${t}_selftest},"; done; \
	   echo "    {NULL, NULL}};"; } > $@.tmp && mv $@.tmp $@

$(BUILD)/tests/selftest.o: tests/selftest.c $(BUILD)/selftest_table.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(BUILD) -MMD -MP -c $< -o $@

$(BUILD)/ll_selftest: $(BUILD)/tests/selftest.o $(LIB_OBJS) $(TEST_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

selftest: $(BUILD)/ll_selftest
	$(BUILD)/ll_selftest

pytest: all
	$(if $(strip $(PYTESTS)),$(PYTHON) -m pytest -q -ra -p no:cacheprovider $(PYTEST_ARGS) $(PYTESTS))

# Everything: the C self-tests, then the integration tests.
test: all $(TEST_DEPS)
	$(BUILD)/ll_selftest
	$(if $(strip $(PYTESTS)),$(PYTHON) -m pytest -q -ra -p no:cacheprovider $(PYTEST_ARGS) $(PYTESTS))

bench: all
	@set -e; for b in $(BENCHES); do echo "== $$b"; $$b; done

# ---- set-up on a fresh Debian 12 machine --------------------------------
# Packages to build and run the kernel, and what the tests drive it with.
# Recommends are installed too: the machines the suite was developed on had them,
# and a fresh machine must see the same Python packages (scipy, for one).
DEB_BUILD := build-essential pkg-config libzmq3-dev libczmq-dev libssl-dev \
             libjansson-dev libpython3-dev libhiredis-dev libxxhash-dev redis-server \
             python3-ipython python3-comm python3-cloudpickle python3-numpy \
             python3-jupyter-client jupyter-client python3-matplotlib-inline
DEB_TEST  := python3-ipykernel jupyter-console python3-nbclient python3-nbformat \
             python3-pytest python3-pexpect python3-torch python3-matplotlib \
             python3-pandas python3-scipy python3-pytest-timeout tmux \
             clang libclang-rt-14-dev
DEB_RUN   := jupyter-notebook

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT  := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q

deps:
	$(SUDO) apt-get update -q
	$(APT) $(DEB_BUILD) $(DEB_TEST) $(DEB_RUN)

deps-test:
	$(SUDO) apt-get update -q
	$(APT) $(DEB_BUILD) $(DEB_TEST)

kernelspec: $(BUILD)/looseleaf
	$(BUILD)/looseleaf install --user

# One command: packages, build, kernelspec.
setup: deps
	$(MAKE) all
	$(MAKE) kernelspec

# The README's first command: set everything up, then start a notebook server.
run: setup
	jupyter notebook --no-browser

# Every C file of the tree in the style of .clang-format (generated test
# vectors keep theirs).
FORMAT_FILES = $(filter-out tests/proto/wire_vectors.h,$(shell git ls-files '*.c' '*.h'))
format:
	clang-format -i $(FORMAT_FILES)

# Fails when a file is not formatted (nothing is changed).
format-check:
	clang-format --dry-run -Werror $(FORMAT_FILES)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
