"""tests/gpu/e2e.py: the checks of the end-to-end run (issue 15, "The run"), driven through jupyter_client
against the looseleaf kernel e2e.sh built; writes report.json and report.md into --out after every check, so a
run cut short still leaves what it measured.  Started by tests/gpu/e2e.sh (never by hand: it sets the paths).

Each check is PASS, FAIL or SKIP with its figures and, when not PASS, why.  --mode cpu runs the same checks
here on CPU tensors with small sizes (the GPU-only ones skip); --mode gpu on the GPU machine.  Every check has
a share of --budget seconds and is skipped, saying so, when too little is left; every cell and plain process
is cut at the budget's end (cap_timeout), and the budget ends early enough for the report and the pools'
stop to fit before --deadline (the device call's end): a cell that hangs costs its check, never the run.
The kernels run with pools of their own (LOOSELEAF_POOL_DIR under --work), stopped at the end; their logs
are gathered into pool.log beside the report after every check.
"""
import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))
GiB = 1 << 30
MiB = 1 << 20
# Kept from --deadline for what follows the checks: libraries_loaded, stopping the pools, the last report.
RESERVE_S = 45
POOL_LOG_TAIL = 4 * MiB  # of each pool's log in pool.log (the device tool takes back files of 16 MiB at most)


def cap_timeout(requested, left):
    """The timeout a cell or a plain process gets: REQUESTED seconds, cut to the LEFT seconds of the budget.
    Raises OutOfBudget when nothing is left (it would not even start)."""
    if left < 1:
        raise OutOfBudget("no time left in the budget (%.0f s)" % left)
    return min(requested, left)


def budget_end(now, budget, deadline_in=None, reserve=RESERVE_S):
    """The monotonic time the checks must end by: NOW + BUDGET, or earlier when the whole run must be over in
    DEADLINE_IN seconds (less RESERVE for what comes after the checks)."""
    end = now + budget
    if deadline_in is not None:
        end = min(end, now + deadline_in - reserve)
    return end


