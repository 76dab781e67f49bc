"""The autoscaler's target is ll_provision's C (the simulator's controller) and the host it drains is
ll_place_drain's pick, both through build/cluster/libllplace.so: checked without Ray or root."""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "cluster"))

from looseleaf_cluster import place  # noqa: E402

if not os.path.exists(place.library_path()):
    pytest.skip("build/cluster/libllplace.so is missing: make all", allow_module_level=True)

from looseleaf_cluster.autoscale import Provision  # noqa: E402  (imports no Ray at module level)

CFG = dict(slots=8, target_util=0.8, p_wait=0.05, window_s=300, down_hold_s=600, min_hosts=1, max_hosts=0,
           idle_load=0)


def test_square_root_staffing_as_the_simulator_decides():
    # ll_provision's self-test day: a burst of 12 running and 4 waiting is seen at once: 16/0.8 + 1.69*4
    # = 26.8 -> 27 GPUs -> 4 hosts of 8.
    p = Provision(**CFG)
    assert p.decide(0, 0) == 1  # nothing seen: the minimum
    p.observe(0, 0, 0)
    p.observe(10, 12, 4)
    assert p.load() == 16
    assert p.decide(10, 1) == 4
    assert p.gpus(16, 0.8, 0.05) == 27
    # Down only after the hold: lower at 70 s, still 4 hosts; long after, 1.
    p.observe(70, 1, 0)
    assert p.decide(70, 4) == 4
    p.observe(3000, 1, 0)
    assert p.decide(3000, 4) == 1


def test_an_idle_fleet_shrinks_to_nothing_only_with_idle_load():
    for idle_load, last in ((0.0, 1), (0.01, 0)):
        p = Provision(**dict(CFG, min_hosts=0, down_hold_s=10, idle_load=idle_load))
        p.observe(0, 8, 0)
        assert p.decide(0, 0) == 2
        p.observe(1, 0, 0)
        p.observe(6000, 0, 0)  # 20 windows later
        assert p.decide(6000, 2) == 2  # the hold starts
        assert p.decide(6020, 2) == last
    p.observe(6030, 0, 1)  # one request waits: wanted at once
    assert p.decide(6030, 0) == 1


def test_bad_configuration_is_refused():
    for bad in (dict(target_util=0), dict(p_wait=1), dict(slots=0), dict(min_hosts=3, max_hosts=2),
                dict(idle_load=-1)):
        with pytest.raises(ValueError, match="ll_provision refused"):
            Provision(**dict(CFG, **bad))


def test_drain_picks_the_emptiest_accepting_host():
    h = lambda busy, warm=0, **kw: dict(slots=4, busy=busy, warm=warm, **kw)
    assert place.drain([h(3), h(0, 1), h(2)]) == 1  # fewest slots held (busy + warm)
    assert place.drain([h(0), h(0, accepting=False), h(1)]) == 0  # a draining host is not picked again
    assert place.drain([h(0, accepting=False)]) == -1
    assert place.drain([]) == -1
