"""CUDA-safety probe: `python3 -m looseleaf_zygote.probe PACKAGE` imports PACKAGE in a throwaway process with
CUDA visible and prints one JSON line {"imported", "safe", "why"}.

Importing touched CUDA when, afterwards, the CUDA driver was initialised in the process (gpu.driver_initialized:
cuInit called, torch.cuda initialized, a /dev/nvidia* descriptor or mapping), or the import called one of
torch's CUDA probes (torch.cuda.is_available, device_count, init, ...: they call cuInit even on a host without
a GPU, so they count as touching).  The driver merely mapped does not count: a CUDA build of torch maps it at
import without calling it.  Such a package is never imported into a zygote (a CUDA context does not survive
fork); workers import it after the fork.
"""
import importlib
import json
import sys

_touched = []


def _wrap_torch_cuda(mod):
    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_name",
                 "set_device", "get_device_properties"):
        fn = getattr(mod, name, None)
        if callable(fn):
            def probe(*a, _fn=fn, _name=name, **k):
                _touched.append("torch.cuda." + _name)
                return _fn(*a, **k)
            setattr(mod, name, probe)


class _Finder:
    """Wraps torch.cuda's probes as soon as torch.cuda is imported (by the package under test)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.cuda":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig = loader.exec_module

        def exec_module(module):
            orig(module)
            _wrap_torch_cuda(module)
        loader.exec_module = exec_module
        return spec


def touched():
    """Why this process counts as having touched CUDA, or None."""
    if _touched:
        return "called " + ", ".join(sorted(set(_touched)))
    from .gpu import driver_initialized
    return driver_initialized()


def main(argv):
    if len(argv) != 2:
        print("usage: python3 -m looseleaf_zygote.probe PACKAGE", file=sys.stderr)
        return 2
    import importlib.util  # noqa: F401 (used by _Finder)
    if "torch.cuda" in sys.modules:
        _wrap_torch_cuda(sys.modules["torch.cuda"])
    else:
        sys.meta_path.insert(0, _Finder())
    out = {"module": argv[1], "imported": False, "safe": False, "why": None}
    try:
        importlib.import_module(argv[1])
        out["imported"] = True
    except BaseException as e:  # noqa: BLE001 - any failure means "not for a zygote"
        out["why"] = "import failed: %s: %s" % (type(e).__name__, e)
    if out["imported"]:
        why = touched()
        out["safe"] = why is None
        out["why"] = why
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