def save_sizes(mode, pool_mib):
    """(sizes the save_restore check can run, {size: why not} for the others): a size needs 2.5 times itself
    in the pool (the committed version, the rewrite's new one, slack)."""
    want = [s * GiB for s in (1, 4, 16)] if mode == "gpu" else [64 * MiB]
    fit = [s for s in want if 2.5 * s <= pool_mib * MiB]
    return fit, {s: "the payload pool has %d MiB (/dev/shm's room), %d MiB needs %d" % (
        pool_mib, s // MiB, int(2.5 * s) // MiB) for s in want if s not in fit}


class Report:
    """report.json (everything) and report.md (a table), rewritten after each check."""

    def __init__(self, out, meta):
        self.out, self.meta, self.checks = out, meta, []
        self.write()

    def add(self, name, status, why="", **figures):
        self.checks.append({"name": name, "status": status, "why": why, "figures": figures})
        line = "%-22s %-4s %s %s" % (name, status, why, json.dumps(figures, default=str)[:600])
        print(line, flush=True)
        self.write()

    def failed(self):
        return [c["name"] for c in self.checks if c["status"] == "FAIL"]

    def write(self):
        doc = dict(self.meta, checks=self.checks,
                   summary={s: sum(c["status"] == s for c in self.checks) for s in ("PASS", "FAIL", "SKIP")})
        with open(os.path.join(self.out, "report.json"), "w") as f:
            json.dump(doc, f, indent=1, default=str)
        env = self.meta.get("env", {})
        md = ["# LooseLeaf end-to-end run (%s mode)" % self.meta["mode"], "",
              "%s; %s; Python %s (%s); torch %s; glibc: %s" % (
                  self.meta.get("date"), env.get("nvidia_smi") or "no GPU", env.get("version"),
                  env.get("python"), env.get("torch"), env.get("glibc")), "",
              "Build: %s%s; libraries: %s" % (self.meta.get("status"), " — " + self.meta["why"] if self.meta.get("why")
                                              else "", self.meta.get("prefix")),
              "", "| check | result | figures / why |", "| --- | --- | --- |"]
        for c in self.checks:
            fig = ", ".join("%s %s" % (k, _fmt(v)) for k, v in c["figures"].items() if not isinstance(v, (list, dict)))
            md.append("| %s | %s | %s |" % (c["name"], c["status"], " — ".join(x for x in (fig, c["why"]) if x)))
        md += ["", "Passed %(PASS)d, failed %(FAIL)d, skipped %(SKIP)d." % doc["summary"]]
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(md) + "\n")


def _fmt(v):
    return ("%.3g" % v) if isinstance(v, float) else str(v)


# ---- kernels -----------------------------------------------------------------------------------------------
class Cell:
    def __init__(self, reply, stdout, stderr, wall):
        self.reply, self.stdout, self.stderr, self.wall = reply, stdout, stderr, wall
        c = reply["content"]
        self.ok = c.get("status") == "ok"
        self.ename, self.evalue = c.get("ename"), c.get("evalue")
        self.md = reply.get("metadata", {}).get("looseleaf", {}) or {}

    def __repr__(self):
        return "Cell(ok=%s, %s: %s, out=%r, err=%r)" % (self.ok, self.ename, (self.evalue or "")[:200],
                                                       self.stdout[-300:], self.stderr[-300:])


class OutOfBudget(Exception):
    """A cell or process the budget's end cut (or left unstarted)."""


class Kernel:
    """A looseleaf kernel started by jupyter_client with POOL as its pool dir and ENV beside."""

    def __init__(self, ctx, pool, **env):
        from jupyter_client import KernelManager
        self.ctx = ctx
        e = dict(os.environ, LOOSELEAF_POOL_DIR=os.path.join(ctx.work, pool), LL_POOL_IDLE_EXIT="20")
        e.update({k: str(v) for k, v in env.items()})
        ctx.pools.add(e["LOOSELEAF_POOL_DIR"])
        self.cells = 0
        t0 = time.perf_counter()
        self.km = KernelManager(kernel_name="looseleaf-e2e")
        self.km.start_kernel(env=e)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=cap_timeout(120, ctx.left() + RESERVE_S / 2))
        self.start_s = time.perf_counter() - t0

    def pid(self):
        prov = getattr(self.km, "provisioner", None)
        proc = getattr(prov, "process", None)
        return getattr(proc, "pid", None)

    def send(self, code):
        cap_timeout(1, self.ctx.left())  # (nothing starts once the budget is spent)
        self.cells += 1
        return self.kc.execute(code, store_history=True, allow_stdin=False)

    def wait(self, msg_id, timeout=600, on_stdout=None):
        """The cell MSG_ID's result, waiting TIMEOUT seconds at most and never past the budget's end: a cell
        still running then is interrupted, and OutOfBudget says how long it ran."""
        t0 = time.perf_counter()
        out, err = [], []
        capped = cap_timeout(timeout, self.ctx.left())
        deadline = time.monotonic() + capped
        try:
            return self._wait(msg_id, deadline, out, err, t0, on_stdout)
        except queue.Empty:
            try:
                self.km.interrupt_kernel()
            except Exception:  # noqa: BLE001 - the report matters more
                pass
            raise OutOfBudget("a cell still ran after %.0f s (%s), interrupted: %r" % (
                time.perf_counter() - t0, "the budget's end" if capped < timeout else "its timeout",
                "".join(out)[-200:])) from None

    def _wait(self, msg_id, deadline, out, err, t0, on_stdout):
        idle = False
        while not idle:
            if time.monotonic() > deadline:
                raise queue.Empty
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                (out if c["name"] == "stdout" else err).append(c["text"])
                if on_stdout and c["name"] == "stdout":
                    on_stdout("".join(out))
            elif t == "status" and c["execution_state"] == "idle":
                idle = True
        while True:
            if time.monotonic() > deadline:
                raise queue.Empty
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return Cell(reply, "".join(out), "".join(err), time.perf_counter() - t0)

    def run(self, code, timeout=600, on_stdout=None):
        return self.wait(self.send(code), timeout, on_stdout)

    def hint(self, code):
        """A complete_request with CODE as the draft: the kernel prepares the cell's worker (edit-time
        prefetch)."""
        self.kc.complete(code, len(code), reply=True, timeout=30)

    def close(self):
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)
        except Exception:  # noqa: BLE001 - the run's result is what matters
            pass


def _ensure_ok(cell, what):
    if not cell.ok:
        raise CheckFailed("%s failed: %r" % (what, cell))
    return cell


class CheckFailed(Exception):
    pass


# ---- the checks ----------------------------------------------------------------------------------------------
def _plain(ctx, code, timeout=300):
    """CODE in a fresh process of the environment's Python (no kernel): its stdout."""
    try:
        p = subprocess.run([ctx.py, "-c", code], capture_output=True, text=True,
                           timeout=cap_timeout(timeout, ctx.left()),
                           env=dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0")))
    except subprocess.TimeoutExpired as e:
        raise OutOfBudget("a plain process still ran after %.0f s" % e.timeout) from None
    if p.returncode != 0:
        raise CheckFailed("plain process failed: %s" % p.stderr[-800:])
    return p.stdout


def check_worker_path(ctx, rep):
    """The torch-only worker path (gpu_worker_path.py): zygote CUDA-clean, probe, fork + CUDA after it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "zygote", "py"),
                                                       os.path.join(REPO, "store", "py"),
                                                       os.environ.get("PYTHONPATH", "")]))
    try:
        p = subprocess.run([ctx.py, os.path.join(HERE, "gpu_worker_path.py")], capture_output=True, text=True,
                           timeout=cap_timeout(240, ctx.left()), env=env)
    except subprocess.TimeoutExpired as e:
        return rep.add("worker_path", "FAIL", "still ran after %.0f s, cut at the budget" % e.timeout)
    for line in p.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[1] in ("PASS", "FAIL", "SKIP"):
            rest = parts[2] if len(parts) > 2 else ""
            rep.add("worker_path." + parts[0], parts[1], rest if parts[1] != "PASS" else "",
                    **({"detail": rest[:300]} if parts[1] == "PASS" else {}))
    if p.returncode not in (0, 1):
        rep.add("worker_path", "FAIL", "exit %d: %s" % (p.returncode, p.stderr[-500:]))


PINNED = r"""
import json, time, torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
d = torch.empty(n, dtype=torch.uint8, device="cuda")
d.fill_(1); torch.cuda.synchronize()
def best(f):
    t = []
    for _ in range(4):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    return n / min(t[1:]) / 1e9
print(json.dumps({"d2h_GBps": best(lambda: h.copy_(d, non_blocking=True)),
                  "h2d_GBps": best(lambda: d.copy_(h, non_blocking=True))}))
"""


def check_pinned(ctx, rep):
    if ctx.mode != "gpu":
        return rep.add("pinned_baseline", "SKIP", "needs CUDA")
    ctx.pinned = json.loads(_plain(ctx, PINNED).strip().splitlines()[-1])
    rep.add("pinned_baseline", "PASS", **ctx.pinned)


TRAIN = ["""import torch
torch.manual_seed(0)
dev = %(dev)r
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
X = torch.randn(512, 64, device=dev)
Y = X.sum(1, keepdim=True).sin()
losses = []""", """for _ in range(40):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(X), Y)
    loss.backward()
    opt.step()
    losses.append(loss.item())""", """lr_scale = 0.5
