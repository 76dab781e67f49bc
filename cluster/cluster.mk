# cluster/: LooseLeaf on a Ray cluster (issue 25, in progress; README "Cluster mode").
# The per-host agent and the server's placer are Python (cluster/looseleaf_cluster); the placement rule
# they run is ll_place's C, built here into a small shared library the placer loads with ctypes.
#
# The library links ll_place's object wherever the tree keeps it (zygote/ today, policy/ after the
# split): found in LIB_OBJS when the recipe runs (recipes expand late, after every .mk is read), built
# by the binary's rule (hence the prerequisite).  --no-undefined: a library missing the rule fails here.
CLUSTER_PLACE_LIB := $(BUILD)/cluster/libllplace.so
EXTRA_TARGETS += $(CLUSTER_PLACE_LIB)

$(CLUSTER_PLACE_LIB): cluster/ll_cluster_place.c $(BUILD)/looseleaf
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,--no-undefined -o $@ $< $(filter %/ll_place.o,$(LIB_OBJS))

# The placement bridge (the C rule through ctypes, the broker's stats as load) needs neither Ray nor root:
# `make test` runs it, so a change to ll_place or its build that breaks the cluster's placer shows there.
PYTESTS += tests/cluster/test_place_unit.py tests/cluster/test_hostd_client_unit.py

# `make test-cluster`: a Ray cluster of network namespaces on this machine (root only; see
# tests/cluster/clusterhelp.py).  Not part of `make test`: it needs root, ip(8) and ~2 GB of memory.
.PHONY: test-cluster
test-cluster: all venv
	$(VENV_PY) $(PYTEST) tests/cluster
