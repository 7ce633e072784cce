/*
 * ringleader._native: the numpy API's blocking calls and the call-site
 * capture, in C.
 *
 * Why: at small sizes Python is most of a call. Through ctypes an 8-byte
 * all_reduce pays its argument marshalling (about 1.5 us) and the Python
 * call-site walk (about 0.8 us) around the library's 0.2-0.5 us. Here a
 * blocking all_reduce, broadcast, all_gather, reduce_scatter or barrier on
 * plain numpy arrays reads the arrays' headers, tells the library the
 * caller's line and calls the C ABI directly, releasing the GIL as ctypes
 * does. mpi4py reaches Open MPI the same way (Cython), so Python against
 * Python compares like with like.
 *
 * Where things live: the package binds this module once at import
 * (ringleader/__init__.py, `_bind_lane`; ringleader/_callsite.py for the
 * capture). Whatever the lane does not take (another type, a strided or
 * read-only array, bool, byte-swapped or unusual dtypes, a destroyed group,
 * a root that is not a plain int) it answers -1 for and the Python method
 * takes its general path, which names the problem as before; every error
 * of the library itself comes back as its code (> 0), raised by Python.
 *
 * The numpy array header is read directly (data, nd, dimensions, descr,
 * flags: numpy's PyArrayObject layout, unchanged for decades). `bind`
 * checks that layout against probe arrays whose fields Python worked out
 * through numpy's own interface, and the lane stays off (every call takes
 * the general path) unless every probe agrees. dtypes are recognised by
 * identity with the builtin native-order descriptors; any other descriptor,
 * even an equal one, takes the general path.
 *
 * The call-site capture mirrors _callsite.py's walk exactly (the same
 * tables, the same helpers for a code object or location seen the first
 * time); the tag last told to the library is kept per thread here, and
 * _callsite uses this `note` for every caller once bound, so there is one
 * record of it per thread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "ringleader.h"

/* The library's entry points, from the loaded library (ctypes gives their
 * addresses), typed after the header's declarations. */
static __typeof__(&rl_all_reduce) p_all_reduce;
static __typeof__(&rl_broadcast) p_broadcast;
static __typeof__(&rl_all_gather) p_all_gather;
static __typeof__(&rl_reduce_scatter) p_reduce_scatter;
static __typeof__(&rl_barrier) p_barrier;
static __typeof__(&rl_set_call_site) p_set_call_site;

/* numpy's array header, as far as the lane reads it. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} np_head;

#define NP_C_CONTIGUOUS 0x0001
#define NP_WRITEABLE 0x0400
#define MAX_DTYPES 16

static PyTypeObject *ndarray_type; /* NULL: the lane is off */
static PyObject *descrs[MAX_DTYPES];
static int dtype_codes[MAX_DTYPES];
static int n_dtypes;

/* The call-site capture's state (see _callsite.py). */
static PyObject *site_codes;    /* id(code) -> True, or {offset: tag} */
static PyObject *site_classify; /* code -> True or its (new) table */
static PyObject *site_tag;      /* (frame, table, offset) -> tag (bytes) */
static int site_on;
/* The tag last told to the library on this thread; borrowed: every tag
 * stays in its code's table, which _callsite keeps for the process. */
static _Thread_local PyObject *site_last;

/* ptr, count and code of a plain numpy array `o`, C-contiguous and, with
 * `writable`, writeable; 0 where the lane does not take it. */
static int np_view(PyObject *o, int writable, void **ptr, size_t *count, int *code) {
    if (ndarray_type == NULL || Py_TYPE(o) != ndarray_type) {
        return 0;
    }
    const np_head *a = (const np_head *)o;
    int need = writable ? (NP_C_CONTIGUOUS | NP_WRITEABLE) : NP_C_CONTIGUOUS;
    if ((a->flags & need) != need) {
        return 0;
    }
    int c = -1;
    for (int i = 0; i < n_dtypes; i++) {
        if (a->descr == descrs[i]) {
            c = dtype_codes[i];
            break;
        }
    }
    if (c < 0 || a->nd < 0) {
        return 0;
    }
    size_t n = 1;
    for (int d = 0; d < a->nd; d++) {
        if (a->dimensions[d] < 0) {
            return 0;
        }
        n *= (size_t)a->dimensions[d];
    }
    *ptr = a->data;
    *count = n;
    *code = c;
    return 1;
}

