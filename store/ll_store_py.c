/* _llstore: the CPython extension module over ll_store (API in store/API.md).
 * Built twice from this file: as build/py/_llstore*.so for tests run by
 * /usr/bin/python3 (LL_STORE_PY_STANDALONE), and into build/looseleaf, where
 * the interpreter registers ll_store_pyinit as the builtin "_llstore".
 * Runs in whatever process imports it; every call that copies, hashes or
 * talks to Redis releases the GIL (ll_store serializes calls itself).
 *
 * Objects whose memory C code reads with the GIL released (names, blobs,
 * refs) are kept referenced in a list for the duration of the call, so
 * another thread mutating the caller's dict cannot free them under us.
 * A mapped payload is a small exporter object (_Mapping) wrapped in a
 * memoryview: the mapping and its leases live exactly as long as some
 * buffer view of it does. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "base/ll_log.h"
#include "store/ll_history.h"
#include "store/ll_redis.h"
#include "store/ll_redis_server.h"
#include "store/ll_store.h"

static PyObject *s_StoreError;
static PyObject *s_StoreUnavailable;
static PyObject *s_PoolFullError;
static PyObject *s_StoreQuotaExceeded;
static PyObject *s_ConflictError;
static PyObject *s_PayloadGoneError;
static PyObject *s_PayloadRef; /* class PayloadRef(str) */

static PyObject *s_exc_for(int kind)
{
    switch (kind) {
    case LL_STORE_EFULL: return s_PoolFullError;
    case LL_STORE_EQUOTA: return s_StoreQuotaExceeded;
    case LL_STORE_ECONFLICT: return s_ConflictError;
    case LL_STORE_EGONE: return s_PayloadGoneError;
    case LL_STORE_EINVAL: return PyExc_ValueError;
    case LL_STORE_EUNAVAIL: return s_StoreUnavailable;
    case LL_STORE_EINTR: return PyExc_KeyboardInterrupt;
    default: return s_StoreError;
    }
}

/* ---- _Mapping: exporter of a mapped payload --------------------------- */

typedef struct {
    PyObject_HEAD ll_pool_map_t *map; /* owned; unmapped at dealloc */
    int readonly;                     /* 0 for a private copy-on-write mapping */
} MappingObject;

static void Mapping_dealloc(MappingObject *self)
{
    ll_pool_unmap(&self->map);
    Py_TYPE(self)->tp_free((PyObject *) self);
}

static int Mapping_getbuffer(MappingObject *self, Py_buffer *view, int flags)
{
    if (!self->map) {
        PyErr_SetString(PyExc_BufferError, "payload mapping is gone");
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *) self, ll_pool_map_addr(self->map),
                             (Py_ssize_t) ll_pool_map_len(self->map), self->readonly, flags);
}

static PyBufferProcs s_mapping_buffer = {
    .bf_getbuffer = (getbufferproc) Mapping_getbuffer,
};

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_llstore._Mapping",
    .tp_basicsize = sizeof(MappingObject),
    .tp_dealloc = (destructor) Mapping_dealloc,
    .tp_as_buffer = &s_mapping_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A payload mapped from the pool (exported through memoryview).",
};

/* ---- Store --------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD ll_store_t *st; /* NULL once closed */
    int busy;                     /* calls running without the GIL (changed only under it) */
    int writers;                  /* PayloadWriters not yet finished or aborted */
} StoreObject;

/* Run EXPR without the GIL, counted so close() cannot free the store under
 * another thread's call. */
#define S_NOGIL(self, expr)                         \
    do {                                            \
        (self)->busy++;                             \
        PyThreadState *s_ts_ = PyEval_SaveThread(); \
        expr;                                       \
        PyEval_RestoreThread(s_ts_);                \
        (self)->busy--;                             \
    } while (0)

static int s_check_open(StoreObject *self)
{
    if (!self->st) {
        PyErr_SetString(s_StoreError, "store is closed");
        return -1;
    }
    return 0;
}

static PyObject *s_raise(StoreObject *self)
{
    /* Interrupted by a signal handler that raised (s_signals): its
     * exception (KeyboardInterrupt) is the one to see. */
    if (ll_store_errkind(self->st) == LL_STORE_EINTR && PyErr_Occurred())
        return NULL;
    PyErr_SetString(s_exc_for(ll_store_errkind(self->st)), ll_store_errstr(self->st));
    return NULL;
}

/* The store's cancel check: run Python's signal handlers (on the main
 * thread; elsewhere this does nothing), so Ctrl-C ends a call that waits for
 * a silent Redis.  Called without the GIL, from inside a store call that
 * released it; a handler that raised leaves its exception set for
 * s_raise. */
static bool s_signals(void *ctx)
{
    (void) ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    bool raised = PyErr_Occurred() || PyErr_CheckSignals() < 0;
    PyGILState_Release(g);
    return raised;
}

/* reserve_bytes as Python says it (None: default policy, 0: none, N bytes)
 * to ll_store_opts_t's encoding. */
static int s_reserve_arg(PyObject *o, long long *out)
{
    if (o == Py_None) {
        *out = LL_STORE_RESERVE_DEFAULT;
        return 0;
    }
    long long n = PyLong_AsLongLong(o);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve_bytes must be None or >= 0");
        return -1;
    }
    *out = n == 0 ? -1 : n;
    return 0;
}

