#!/bin/sh
# tests/gpu/run.sh: the worker side of GPU routing (forked workers, the store) on a real GPU (CUDA,
# PyTorch; any python3 >= 3.10).
#
# The GPU machines have no Debian libraries, so build/looseleaf (libzmq, hiredis, libpython3.11, redis-server)
# cannot run there.  This runs what can run with only python3 + torch + CUDA, using the repo's own Python code
# (zygote/py, store/py): a zygote that imported torch without touching CUDA passes the pre-fork checks; the
# CUDA-safety probe flags packages that touch CUDA; a worker forked from the zygote initialises CUDA after the
# fork on its assigned device and computes; a zygote that touched CUDA makes a child fail (why the checks
# exist); a CUDA tensor goes device -> pinned host memory -> device through the store's own copy routines.
#
# Without a GPU (no CUDA device visible to torch) it prints SKIP and exits 0, after running the checks that
# need no GPU.  Exit status: 0 all passed or skipped, 1 a check failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${LL_GPU_PYTHON:-python3}
if ! "$py" -c 'import torch' 2>/dev/null; then
    [ -x /usr/bin/python3 ] && py=/usr/bin/python3
fi
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "SKIP: no python3 with torch"
    exit 0
fi
PYTHONPATH="$repo/zygote/py:$repo/store/py${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$here/gpu_worker_path.py" "$@"
