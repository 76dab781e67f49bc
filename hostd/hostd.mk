# hostd/: `looseleaf hostd`, the host's GPU slot broker, and `looseleaf top` (hostd/API.md).
# The broker's policy is pure (policy/ll_hostd_policy, scripted self-test); the pool's link to it is
# zygote/ll_hostpool_hostd.c, which includes only hostd/ll_hostd_wire.h: the broker lends slots and never
# depends on the pool (tests/tree checks).  The systemd unit is hostd/looseleaf-hostd.service.
SELFTESTS += ll_hostd_wire ll_lease
LIB_SRCS  += hostd/ll_hostd_wire.c hostd/ll_hostd.c hostd/ll_hostd_metrics.c hostd/ll_lease.c

# Real OS users (useradd, setpriv; root only, skipped otherwise) sharing one broker, and three users'
# kernels through jupyter_client against ipykernel (~90 s on 2 cores, alone, of which the fake-GPU slot map
# and the prefetch lease take ~15 s; next to another test process its nine kernels on two slots ran past the
# 300 s limit).
PYTESTS_ALONE += tests/hostd

# Administrators: `make install-hostd` (root) installs the binary and the unit and starts the broker
# (with DESTDIR set, it only copies).
PREFIX ?= /usr/local
.PHONY: install-hostd
install-hostd: $(BUILD)/looseleaf
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)/etc/systemd/system
	install -m 0755 $(BUILD)/looseleaf $(DESTDIR)$(PREFIX)/bin/looseleaf
	sed 's|@BINDIR@|$(PREFIX)/bin|' hostd/looseleaf-hostd.service \
	    > $(DESTDIR)/etc/systemd/system/looseleaf-hostd.service
	[ -n "$(DESTDIR)" ] || { systemctl daemon-reload && systemctl enable --now looseleaf-hostd; }

# Three users' sessions on 2 slots: GPU-seconds held and busy per user against pinned, cell start latency
# (root only; ~20 s).
BENCHES   += tests/bench/bench_hostd.py
