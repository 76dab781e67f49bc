#!/bin/bash
# tests/gpu/e2e.sh [--cpu] [--budget SECONDS of checks] [--limit SECONDS in all] [--checks NAME,...]: the
# complete looseleaf kernel, built and run end to end on a GPU machine; writes report.json, report.md,
# e2e.log and pool.log under $OUT (else build/e2e/report).  tests/gpu/README.md says what it checks and how
# the device tool runs it.
#
# On the GPU machine (no Debian libraries, no network, Python 3.12 with torch in a venv): /dev/shm and huge
# pages for the payload pool (e2e_host.py setup: remounted and configured as root, else the reason in the
# report); find out what its Python offers (headers, a shared libpython) and say so in the report; unpack the
# carried bundle (.gpubundle, make gpu-bundle: Debian's libraries and headers, redis-server, the kernel's
# wheels; the system's copies of libraries it has too, matched by soname: e2e_host.py swap); build the
# kernel and the store's extension against that Python (make BUILD=build/e2e PYTHON=... DEPS_PREFIX=...);
# install the wheels into a private site dir; then tests/gpu/e2e.py starts the kernel with jupyter_client
# and runs the checks.  When the build cannot be made, the torch-only checks of gpu_worker_path.py still run,
# and the report says why the rest could not.
#
# --cpu: the same bundle and the same build path here, without a GPU (make test runs it, so it cannot rot):
# the venv's Python and packages (3.11: the bundle's cp312 wheels are only checked for completeness), small
# sizes, the GPU-only checks skipped.  Exit status: 0 when no check failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=gpu
budget=""
limit=""
checks=""
while [ $# -gt 0 ]; do
    case "$1" in
    --cpu) mode=cpu ;;
    --budget) budget=$2; shift ;;
    --limit) limit=$2; shift ;;
    --checks) checks=$2; shift ;;
    *) echo "usage: $0 [--cpu] [--budget SECONDS] [--limit SECONDS] [--checks NAME,NAME,...]" >&2; exit 2 ;;
    esac
    shift
done
# The checks' time (the build and the bundle's set-up come before it).  --limit: the whole script's time (the
# device call's timeout less a margin): the checks end early enough that e2e.py reports and stops its pools
# inside it, however long the build took.
[ -n "$budget" ] || { [ $mode = gpu ] && budget=330 || budget=120; }
t0=$(date +%s)
deadline=""
[ -n "$limit" ] && deadline=$((t0 + limit))
bundle=${LL_E2E_BUNDLE:-$repo/.gpubundle}
work=${LL_E2E_WORK:-${TMPDIR:-/tmp}/ll-e2e-$mode}
report=${OUT:-$repo/build/e2e/report}
build=build/e2e-$mode
mkdir -p "$report"
rm -rf "$work"
mkdir -p "$work/bin" "$work/site"
log=$report/e2e.log
: >"$log"
say() { echo "e2e: $*" | tee -a "$log"; }

if [ $mode = gpu ]; then
    py=${LL_E2E_PYTHON:-/opt/torch/.venv/bin/python3}
    [ -x "$py" ] || py=$(command -v python3)
else
    py=${LL_E2E_PYTHON:-$repo/.venv/bin/python}
    [ -x "$py" ] || py=/usr/bin/python3
fi
jobs=$(nproc 2>/dev/null || echo 2)
[ $mode = cpu ] && jobs=2

# 1. The payload pool's memory: /dev/shm large enough, huge pages where the host allows them (host.json);
#    then what this machine and its Python offer (env.json; both read by e2e.py for the report).
"$py" "$here/e2e_host.py" setup --mode $mode --out "$work/host.json" 2>&1 | tee -a "$log"
"$py" - "$work/env.json" <<'EOF' 2>>"$log"
import glob, json, os, platform, shutil, subprocess, sys, sysconfig
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return "(%s)" % e
cv = sysconfig.get_config_var
inc, libdir, ldver = cv("INCLUDEPY") or "", cv("LIBDIR") or "", cv("LDVERSION") or ""
shared = [p for p in glob.glob(os.path.join(libdir, "libpython%s.so*" % ldver))]
static = [p for p in glob.glob(os.path.join(libdir, "libpython%s.a" % ldver))]
env = {"python": sys.executable, "version": platform.python_version(), "include": inc,
       "has_python_h": os.path.exists(os.path.join(inc, "Python.h")), "libdir": libdir,
       "libpython_shared": shared, "libpython_static": static, "py_enable_shared": cv("Py_ENABLE_SHARED"),
       "ext_suffix": cv("EXT_SUFFIX"), "glibc": run("ldd", "--version").split("\n")[0],
       "cc": run("cc", "--version").split("\n")[0], "kernel": platform.release(),
       "cpus": os.cpu_count(), "nvidia_smi": run("nvidia-smi", "-L") if shutil.which("nvidia-smi") else None,
       "driver": run("nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader")
       if shutil.which("nvidia-smi") else None,
       "pkg_config": bool(shutil.which("pkg-config")), "dpkg": bool(shutil.which("dpkg"))}
try:
    st = os.statvfs("/dev/shm")
    env["dev_shm_free_gib"] = round(st.f_bavail * st.f_frsize / 2**30, 3)
    env["mem_gib"] = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
except (OSError, ValueError):
    pass
env["torch"] = run(sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda, "
                   "torch.cuda.is_available())")
json.dump(env, open(sys.argv[1], "w"), indent=1)
EOF
say "python: $py; $(tr -d '\n' <"$work/env.json" | head -c 600)"

