"""Fixtures of the edit-time prefetch tests: one private host pool (warm workers on, 4 virtual slots so no
test's prefetch is skipped for want of a slot) for the whole directory, stopped at the end."""
import os
import shutil
import tempfile

import pytest

from pfhelp import Pool


@pytest.fixture(scope="session")
def slow_module_dir():
    """A directory on the PYTHONPATH of the pool and the kernels, holding modules pf_slow_a ... pf_slow_d whose
    import takes 4 s: a prefetch of a cell importing one stays in its preparation long enough for a test to act
    while it is in flight.  One module per test: once imported, the pool grows a zygote node holding it."""
    d = tempfile.mkdtemp(prefix="ll-pf-mods-")
    for name in "abcd":
        with open(os.path.join(d, "pf_slow_%s.py" % name), "w") as f:
            f.write("import time\ntime.sleep(4)\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pool(jupyter_env, slow_module_dir):
    path = os.pathsep.join(p for p in (slow_module_dir, os.environ.get("PYTHONPATH")) if p)
    p = Pool(slots=4, env={"PYTHONPATH": path})
    yield p
    p.close()
