# tests/gpu/: the GPU machine's run (tests/gpu/README.md).  Here, without a GPU: tests/gpu/run.sh (through
# tests/zygote/test_gpu_script.py) and tests/gpu/e2e.sh --cpu, on the bundle and build path the device uses;
# the script's helpers (sonames, libpython's link, /dev/shm and huge-page plans, the per-cell time cap).
PYTESTS += tests/gpu/test_e2e_cpu.py tests/gpu/test_e2e_helpers.py
