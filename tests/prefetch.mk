# Edit-time prefetch and warm workers through the real kernel (prefetch-test engineer):
# tests/prefetch/test_pf_*.py drive build/looseleaf through jupyter_client on a private host pool and read the
# pool's stats (build/zygote/ll_zdriver) and log: each hint kind prepares the worker before Run, stale
# prefetches stay correct, cancel drops speculative work, debounce, semantics unchanged by warm workers.
PYTESTS += tests/prefetch