print("lr scale", lr_scale)""", """for group in opt.param_groups:
    group["lr"] = group["lr"] * lr_scale
for _ in range(40):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(X) + 0.0 * torch.randn_like(Y), Y)
    loss.backward()
    opt.step()
    losses.append(loss.item())""", """print(repr(losses[-1]), repr(float(sum(p.double().sum() for p in model.parameters()))))"""]
TRAIN_ROUTES = ["gpu", "gpu", "cpu", "gpu", None]  # (the last reads the model: either is right)


def check_train(ctx, rep):
    """A model and optimizer on the device trained across GPU and CPU cells, against one plain process."""
    k = ctx.kernel("pool-warm")
    routes, cells = [], []
    for code in TRAIN:
        c = _ensure_ok(k.run(code % {"dev": ctx.dev}), "a training cell")
        routes.append(c.md.get("route"))
        cells.append(c)
    got = cells[-1].stdout.split()
    want = _plain(ctx, "\n".join(c % {"dev": ctx.dev} for c in TRAIN)).split()
    same = got == want[-2:]
    close = len(got) == 2 and all(abs(float(a) - float(b)) <= 1e-5 * max(1.0, abs(float(b)))
                                  for a, b in zip(got, want[-2:]))
    routed = [r for r, want in zip(routes, TRAIN_ROUTES) if want] == [r for r in TRAIN_ROUTES if r]
    status = "PASS" if (same or close) and routed else "FAIL"
    why = "" if status == "PASS" else "routes %s (want %s), kernel %s vs plain %s" % (routes, TRAIN_ROUTES, got,
                                                                                    want[-2:])
    rep.add("train_across_cells", status, why, bitwise=same, final_loss=got[0] if got else None,
            plain_loss=want[-2] if len(want) > 1 else None,
            first_gpu_cell=_prep(cells[0].md), cpu_cell_route=routes[2], notice=cells[0].stderr[:300])


def _prep(md):
    keys = ("worker_pid", "fork_ms", "import_ms", "cuda_ms", "cuda_init_ms", "cublas_warm_ms", "restore_ms",
            "exec_ms", "save_ms", "bytes_restored", "bytes_saved", "wait_ms", "visible_wait_ms", "warm_hit",
            "device", "mem_fraction", "cuda_error", "prep_ms")
    return {k: md[k] for k in keys if k in md}


def check_save_restore(ctx, rep):
    """Save and restore of SIZES of device tensors through the kernel (cold workers: every cell restores),
    against the pinned copy measured in the same run; and the save of unchanged state."""
    for size, why in sorted(ctx.sizes_skipped.items()):
        rep.add("save_restore.%dMiB" % (size // MiB), "SKIP", why + _host_why(ctx))
    if not ctx.sizes:
        return
    k = ctx.kernel("pool-cold", LL_POOL_WARM_IDLE_S=0)
    for size in ctx.sizes:
        if ctx.left() < ctx.per_size_s:
            rep.add("save_restore.%dMiB" % (size // MiB), "SKIP", "out of time budget")
            continue
        name = "save_restore.%dMiB" % (size // MiB)
        try:
            c1 = _ensure_ok(k.run("import torch\nx = torch.randint(0, 256, (%d,), dtype=torch.uint8, device=%r)"
                                  % (size, ctx.dev)), "the first save")
            c2 = _ensure_ok(k.run("y = int(x[0])"), "a cell reading x (restore, unchanged save)")
            c3 = _ensure_ok(k.run("x.add_(1)"), "a cell rewriting x (restore, full save)")
            _ensure_ok(k.run("del x"), "del x")
        except CheckFailed as e:
            rep.add(name, "FAIL", str(e)[:600])
            continue
        f = {"first_save_ms": c1.md.get("save_ms"), "first_save_bytes": c1.md.get("bytes_saved"),
             "restore_ms": c2.md.get("restore_ms"), "restored_bytes": c2.md.get("bytes_restored"),
             "unchanged_save_ms": c2.md.get("save_ms"), "unchanged_save_bytes": c2.md.get("bytes_saved"),
             "rewrite_save_ms": c3.md.get("save_ms"), "rewrite_save_bytes": c3.md.get("bytes_saved")}
        gbps = lambda b, ms: (b / (ms / 1e3) / 1e9) if b and ms else None  # noqa: E731
        f["save_GBps"] = max(filter(None, [gbps(size, f["first_save_ms"]), gbps(size, f["rewrite_save_ms"])]),
                             default=None)
        f["restore_GBps"] = gbps(size, f["restore_ms"])
        why, status = "", "PASS"
        if f["unchanged_save_bytes"]:
            status, why = "FAIL", "the unchanged save wrote %s bytes" % f["unchanged_save_bytes"]
        if ctx.pinned and f["save_GBps"] and f["restore_GBps"]:
            f["save_vs_pinned"] = f["save_GBps"] / ctx.pinned["d2h_GBps"]
            f["restore_vs_pinned"] = f["restore_GBps"] / ctx.pinned["h2d_GBps"]
            if min(f["save_vs_pinned"], f["restore_vs_pinned"]) < 0.9 and status == "PASS":
                status, why = "FAIL", "below 90% of the pinned copy's bandwidth"
        rep.add(name, status, why, **f)


def _host_why(ctx):
    """What e2e_host.py could not do for the pool, for a SKIP's reason ("" when nothing)."""
    probs = ctx.host.get("problems") or []
    return ("; " + "; ".join(probs)) if probs else ""


