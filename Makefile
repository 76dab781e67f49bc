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
PKGS    := libzmq libczmq openssl jansson hiredis libxxhash
BUILD   := build

# The libraries: pkg-config's, or, with DEPS_PREFIX=DIR, Debian's packages
# unpacked with dpkg -x into DIR (the GPU machine's bundle, tests/gpu/README.md:
# no pkg-config, no Debian libraries there), found at run time through the
# binaries' RPATH (DT_RPATH, which also serves the libraries' own needs).
DEPS_PREFIX ?=
ifeq ($(strip $(DEPS_PREFIX)),)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))
STORE_DEPS_LIBS := $(shell pkg-config --libs hiredis libxxhash jansson)
else
DEPS_LIBDIR := $(abspath $(DEPS_PREFIX)/usr/lib/x86_64-linux-gnu)
DEPS_RPATH  := -L$(DEPS_LIBDIR) -Wl,--disable-new-dtags,-rpath,$(DEPS_LIBDIR)
PKG_CFLAGS := -I$(abspath $(DEPS_PREFIX)/usr/include) \
              -I$(abspath $(DEPS_PREFIX)/usr/include/x86_64-linux-gnu)
PKG_LIBS   := $(DEPS_RPATH) -lzmq -lczmq -lssl -lcrypto -ljansson -lhiredis -lxxhash
STORE_DEPS_LIBS := $(DEPS_RPATH) -lhiredis -lxxhash -ljansson
endif

# The Python the kernel embeds (its libpython) and runs in unless a kernelspec
# names another environment of the same version (kernel/ll_pyenv.h):
# Debian's by default, any CPython with a shared libpython with
# `make PYTHON=/path/to/python3.X`.  Headers, library and the extension
# suffix come from its sysconfig.
PYTHON  ?= /usr/bin/python3
PY_CONFIG  = $(shell $(PYTHON) -c 'import sysconfig as s; print(s.get_config_var("$(1)") or "")' 2>/dev/null)
PY_CFLAGS := -I$(call PY_CONFIG,INCLUDEPY)
PY_LIBDIR := $(call PY_CONFIG,LIBDIR)
PY_LDVERSION := $(call PY_CONFIG,LDVERSION)
# A Python whose -dev package is missing (an Ubuntu venv's python3.12 without
# python3.12-dev) has only libpython3.X.so.1.0 (INSTSONAME), not the link
# name libpython3.X.so that -lpython3.X wants: then that file is linked by
# its name (-l:libpython3.X.so.1.0).
PY_SONAME := $(call PY_CONFIG,INSTSONAME)
PY_LIBNAME := $(if $(wildcard $(PY_LIBDIR)/libpython$(PY_LDVERSION).so),python$(PY_LDVERSION),$(if               $(and $(PY_SONAME),$(wildcard $(PY_LIBDIR)/$(PY_SONAME))),:$(PY_SONAME),python$(PY_LDVERSION)))
PY_LIBS   := -L$(PY_LIBDIR) -l$(PY_LIBNAME)
ifneq ($(strip $(DEPS_PREFIX)),)
PY_LIBS   += -Wl,-rpath,$(PY_LIBDIR)
endif
PY_EXT    := $(call PY_CONFIG,EXT_SUFFIX)
PKG_CFLAGS += $(PY_CFLAGS)
PKG_LIBS   += $(PY_LIBS)

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
PYTESTS_ALONE :=
BENCHES   :=
EXTRA_TARGETS :=
TEST_DEPS :=