static int Store_init(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"runtime_dir", "session_id",    "redis_url", "pool_bytes",
                             "pool_path",   "reserve_bytes", NULL};
    const char *rd, *session, *url = NULL, *pool_path = NULL;
    PyObject *pool_bytes_o = Py_None, *reserve_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|zOzO:Store", kwlist, &rd, &session, &url,
                                     &pool_bytes_o, &pool_path, &reserve_o))
        return -1;
    long long reserve;
    if (s_reserve_arg(reserve_o, &reserve) != 0)
        return -1;
    size_t pool_bytes = 0;
    if (pool_bytes_o != Py_None) {
        pool_bytes = PyLong_AsSize_t(pool_bytes_o);
        if (pool_bytes == (size_t) -1 && PyErr_Occurred())
            return -1;
        if (pool_bytes < LL_POOL_REGION_BYTES) {
            PyErr_Format(PyExc_ValueError, "pool_bytes must be at least %zu",
                         (size_t) LL_POOL_REGION_BYTES);
            return -1;
        }
    }
    if (self->st) {
        PyErr_SetString(s_StoreError, "Store is already open");
        return -1;
    }
    ll_store_opts_t opts = {.redis_url = url,
                            .pool_bytes = pool_bytes,
                            .pool_path = pool_path,
                            .reserve_bytes = reserve};
    char err[512] = "";
    ll_store_t *st;
    Py_BEGIN_ALLOW_THREADS st = ll_store_open(rd, session, &opts, err, sizeof err);
    Py_END_ALLOW_THREADS if (!st)
    {
        PyErr_SetString(s_StoreError, err);
        return -1;
    }
    self->st = st;
    ll_store_set_cancel(st, -1, false, s_signals, NULL);
    return 0;
}

static void Store_dealloc(StoreObject *self)
{
    if (self->st) {
        Py_BEGIN_ALLOW_THREADS ll_store_destroy(&self->st);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *) self);
}

static PyObject *s_make_ref(const char *ref, size_t nbytes, size_t written)
{
    PyObject *r = PyObject_CallFunction(s_PayloadRef, "s", ref);
    if (!r)
        return NULL;
    PyObject *nb = PyLong_FromSize_t(nbytes), *wr = PyLong_FromSize_t(written);
    if (!nb || !wr || PyObject_SetAttrString(r, "nbytes", nb) != 0 ||
        PyObject_SetAttrString(r, "written", wr) != 0) {
        Py_XDECREF(nb);
        Py_XDECREF(wr);
        Py_DECREF(r);
        return NULL;
    }
    Py_DECREF(nb);
    Py_DECREF(wr);
    return r;
}

/* DIRTY_O (an iterable of region indices) as a flag per region of a payload
 * of NBYTES; NULL with an exception on bad input. */
static uint8_t *s_dirty_mask(PyObject *dirty_o, size_t nbytes)
{
    size_t n = (nbytes + LL_POOL_REGION_BYTES - 1) / LL_POOL_REGION_BYTES;
    uint8_t *mask = calloc(n ? n : 1, 1);
    PyObject *it = mask ? PyObject_GetIter(dirty_o) : NULL;
    if (!mask) {
        PyErr_NoMemory();
        return NULL;
    }
    if (!it) {
        free(mask);
        return NULL;
    }
    PyObject *item;
    while ((item = PyIter_Next(it))) {
        Py_ssize_t i = PyNumber_AsSsize_t(item, PyExc_OverflowError);
        Py_DECREF(item);
        if (i == -1 && PyErr_Occurred())
            break;
        if (i < 0 || (size_t) i >= n) {
            PyErr_Format(PyExc_ValueError, "dirty region %zd is out of range (payload has %zu)", i,
                         n);
            break;
        }
        mask[i] = 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        free(mask);
        return NULL;
    }
    return mask;
}

static PyObject *Store_put_payload(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"buffer", "base", "dirty", NULL};
    PyObject *obj, *base_o = Py_None, *dirty_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:put_payload", kwlist, &obj, &base_o, &dirty_o))
        return NULL;
    if (s_check_open(self) != 0)
        return NULL;
    const char *base = NULL;
    if (base_o != Py_None) {
        if (!PyUnicode_Check(base_o))
            return PyErr_Format(PyExc_TypeError, "base must be a payload ref (str) or None");
        base = PyUnicode_AsUTF8(base_o);
        if (!base)
            return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError, "put_payload needs a C-contiguous buffer, not %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    uint8_t *dirty = NULL;
    if (dirty_o != Py_None) {
        if (!base) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "dirty needs a base");
        }
        dirty = s_dirty_mask(dirty_o, (size_t) view.len);
        if (!dirty) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    Py_INCREF(base_o); /* keeps BASE's UTF-8 alive without the GIL */
    size_t written = 0;
    char *ref;
    S_NOGIL(self, ref = ll_store_put(self->st, view.buf, (size_t) view.len, base, dirty, &written));
    size_t nbytes = (size_t) view.len;
    PyBuffer_Release(&view);
    Py_DECREF(base_o);
    free(dirty);
    if (!ref)
        return s_raise(self);
    PyObject *r = s_make_ref(ref, nbytes, written);
    free(ref);
    return r;
}

/* ---- PayloadWriter: a payload written in pieces (ll_store_writer_*) ------ */

typedef struct {
    PyObject_HEAD StoreObject *store; /* strong reference */
    ll_store_writer_t *w;             /* NULL once finished or aborted */
    size_t nbytes;                    /* the payload's length */
} WriterObject;