/* Code objects already classified (borrowed: _callsite keeps every code
 * it classified, and its value, for the process), by address. */
#define CODE_CACHE 256
static struct {
    PyCodeObject *code;
    PyObject *value;
} code_cache[CODE_CACHE];

static size_t code_slot(const PyCodeObject *code) { return ((uintptr_t)code >> 4) & (CODE_CACHE - 1); }

/* The location last told to the library on this thread: the code object
 * and instruction offset that the tag `site_last` names. */
static _Thread_local PyCodeObject *site_last_code;
static _Thread_local int site_last_at = -1;

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
/* The quick check, CPython 3.11 only: the interpreter's own frames read
 * directly (the layout of 3.11's _PyInterpreterFrame, whose leading fields
 * are mirrored here), without making a frame object for each frame the way
 * the public API does (a third of an 8-byte call). It answers only "the
 * caller's site is the one already told"; anything else, including a code
 * object not seen yet, goes to the full walk below. `bind_sites` turns it
 * on only if it agrees with the public API frame by frame
 * (`quick_walk_agrees`). */
#define QUICK_WALK 1
typedef struct quick_frame {
    PyObject *f_func;
    PyObject *f_globals;
    PyObject *f_builtins;
    PyObject *f_locals;
    PyCodeObject *f_code;
    PyObject *frame_obj;
    struct quick_frame *previous;
    _Py_CODEUNIT *prev_instr;
    int stacktop;
    char is_entry;
    char owner;
} quick_frame;

#define QUICK_OWNED_BY_GENERATOR 1

static int quick_on;

static quick_frame *quick_top(void) { return (quick_frame *)PyThreadState_Get()->cframe->current_frame; }

/* A frame the public API skips: started, its first instruction not yet
 * reached (as CPython 3.11's _PyFrame_IsIncomplete). */
static int quick_incomplete(const quick_frame *f) {
    return f->owner != QUICK_OWNED_BY_GENERATOR && f->prev_instr < _PyCode_CODE(f->f_code) + f->f_code->_co_firsttraceable;
}

static int quick_at(const quick_frame *f) {
    return (int)(f->prev_instr - _PyCode_CODE(f->f_code)) * (int)sizeof(_Py_CODEUNIT);
}

/* 1 when the caller's site is the one last told on this thread. */
static int quick_note(void) {
    for (const quick_frame *f = quick_top(); f != NULL; f = f->previous) {
        if (quick_incomplete(f)) {
            continue;
        }
        size_t slot = code_slot(f->f_code);
        if (code_cache[slot].code != f->f_code) {
            return 0;
        }
        if (code_cache[slot].value != Py_True) {
            return f->f_code == site_last_code && quick_at(f) == site_last_at;
        }
    }
    return 0;
}

/* 1 when the quick walk sees, from here, the frames the public API sees:
 * the same code objects at the same offsets, in the same order. */