include $(sort $(wildcard */*.mk))

LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o)
BIN_OBJS  := $(BIN_SRCS:%.c=$(BUILD)/%.o)
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o)

.PHONY: all test test-debian test-browser selftest pytest venv bench clean deps deps-test setup run \
        kernelspec format format-check gpu-bundle e2e-build
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

# ---- the current Jupyter stack, from PyPI ----------------------------------
# The project's virtual environment, made from the Python the kernel embeds
# (so their libpython is one), with every version pinned in requirements.txt:
# JupyterLab 4, Notebook 7, jupyter_client 8, ipykernel 7 (the reference
# kernel), IPython 9, ipywidgets 8, torch 2.x, numpy 2.x, the test tools.
VENV    := .venv
VENV_PY := $(VENV)/bin/python

venv: $(VENV)/.requirements
$(VENV)/.requirements: requirements.txt
	@[ -x $(VENV_PY) ] || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install -q -r requirements.txt
	@cp requirements.txt $@

PYTEST = -m pytest -q -ra -p no:cacheprovider $(PYTEST_ARGS)
# The venv's suites run in TEST_JOBS pytest processes (pytest-xdist), a test
# file to a process: most of a test's time is spent waiting for kernels,
# workers and timers, not computing, so two processes on two cores take
# about half the time of one.  Each process has its own Jupyter directories,
# host pool and stores (tests/conftest.py).  TEST_JOBS=0: one process.
# A crashed test process ends the run (--max-worker-restart=0) rather than
# leave its files unscheduled.  Suites in PYTESTS_ALONE need the machine to
# themselves (tests/hostd: OS users, nine kernels on two slots) and run after
# the others, in one process.
TEST_JOBS ?= 2
PYTEST_PAR = $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile --max-worker-restart=0)

pytest: all venv $(TEST_DEPS)
	$(if $(strip $(PYTESTS)),$(VENV_PY) $(PYTEST) $(PYTEST_PAR) $(PYTESTS))
	$(if $(strip $(PYTESTS_ALONE)),$(VENV_PY) $(PYTEST) $(PYTESTS_ALONE))

# Everything: the C self-tests, the suites on the current stack (the venv),
# then a smoke run on Debian's own Jupyter stack so both keep working.
test: all venv $(TEST_DEPS)
	$(BUILD)/ll_selftest
	$(if $(strip $(PYTESTS)),$(VENV_PY) $(PYTEST) $(PYTEST_PAR) $(PYTESTS))
	$(if $(strip $(PYTESTS_ALONE)),$(VENV_PY) $(PYTEST) $(PYTESTS_ALONE))
	$(MAKE) --no-print-directory test-debian

# Debian 12's Jupyter (jupyter_client 7, ipykernel 6, IPython 8, torch 1.13)
# as client, reference and the kernel's environment.
test-debian: all
	$(if $(strip $(DEBIAN_SMOKE)),/usr/bin/python3 $(PYTEST) $(DEBIAN_SMOKE))

# Python benchmarks run on the project's venv (the current stack; their
# reference ipykernel is the venv's), the C ones as they are.
bench: all venv
	@set -e; for b in $(BENCHES); do echo "== $$b"; \
	    case $$b in *.py) $(VENV_PY) $$b ;; *) $$b ;; esac; done

# ---- the GPU machine's run (tests/gpu/README.md) --------------------------
# The bundle it carries (Debian's libraries and the kernel's wheels for
# CPython 3.12, under the size limit), and what tests/gpu/e2e.sh builds there
# (with BUILD, PYTHON and DEPS_PREFIX of its own): the kernel and the store's
# extension, nothing else.
gpu-bundle: all
	tests/gpu/bundle.sh
e2e-build: $(BUILD)/looseleaf $(STORE_PYEXT)

# ---- set-up on a fresh Debian 12 machine --------------------------------
# Packages to build and run the kernel, and what the tests drive it with.
# Recommends are installed too: the machines the suite was developed on had them,
# and a fresh machine must see the same Python packages (scipy, for one).
DEB_BUILD := build-essential pkg-config libzmq3-dev libczmq-dev libssl-dev \
             libjansson-dev libpython3-dev python3-venv libhiredis-dev libxxhash-dev \
             redis-server git ca-certificates
# Debian's own Jupyter stack, for `make test-debian` (and a kernel installed
# for /usr/bin/python3 without a venv).
DEB_STACK := python3-ipython python3-comm python3-cloudpickle python3-numpy \
             python3-jupyter-client jupyter-client python3-matplotlib-inline \
             python3-ipykernel jupyter-console python3-nbclient python3-nbformat \
             python3-pytest python3-pexpect python3-torch python3-matplotlib \
             python3-pandas python3-scipy python3-pytest-timeout jupyter-notebook python3-ipywidgets
DEB_TEST  := $(DEB_STACK) tmux chromium clang libclang-rt-14-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT  := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q

deps:
	$(SUDO) apt-get update -q
	$(APT) $(DEB_BUILD) $(DEB_TEST)

# What the tests need is part of `deps` (DEB_TEST): one list, so that `make
# setup`, which a new user and .ci/run start with, leaves a machine the whole
# suite runs on.
deps-test: deps

# The kernelspec, into the project's venv, with the JupyterLab extension that
# sends the cell being edited to a LooseLeaf kernel (typing stays JupyterLab's
# own): `looseleaf install --help` for other places.
kernelspec: $(BUILD)/looseleaf venv
	$(BUILD)/looseleaf install --sys-prefix --python $(VENV_PY)

# One command: packages, build, the venv, the kernelspec.  It starts nothing:
# .ci/run runs it, then `make test` and `make test-browser`, as README.md tells
# a new user.
setup: deps
	$(MAKE) all
	$(MAKE) kernelspec

# The README's first command: set everything up, then start JupyterLab, with
# "LooseLeaf (GPU)" in its launcher.
ROOT_OK := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
run: setup
	$(VENV)/bin/jupyter lab $(ROOT_OK)

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
