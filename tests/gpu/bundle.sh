#!/bin/bash
# tests/gpu/bundle.sh [DIR]: the bundle tests/gpu/e2e.sh carries to the GPU machine (make gpu-bundle).
#
# That machine has Python 3.12 with torch in a venv, a C compiler, no Debian libraries and no network, and a
# working tree of at most 64 MiB travels (the device tool's README).  So the bundle holds, built here:
#   deps.tar.xz  Debian 12's packages unpacked with dpkg -x into a prefix (never over /): the -dev packages the
#                build needs (libzmq, czmq, OpenSSL, jansson, hiredis, xxhash: headers and link names), the
#                runtime libraries of build/looseleaf, its _llstore extension and redis-server (their ldd
#                closure, by package, less glibc and the C++ runtime, which the machine has newer),
#                redis-server itself (redis-tools holds the binary), and GNU make;
#   wheels/      the Python packages the kernel and its client need for CPython 3.12 (pip download
#                --python-version 3.12 --only-binary=:all:), at the versions of the project's venv: IPython
#                and its dependencies, comm, cloudpickle, pyzmq, jupyter_client and theirs;
#   MANIFEST.json what is in it, and its size, which must stay under the limit (LL_BUNDLE_LIMIT_MB, 56: the
#                repository's own files travel too).
# Needs the Debian package lists (apt-get update) and PyPI, and `make all` done (for the ldd closure).  A
# complete bundle (its MANIFEST.json newer than this script) is left as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/.gpubundle}
limit_mb=${LL_BUNDLE_LIMIT_MB:-56}
venv_py=${LL_BUNDLE_PIP_PYTHON:-$repo/.venv/bin/python}
[ -x "$venv_py" ] || venv_py=python3

if [ -f "$out/MANIFEST.json" ] && [ "$out/MANIFEST.json" -nt "$0" ] && [ -f "$out/deps.tar.xz" ]; then
    echo "bundle: $out is complete ($(du -sh "$out" | cut -f1)); rm -rf it to build it again"
    exit 0
fi

# The packages: the build's -dev ones, redis, and whatever the built binaries load.
# (make too: the GPU machine's image is not known to have it; Debian's needs only glibc)
dev_pkgs="libzmq3-dev libczmq-dev libssl-dev libjansson-dev libhiredis-dev libxxhash-dev redis-tools make"
skip_re='^(libc6|libc6-dev|libgcc-s1|libstdc\+\+6|libpython3[.0-9]*|libpython3[.0-9]*t64|libpython3[.0-9]*-stdlib)$'
owner() { # the package owning library PATH (usrmerge: dpkg may know it under /lib or /usr/lib)
    local p=$1 q
    for q in "$p" "${p#/usr}" "/usr$p"; do
        dpkg -S "$q" 2>/dev/null | head -1 | cut -d: -f1 && return 0
    done
    return 0
}
bins=("$repo/build/looseleaf" "$(readlink -f "$(command -v redis-server)")")
for so in "$repo"/build/py/_llstore*.so; do [ -f "$so" ] && bins+=("$so"); done
for b in "${bins[@]}"; do
    [ -f "$b" ] || { echo "bundle: $b is missing (make all, and Debian's redis-server: make deps)" >&2; exit 1; }
done
rt_pkgs=$(for b in "${bins[@]}"; do ldd "$b" | awk '$3 ~ /^\// {print $3}'; done | sort -u |
          while read -r lib; do owner "$(readlink -f "$lib")"; done | sort -u | grep -Ev "$skip_re" || true)
pkgs=$(echo $dev_pkgs $rt_pkgs | tr ' ' '\n' | sort -u | tr '\n' ' ')

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ll-bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debs" "$tmp/root" "$tmp/out/wheels"
echo "bundle: Debian packages: $pkgs"
(cd "$tmp/debs" && apt-get download $pkgs >/dev/null) || {
    echo "bundle: apt-get download failed (run apt-get update first)" >&2; exit 1; }
for d in "$tmp"/debs/*.deb; do dpkg -x "$d" "$tmp/root"; done
# One library directory (usrmerge packages put some under /lib), no documentation.
if [ -d "$tmp/root/lib/x86_64-linux-gnu" ]; then
    mkdir -p "$tmp/root/usr/lib/x86_64-linux-gnu"
    cp -a "$tmp/root/lib/x86_64-linux-gnu/." "$tmp/root/usr/lib/x86_64-linux-gnu/"
    rm -rf "$tmp/root/lib"
fi
rm -rf "$tmp/root/usr/share" "$tmp/root/etc" "$tmp/root/var" "$tmp/root/usr/lib/systemd"
find "$tmp/root/usr/lib/x86_64-linux-gnu" -name '*.a' -delete
# Absolute symlinks (libfoo.so -> /lib/x86_64-linux-gnu/libfoo.so.N) would point outside the prefix.
find "$tmp/root" -type l | while read -r l; do
    t=$(readlink "$l")
    case "$t" in /*) ln -sfn "$(basename "$t")" "$l" ;; esac
done
tar -C "$tmp/root" -cJf "$tmp/out/deps.tar.xz" .

# The wheels, at the venv's versions.
names="ipython ipython_pygments_lexers jedi parso prompt_toolkit wcwidth pygments stack_data asttokens executing
pure_eval pexpect ptyprocess traitlets matplotlib_inline psutil typing_extensions comm cloudpickle pyzmq tornado
jupyter_client jupyter_core platformdirs python_dateutil six tzdata packaging"
freeze=$("$venv_py" -m pip freeze 2>/dev/null | tr 'A-Z-' 'a-z_')
reqs=""
for n in $names; do
    v=$(echo "$freeze" | sed -n "s/^$n==//p" | head -1)
    reqs="$reqs ${n}${v:+==$v}"
done
echo "bundle: wheels:$reqs"
"$venv_py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
    --platform any -d "$tmp/out/wheels" $reqs

size=$(du -sb "$tmp/out" | cut -f1)
"$venv_py" - "$tmp/out" "$size" "$limit_mb" "$pkgs" <<'EOF'
import json, os, sys, time
out, size, limit, pkgs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
wheels = sorted(os.listdir(os.path.join(out, "wheels")))
json.dump({"made": time.strftime("%Y-%m-%d %H:%M:%S"), "bytes": size, "limit_mb": limit,
           "deps_tar_bytes": os.path.getsize(os.path.join(out, "deps.tar.xz")),
           "debian_packages": pkgs, "wheels": wheels}, open(os.path.join(out, "MANIFEST.json"), "w"), indent=1)
EOF
if [ "$size" -gt $((limit_mb << 20)) ]; then
    echo "bundle: $((size >> 20)) MiB is over the ${limit_mb} MiB limit" >&2
    exit 1
fi
rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$tmp/out" "$out"
echo "bundle: $out, $((size >> 10)) KiB ($(ls "$out/wheels" | wc -l) wheels, $(echo $pkgs | wc -w) Debian packages)"