static void s_writer_end(WriterObject *self)
{
    if (!self->w)
        return;
    if (self->store->st)
        S_NOGIL(self->store, ll_store_writer_abort(&self->w));
    self->w = NULL;
    self->store->writers--;
}

static void Writer_dealloc(WriterObject *self)
{
    s_writer_end(self);
    Py_XDECREF(self->store);
    Py_TYPE(self)->tp_free((PyObject *) self);
}

static int s_writer_open(WriterObject *self)
{
    if (!self->w) {
        PyErr_SetString(PyExc_ValueError, "this payload writer is finished");
        return -1;
    }
    return s_check_open(self->store);
}

static PyObject *Writer_needed(WriterObject *self, void *unused)
{
    if (s_writer_open(self) != 0)
        return NULL;
    size_t n = ll_store_writer_needed(self->w, NULL);
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx)
        return PyErr_NoMemory();
    ll_store_writer_needed(self->w, idx);
    PyObject *list = PyList_New((Py_ssize_t) n);
    for (size_t k = 0; list && k < n; k++) {
        PyObject *v = PyLong_FromSize_t(idx[k]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t) k, v);
    }
    free(idx);
    return list;
}

static PyObject *Writer_write(WriterObject *self, PyObject *args)
{
    PyObject *regions_o, *buf_o;
    if (!PyArg_ParseTuple(args, "OO:write", &regions_o, &buf_o) || s_writer_open(self) != 0)
        return NULL;
    PyObject *seq = PySequence_Fast(regions_o, "regions must be a sequence of region indices");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    size_t *idx = malloc((n ? (size_t) n : 1) * sizeof *idx);
    if (!idx) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, k), PyExc_OverflowError);
        if (i < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "region %zd is out of range", i);
            free(idx);
            Py_DECREF(seq);
            return NULL;
        }
        idx[k] = (size_t) i;
    }
    Py_DECREF(seq);
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_C_CONTIGUOUS) != 0) {
        free(idx);
        return NULL;
    }
    int rc;
    S_NOGIL(self->store,
            rc = ll_store_writer_write(self->w, idx, (size_t) n, view.buf, (size_t) view.len));
    PyBuffer_Release(&view);
    free(idx);
    if (rc != 0)
        return s_raise(self->store);
    Py_RETURN_NONE;
}

static PyObject *Writer_finish(WriterObject *self, PyObject *unused)
{
    if (s_writer_open(self) != 0)
        return NULL;
    size_t written = 0;
    char *ref;
    S_NOGIL(self->store, ref = ll_store_writer_finish(&self->w, &written));
    self->w = NULL;
    self->store->writers--;
    if (!ref)
        return s_raise(self->store);
    PyObject *r = s_make_ref(ref, self->nbytes, written);
    free(ref);
    return r;
}

static PyObject *Writer_abort(WriterObject *self, PyObject *unused)
{
    s_writer_end(self);
    Py_RETURN_NONE;
}

static PyMethodDef Writer_methods[] = {
    {"write", (PyCFunction) Writer_write, METH_VARARGS,
     "write(regions, buffer): copy regions[k] of the payload from buffer[k * REGION_BYTES:]"},
    {"finish", (PyCFunction) Writer_finish, METH_NOARGS,
     "finish() -> PayloadRef, once every needed region was written"},
    {"abort", (PyCFunction) Writer_abort, METH_NOARGS,
     "abort(): give back everything (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Writer_getset[] = {
    {"needed", (getter) Writer_needed, NULL,
     "the region indices still to write (the dirty ones, and any the base lost)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_llstore.PayloadWriter",
    .tp_basicsize = sizeof(WriterObject),
    .tp_dealloc = (destructor) Writer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A payload written in pieces: Store.payload_writer(nbytes, base=None, dirty=None).",
    .tp_methods = Writer_methods,
    .tp_getset = Writer_getset,
};

static PyObject *Store_payload_writer(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"nbytes", "base", "dirty", NULL};
    Py_ssize_t nbytes;
    PyObject *base_o = Py_None, *dirty_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n|OO:payload_writer", kwlist, &nbytes, &base_o,
                                     &dirty_o))
        return NULL;
    if (s_check_open(self) != 0)
        return NULL;
    if (nbytes < 0)
        return PyErr_Format(PyExc_ValueError, "nbytes must be >= 0");
    const char *base = NULL;
    if (base_o != Py_None) {
        if (!PyUnicode_Check(base_o))
            return PyErr_Format(PyExc_TypeError, "base must be a payload ref (str) or None");
        if (!(base = PyUnicode_AsUTF8(base_o)))
            return NULL;
    }
    uint8_t *dirty = NULL;
    if (dirty_o != Py_None) {
        if (!base)
            return PyErr_Format(PyExc_ValueError, "dirty needs a base");
        if (!(dirty = s_dirty_mask(dirty_o, (size_t) nbytes)))
            return NULL;
    }
    WriterObject *wo = PyObject_New(WriterObject, &WriterType);
    if (!wo) {
        free(dirty);
        return NULL;
    }
    wo->store = NULL;
    wo->w = NULL;
    wo->nbytes = (size_t) nbytes;
    Py_INCREF(base_o);
    ll_store_writer_t *w;
    S_NOGIL(self, w = ll_store_writer_begin(self->st, (size_t) nbytes, base, dirty));
    Py_DECREF(base_o);
    free(dirty);
    if (!w) {
        Py_DECREF(wo);
        return s_raise(self);
    }
    Py_INCREF(self);
    wo->store = self;
    wo->w = w;
    self->writers++;
    return (PyObject *) wo;
}

