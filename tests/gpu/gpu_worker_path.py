"""The worker path of issue 5 on a real GPU, with only python3 + torch + CUDA (see run.sh for why not the binary).

Checks (each prints PASS / FAIL / SKIP and a figure):
  zygote    import torch (+numpy) with torch at 1 thread, gc.freeze(): single-threaded, no libcuda mapped, no
            /dev/nvidia* descriptor (the pre-fork checks of zygote/ll_zygote.c, done with probe.touched()).
  probe     looseleaf_zygote.probe: a plain package is CUDA-safe; one calling torch.cuda.is_available() at
            import is not (on a GPU host libcuda is then mapped too).
  fork      a worker forked from the zygote sets CUDA_VISIBLE_DEVICES to its slot, initialises CUDA after the
            fork, and gets the same matmul result as the CPU; time of CUDA init after fork.
  control   a zygote that initialised CUDA: its forked child cannot use CUDA (so zygotes must never touch it).
  pinned    a CUDA tensor copied to pinned host memory and back through looseleaf_store.devsave's staging
            pair is bit-identical, and region hashes computed on the device equal those computed on the
            CPU (the same function runs on both); GB/s both ways.
"""
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

results = []


def report(name, status, detail=""):
    results.append((name, status))
    print("%-8s %-4s %s" % (name, status, detail), flush=True)


def zygote_state():
    from looseleaf_zygote import probe
    tasks = len(os.listdir("/proc/self/task"))
    why = probe.touched()
    return tasks, why


def main():
    # As a zygote starts (zygote/ll_zygote.c): numpy 2.x's OpenBLAS starts threads at import unless told not to.
    for var in ("OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch
    torch.set_num_threads(1)
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    gc.collect()
    gc.freeze()
    tasks, why = zygote_state()
    report("zygote", "PASS" if tasks == 1 and why is None else "FAIL",
           "threads=%d cuda=%s torch=%s" % (tasks, why, torch.__version__))

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "llg_cudaish.py"), "w") as f:
            f.write("import torch\nHAVE = torch.cuda.is_available()\n")
        env = dict(os.environ)
        env["PYTHONPATH"] = tmp + os.pathsep + env.get("PYTHONPATH", "")
        verdicts = {}
        for mod in ("json", "llg_cudaish"):
            out = subprocess.run([sys.executable, "-m", "looseleaf_zygote.probe", mod], env=env,
                                 capture_output=True, text=True).stdout
            verdicts[mod] = json.loads(out)
        ok = verdicts["json"]["safe"] and not verdicts["llg_cudaish"]["safe"]
        report("probe", "PASS" if ok else "FAIL", "llg_cudaish: %s" % verdicts["llg_cudaish"]["why"])

    # Ask in a child: asking here would initialise CUDA in the zygote.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        os.write(w, str(n).encode())
        os._exit(0)
    os.close(w)
    ndev = int(os.read(r, 16) or b"0")
    os.waitpid(pid, 0)
    tasks, why = zygote_state()
    if why is not None:
        report("zygote", "FAIL", "asking a child for the device count touched CUDA here: %s" % why)
    if ndev == 0:
        report("fork", "SKIP", "no CUDA device")
        report("control", "SKIP", "no CUDA device")
        report("pinned", "SKIP", "no CUDA device")
        print("SKIP: no GPU (the checks that need none ran above)")
        return 1 if any(s == "FAIL" for _, s in results) else 0

    # fork: a worker per slot initialises CUDA after the fork.
    for slot in range(min(ndev, 2)):
        r, w = os.pipe()
        t_fork = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                os.environ["CUDA_VISIBLE_DEVICES"] = str(slot)
                t0 = time.perf_counter()
                torch.cuda.init()
                torch.cuda.set_device(0)
                init_ms = (time.perf_counter() - t0) * 1e3
                torch.manual_seed(0)
                a = torch.randn(512, 512)
                cpu = a @ a
                gpu_res = (a.cuda() @ a.cuda()).cpu()
                ok = torch.allclose(cpu, gpu_res, rtol=1e-3, atol=1e-3)
                msg = json.dumps({"ok": bool(ok), "init_ms": init_ms, "fork_ms": (t0 - t_fork) * 1e3,
                                  "name": torch.cuda.get_device_name(0), "visible": torch.cuda.device_count()})
            except Exception as e:  # noqa: BLE001
                msg = json.dumps({"ok": False, "error": repr(e)})
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        data = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
        os.waitpid(pid, 0)
        res = json.loads(data or b'{"ok": false, "error": "child died"}')
        report("fork", "PASS" if res.get("ok") and res.get("visible") == 1 else "FAIL",
               "slot %d: %s" % (slot, res))

    # pinned: device -> host -> device through the store's staging pair (looseleaf_store.devsave).
    try:
        from looseleaf_store import devsave
    except ImportError as e:
        report("pinned", "SKIP", "looseleaf_store does not import here: %s" % e)
        devsave = None
    if devsave is not None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                torch.cuda.init()
                n = 256 << 20
                src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
                host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                host.copy_(src)
                t1 = time.perf_counter()
                back = devsave.to_device(torch, host.numpy(), "cuda")
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                h_dev = devsave.region_hashes(torch, src).cpu()
                h_cpu = devsave.region_hashes(torch, host)
                ok = (bool(torch.equal(back, src)) and devsave._staging.pinned
                      and bool(torch.equal(h_dev, h_cpu)))
                msg = json.dumps({"ok": ok, "d2h_GBps": n / (t1 - t0) / 1e9, "h2d_GBps": n / (t2 - t1) / 1e9,
                                  "hashes_agree": bool(torch.equal(h_dev, h_cpu))})
            except Exception as e:  # noqa: BLE001
                msg = json.dumps({"ok": False, "error": repr(e)})
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        data = os.read(r, 65536)
        os.waitpid(pid, 0)
        res = json.loads(data or b'{"ok": false, "error": "child died"}')
        report("pinned", "PASS" if res.get("ok") else "FAIL", str(res))

    # control: a zygote that touched CUDA cannot give its children CUDA (run last: it touches CUDA here).
    torch.cuda.init()
    _, why = zygote_state()
    pid = os.fork()
    if pid == 0:
        try:
            torch.zeros(1, device="cuda")
            os._exit(0)
        except Exception:  # noqa: BLE001 - expected: "Cannot re-initialize CUDA in forked subprocess"
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    failed_child = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3
    report("control", "PASS" if failed_child and why is not None else "FAIL",
           "after cuInit the zygote check says: %s; child CUDA use failed: %s" % (why, failed_child))
    return 1 if any(s == "FAIL" for _, s in results) else 0


if __name__ == "__main__":
    sys.exit(main())
