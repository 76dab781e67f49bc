"""The cluster of network namespaces (clusterhelp.Cluster), one per test module: building it takes ~half a
minute and ~2 GB, so the scenarios of a module share it and leave it as they found it (or note what they
broke, as the host-killed test does, which runs last in its module)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import clusterhelp  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    why = clusterhelp.usable()
    if why:
        pytest.skip(why)
    c = clusterhelp.Cluster(nhosts=int(os.environ.get("LL_CLUSTER_HOSTS", "3")),
                            slots=int(os.environ.get("LL_POOL_SLOTS", "4")))
    try:  # close() is armed before anything is made: a failing start tears down what it made
        try:
            c.start()
        except Exception as e:
            raise RuntimeError("the cluster did not start: %s\n%s" % (e, c.logs()[-8000:])) from e
        yield c
    finally:
        c.close()