static PyObject *Store_map_payload(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ref", "writable", NULL};
    PyObject *ref_o;
    int writable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "U|p:map_payload", kwlist, &ref_o, &writable))
        return NULL;
    if (s_check_open(self) != 0)
        return NULL;
    const char *ref = PyUnicode_AsUTF8(ref_o);
    if (!ref)
        return NULL;
    Py_INCREF(ref_o);
    ll_pool_map_t *map;
    S_NOGIL(self, map = ll_store_map(self->st, ref, writable != 0));
    Py_DECREF(ref_o);
    if (!map)
        return s_raise(self);
    MappingObject *m = PyObject_New(MappingObject, &MappingType);
    if (!m) {
        ll_pool_unmap(&map);
        return NULL;
    }
    m->map = map;
    m->readonly = !writable;
    PyObject *mv = PyMemoryView_FromObject((PyObject *) m);
    Py_DECREF(m); /* the memoryview holds it now */
    return mv;
}

/* Append O to KEEP and return its UTF-8 (NULL with an exception). */
static const char *s_utf8_kept(PyObject *keep, PyObject *o, const char *what)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    if (PyList_Append(keep, o) != 0)
        return NULL;
    return PyUnicode_AsUTF8(o);
}

/* A list of str as a malloc'd array of UTF-8 pointers (kept alive by KEEP). */
static const char **s_str_array(PyObject *keep, PyObject *seq_o, size_t *n, const char *what)
{
    PyObject *seq = PySequence_Fast(seq_o, "expected a list of str");
    if (!seq)
        return NULL;
    if (PyList_Append(keep, seq) != 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_DECREF(seq);
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    const char **arr = malloc(((size_t) len + 1) * sizeof *arr);
    if (!arr) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        arr[i] = s_utf8_kept(keep, PySequence_Fast_GET_ITEM(seq, i), what);
        if (!arr[i]) {
            free(arr);
            return NULL;
        }
    }
    *n = (size_t) len;
    return arr;
}

static PyObject *Store_commit(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"cell_id", "writes", "deletes", "base_versions", NULL};
    PyObject *cell_o, *writes_o, *deletes_o = NULL, *bases_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!|OO:commit", kwlist, &cell_o, &PyDict_Type,
                                     &writes_o, &deletes_o, &bases_o))
        return NULL;
    if (s_check_open(self) != 0)
        return NULL;
    PyObject *keep = PyList_New(0), *result = NULL;
    Py_ssize_t nw = PyDict_Size(writes_o);
    ll_store_write_t *w = calloc((size_t) nw + 1, sizeof *w);
    Py_buffer *blobs = calloc((size_t) nw + 1, sizeof *blobs);
    Py_ssize_t nblobs = 0;
    const char **deletes = NULL;
    size_t nd = 0, nb = 0;
    ll_store_base_t *bases = NULL;
    if (!keep || !w || !blobs) {
        PyErr_NoMemory();
        goto out;
    }
    PyObject *cell_s = cell_o == Py_None ? NULL : PyObject_Str(cell_o);
    if (cell_o != Py_None && !cell_s)
        goto out;
    const char *cell = "";
    if (cell_s) {
        int bad = PyList_Append(keep, cell_s);
        Py_DECREF(cell_s);
        if (bad || !(cell = PyUnicode_AsUTF8(cell_s)))
            goto out;
    }
    PyObject *key, *val;
    Py_ssize_t pos = 0, i = 0;
    while (PyDict_Next(writes_o, &pos, &key, &val)) {
        if (!(w[i].name = s_utf8_kept(keep, key, "variable name")))
            goto out;
        PyObject *blob_o, *prefs_o, *refs_o;
        if (!PyTuple_Check(val) || PyTuple_GET_SIZE(val) != 3) {
            PyErr_Format(PyExc_TypeError, "writes['%s'] must be a tuple (blob, payload_refs, refs)",
                         w[i].name);
            goto out;
        }
        blob_o = PyTuple_GET_ITEM(val, 0);
        prefs_o = PyTuple_GET_ITEM(val, 1);
        refs_o = PyTuple_GET_ITEM(val, 2);
        if (PyObject_GetBuffer(blob_o, &blobs[nblobs], PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "writes['%s']: the blob must be bytes-like", w[i].name);
            goto out;
        }
        w[i].blob = blobs[nblobs].buf;
        w[i].bloblen = (size_t) blobs[nblobs].len;
        nblobs++;
        if (!(w[i].prefs = s_str_array(keep, prefs_o, &w[i].nprefs, "a payload ref")) ||
            !(w[i].refs = s_str_array(keep, refs_o, &w[i].nrefs, "a ref")))
            goto out;
        i++;
    }
    if (deletes_o && deletes_o != Py_None &&
        !(deletes = s_str_array(keep, deletes_o, &nd, "a name to delete")))
        goto out;
    if (bases_o != Py_None) {
        if (!PyDict_Check(bases_o)) {
            PyErr_SetString(PyExc_TypeError,
                            "base_versions must be a dict {name: version or None}");
            goto out;
        }
        bases = calloc((size_t) PyDict_Size(bases_o) + 1, sizeof *bases);
        if (!bases) {
            PyErr_NoMemory();
            goto out;
        }
        pos = 0;
        while (PyDict_Next(bases_o, &pos, &key, &val)) {
            if (!(bases[nb].name = s_utf8_kept(keep, key, "variable name")))
                goto out;
            if (val == Py_None) {
                bases[nb].version = 0;
            } else {
                unsigned long long v = PyLong_AsUnsignedLongLong(val);
                if (PyErr_Occurred())
                    goto out;
                bases[nb].version = v;
            }
            nb++;
        }
    }
    uint64_t version = 0;
    int rc;
    S_NOGIL(self,
            rc = ll_store_commit(self->st, cell, w, (size_t) nw, deletes, nd, bases, nb, &version));
    if (rc != 0) {
        s_raise(self);
        goto out;
    }
    result = PyDict_New();
    if (!result)
        goto out;
    for (Py_ssize_t k = 0; k < nw; k++) {
        PyObject *v = PyLong_FromUnsignedLongLong(version);
        if (!v || PyDict_SetItemString(result, w[k].name, v) != 0) {
            Py_XDECREF(v);
            Py_CLEAR(result);
            goto out;
        }
        Py_DECREF(v);
    }
