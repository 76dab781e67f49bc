"""The cluster's placement is ll_place's C rule (build/cluster/libllplace.so through ctypes) and the host load
it is fed is the broker's count: checked without Ray or root."""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "cluster"))

from looseleaf_cluster import hostd, place  # noqa: E402

if not os.path.exists(place.library_path()):
    pytest.skip("build/cluster/libllplace.so is missing: make all", allow_module_level=True)


def host(slots=4, busy=0, warm=0, **kw):
    return dict(slots=slots, busy=busy, warm=warm, **kw)


def test_most_loaded_host_with_a_free_slot():
    # ll_place's own self-test fleet: 0 lightly, 1 heavily loaded with a free slot, 2 full, 3 booting.
    hosts = [host(8, 1, 1), host(8, 5, 2), host(8, 8), host(8, accepting=False)]
    assert place.choose(hosts) == (1, "free")


def test_consolidation_order_fills_hosts_one_by_one():
    hosts = [host(), host(busy=2), host(busy=1)]
    order = []
    for _ in range(9):  # 9 free slots in all
        i, how = place.choose(hosts)
        assert how == "free"
        order.append(i)
        hosts[i]["busy"] += 1
    assert order == [1, 1, 2, 2, 2, 0, 0, 0, 0]  # the fullest first, never spread
    assert place.choose(hosts)[1] == "queue"  # all full: the shortest queue (the cluster does not queue yet)


def test_home_then_evict_then_none():
    hosts = [host(busy=4), host(busy=3, warm=1)]
    assert place.choose(hosts, home=0, home_slot=True) == (0, "home")
    assert place.choose(hosts) == (1, "evict")
    assert place.choose([host(accepting=False)]) == (-1, "none")
    assert place.choose([]) == (-1, "none")
    # Room for the session's state is the rule's too.
    assert place.choose([host(mem_free=1e6), host(busy=1, mem_free=1e9)], state_bytes=1e8) == (1, "free")
    assert place.choose([host(mem_free=1e6)], state_bytes=1e8) == (-1, "none")


def test_broker_stats_as_placement_load():
    st = {"slots": 4, "waiting": 1, "lease_list": [{"slot": 0, "state": "busy"}, {"slot": 1, "state": "warm"},
                                                    {"slot": 2, "state": "revoking"}]}
    assert hostd.load(st) == {"slots": 4, "busy": 2, "warm": 1, "queued": 1}
