"""looseleaf_zygote: the Python half of LooseLeaf's zygotes and workers (zygote/ll_zygote.c calls zyg.*).

zyg.py      what a zygote imports and checks before forking, and what a worker does around its cell
            (CUDA device, imports, restore, process state, save).
probe.py    the CUDA-safety probe: does importing a package touch CUDA?
"""