out:
    for (Py_ssize_t k = 0; k < nblobs; k++)
        PyBuffer_Release(&blobs[k]);
    if (w)
        for (Py_ssize_t k = 0; k < nw; k++) {
            free((void *) w[k].prefs);
            free((void *) w[k].refs);
        }
    free(w);
    free(blobs);
    free(deletes);
    free(bases);
    Py_XDECREF(keep);
    return result;
}

static PyObject *s_list_of_str(char **items, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t) n);
    if (!l)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_FromString(items[i]);
        if (!s) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t) i, s);
    }
    return l;
}

static PyObject *Store_fetch(StoreObject *self, PyObject *names_o)
{
    if (s_check_open(self) != 0)
        return NULL;
    if (PyUnicode_Check(names_o))
        return PyErr_Format(PyExc_TypeError, "fetch takes a list of names, not one str");
    PyObject *keep = PyList_New(0), *result = NULL;
    if (!keep)
        return NULL;
    size_t n = 0, ne = 0;
    const char **names = s_str_array(keep, names_o, &n, "a variable name");
    ll_store_entry_t *e = NULL;
    if (!names)
        goto out;
    int rc;
    S_NOGIL(self, rc = ll_store_fetch(self->st, names, n, &e, &ne));
    if (rc != 0) {
        s_raise(self);
        goto out;
    }
    result = PyDict_New();
    for (size_t i = 0; result && i < ne; i++) {
        PyObject *prefs = s_list_of_str(e[i].prefs, e[i].nprefs);
        PyObject *refs = s_list_of_str(e[i].refs, e[i].nrefs);
        PyObject *t = prefs && refs
                          ? Py_BuildValue("(Ky#OO)", (unsigned long long) e[i].version, e[i].blob,
                                          (Py_ssize_t) e[i].bloblen, prefs, refs)
                          : NULL;
        Py_XDECREF(prefs);
        Py_XDECREF(refs);
        if (!t || PyDict_SetItemString(result, e[i].name, t) != 0) {
            Py_XDECREF(t);
            Py_CLEAR(result);
            break;
        }
        Py_DECREF(t);
    }
out:
    ll_store_entries_free(e, ne);
    free(names);
    Py_DECREF(keep);
    return result;
}

/* history_op(op, name=None, num=0) -> (text, entry or None): ll_history_op
 * (the operations and their text: ll_history.h; looseleaf_store.history
 * reads them). */
static PyObject *Store_history_op(StoreObject *self, PyObject *args)
{
    const char *op, *name = NULL;
    unsigned long long num = 0;
    if (s_check_open(self) != 0 || !PyArg_ParseTuple(args, "s|zK", &op, &name, &num))
        return NULL;
    char *text = NULL;
    ll_store_entry_t *e = NULL;
    int rc;
    S_NOGIL(self, rc = ll_history_op(self->st, op, name, num, &text, &e));
    if (rc != 0)
        return s_raise(self);
    PyObject *prefs = e ? s_list_of_str(e->prefs, e->nprefs) : NULL;
    PyObject *refs = e ? s_list_of_str(e->refs, e->nrefs) : NULL;
    PyObject *r = !e ? Py_BuildValue("(sO)", text, Py_None)
                  : prefs && refs
                      ? Py_BuildValue("(s(Ky#OO))", text, (unsigned long long) e->version, e->blob,
                                      (Py_ssize_t) e->bloblen, prefs, refs)
                      : NULL;
    Py_XDECREF(prefs);
    Py_XDECREF(refs);
    ll_store_entries_free(e, e ? 1 : 0);
    free(text);
    return r;
}