static int quick_agrees(void) {
    const quick_frame *q = quick_top();
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    int ok = 1;
    while (f != NULL) {
        while (q != NULL && quick_incomplete(q)) {
            q = q->previous;
        }
        PyCodeObject *code = PyFrame_GetCode(f);
        ok = q != NULL && q->f_code == code && quick_at(q) == PyFrame_GetLasti(f);
        Py_DECREF(code);
        if (!ok) {
            break;
        }
        q = q->previous;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    while (ok && q != NULL && quick_incomplete(q)) {
        q = q->previous;
    }
    return ok && q == NULL;
}
#endif

/* Tells the library the caller's call site: the first frame, from the
 * innermost Python frame out, whose code is neither ringleader's nor
 * torch's. 0, or -1 with a Python error set. */
static int note_site(void) {
    if (!site_on) {
        return 0;
    }
#ifdef QUICK_WALK
    if (quick_on && quick_note()) {
        return 0;
    }
#endif
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        size_t slot = code_slot(code);
        /* Codes are pinned once classified, so an address in the cache is
         * the code it was classified as; the dict is the fallback. */
        PyObject *v = code_cache[slot].code == code ? code_cache[slot].value : NULL;
        if (v == NULL) {
            PyObject *key = PyLong_FromVoidPtr(code);
            v = key ? PyDict_GetItemWithError(site_codes, key) : NULL; /* borrowed */
            Py_XDECREF(key);
        }
        if (v == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(code);
                Py_DECREF(f);
                return -1;
            }
            v = PyObject_CallOneArg(site_classify, (PyObject *)code);
            if (v == NULL) {
                Py_DECREF(code);
                Py_DECREF(f);
                return -1;
            }
            Py_DECREF(v); /* kept alive by site_codes */
        }
        code_cache[slot].code = code;
        code_cache[slot].value = v;
        Py_DECREF(code);
        if (v != Py_True) {
            int at = PyFrame_GetLasti(f);
            PyObject *off = PyLong_FromLong(at);
            PyObject *t = off ? PyDict_GetItemWithError(v, off) : NULL; /* borrowed */
            if (t == NULL && !PyErr_Occurred()) {
                t = PyObject_CallFunctionObjArgs(site_tag, (PyObject *)f, v, off, NULL);
                Py_XDECREF(t); /* kept alive by its table */
            }
            Py_XDECREF(off);
            Py_DECREF(f);
            if (t == NULL) {
                return -1;
            }
            if (t != site_last) {
                if (!PyBytes_Check(t)) {
                    PyErr_SetString(PyExc_TypeError, "ringleader: a call-site tag is not bytes");
                    return -1;
                }
                site_last = t;
                p_set_call_site(PyBytes_AS_STRING(t));
            }
            site_last_code = code; /* borrowed, as the cache's */
            site_last_at = at;
            return 0;
        }
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    return 0;
}

/* The handle in `h`, or NULL for None (a destroyed group: the general
 * path raises). -1 with an error set for anything else. */
