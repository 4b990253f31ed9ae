/*
 * A Python extension module for `cargo xtask profile --python`: a tensor type whose instances
 * export through the DLPack C exchange API (`__dlpack_c_exchange_api__`), as PyTorch's do, with
 * the export and the deleter in C (one allocation each way), so that counting the host
 * instructions of `tile_py.launch` against the stub driver measures tile_py, not the producer.
 * Its memory is a fixed fake device address, which only the stub driver accepts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data; DLDevice device; int32_t ndim; DLDataType dtype;
    int64_t *shape, *strides; uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version; void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *); uint64_t flags; DLTensor dl_tensor;
} DLManagedTensorVersioned;
typedef struct {
    DLPackVersion version; void *prev_api;
} DLPackExchangeAPIHeader;
typedef struct {
    DLPackExchangeAPIHeader header;
    void *managed_tensor_allocator;
    int (*from_py_object_no_sync)(void *, DLManagedTensorVersioned **);
    void *to_py_object_no_sync;
    void *dltensor_from_py_object_no_sync;
    int (*current_work_stream)(int32_t, int32_t, void **);
} DLPackExchangeAPI;

typedef struct { PyObject_HEAD int64_t n; uint64_t address; } Tensor;

typedef struct { DLManagedTensorVersioned m; int64_t shape[1], strides[1]; PyObject *owner; } Export;

static void deleter(DLManagedTensorVersioned *m) {
    Export *e = (Export *)m;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(e->owner);
    PyGILState_Release(g);
    free(e);
}

static int from_obj(void *obj, DLManagedTensorVersioned **out) {
    Tensor *t = (Tensor *)obj;
    Export *e = calloc(1, sizeof(Export));
    if (!e) { PyErr_NoMemory(); return -1; }
    e->m.version.major = 1; e->m.version.minor = 3;
    e->m.deleter = deleter;
    e->shape[0] = t->n;
    e->m.dl_tensor.data = (void *)(uintptr_t)t->address;
    e->m.dl_tensor.device.device_type = 2; /* kDLCUDA */
    e->m.dl_tensor.ndim = 1;
    e->m.dl_tensor.dtype.code = 2; e->m.dl_tensor.dtype.bits = 32; e->m.dl_tensor.dtype.lanes = 1;
    e->m.dl_tensor.shape = e->shape;
    e->strides[0] = 1; /* PyTorch always gives strides */
    e->m.dl_tensor.strides = e->strides;
    e->owner = obj; Py_INCREF(obj);
    *out = &e->m;
    return 0;
}

static uintptr_t current = 0x777;

static int current_stream(int32_t type, int32_t id, void **out) {
    (void)type; (void)id; *out = (void *)current; return 0;
}

static PyObject *set_current_stream(PyObject *self, PyObject *arg) {
    (void)self;
    current = (uintptr_t)PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_current_stream", set_current_stream, METH_O, "The stream current_work_stream reports."},
    {NULL, NULL, 0, NULL},
};

static DLPackExchangeAPI api = {{{1, 3}, NULL}, NULL, from_obj, NULL, NULL, current_stream};
static uint64_t next_address = 0x7e0000000000ull;

static int tensor_init(Tensor *self, PyObject *args, PyObject *kw) {
    (void)kw;
    if (!PyArg_ParseTuple(args, "L", &self->n)) return -1;
    self->address = next_address;
    next_address += 1 << 20;
    return 0;
}

static PyObject *no(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    Py_RETURN_FALSE;
}
static PyObject *no_get(PyObject *self, void *closure) {
    (void)self; (void)closure;
    Py_RETURN_FALSE;
}

/* A generic DLPack producer in C (as CuPy's ndarray is in Cython): `__dlpack__(*, stream=None,
 * max_version=None, dl_device=None, copy=None)` returns, as the DLPack protocol says, a
 * "dltensor_versioned" capsule when the consumer passes `max_version` with a major version of 1
 * or more (tile_py does), and else a legacy "dltensor" capsule (a `DLManagedTensor`: cuTile's
 * `ct.launch` asks so); either deleter drops the export. No exchange API, not named as any
 * family tile_py knows. */
typedef struct { PyObject_HEAD int64_t n; uint64_t address; } Array;

typedef struct DLManagedTensor {
    DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct DLManagedTensor *);
} DLManagedTensor;
/* The legacy export: the same tensor as `Export`, in the unversioned struct. */
typedef struct { DLManagedTensor m; Export *versioned; } LegacyExport;

static void legacy_deleter(DLManagedTensor *m) {
    LegacyExport *e = (LegacyExport *)m;
    e->versioned->m.deleter(&e->versioned->m);
    free(e);
}

static void capsule_destructor(PyObject *cap) {
    /* Unconsumed: the capsule still owns the export. */
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m && m->deleter) m->deleter(m);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (m && m->deleter) m->deleter(m);
    }
}

/* Whether the keyword arguments hold `max_version=(major, ...)` with major >= 1. */
static int asks_versioned(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t n = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "max_version") != 0) continue;
        PyObject *v = args[nargs + i];
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) == 0) return 0;
        long major = PyLong_AsLong(PyTuple_GET_ITEM(v, 0));
        if (major == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        return major >= 1;
    }
    return 0;
}

static PyObject *array_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "__dlpack__() takes keyword arguments only");
        return NULL;
    }
    /* stream, dl_device, copy: accepted and ignored here */
    DLManagedTensorVersioned *m;
    if (from_obj(self, &m) < 0) return NULL;
    if (asks_versioned(args, nargs, kwnames)) {
        return PyCapsule_New(m, "dltensor_versioned", capsule_destructor);
    }
    LegacyExport *e = calloc(1, sizeof(LegacyExport));
    if (!e) { m->deleter(m); return PyErr_NoMemory(); }
    e->versioned = (Export *)m;
    e->m.dl_tensor = m->dl_tensor;
    e->m.deleter = legacy_deleter;
    return PyCapsule_New(&e->m, "dltensor", capsule_destructor);
}

static PyObject *array_dlpack_device(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return Py_BuildValue("(ii)", 2, 0);
}

static PyMethodDef array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"__dlpack_device__", array_dlpack_device, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fake_exchange.Array",
    .tp_methods = array_methods,
    .tp_basicsize = sizeof(Array),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tensor_init,
};

/* The queries tile_py makes of a PyTorch tensor (lazy conjugate / negative views, autograd). */
static PyMethodDef tensor_methods[] = {
    {"is_conj", no, METH_NOARGS, NULL},
    {"is_neg", no, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static PyGetSetDef tensor_getset[] = {
    {"requires_grad", no_get, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* Named as PyTorch's tensor base class, so that tile_py treats it as a PyTorch tensor (its
 * exports trusted, its lazy-view and autograd queries made). */
static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torch._C.TensorBase",
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
    .tp_basicsize = sizeof(Tensor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tensor_init,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fake_exchange", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fake_exchange(void) {
    if (PyType_Ready(&TensorType) < 0 || PyType_Ready(&ArrayType) < 0) return NULL;
    PyObject *cap = PyCapsule_New(&api, "dlpack_exchange_api", NULL);
    if (!cap || PyDict_SetItemString(TensorType.tp_dict, "__dlpack_c_exchange_api__", cap) < 0)
        return NULL;
    Py_DECREF(cap);
    PyType_Modified(&TensorType);
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&TensorType);
    PyModule_AddObject(m, "Tensor", (PyObject *)&TensorType);
    Py_INCREF(&ArrayType);
    PyModule_AddObject(m, "Array", (PyObject *)&ArrayType);
    return m;
}