static PyObject *Store_versions(StoreObject *self, PyObject *unused)
{
    if (s_check_open(self) != 0)
        return NULL;
    char **names;
    uint64_t *vers;
    size_t n;
    int rc;
    S_NOGIL(self, rc = ll_store_versions(self->st, &names, &vers, &n));
    if (rc != 0)
        return s_raise(self);
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(vers[i]);
        if (!v || PyDict_SetItemString(d, names[i], v) != 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    free(vers);
    return d;
}

static PyObject *Store_last_commit(StoreObject *self, PyObject *unused)
{
    if (s_check_open(self) != 0)
        return NULL;
    uint64_t v;
    char *cell;
    int rc;
    S_NOGIL(self, rc = ll_store_last_commit(self->st, &v, &cell));
    if (rc != 0)
        return s_raise(self);
    PyObject *r = cell ? Py_BuildValue("(Ks)", (unsigned long long) v, cell)
                       : Py_BuildValue("(KO)", (unsigned long long) v, Py_None);
    free(cell);
    return r;
}

static PyObject *Store_discard(StoreObject *self, PyObject *ref_o)
{
    if (s_check_open(self) != 0)
        return NULL;
    if (!PyUnicode_Check(ref_o))
        return PyErr_Format(PyExc_TypeError, "discard takes a payload ref (str)");
    const char *ref = PyUnicode_AsUTF8(ref_o);
    if (!ref)
        return NULL;
    if (ll_store_discard(self->st, ref) != 0)
        return s_raise(self);
    Py_RETURN_NONE;
}

static PyObject *Store_gc(StoreObject *self, PyObject *unused)
{
    if (s_check_open(self) != 0)
        return NULL;
    int n;
    S_NOGIL(self, n = ll_store_gc(self->st));
    if (n < 0)
        return s_raise(self);
    return PyLong_FromLong(n);
}

static PyObject *Store_prefault(StoreObject *self, PyObject *arg)
{
    if (s_check_open(self) != 0)
        return NULL;
    size_t nbytes = PyLong_AsSize_t(arg);
    if (nbytes == (size_t) -1 && PyErr_Occurred())
        return NULL;
    long long n;
    S_NOGIL(self, n = ll_store_prefault(self->st, nbytes));
    if (n < 0)
        return s_raise(self);
    return PyLong_FromLongLong(n);
}

static PyObject *Store_set_reserve(StoreObject *self, PyObject *arg)
{
    if (s_check_open(self) != 0)
        return NULL;
    long long n;
    if (s_reserve_arg(arg, &n) != 0)
        return NULL;
    int rc;
    S_NOGIL(self, rc = ll_store_set_reserve(self->st, n));
    if (rc != 0)
        return s_raise(self);
    Py_RETURN_NONE;
}

static PyObject *Store_set_interrupt_fd(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"fd", "drain", NULL};
    int fd, drain = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|p:set_interrupt_fd", kwlist, &fd, &drain))
        return NULL;
    if (s_check_open(self) != 0)
        return NULL;
    ll_store_set_cancel(self->st, fd, drain != 0, s_signals, NULL);
    Py_RETURN_NONE;
}

static PyObject *Store_delete_session(StoreObject *self, PyObject *unused)
{
    if (s_check_open(self) != 0)
        return NULL;
    int rc;
    S_NOGIL(self, rc = ll_store_delete_session(self->st));
    if (rc != 0)
        return s_raise(self);
    Py_RETURN_NONE;
}

