"""Kept versions of a session's variables (time travel), over `_llstore.Store.history_op`.

Every commit of a session whose history is on (`enable`) keeps what it wrote as a version of its own, in the
same transaction, and the store's reclamation treats kept versions as readers (store/ll_history.c), so their
payloads stay in the pool until `prune` drops them: the oldest superseded versions first, until what they hold
beyond the current versions fits the budget (`budget_bytes`).  A dropped version is remembered as dropped.

    enable(store)
    versions(store, "w")          # [Version(...)] oldest first, and [(version, dropped_at)] of dropped ones
    load(cp, "w", 7)              # the value w had at version 7 (a fresh object; nothing is bound)
    prune(store, budget_bytes())  # [(version, name)] dropped
"""
import collections
import os

# Superseded versions kept at most (bytes of pool regions and blobs no current version uses): LL_HISTORY_BYTES
# (unset or "auto": the default below; "0": keep none; sizes as LL_STORE_POOL_BYTES: "2G", "512M").
_DEFAULT_SHARE = 4          # a quarter of the pool ...
_DEFAULT_MAX = 4 << 30      # ... and at most 4 GiB
_DEFAULT_VERSIONS = 1000    # superseded versions, whatever their size (LL_HISTORY_VERSIONS)

Version = collections.namedtuple("Version", "name version time nbytes current cell")


class HistoryError(Exception):
    """A version that cannot be brought back; the message says why (dropped by the budget, never existed)."""


def parse_bytes(text):
    """A size such as "512M", "2G", "1073741824" (binary units) -> int; ValueError for anything else."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = 1
    if t and t[-1] in "KMGT":
        mult = 1 << (10 * ("KMGT".index(t[-1]) + 1))
        t = t[:-1]
    if not t.isdigit():
        raise ValueError("not a size: %r (e.g. 512M, 2G)" % text)
    return int(t) * mult


def budget_bytes(store=None):
    """The session's history budget: LL_HISTORY_BYTES, unset or "auto": a quarter of the pool, at most 4 GiB;
    "0": no history.  Kept versions never cost a save its room: a save into a full pool or over the user's
    store cap drops the oldest first (store/ll_history.c, ll_history_relieve)."""
    env = os.environ.get("LL_HISTORY_BYTES", "").strip() or "auto"
    if env != "auto":
        return parse_bytes(env)
    pool = 16 << 30
    if store is not None:
        try:
            pool = int(store.stats()["pool_bytes"])
        except Exception:  # noqa: BLE001 - the default pool's size then
            pass
    return min(pool // _DEFAULT_SHARE, _DEFAULT_MAX)


def enable(store, on=True):
    store.history_op("set", None, 1 if on else 0)


def versions(store, name=None):
    """([Version] kept of NAME (None: every name), oldest first; [(version, name, dropped_at, why)] of
    dropped ones, why: "budget", "pool" (a save found the pool full) or "cap" (a save met the user's store
    cap))."""
    text, _ = store.history_op("list", name, 0)
    kept, dropped = [], []
    for line in text.splitlines():
        f = line.split("\t")
        if f[0] == "dropped" and len(f) >= 4:
            dropped.append((int(f[1]), f[2], float(f[3]), f[4] if len(f) >= 5 else "budget"))
        elif len(f) >= 6:
            kept.append(Version(f[1], int(f[0]), float(f[2]), int(f[3]), f[4] == "1", "\t".join(f[5:])))
    dropped.sort()
    return kept, dropped


def fetch(store, name, version):
    """(version, blob, payload_refs, refs) of NAME at VERSION, as Store.fetch gives entries; HistoryError
    naming why when it is not kept."""
    text, entry = store.history_op("fetch", name, int(version))
    if entry is not None:
        return entry
    if text.startswith("dropped"):
        import time
        words = text.split()
        when, why = float(words[1]), words[2] if len(words) > 2 else "budget"
        raise HistoryError("%s@%d was dropped from the history at %s %s; versions still kept: "
                           "%%looseleaf history %s"
                           % (name, version, time.strftime("%H:%M:%S", time.localtime(when)),
                              why_dropped(why, store), name))
    raise HistoryError("%s@%d is not a version of %s: see %%looseleaf history %s" % (name, version, name, name))


def why_dropped(why, store=None):
    """Why old versions were dropped, as a user reads it (WHY as versions() gives it)."""
    if why == "cap":
        return "to make room for a save at your store cap (old versions give way to new values)"
    if why == "pool":
        return "to make room for a save in the session's full pool (old versions give way to new values)"
    return "to keep it within its budget (LL_HISTORY_BYTES, now %s)" % _fmt(budget_bytes(store))


def max_versions():
    """Superseded versions kept at most (LL_HISTORY_VERSIONS, default 1000): bounds what a prune reads."""
    env = os.environ.get("LL_HISTORY_VERSIONS")
    return int(env) if env and env.isdigit() else _DEFAULT_VERSIONS


def prune(store, budget, max_kept=None):
    """Drop the oldest superseded versions until the rest fit BUDGET bytes and number at most MAX_KEPT
    (default max_versions()): [(version, name)] dropped."""
    max_kept = max_versions() if max_kept is None else max_kept
    text, _ = store.history_op("prune", str(max(0, int(max_kept))), max(0, int(budget)))
    out = []
    for line in text.splitlines():
        v, _, n = line.partition("\t")
        out.append((int(v), n))
    return out


def load(cp, name, version):
    """The value NAME had at VERSION, loaded by Checkpointer CP (payloads mapped copy-on-write); objects it
    shares with other variables are the ones those variables hold now in CP's namespace.  Nothing is bound.
    HistoryError when the version is not kept or its payloads are gone."""
    from .checkpoint import RestoreReport, _reason
    from .serial import split_blob
    entry = fetch(cp.store, name, version)
    # The variables it shares objects with (an optimizer's model) come first, at their current versions,
    # when this process does not hold them yet (a GPU cell made them).
    try:
        hard = sorted(set(split_blob(entry[1])[0].get("hard", ())) - set(cp._state))
    except Exception:  # noqa: BLE001 - then _load_one says what is wrong with it
        hard = []
    if hard:
        rep = cp.restore(hard)
        if rep.failed:
            raise HistoryError("%s@%d shares objects with %s, which could not be restored: %s" % (
                name, version, ", ".join(sorted(rep.failed)), "; ".join(sorted(rep.failed.values()))))

    def resolve(owner, kind, idx):
        st = cp._state.get(owner)
        if st is None or (kind, idx) not in st.exports:
            raise LookupError("%s@%d shares an object with %r, which the kernel does not hold now"
                              % (name, version, owner))
        return st.exports[(kind, idx)]

    rep = RestoreReport()
    try:
        value, _ = cp._load_one(name, entry, resolve, rep)
    except LookupError as e:
        raise HistoryError(str(e).strip("'\"")) from None
    except Exception as e:  # noqa: BLE001 - said, with what it was
        raise HistoryError("%s@%d could not be loaded: %s" % (name, version, _reason(e))) from None
    return value, rep


def _fmt(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%d B" % n if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1024
    return "%.1f GiB" % n