# (A GPU cell: it uses torch.  The worker's store is the session's, opened on the kernel's pool.)
POOL_KIND_CELL = """import torch
import looseleaf_zygote.zyg as _llz
print(torch.ones(1).device, _llz._store.stats()["page_kind"])"""


def check_pool_pages(ctx, rep):
    """The page kind of the kernel's payload pool on this host: what ll_pagekind.c chooses for the run's pool
    size (asked through the store's extension), and what the pool got (a worker's store, in a GPU cell; the
    choice falls back to 4 KiB pages when the huge pages do not come).  Huge pages (hugetlb, or THP) where
    the host allows them; 4 KiB pages are no failure of the kernel, but they cap a save near the page-fault
    rate, far below a pinned copy: then a SKIP that says why (and what e2e_host.py could not change)."""
    import _llstore
    choice, why = _llstore.page_kind_choice(ctx.pool_mib * MiB, True)
    k = ctx.kernel("pool-cold", LL_POOL_WARM_IDLE_S=0)
    kind = _ensure_ok(k.run(POOL_KIND_CELL), "the cell reading the pool's page kind").stdout.split()[-1]
    figures = dict(kind=kind, chosen=choice, pool_mib=ctx.pool_mib, actions=ctx.host.get("actions"),
                   nr_overcommit_hugepages=ctx.host.get("nr_overcommit_hugepages"),
                   shmem_enabled=ctx.host.get("shmem_enabled"), choice=why[:400])
    if kind in ("hugetlb", "thp"):
        return rep.add("pool_pages", "PASS", **figures)
    got = "" if kind == choice else " (%s chosen, but its pages did not come)" % choice
    rep.add("pool_pages", "SKIP", "4 KiB pages%s: %s%s" % (got, why[:300], _host_why(ctx)), **figures)


