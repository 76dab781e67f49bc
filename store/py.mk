# store/py.mk: the Python half of the checkpoint store (owned by the store-Python engineer):
# the package store/py/looseleaf_store (pure Python, imported from the source tree: the kernel puts
# $(LL_SRCDIR)/store/py on sys.path; tests and the benchmark do it themselves), its tests and benchmark.
# They need the _llstore extension that store/store.mk builds into build/py.
PYTESTS += tests/store
BENCHES += tests/bench/bench_store.py