static PyObject *Store_close(StoreObject *self, PyObject *unused)
{
    if (self->writers) {
        PyErr_SetString(s_StoreError, "a payload writer of this store is still open: finish or "
                                      "abort it first");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(s_StoreError,
                        "store is in use by another thread; close it after that call");
        return NULL;
    }
    if (self->st) {
        Py_BEGIN_ALLOW_THREADS ll_store_destroy(&self->st);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Store_enter(StoreObject *self, PyObject *unused)
{
    Py_INCREF(self);
    return (PyObject *) self;
}

static PyObject *Store_exit(StoreObject *self, PyObject *args)
{
    return Store_close(self, NULL);
}

static PyObject *Store_stats(StoreObject *self, PyObject *unused)
{
    if (s_check_open(self) != 0)
        return NULL;
    ll_store_stats_t s;
    ll_store_stats(self->st, &s);
    return Py_BuildValue(
        "{s:s,s:s,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:K,s:K,s:K,s:K,s:K,s:K,s:k,s:n,s:s,s:O}",
        "page_kind", s.pool.page_kind, "pool_path", s.pool.path, "pool_bytes",
        (Py_ssize_t) s.pool.pool_bytes, "region_bytes", (Py_ssize_t) LL_POOL_REGION_BYTES,
        "regions_total", (Py_ssize_t) s.pool.regions_total, "regions_used",
        (Py_ssize_t) s.pool.regions_used, "regions_backed", (Py_ssize_t) s.pool.regions_backed,
        "regions_leased", (Py_ssize_t) s.pool.regions_leased, "regions_prefaulted",
        (Py_ssize_t) s.pool.regions_prefaulted, "reserve_bytes",
        (Py_ssize_t) (s.pool.reserve_target * LL_POOL_REGION_BYTES), "reserve_ready_bytes",
        (Py_ssize_t) (s.pool.reserve_ready * LL_POOL_REGION_BYTES), "bytes_written",
        (unsigned long long) s.bytes_written, "bytes_shared", (unsigned long long) s.bytes_shared,
        "puts", (unsigned long long) s.puts, "commits", (unsigned long long) s.commits, "gc_runs",
        (unsigned long long) s.gc_runs, "regions_reclaimed",
        (unsigned long long) s.regions_reclaimed, "redis_reconnects", s.redis_reconnects, "pending",
        (Py_ssize_t) s.pending, "redis_url", s.redis_url, "redis_owned",
        s.redis_owned ? Py_True : Py_False);
}

static PyMethodDef Store_methods[] = {
    {"put_payload", (PyCFunction) (void (*)(void)) Store_put_payload, METH_VARARGS | METH_KEYWORDS,
     "put_payload(buffer, base=None, dirty=None) -> PayloadRef: copy a buffer into the pool"},
    {"payload_writer", (PyCFunction) (void (*)(void)) Store_payload_writer,
     METH_VARARGS | METH_KEYWORDS,
     "payload_writer(nbytes, base=None, dirty=None) -> PayloadWriter: a payload written in "
     "pieces"},
    {"map_payload", (PyCFunction) (void (*)(void)) Store_map_payload, METH_VARARGS | METH_KEYWORDS,
     "map_payload(ref, writable=False) -> memoryview of the payload (no copy)"},
    {"commit", (PyCFunction) (void (*)(void)) Store_commit, METH_VARARGS | METH_KEYWORDS,
     "commit(cell_id, writes, deletes=(), base_versions=None) -> {name: version}"},
    {"fetch", (PyCFunction) Store_fetch, METH_O,
     "fetch(names) -> {name: (version, blob, payload_refs, refs)}"},
    {"versions", (PyCFunction) Store_versions, METH_NOARGS, "versions() -> {name: version}"},
    {"history_op", (PyCFunction) Store_history_op, METH_VARARGS,
     "history_op(op, name=None, num=0) -> (text, entry or None): kept versions (ll_history.h)"},
    {"last_commit", (PyCFunction) Store_last_commit, METH_NOARGS,
     "last_commit() -> (version, cell_id) of the newest commit"},
    {"discard", (PyCFunction) Store_discard, METH_O,
     "discard(ref): give back an uncommitted payload"},
    {"gc", (PyCFunction) Store_gc, METH_NOARGS, "gc() -> regions reclaimed"},
    {"set_reserve", (PyCFunction) Store_set_reserve, METH_O,
     "set_reserve(nbytes): keep this much free pool space prefaulted in the background "
     "(None: default policy, 0: none)"},
    {"prefault", (PyCFunction) Store_prefault, METH_O,
     "prefault(nbytes) -> bytes of free pool space backed and prefaulted ahead of a save"},
    {"set_interrupt_fd", (PyCFunction) (void (*)(void)) Store_set_interrupt_fd,
     METH_VARARGS | METH_KEYWORDS,
     "set_interrupt_fd(fd, drain=False): a call waiting for Redis ends with KeyboardInterrupt "
     "once FD is readable (-1: none; drain: emptied at the start of each call)"},
    {"delete_session", (PyCFunction) Store_delete_session, METH_NOARGS,
     "delete_session(): drop every key of the session and the pool file"},
    {"close", (PyCFunction) Store_close, METH_NOARGS, "close(): release everything (idempotent)"},
    {"stats", (PyCFunction) Store_stats, METH_NOARGS, "stats() -> dict"},
    {"__enter__", (PyCFunction) Store_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction) Store_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_llstore.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_dealloc = (destructor) Store_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Store(runtime_dir, session_id, redis_url=None, pool_bytes=None, pool_path=None, "
              "reserve_bytes=None)",
    .tp_methods = Store_methods,
    .tp_init = (initproc) Store_init,
    .tp_new = PyType_GenericNew,
};

/* ---- module functions ----------------------------------------------------- */

static PyObject *mod_start_redis(PyObject *mod, PyObject *dir_o)
{
    PyObject *bytes;
    if (!PyUnicode_FSConverter(dir_o, &bytes))
        return NULL;
    char err[512] = "";
    bool started;
    char *sock;
    Py_BEGIN_ALLOW_THREADS sock =
        ll_redis_start(PyBytes_AS_STRING(bytes), NULL, &started, err, sizeof err);
    Py_END_ALLOW_THREADS Py_DECREF(bytes);
    if (!sock) {
        PyErr_SetString(s_StoreError, err);
        return NULL;
    }
    PyObject *r = PyUnicode_DecodeFSDefault(sock);
    free(sock);
    return r;
}

static PyObject *mod_stop_redis(PyObject *mod, PyObject *dir_o)
{
    PyObject *bytes;
    if (!PyUnicode_FSConverter(dir_o, &bytes))
        return NULL;
    char err[512] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = ll_redis_stop(PyBytes_AS_STRING(bytes), err, sizeof err);
    Py_END_ALLOW_THREADS Py_DECREF(bytes);
    if (rc < 0) {
        PyErr_SetString(s_StoreError, err);
        return NULL;
    }
    return PyBool_FromLong(rc);
}

static PyObject *mod_ref_nbytes(PyObject *mod, PyObject *ref_o)
{
    if (!PyUnicode_Check(ref_o))
        return PyErr_Format(PyExc_TypeError, "ref_nbytes takes a payload ref (str)");
    const char *ref = PyUnicode_AsUTF8(ref_o);
    if (!ref)
        return NULL;
    long long n = ll_store_ref_nbytes(ref);
    if (n < 0)
        return PyErr_Format(PyExc_ValueError, "not a payload ref: %.80s", ref);
    return PyLong_FromLongLong(n);
}

static PyObject *mod_page_kind_choice(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pool_bytes", "owner", NULL};
    PyObject *pb = Py_None;
    int owner = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Op:page_kind_choice", kwlist, &pb, &owner))
        return NULL;
    size_t pool_bytes = 0;
    if (pb != Py_None) {
        pool_bytes = PyLong_AsSize_t(pb);
        if (pool_bytes == (size_t) -1 && PyErr_Occurred())
            return NULL;
    }
    char kind[16], why[768];
    if (ll_store_page_kind_choice(pool_bytes, owner != 0, kind, why, sizeof why) != 0) {
        PyErr_SetString(s_StoreError, why);
        return NULL;
    }
    return Py_BuildValue("(ss)", kind, why);
}

static PyMethodDef s_module_methods[] = {
    {"page_kind_choice", (PyCFunction) (void (*)(void)) mod_page_kind_choice,
     METH_VARARGS | METH_KEYWORDS,
     "page_kind_choice(pool_bytes=None, owner=True) -> (kind, why): the page kind a new pool "
     "would get here"},
    {"start_redis", mod_start_redis, METH_O,
     "start_redis(runtime_dir) -> socket path of the private redis-server (started if needed)"},
    {"stop_redis", mod_stop_redis, METH_O,
     "stop_redis(runtime_dir) -> bool: stop the private redis-server"},
    {"ref_nbytes", mod_ref_nbytes, METH_O, "ref_nbytes(ref) -> payload length"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef s_module = {
    PyModuleDef_HEAD_INIT,
    "_llstore",
    "LooseLeaf checkpoint store: payload pool in shared memory, metadata in Redis "
    "(see store/API.md).",
    -1,
    s_module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static const char s_py_source[] =
    "class PayloadRef(str):\n"
    "    '''A payload ref: a str, plus .nbytes (payload length) and .written\n"
    "    (bytes put_payload copied; the rest was shared with the base).'''\n"
    "    def __reduce__(self):\n"
    "        return (str, (str(self),))\n";

PyMODINIT_FUNC PyInit__llstore(void)
{
#ifdef LL_STORE_PY_STANDALONE
    ll_log_init('W');
#endif
    if (PyType_Ready(&StoreType) < 0 || PyType_Ready(&MappingType) < 0 ||
        PyType_Ready(&WriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&s_module);
    if (!m)
        return NULL;
    s_StoreError =
        PyErr_NewExceptionWithDoc("_llstore.StoreError", "A store operation failed.", NULL, NULL);
    s_PoolFullError = PyErr_NewExceptionWithDoc(
        "_llstore.PoolFullError", "The payload pool has no room.", s_StoreError, NULL);
    s_StoreQuotaExceeded = PyErr_NewExceptionWithDoc(
        "_llstore.StoreQuotaExceeded",
        "The user's payload pools would hold more than the user's cap (looseleaf hostd "
        "--store-cap, LL_STORE_USER_CAP).",
        s_PoolFullError, NULL);
    s_ConflictError = PyErr_NewExceptionWithDoc("_llstore.ConflictError",
                                                "base_versions did not match.", s_StoreError, NULL);
    s_PayloadGoneError = PyErr_NewExceptionWithDoc(
        "_llstore.PayloadGoneError", "The payload's space was reclaimed.", s_StoreError, NULL);
    s_StoreUnavailable = PyErr_NewExceptionWithDoc(
        "_llstore.StoreUnavailable",
        "Redis did not answer within the store's timeout, or cannot be reached.", s_StoreError,
        NULL);
    if (!s_StoreError || !s_PoolFullError || !s_StoreQuotaExceeded || !s_ConflictError ||
        !s_PayloadGoneError || !s_StoreUnavailable)
        goto fail;
    PyObject *d = PyModule_GetDict(m);
    PyObject *r = PyRun_String(s_py_source, Py_file_input, d, d);
    if (!r)
        goto fail;
    Py_DECREF(r);
    s_PayloadRef = PyDict_GetItemString(d, "PayloadRef");
    if (!s_PayloadRef)
        goto fail;
    Py_INCREF(s_PayloadRef);
    Py_INCREF(&StoreType);
    Py_INCREF(&MappingType);
    Py_INCREF(&WriterType);
    Py_INCREF(s_StoreError);
    Py_INCREF(s_PoolFullError);
    Py_INCREF(s_StoreQuotaExceeded);
    Py_INCREF(s_ConflictError);
    Py_INCREF(s_PayloadGoneError);
    Py_INCREF(s_StoreUnavailable);
    if (PyModule_AddObject(m, "Store", (PyObject *) &StoreType) ||
        PyModule_AddObject(m, "_Mapping", (PyObject *) &MappingType) ||
        PyModule_AddObject(m, "PayloadWriter", (PyObject *) &WriterType) ||
        PyModule_AddObject(m, "StoreError", s_StoreError) ||
        PyModule_AddObject(m, "PoolFullError", s_PoolFullError) ||
        PyModule_AddObject(m, "StoreQuotaExceeded", s_StoreQuotaExceeded) ||
        PyModule_AddObject(m, "ConflictError", s_ConflictError) ||
        PyModule_AddObject(m, "PayloadGoneError", s_PayloadGoneError) ||
        PyModule_AddObject(m, "StoreUnavailable", s_StoreUnavailable) ||
        PyModule_AddIntConstant(m, "REGION_BYTES", (long) LL_POOL_REGION_BYTES))
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}

/* For the kernel binary: ll_interp_add_builtin("_llstore", ll_store_pyinit). */
void *ll_store_pyinit(void)
{
    return PyInit__llstore();
}