def _gpu_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return float(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


EVICT_CELL = r"""import subprocess, sys, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
child = subprocess.Popen([sys.executable, "-c", "import torch, time; y = torch.empty(1 << 30, dtype=torch.uint8, "
                          "device='cuda'); print(1, flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
child.stdout.readline()
cpid = child.pid
del child"""


def check_evict(ctx, rep):
    """No device memory held by a session once its worker is evicted (a child of its cell, holding the device
    as DataLoader workers do, included): slot pressure in a one-slot pool evicts it."""
    if ctx.mode != "gpu":
        return rep.add("evict_frees_device", "SKIP", "needs CUDA")
    used0 = _gpu_used_mib()
    a = ctx.kernel("pool-evict", LL_POOL_GPU_SLOTS=1)
    ca = _ensure_ok(a.run(EVICT_CELL), "the cell holding 4 GiB and a child with 1 GiB")
    cpid = int(_ensure_ok(a.run("print(cpid)"), "print(cpid)").stdout)
    used1 = _gpu_used_mib()
    b = ctx.kernel("pool-evict", LL_POOL_GPU_SLOTS=1)
    t0 = time.perf_counter()
    cb = _ensure_ok(b.run("import torch\nprint(float(torch.ones(8, device='cuda').sum()))"), "the evicting cell")
    deadline, used2 = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        used2 = _gpu_used_mib()
        if used1 is None or used2 is None or used2 <= used1 - 4800:
            break
        time.sleep(0.2)
    child_gone = not os.path.exists("/proc/%d" % cpid)
    freed = (used1 - used2) if used1 is not None and used2 is not None else None
    ok = child_gone and (freed is None or freed >= 4800)
    rep.add("evict_frees_device", "PASS" if ok else "FAIL",
            "" if ok else "child alive: %s, freed %s MiB" % (not child_gone, freed),
            used_before_mib=used0, used_held_mib=used1, used_after_mib=used2, freed_mib=freed,
            evicting_cell_wait_ms=cb.md.get("wait_ms"), seconds=time.perf_counter() - t0,
            first_worker=ca.md.get("worker_pid"), evicting_worker=cb.md.get("worker_pid"))


def check_oom(ctx, rep):
    if ctx.mode != "gpu":
        return rep.add("cuda_oom_in_cell", "SKIP", "needs CUDA")
    k = ctx.kernel("pool-warm")
    c0 = _ensure_ok(k.run("import torch, os\nkeep = torch.ones(4, device='cuda')\nprint(os.getpid())"), "set-up")
    c1 = k.run("big = torch.empty(1 << 50, dtype=torch.uint8, device='cuda')")
    c2 = k.run("print(os.getpid(), float(keep.sum()))")
    ok = (not c1.ok and "OutOfMemory" in (c1.ename or "") and c2.ok
          and c2.stdout.split()[0] == c0.stdout.strip() and c2.stdout.split()[1] == "4.0")
    rep.add("cuda_oom_in_cell", "PASS" if ok else "FAIL", "" if ok else "%r / %r" % (c1, c2),
            ename=c1.ename, same_worker=c2.ok and c2.stdout.split()[0] == c0.stdout.strip())


def check_sticky(ctx, rep):
    """A sticky CUDA error (a device-side assert in an indexing kernel): the worker is discarded, the variables
    keep their last committed versions, the next cell runs."""
    if ctx.mode != "gpu":
        return rep.add("sticky_cuda_error", "SKIP", "needs CUDA")
    k = ctx.kernel("pool-warm")
    c0 = _ensure_ok(k.run("import torch, os\nz = torch.arange(10, device='cuda')\nprint(os.getpid())"), "set-up")
    c1 = k.run("z.add_(100)\nbad = z[torch.tensor([1000], device='cuda')]\ntorch.cuda.synchronize()")
    c2 = k.run("import os\nprint(int(z.sum()), os.getpid())")
    out = c2.stdout.split()
    # (The discarded worker says why in one line: zyg.py's _discard, after the cell's own error.)
    said = "CUDA context is broken" in c1.stderr and bool(c1.md.get("device_broken"))
    ok = not c1.ok and said and c2.ok and out[:1] == ["45"] and out[1:] != c0.stdout.split()
    rep.add("sticky_cuda_error", "PASS" if ok else "FAIL", "" if ok else "%r / %r" % (c1, c2),
            error=(c1.evalue or "")[:160], notice=c1.stderr.strip()[-300:], stays_warm=c1.md.get("stays_warm"),
            next_cell=c2.stdout.strip(), first_worker=c0.stdout.strip())


def check_sigkill(ctx, rep):
    k = ctx.kernel("pool-warm")
    _ensure_ok(k.run("import torch\nq = torch.ones(1000, device=%r)" % ctx.dev), "set-up")
    killed = []

    def kill(text):
        if text.strip() and not killed:
            killed.append(int(text.split()[0]))
            if killed[0] != k.pid():  # (never the kernel itself, had the cell run there)
                os.kill(killed[0], signal.SIGKILL)
    c1 = k.run("import os, time\nq.add_(1)\nprint(os.getpid(), flush=True)\ntime.sleep(600)", timeout=120,
               on_stdout=kill)
    c2 = k.run("print(float(q.sum()))")
    ok = bool(killed) and not c1.ok and c1.ename == "WorkerDied" and c2.ok and c2.stdout.strip() == "1000.0"
    rep.add("sigkill_mid_cell", "PASS" if ok else "FAIL", "" if ok else "%r / %r" % (c1, c2),
            ename=c1.ename, next_cell=c2.stdout.strip())


def check_cold_vs_naive(ctx, rep):
    """Cold preparation (fork + import + restore) of a worker against the naive path: a fresh python3 that
    imports torch, initialises CUDA and restores the same state in full."""
    n = ctx.state_bytes // 4 // 4
    k = ctx.kernel("pool-cold", LL_POOL_WARM_IDLE_S=0)
    _ensure_ok(k.run("import torch\nw = [torch.randn(%d, device=%r) for _ in range(4)]" % (n, ctx.dev)), "set-up")
    c = _ensure_ok(k.run("s = sum(float(t[0]) for t in w)"), "the cold cell")
    prep = c.md.get("prep_ms") or {}
    cold_ms = sum(v for v in prep.values() if isinstance(v, (int, float))) if prep else None
    path = os.path.join(ctx.work, "naive.pt")
    _plain(ctx, "import torch\ntorch.save([torch.randn(%d) for _ in range(4)], %r)" % (n, path))
    t0 = time.perf_counter()
    _plain(ctx, "import torch\n%s\nw = torch.load(%r, map_location=%r)\n%s" % (
        "torch.cuda.init()" if ctx.mode == "gpu" else "", path, ctx.dev,
        "torch.cuda.synchronize()" if ctx.mode == "gpu" else ""))
    naive_ms = (time.perf_counter() - t0) * 1e3
    os.unlink(path)
    ratio = naive_ms / cold_ms if cold_ms else None
    ok = ratio is not None and ratio >= 10
    rep.add("cold_vs_naive", "PASS" if ok else "FAIL", "" if ok else "ratio %s (target >= 10)" % ratio,
            cold_prep_ms=cold_ms, prep=prep, naive_ms=naive_ms, ratio=ratio, state_bytes=ctx.state_bytes,
            cuda=_prep(c.md))


def check_hinted(ctx, rep):
    """The visible wait (Run to the start of execution) of a GPU cell whose draft the frontend sent while the
    user edited (a complete_request), after an edit window."""
    k = ctx.kernel("pool-warm")
    _ensure_ok(k.run("import torch\nv = torch.ones(1 << 20, device=%r)" % ctx.dev), "set-up")
    _ensure_ok(k.run("note = 'a CPU cell'"), "a CPU cell")
    code = "u = v * 2\nprint(float(u.sum()))"
    waits = []
    for i in range(3):
        k.hint(code)
        time.sleep(1.5)
        c = _ensure_ok(k.run(code), "the hinted cell")
        waits.append(c.md.get("visible_wait_ms"))
        _ensure_ok(k.run("note = %d" % i), "a CPU cell")
    ok = all(w is not None and w < 1000 for w in waits)
    rep.add("hinted_visible_wait", "PASS" if ok else "FAIL", "" if ok else "waits %s ms (target < 1000)" % waits,
            visible_wait_ms=waits, median_ms=sorted(waits)[1] if all(w is not None for w in waits) else None)


TRAIN_LONG = """import torch, time
a = torch.randn(%(n)d, %(n)d, device=%(dev)r)
t0 = time.time()
while time.time() - t0 < %(secs)d:
    a = torch.tanh(a @ a / %(n)d)
    if %(gpu)s: torch.cuda.synchronize()
print('trained')"""


def check_three_kernels(ctx, rep):
    """Three kernels share the GPU: one trains for a while, the others run short cells meanwhile."""
    slots = {"LL_POOL_GPU_SLOTS": 3} if ctx.mode == "gpu" else {"LL_POOL_SLOTS": 3}
    ks = [ctx.kernel("pool-three", **slots) for _ in range(3)]
    for kk in ks:
        _ensure_ok(kk.run("import torch\nb = torch.ones(256, 256, device=%r)" % ctx.dev), "set-up")
    secs = 20 if ctx.mode == "gpu" else 6
    long_id = ks[0].send(TRAIN_LONG % {"n": 4096 if ctx.mode == "gpu" else 256, "dev": ctx.dev, "secs": secs,
                                       "gpu": ctx.mode == "gpu"})
    walls, waits, fails = [], [], []
    t0 = time.monotonic()
    while time.monotonic() - t0 < secs - 1:
        for kk in ks[1:]:
            c = kk.run("s = float((b @ b).sum())")
            if not c.ok:
                fails.append(repr(c))
            walls.append(c.wall * 1e3)
            waits.append(c.md.get("visible_wait_ms") or 0)
    long = ks[0].wait(long_id, timeout=secs + 120)
    walls.sort()
    p95 = walls[max(0, -(-len(walls) * 95 // 100) - 1)] if walls else None
    # (Here, on a CPU the training shares with everything else, latency says nothing: only that all ran.)
    ok = (long.ok and "trained" in long.stdout and not fails and p95 is not None
          and (p95 < 1000 or ctx.mode != "gpu"))
    rep.add("three_kernels", "PASS" if ok else "FAIL", "" if ok else "long %r; fails %s; p95 %s ms" % (
        long, fails[:2], p95), short_cells=len(walls), short_p50_ms=walls[len(walls) // 2] if walls else None,
        short_p95_ms=p95, max_visible_wait_ms=max(waits) if waits else None)


def _mapped(pid):
    """{file name: directory} of the shared objects process PID has mapped."""
    got = {}
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and ".so" in parts[5]:
                path = parts[5].strip()
                got[os.path.basename(path)] = os.path.realpath(os.path.dirname(path))
    return got


DEBIAN_LIBS = ("libzmq.so", "libczmq.so", "libhiredis.so", "libjansson.so", "libxxhash.so")


def check_libraries(ctx, rep):
    """What the running kernel loaded: the prefix's Debian libraries (the build's RPATH) and the chosen
    Python's libpython; and the store's redis-server, the prefix's own when it holds one."""
    k = ctx.kernel("pool-warm")
    pid = k.pid()
    if not pid:
        return rep.add("libraries_loaded", "FAIL", "no kernel pid from jupyter_client")
    maps = _mapped(pid)
    want_dir = os.path.realpath(os.path.join(ctx.deps, "usr", "lib", "x86_64-linux-gnu"))
    found = {lib: [maps[n] for n in maps if n.startswith(lib)] for lib in DEBIAN_LIBS}
    wrong = {lib: dirs for lib, dirs in found.items() if dirs != [want_dir]}
    pylib = [n for n in maps if n.startswith("libpython")]
    py_dir = os.path.realpath(ctx.env.get("libdir") or "")
    if not pylib or maps[pylib[0]] != py_dir:
        wrong["libpython"] = [(n, maps[n]) for n in pylib]
    rep.add("libraries_loaded", "FAIL" if wrong else "PASS",
            "" if not wrong else "not from %s (libpython: %s): %s" % (want_dir, py_dir, wrong),
            prefix=ctx.deps_note, libdir=want_dir, libpython=pylib[0] if pylib else None)
    server = os.path.realpath(os.path.join(ctx.deps, "usr", "bin", "redis-check-rdb"))
    if ctx.deps == "/" or not os.path.exists(server):
        return rep.add("redis_from_bundle", "SKIP", "no bundle: the system's redis-server")
    exes = {}
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and open("/proc/%s/comm" % d).read().strip() == "redis-server":
                exes[int(d)] = os.path.realpath("/proc/%s/exe" % d)
        except OSError:
            continue
    ours = [pid for pid, exe in exes.items() if exe == server]
    if not ours and not k.cells:
        return rep.add("redis_from_bundle", "SKIP", "no cell ran in this kernel: its store was never opened")
    rep.add("redis_from_bundle", "PASS" if ours else "FAIL", "" if ours else "no redis-server runs %s: %s" % (
        server, sorted(set(exes.values()))), server=server, pids=ours)


# (name, check, seconds it needs on the GPU machine, here).  The torch-only worker path comes last: with the
# kernel built, the kernel's own checks matter more when the budget runs short.
CHECKS = [("pinned", check_pinned, 20, 0),
          ("train", check_train, 40, 25), ("save_restore", check_save_restore, 90, 25),
          ("evict", check_evict, 40, 0), ("oom", check_oom, 20, 0), ("sticky", check_sticky, 20, 0),
          ("sigkill", check_sigkill, 20, 15), ("cold", check_cold_vs_naive, 40, 20),
          ("hinted", check_hinted, 20, 15), ("three", check_three_kernels, 45, 25),
          ("worker_path", check_worker_path, 30, 15)]


class Ctx:
    def __init__(self, a):
        self.mode, self.work, self.py = a.mode, a.work, sys.executable
        self.deps, self.deps_note = a.deps or "/", a.deps_note or ""
        self.deadline = a.deadline  # (epoch seconds, or None)
        now = time.monotonic()
        self.t_end = budget_end(now, a.budget, None if a.deadline is None else a.deadline - time.time())
        self.dev = "cuda" if a.mode == "gpu" else "cpu"
        self.pinned = None
        self.pools = set()
        self.kernels = {}
        self.env = json.load(open(a.env)) if a.env and os.path.exists(a.env) else {}
        # What e2e_host.py found and did for the payload pool (/dev/shm, huge pages) and the pool size it
        # chose; without it (an older e2e.sh), /dev/shm's free room as env.json saw it.
        self.host = json.load(open(a.host)) if a.host and os.path.exists(a.host) else {}
        pool_mib = self.host.get("pool_mib")
        if pool_mib is None:
            shm = self.env.get("dev_shm_free_gib")
            pool_mib = max(16, min((48 << 10) if a.mode == "gpu" else (2 << 10),
                                   int((8 if shm is None else shm) * 1024 * 0.8)))
        self.pool_mib = pool_mib
        self.sizes, self.sizes_skipped = save_sizes(a.mode, pool_mib)
        if a.mode == "gpu":
            self.per_size_s = 25
            self.state_bytes = GiB
        else:
            self.per_size_s = 10
            self.state_bytes = 64 * MiB
        os.environ["LL_STORE_POOL_BYTES"] = "%dM" % pool_mib

    def left(self):
        return self.t_end - time.monotonic()

    def kernel(self, pool, **env):
        key = (pool, tuple(sorted(env.items())))
        k = self.kernels.get(key)
        if k is None or pool == "pool-evict" or pool == "pool-three":
            k = Kernel(self, pool, **env)
            self.kernels[key if pool not in ("pool-evict", "pool-three") else (key, len(self.kernels))] = k
        return k

    def close(self):
        """Stop the kernels and their pools, each pool's wait cut so that all end before the deadline."""
        from llpool_util import stop_pool
        for k in self.kernels.values():
            k.close()
        for i, p in enumerate(sorted(self.pools)):
            wait = 30.0
            if self.deadline is not None:
                wait = max(2.0, min(wait, (self.deadline - time.time() - 5) / (len(self.pools) - i)))
            try:
                stop_pool(p, timeout=wait)
            except AssertionError as e:
                print("e2e: %s" % e, flush=True)

    def gather_logs(self, out):
        """Each pool's pool.log (its last POOL_LOG_TAIL bytes) into OUT/pool.log, under a header line."""
        parts = []
        for p in sorted(self.pools):
            path = os.path.join(p, "pool.log")
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - POOL_LOG_TAIL))
                    text = f.read()
            except OSError as e:
                text = ("(%s)\n" % (e.strerror or e)).encode()
                size = 0
            head = "==> %s (%d bytes%s) <==\n" % (path, size, ", the last %d" % POOL_LOG_TAIL
                                                  if size > POOL_LOG_TAIL else "")
            parts.append(head.encode() + text + (b"" if text.endswith(b"\n") else b"\n"))
        tmp = os.path.join(out, ".pool.log.tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(parts))
        os.replace(tmp, os.path.join(out, "pool.log"))


def _kernelspec(a):
    share = os.path.join(a.work, "share", "jupyter")
    kdir = os.path.join(share, "kernels", "looseleaf-e2e")
    os.makedirs(os.path.dirname(kdir), exist_ok=True)
    subprocess.run([a.binary, "install", "--dir", kdir, "--python", sys.executable, "--no-hints"], check=True,
                   capture_output=True, text=True)
    os.environ["JUPYTER_PATH"] = share
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", os.path.join(a.work, "runtime"))
    os.environ["IPYTHONDIR"] = os.path.join(a.work, "ipython")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--env")
    ap.add_argument("--budget", type=float, default=420)
    ap.add_argument("--status", default="ok")
    ap.add_argument("--why", default="")
    ap.add_argument("--build-s", type=float, default=0)
    ap.add_argument("--bundle")
    ap.add_argument("--deps", help="the DEPS_PREFIX the kernel was built against")
    ap.add_argument("--deps-note", help="where that prefix came from (the bundle, or the system)")
    ap.add_argument("--wheels-closure")
    ap.add_argument("--binary")
    ap.add_argument("--pyext")
    ap.add_argument("--checks", help="a comma list of check names (default: all)")
    ap.add_argument("--host", help="e2e_host.py's host.json: /dev/shm, huge pages, the pool's size")
    ap.add_argument("--deadline", type=float, help="epoch seconds by which the whole run must be over")
    a = ap.parse_args()
    ctx = Ctx(a)
    manifest = {}
    if a.bundle and os.path.exists(os.path.join(a.bundle, "MANIFEST.json")):
        manifest = json.load(open(os.path.join(a.bundle, "MANIFEST.json")))
    rep = Report(a.out, {"mode": a.mode, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "env": ctx.env,
                         "status": a.status, "why": a.why, "build_s": a.build_s, "prefix": a.deps_note,
                         "bundle_bytes": manifest.get("bytes"), "budget_s": a.budget,
                         "checks_s": round(ctx.left(), 1), "host": ctx.host})
    if manifest:
        rep.add("bundle", "PASS" if manifest["bytes"] <= manifest["limit_mb"] * MiB else "FAIL",
                bytes=manifest["bytes"], limit_mb=manifest["limit_mb"], wheels=len(manifest["wheels"]),
                debian_packages=len(manifest["debian_packages"]))
    else:
        rep.add("bundle", "SKIP" if a.mode == "cpu" else "FAIL", "no bundle (make gpu-bundle); prefix: %s"
                % a.deps_note)
    if a.wheels_closure:
        rep.add("bundle_wheels_cp312", "PASS" if a.wheels_closure == "ok" else "FAIL",
                "" if a.wheels_closure == "ok" else a.wheels_closure)
    env = ctx.env
    rep.add("python_for_embedding", "PASS" if env.get("has_python_h") and env.get("libpython_shared") else "FAIL",
            "" if env.get("has_python_h") and env.get("libpython_shared") else
            "Python.h: %s, shared libpython: %s (static: %s)" % (env.get("has_python_h"),
                                                                env.get("libpython_shared"),
                                                                env.get("libpython_static")),
            include=env.get("include"), libpython=env.get("libpython_shared"))
    rep.add("build", "PASS" if a.status == "ok" else "FAIL", a.why, seconds=a.build_s)
    try:
        if a.status != "ok":
            check_worker_path(ctx, rep)  # what runs with torch alone
            check_pinned(ctx, rep)
            return 1
        if a.pyext:
            sys.path.insert(0, a.pyext)
        _kernelspec(a)
        t0 = time.perf_counter()
        k = ctx.kernel("pool-warm")
        rep.add("kernel_start", "PASS", start_s=k.start_s, first_s=time.perf_counter() - t0)
        try:
            check_pool_pages(ctx, rep)
        except Exception as e:  # noqa: BLE001
            rep.add("pool_pages", "FAIL", "%s: %s" % (type(e).__name__, str(e)[:800]))
        only = set(a.checks.split(",")) if a.checks else None
        for name, fn, need_gpu, need_cpu in CHECKS:
            gpu_only = need_cpu == 0  # (here they only say why they skip)
            if only is not None and name not in only and not (gpu_only and ctx.mode == "cpu"):
                rep.add(name, "SKIP", "not among --checks %s" % a.checks)
                continue
            need = need_gpu if ctx.mode == "gpu" else need_cpu
            if ctx.left() < need:
                rep.add(name, "SKIP", "out of time budget (%.0f s left, needs ~%d)" % (ctx.left(), need))
                continue
            try:
                fn(ctx, rep)
            except Exception as e:  # noqa: BLE001 - one check's failure must not stop the others
                rep.add(name, "FAIL", "%s: %s" % (type(e).__name__, str(e)[:800]))
            ctx.gather_logs(a.out)
        try:
            check_libraries(ctx, rep)
        except Exception as e:  # noqa: BLE001
            rep.add("libraries_loaded", "FAIL", "%s: %s" % (type(e).__name__, str(e)[:800]))
    finally:
        ctx.close()
        ctx.gather_logs(a.out)
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