static int handle_of(PyObject *h, void **out) {
    if (h == Py_None) {
        *out = NULL;
        return 0;
    }
    *out = PyLong_AsVoidPtr(h);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* A plain int argument as a C long long; 0 where it is not one (or does
 * not fit: the general path passes it on for the library to name). */
static int plain_int(PyObject *o, long long *out) {
    if (!PyLong_CheckExact(o)) {
        return 0;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int arity(Py_ssize_t nargs, Py_ssize_t want, const char *name) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "ringleader._native.%s takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    return 0;
}

/* A lane's arguments: the handle, `nbufs` numpy arrays (the first
 * written, any second only read, of the same dtype) and, with `want_int`, a
 * plain int last. 1: the lane takes the call (the caller's site is told);
 * 0: it does not; -1: a Python error is set. */
typedef struct {
    void *h;
    void *ptr[2];
    size_t count[2];
    int code;
    long long arg;
} lane_call;

static int lane_args(PyObject *const *args, Py_ssize_t nargs, const char *name, int nbufs, int want_int, lane_call *c) {
    int code[2] = {0, 0};
    if (arity(nargs, 1 + nbufs + want_int, name) || handle_of(args[0], &c->h)) {
        return -1;
    }
    /* (Unbound, the module calls nothing: RINGLEADER_NATIVE=0 imports it
     * without binding it.) */
    if (p_all_reduce == NULL || c->h == NULL || (want_int && !plain_int(args[1 + nbufs], &c->arg))) {
        return 0;
    }
    for (int i = 0; i < nbufs; i++) {
        if (!np_view(args[1 + i], i == 0, &c->ptr[i], &c->count[i], &code[i])) {
            return 0;
        }
    }
    if (nbufs == 2 && code[0] != code[1]) {
        return 0;
    }
    c->code = code[0];
    return note_site() < 0 ? -1 : 1;
}

/* What a lane answers for `lane_args`'s `taken` (no call made). */
static PyObject *untaken(int taken) { return taken < 0 ? NULL : PyLong_FromLong(-1); }

/* all_reduce(handle, buf, op_code) -> 0, the library's error code, or -1
 * (not the lane's). */
static PyObject *lane_all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    lane_call c;
    int taken = lane_args(args, nargs, "all_reduce", 1, 1, &c);
    if (taken <= 0) {
        return untaken(taken);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = p_all_reduce((const struct rl_comm *)c.h, c.ptr[0], c.count[0], c.code, (int)c.arg, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* broadcast(handle, buf, root) -> as all_reduce. */
static PyObject *lane_broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    lane_call c;
    int taken = lane_args(args, nargs, "broadcast", 1, 1, &c);
    if (taken <= 0) {
        return untaken(taken);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = p_broadcast((const struct rl_comm *)c.h, c.ptr[0], c.count[0], c.code, (int64_t)c.arg, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* all_gather(handle, out, inp) -> as all_reduce. */
static PyObject *lane_all_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    lane_call c;
    int taken = lane_args(args, nargs, "all_gather", 2, 0, &c);
    if (taken <= 0) {
        return untaken(taken);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = p_all_gather((const struct rl_comm *)c.h, c.ptr[1], c.count[1], c.ptr[0], c.count[0], c.code, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* reduce_scatter(handle, out, inp, op_code) -> as all_reduce. */
static PyObject *lane_reduce_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    lane_call c;
    int taken = lane_args(args, nargs, "reduce_scatter", 2, 1, &c);
    if (taken <= 0) {
        return untaken(taken);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = p_reduce_scatter((const struct rl_comm *)c.h, c.ptr[1], c.count[1], c.ptr[0], c.count[0], c.code, (int)c.arg,
                          NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* barrier(handle) -> as all_reduce. */
static PyObject *lane_barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    lane_call c;
    int taken = lane_args(args, nargs, "barrier", 0, 0, &c);
    if (taken <= 0) {
        return untaken(taken);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = p_barrier((const struct rl_comm *)c.h, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* note() -> None: the call-site capture alone (_callsite.note). */
static PyObject *lane_note(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    (void)args;
    if (arity(nargs, 0, "note") || note_site() < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static void *address(PyObject *o) { return PyLong_AsVoidPtr(o); }

/* bind_calls(all_reduce, broadcast, all_gather, reduce_scatter, barrier,
 * set_call_site): the library's entry points, as addresses. */
static PyObject *lane_bind_calls(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (arity(nargs, 6, "bind_calls")) {
        return NULL;
    }
    void *a[6];
    for (int i = 0; i < 6; i++) {
        a[i] = address(args[i]);
        if (a[i] == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "ringleader._native.bind_calls: a NULL entry point");
            }
            return NULL;
        }
    }
    p_all_reduce = (__typeof__(p_all_reduce))a[0];
    p_broadcast = (__typeof__(p_broadcast))a[1];
    p_all_gather = (__typeof__(p_all_gather))a[2];
    p_reduce_scatter = (__typeof__(p_reduce_scatter))a[3];
    p_barrier = (__typeof__(p_barrier))a[4];
    p_set_call_site = (__typeof__(p_set_call_site))a[5];
    Py_RETURN_NONE;
}

/* bind_numpy(ndarray, {descr: code}, probes) -> bool: turns the lane on
 * for numpy arrays if every probe, a tuple (array, data address, size,
 * flags, descr), reads back as numpy says. */
static PyObject *lane_bind_numpy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (arity(nargs, 3, "bind_numpy")) {
        return NULL;
    }
    PyObject *type = args[0], *table = args[1], *probes = args[2];
    if (!PyType_Check(type) || !PyDict_Check(table) || !PyList_Check(probes)) {
        PyErr_SetString(PyExc_TypeError, "ringleader._native.bind_numpy(type, dict, list)");
        return NULL;
    }
    if (PyDict_Size(table) > MAX_DTYPES || ((PyTypeObject *)type)->tp_basicsize < (Py_ssize_t)sizeof(np_head)) {
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(probes); i++) {
        PyObject *p = PyList_GET_ITEM(probes, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 5 || Py_TYPE(PyTuple_GET_ITEM(p, 0)) != (PyTypeObject *)type) {
            PyErr_SetString(PyExc_TypeError, "ringleader._native.bind_numpy: a probe is (ndarray, data, size, flags, descr)");
            return NULL;
        }
        const np_head *a = (const np_head *)PyTuple_GET_ITEM(p, 0);
        void *data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, 1));
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(p, 2));
        long flags = PyLong_AsLong(PyTuple_GET_ITEM(p, 3));
        if (PyErr_Occurred()) {
            return NULL;
        }
        long long n = 1;
        for (int d = 0; d < a->nd && d < 64; d++) {
            n *= a->dimensions[d];
        }
        if ((void *)a->data != data || n != size || (long)a->flags != flags || a->descr != PyTuple_GET_ITEM(p, 4) ||
            a->nd < 0 || a->nd > 64) {
            Py_RETURN_FALSE;
        }
    }
    for (int i = 0; i < n_dtypes; i++) {
        Py_CLEAR(descrs[i]);
    }
    n_dtypes = 0;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(table, &pos, &k, &v)) {
        long c = PyLong_AsLong(v);
        if (c == -1 && PyErr_Occurred()) {
            return NULL;
        }
        Py_INCREF(k);
        descrs[n_dtypes] = k;
        dtype_codes[n_dtypes] = (int)c;
        n_dtypes++;
    }
    Py_INCREF(type);
    Py_XSETREF(ndarray_type, (PyTypeObject *)type);
    Py_RETURN_TRUE;
}

/* bind_sites(codes, classify, tag, on): the call-site capture's tables and
 * helpers (_callsite.py). */
static PyObject *lane_bind_sites(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (arity(nargs, 4, "bind_sites")) {
        return NULL;
    }
    if (!PyDict_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "ringleader._native.bind_sites(dict, callable, callable, bool)");
        return NULL;
    }
    if (p_set_call_site == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ringleader._native.bind_sites before bind_calls");
        return NULL;
    }
    int on = PyObject_IsTrue(args[3]);
    if (on < 0) {
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(site_codes, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(site_classify, args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(site_tag, args[2]);
    site_on = on;
    memset(code_cache, 0, sizeof code_cache);
#ifdef QUICK_WALK
    quick_on = quick_agrees();
#endif
    Py_RETURN_NONE;
}

/* quick_walk() -> None where this interpreter has no quick check (see
 * QUICK_WALK), else (whether it is on, whether it agrees with the public
 * API from the caller's frame). */
static PyObject *lane_quick_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    (void)args;
    if (arity(nargs, 0, "quick_walk")) {
        return NULL;
    }
#ifdef QUICK_WALK
    return Py_BuildValue("(OO)", quick_on ? Py_True : Py_False, quick_agrees() ? Py_True : Py_False);
#else
    Py_RETURN_NONE;
#endif
}

static PyMethodDef methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))lane_all_reduce, METH_FASTCALL,
     "all_reduce(handle, buf, op_code): 0, the library's error code, or -1 (not the lane's)."},
    {"broadcast", (PyCFunction)(void (*)(void))lane_broadcast, METH_FASTCALL,
     "broadcast(handle, buf, root): as all_reduce."},
    {"all_gather", (PyCFunction)(void (*)(void))lane_all_gather, METH_FASTCALL,
     "all_gather(handle, out, inp): as all_reduce."},
    {"reduce_scatter", (PyCFunction)(void (*)(void))lane_reduce_scatter, METH_FASTCALL,
     "reduce_scatter(handle, out, inp, op_code): as all_reduce."},
    {"barrier", (PyCFunction)(void (*)(void))lane_barrier, METH_FASTCALL, "barrier(handle): as all_reduce."},
    {"note", (PyCFunction)(void (*)(void))lane_note, METH_FASTCALL,
     "Tells the library this thread's call site: the first frame outside ringleader and torch."},
    {"bind_calls", (PyCFunction)(void (*)(void))lane_bind_calls, METH_FASTCALL,
     "bind_calls(all_reduce, broadcast, all_gather, reduce_scatter, barrier, set_call_site): entry points."},
    {"bind_numpy", (PyCFunction)(void (*)(void))lane_bind_numpy, METH_FASTCALL,
     "bind_numpy(ndarray, {descr: code}, probes) -> whether the lane takes numpy arrays."},
    {"bind_sites", (PyCFunction)(void (*)(void))lane_bind_sites, METH_FASTCALL,
     "bind_sites(codes, classify, tag, on): the call-site capture's tables and helpers."},
    {"quick_walk", (PyCFunction)(void (*)(void))lane_quick_walk, METH_FASTCALL,
     "quick_walk() -> None, or (on, agrees from the caller's frame): the call-site capture's quick check."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ringleader._native",
    "The numpy API's blocking calls and the call-site capture in C (see _native.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* setup.py builds this for CPython 3.11 and later with the GIL
 * (PyFrame_GetLasti is 3.11's; the borrowed dictionary lookups need the
 * GIL); elsewhere the package runs its Python paths. */
PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
