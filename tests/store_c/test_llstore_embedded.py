"""_llstore as the kernel binary has it: a builtin module registered through
ll_store_pyinit in an embedded interpreter (build/tests/store_c/embed_llstore)."""
import os
import subprocess
import sys

from llsc_helpers import ROOT

DRIVER = os.path.join(ROOT, "build", "tests", "store_c", "embed_llstore")

SCRIPT = r"""
import sys, _llstore
assert _llstore.__spec__.origin == "built-in", _llstore.__spec__
rd, session, url, pool = sys.argv[1:5]
st = _llstore.Store(rd, session, redis_url=url, pool_path=pool, pool_bytes=8 << 20)
ref = st.put_payload(b"x" * 3000000)
print(st.commit("c", {"a": (b"blob", [ref], [])}))
(v, blob, prefs, refs), = st.fetch(["a"]).values()
print(bytes(st.map_payload(prefs[0])[:3]), ref.written)
st.delete_session()
st.close()
"""


def test_builtin_module_in_embedded_interpreter(tmp_path, runtime_dir, redis_url, session,
                                                pool_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    out = subprocess.run([DRIVER, str(script), runtime_dir, session, redis_url, pool_path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["{'a': 1}", "b'xxx' 3000000"]
