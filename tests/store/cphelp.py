"""Helpers of the Checkpointer tests (tests/store/): play a notebook the way the kernel and GPU workers do.

Cells are exec'd in a namespace dict (module __main__, as in the kernel); variables are saved from it and
restored into fresh namespaces, each with a Checkpointer of its own over the real _llstore.  Runs in the
pytest process; tests/store/conftest.py puts looseleaf_store on sys.path.
"""
import builtins
import textwrap

from looseleaf_store import Checkpointer


def new_ns():
    """An empty user namespace, as the kernel's: module __main__ with the builtins."""
    return {"__name__": "__main__", "__builtins__": builtins}


def run(ns, code):
    """Run cell CODE (dedented) in namespace NS."""
    exec(compile(textwrap.dedent(code), "<cell>", "exec"), ns)


def fresh(store):
    """A new namespace and a Checkpointer over STORE for it: (ns, cp)."""
    ns = new_ns()
    return ns, Checkpointer(store, ns)


def save_ok(cp, names, **kw):
    """cp.save(NAMES, **KW), asserted to have saved every name; returns the SaveReport."""
    rep = cp.save(names, **kw)
    assert rep.error is None and not rep.failed, rep
    return rep


def restore_ok(cp, names):
    """cp.restore(NAMES), asserted to have restored every name; returns the report."""
    rep = cp.restore(names)
    assert not rep.failed and not rep.missing, rep
    return rep
