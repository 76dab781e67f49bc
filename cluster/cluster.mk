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
PYTESTS += tests/cluster/test_place_unit.py tests/cluster/test_hostd_client_unit.py

# `make test-cluster`: a Ray cluster of network namespaces on this machine (root only; see
# tests/cluster/clusterhelp.py).  Not part of `make test`: it needs root, ip(8) and ~2 GB of memory.
.PHONY: test-cluster
test-cluster: all venv
	$(VENV_PY) $(PYTEST) tests/cluster
