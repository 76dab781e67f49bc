"""JSON for the wire: what the hooks and ll_interp_handle carry.

Runs in the interpreter thread (and any thread that displays).  Mirrors
jupyter_client's packer: try a fast strict dump first, and only when that
fails clean the object (NaN/inf become their repr, bytes become base64,
tuples/sets/iterators become lists, datetimes ISO 8601) so that a user's odd
metadata never kills a message.  Output is ASCII-only (\\u escapes), so the
C side can hand it on as UTF-8 whatever lone surrogates the data held.
"""
import json
import math
import re
import numbers
from binascii import b2a_base64
from datetime import date, datetime, timezone

__all__ = ["dumps", "loads", "clean"]

loads = json.loads
_strict = json.JSONEncoder(allow_nan=False, separators=(", ", ": ")).encode


def _default(obj):
    if isinstance(obj, datetime):
        if obj.tzinfo is None:
            obj = obj.replace(tzinfo=timezone.utc)
        return obj.isoformat().replace("+00:00", "Z")
    if isinstance(obj, date):
        return obj.isoformat()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        # without a trailing newline, as jupyter_client 8 encodes bytes (7 added one)
        return b2a_base64(bytes(obj), newline=False).decode("ascii")
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return clean(float(obj))
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    if hasattr(obj, "__iter__"):
        return list(obj)
    raise TypeError("%r is not JSON serializable" % (obj,))


_lenient = json.JSONEncoder(allow_nan=False, separators=(", ", ": "), default=_default).encode


def clean(obj):
    """A copy of OBJ that json can encode: non-finite floats become their
    repr, unknown keys become str, containers are copied."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else repr(obj)
    if isinstance(obj, (str, int, type(None))):
        return obj
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [clean(v) for v in obj]
    try:
        return clean(_default(obj))
    except TypeError:
        return repr(obj)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_surrogates(obj):
    """OBJ with lone surrogates in its strings replaced by U+FFFD: JSON
    parsers (jansson) reject a lone \\udXXX escape.  (In a Python str every
    surrogate is lone; characters beyond the BMP are single code points.)"""
    if isinstance(obj, str):
        return _SURROGATE.sub("\ufffd", obj)
    if isinstance(obj, dict):
        return {_no_surrogates(k): _no_surrogates(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_no_surrogates(v) for v in obj]
    return obj


def _dumps(obj):
    try:
        return _strict(obj)
    except (TypeError, ValueError):
        pass
    try:
        return _lenient(obj)
    except (TypeError, ValueError):
        return _lenient(clean(obj))


def dumps(obj):
    """OBJ as JSON text; never raises for data a user could put in a message."""
    text = _dumps(obj)
    if "\\ud" in text:  # a surrogate escape: a pair (fine) or a lone one
        cleaned = _no_surrogates(obj)
        if cleaned != obj:
            text = _dumps(cleaned)
    return text
