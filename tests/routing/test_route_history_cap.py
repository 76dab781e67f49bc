"""Time travel at the user's store cap (issue 28): with the history on by default, a session whose kept old
versions fill the user's cap (LL_STORE_USER_CAP, or `looseleaf hostd --store-cap`) still saves every new
value: the oldest kept versions give way, only as many as each save needs, and `%looseleaf history` says they
were dropped to make room at the cap (store/ll_history.c, ll_history_relieve)."""
import re

from routehelp import Kernel, _error_text, execute, run_route, stop_pool, stream_text

MIB12 = 3 << 20  # float32 elements: 12 MiB, six pool regions


def test_saves_near_the_cap_drop_the_oldest_versions_and_say_so(jupyter_env, tmp_path):
    # A ledger of the test's own (the user's real one counts other kernels' pools); 64 MiB: a few versions.
    # The workers make the saves, and they get the cap and the ledger from their host pool's environment:
    # a pool of the test's own, started by this kernel (the run's shared pool was started without them).
    pool_dir = str(tmp_path / "pool")
    env = {"LL_STORE_LEDGER": str(tmp_path / "ledger"), "LL_STORE_USER_CAP": "64M",
           "LOOSELEAF_POOL_DIR": pool_dir}
    k = Kernel("looseleaf", env=env)
    try:
        run_route(k, "import torch\ncw = torch.zeros(%d)" % MIB12, "gpu")
        for step in range(7):  # 8 versions of 12 MiB: twice what the cap holds
            run_route(k, "cw += 1\nprint(float(cw[0]))", "gpu")  # (run_route: each cell saved, none failed)
        reply, msgs = execute(k, "%looseleaf history cw")
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        lines = [ln for ln in stream_text(msgs).splitlines() if ln]
        kept = [int(m.group(1)) for m in (re.match(r"cw@(\d+)\s", ln) for ln in lines) if m]
        # The newest versions stay, the current one among them; the oldest went, and the listing says why.
        assert len(kept) >= 2 and "(current" in lines[len(kept) - 1], lines
        listing = "\n".join(lines)  # (whole: pytest would cut a list's repr short)
        assert any("older version" in ln and "dropped to make room for a save at your store cap" in ln
                   for ln in lines), listing
        assert not any("within its budget" in ln for ln in lines), listing
        # The newest value is the one a fresh cell reads.
        reply, msgs = execute(k, "print(float(cw[0]))")
        assert stream_text(msgs) == "7.0\n", _error_text(reply, msgs)
    finally:
        k.stop()
        stop_pool(pool_dir)