# 2. The bundle: Debian's prefix (a library the system's loader has already is the system's: Python's own
#    modules load libssl, libz, ... and one process holds one of each), redis-server, the wheels.  The prefix
#    is unpacked at a fixed place (its files keep the archive's times), so the build below is incremental and
#    its RPATH stays right; the build is made anew when the prefix or the Python changes.
status=ok
why=""
deps_note=bundle
deps=$repo/$build.deps
if [ ! -f "$bundle/deps.tar.xz" ]; then
    if [ $mode = gpu ]; then
        status=no_bundle
        why="no bundle at $bundle (make gpu-bundle, and carry .gpubundle)"
    else
        # Here without a bundle (a fresh checkout; making one needs Debian's mirrors and PyPI): the same
        # DEPS_PREFIX build, with the system's root as the prefix (Debian's packages installed there).
        deps=/
        deps_note="system (no bundle at $bundle: the DEPS_PREFIX build against / instead)"
        say "no bundle at $bundle: building with DEPS_PREFIX=/ (the system's Debian libraries)"
    fi
else
    rm -rf "$deps"
    mkdir -p "$deps"
    "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$bundle/deps.tar.xz" "$deps" 2>>"$log" || { status=no_bundle; why="cannot unpack $bundle/deps.tar.xz"; }
fi
libdir=$deps/usr/lib/x86_64-linux-gnu
if [ $status = ok ] && [ $mode = gpu ]; then
    # By soname (read from each ELF file), which is what the loader looks for and ldconfig lists.
    "$py" "$here/e2e_host.py" swap "$libdir" 2>&1 | tee -a "$log"
fi
if [ "$deps" != / ] && [ -x "$deps/usr/bin/redis-check-rdb" ]; then
    # (redis-tools ships the one redis binary as redis-check-rdb; it is the server when run as redis-server,
    # as Debian's redis-server package links it)
    ln -sfn redis-check-rdb "$deps/usr/bin/redis-server"
    printf '#!/bin/bash\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
        "$libdir" "$deps/usr/bin/redis-server" >"$work/bin/redis-server"
    chmod +x "$work/bin/redis-server"
    export LL_REDIS_SERVER="$work/bin/redis-server"
fi
if [ $status = ok ] && [ "$deps" != / ]; then
    # (Here, with --cpu, the venv lacks none of them: the selection runs, nothing is installed.)
    # Only what the machine's environment lacks or has older (IPython 9 wants psutil >= 7, ...); the packages
    # torch imports too (typing_extensions, packaging) stay as they are.
    mapfile -t lacking < <("$py" - "$bundle"/wheels/*.whl <<'PYEOF'
import importlib.metadata as md, os, sys
def key(v):
    return tuple(int(p) if p.isdigit() else 0 for p in v.split(".")[:3])
for w in sys.argv[1:]:
    name, version = os.path.basename(w).split("-")[:2]
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(w)
        continue
    if name not in ("typing_extensions", "packaging") and key(have) < key(version):
        print(w)
PYEOF
)
    say "wheels from the bundle (lacking or older here): ${#lacking[@]} ${lacking[*]##*/}"
    if [ ${#lacking[@]} -eq 0 ]; then
        :
    elif "$py" -m pip --version >/dev/null 2>&1; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
            "${lacking[@]}" >>"$log" 2>&1 || { status=no_wheels; why="the wheels did not install (e2e.log)"; }
    else
        for w in "${lacking[@]}"; do "$py" -m zipfile -e "$w" "$work/site"; done
    fi
fi
if [ $status = ok ] && [ $mode = cpu ] && [ "$deps" != / ]; then
    # Here the venv holds the packages; the bundle's wheels must still make a complete set for CPython 3.12.
    "$py" -m pip install -q --dry-run --ignore-installed --no-index --find-links "$bundle/wheels" \
        --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
        --platform manylinux_2_5_x86_64 --target "$work/dry" ipython jupyter_client comm cloudpickle pyzmq \
        >>"$log" 2>&1 && echo ok >"$work/wheels_closure" || echo "incomplete (e2e.log)" >"$work/wheels_closure"
fi

# 3. The build, against this Python and this prefix.
build_s=0
if [ $status = ok ]; then
    b0=$(date +%s)
    stamp="$py $deps"
    if [ "$(cat "$repo/$build/.e2e-stamp" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "${repo:?}/$build"
        mkdir -p "$repo/$build"
        echo "$stamp" >"$repo/$build/.e2e-stamp"
    fi
    mk=make
    command -v make >/dev/null || mk=$deps/usr/bin/make # (the bundle's, where the machine has none)
    if "$mk" -C "$repo" -j"$jobs" BUILD="$build" PYTHON="$py" DEPS_PREFIX="$deps" e2e-build >>"$log" 2>&1; then
        build_s=$(($(date +%s) - b0))
        say "built in ${build_s} s: $repo/$build/looseleaf"
    else
        status=build_failed
        why="the build against $py failed: $(grep -m3 -E 'error|cannot find|No such file' "$log" | tr '\n' ' ' | head -c 400)"
        say "$why"
    fi
fi

# 4. The run.
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
args=(--mode "$mode" --out "$report" --env "$work/env.json" --budget "$budget" --status "$status" --why "$why"
      --build-s "$build_s" --bundle "$bundle" --work "$work" --deps "$deps" --deps-note "$deps_note"
      --host "$work/host.json")
[ -n "$deadline" ] && args+=(--deadline "$deadline")
[ -n "$checks" ] && args+=(--checks "$checks")
[ -f "$work/wheels_closure" ] && args+=(--wheels-closure "$(cat "$work/wheels_closure")")
if [ $status = ok ]; then
    args+=(--binary "$repo/$build/looseleaf" --pyext "$repo/$build/py")
fi
"$py" "$here/e2e.py" "${args[@]}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
say "done in $(($(date +%s) - t0)) s (exit $rc); report in $report"
exit "$rc"
