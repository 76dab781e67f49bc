"""looseleaf_zygote: the Python half of LooseLeaf's zygotes and workers (zygote/ll_zygote.c calls zyg.*).

zyg.py      what a zygote imports and checks before forking, and what a worker does around its cell
            (CUDA device, imports, restore, process state, save).
procstate.py  process state besides variables (cwd, environment, sys.path, RNG states, torch dtype/grad
            mode) captured after a cell and applied before the next, wherever it runs.
probe.py    the CUDA-safety probe: does importing a package touch CUDA?
"""
