# cluster/: LooseLeaf on a Ray cluster (in progress; README "Cluster mode").
# The per-host agent and the server's placer are Python (cluster/looseleaf_cluster); the placement rule
# they run is ll_place's C, built here into a small shared library the placer loads with ctypes.
# --no-undefined: a library missing the rule fails here, not when the placer loads it.
CLUSTER_PLACE_LIB := $(BUILD)/cluster/libllplace.so
EXTRA_TARGETS += $(CLUSTER_PLACE_LIB)

$(CLUSTER_PLACE_LIB): $(BUILD)/cluster/ll_cluster_place.o $(BUILD)/policy/ll_place.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -shared -Wl,--no-undefined -o $@ $^

# The placement bridge (the C rule through ctypes, the broker's stats as load) needs neither Ray nor root:
# `make test` runs it, so a change to ll_place or its build that breaks the cluster's placer shows there.
PYTESTS += tests/cluster/test_place_unit.py tests/cluster/test_hostd_client_unit.py \
           tests/cluster/test_store_foreign_unit.py

# `make test-cluster`: a Ray cluster of network namespaces on this machine (root only; see
# tests/cluster/clusterhelp.py).  Not part of `make test`: it needs root, ip(8) and ~2 GB of memory.
.PHONY: test-cluster
test-cluster: all venv
	$(VENV_PY) $(PYTEST) tests/cluster

# Administrators: `make install-cluster` (root; after `make install-hostd`'s prerequisites) installs the
# cluster package and the placement library under $(PREFIX)/lib/looseleaf, the raylet's and the agent's units,
# the hostd's drop-in that gives it the cluster config, and an example config; then reloads systemd and
# restarts the broker.  Without DESTDIR it wants /etc/looseleaf/cluster.json written first (the broker reads
# it).  Enabling the units is the administrator's step: README, "Cluster mode".
CLUSTER_PY := $(wildcard cluster/looseleaf_cluster/*.py)
CLUSTER_LIB_DIR = $(DESTDIR)$(PREFIX)/lib/looseleaf
.PHONY: install-cluster
install-cluster: $(BUILD)/looseleaf $(CLUSTER_PLACE_LIB)
	@[ -n "$(DESTDIR)" ] || [ -f /etc/looseleaf/cluster.json ] || { \
	    echo "install-cluster: write /etc/looseleaf/cluster.json first (cluster/cluster.json.example)"; exit 1; }
	$(MAKE) --no-print-directory install-hostd
	install -d $(CLUSTER_LIB_DIR)/cluster/looseleaf_cluster $(CLUSTER_LIB_DIR)/build/cluster \
	    $(DESTDIR)/etc/systemd/system/looseleaf-hostd.service.d $(DESTDIR)/etc/looseleaf
	install -m 0644 $(CLUSTER_PY) $(CLUSTER_LIB_DIR)/cluster/looseleaf_cluster/
	install -m 0755 $(CLUSTER_PLACE_LIB) $(CLUSTER_LIB_DIR)/build/cluster/
	for u in looseleaf-raylet looseleaf-agent; do \
	    sed 's|@BINDIR@|$(PREFIX)/bin|g' cluster/$$u.service > $(DESTDIR)/etc/systemd/system/$$u.service; done
	install -m 0644 cluster/looseleaf-hostd-cluster.conf \
	    $(DESTDIR)/etc/systemd/system/looseleaf-hostd.service.d/cluster.conf
	install -m 0644 cluster/cluster.json.example $(DESTDIR)/etc/looseleaf/cluster.json.example
	[ -n "$(DESTDIR)" ] || { systemctl daemon-reload && systemctl restart looseleaf-hostd; }

# Config, CLI, units, `top --cluster` rendering, without Ray or root.
PYTESTS += tests/cluster/test_cluster_config.py
