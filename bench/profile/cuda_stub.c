/*
 * A stand-in for libcuda.so.1 that does no GPU work, for counting the host instructions of
 * tile-launch's launch path with callgrind on a machine without a GPU (`cargo xtask profile`).
 *
 * Every entry point resolves (cuGetProcAddress_v2 hands out a function returning
 * CUDA_SUCCESS for any name it does not implement); the ones whose out-parameters the launch
 * path reads are implemented with fixed, plausible answers: one device of compute capability
 * 9.0, a primary context, streams and events as distinct addresses, every event complete,
 * every stream idle and not capturing, every kernel with seven 8-byte parameters, and every
 * address device memory of device 0 but two ranges: addresses 0x6d00_0000_0000 to
 * 0x6dff_ffff_ffff are managed memory and 0x6800_0000_0000 to 0x68ff_ffff_ffff page-locked
 * host memory, both of (a context of) device 1. A launch returns at once.
 *
 * Its costs are not the driver's: callgrind's counts for these functions only say how often
 * tile-launch calls them. Instruction counts of tile-launch's own code are what it is for.
 *
 * It counts the driver calls it answers, per entry point, for the tests that assert how many
 * calls a launch makes and for the driver-call column of `cargo xtask profile`:
 * `stub_driver_calls(name)` is the count of one entry point (`"other"`: every entry point it
 * does not name in `ENTRIES`, together; NULL: all calls), `stub_driver_call_name(i)` names
 * counter i (NULL past the last), `stub_driver_calls_reset()` sets every count to zero. The counts are process-wide (relaxed atomics, a few instructions per call).
 *
 * For tests of what is released when, two switches model a busy device and a capture:
 * - `stub_set_busy(1)`: the work enqueued so far has not finished: `cuEventQuery` answers
 *   CUDA_ERROR_NOT_READY until `stub_set_busy(0)`; a synchronisation (`cuEventSynchronize`,
 *   `cuStreamSynchronize`, `cuCtxSynchronize`) waits for it, which here finishes it at once.
 * - `stub_set_capturing(1)`: every stream is capturing (`cuStreamGetCaptureInfo` answers
 *   ACTIVE, capture id 1, one graph). `cuUserObjectCreate` keeps each object's destructor, and
 *   `stub_destroy_graphs()` runs those of every object since the last call, as destroying the
 *   graph would; `stub_user_objects()` counts the objects not yet destroyed;
 *   `stub_refuse_user_objects(1)` makes `cuUserObjectCreate` fail until cleared.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
#define SUCCESS 0
#define INVALID_VALUE 1

/* Every entry point the stub answers by name: X(driver name, stub function). */
#define ENTRIES(X) \
    X(cuInit, cuInit) \
    X(cuDriverGetVersion, driver_version) \
    X(cuDeviceGetCount, device_count) \
    X(cuDeviceGet, device_get) \
    X(cuDeviceGetName, device_name) \
    X(cuDeviceTotalMem, device_total_mem) \
    X(cuDeviceGetAttribute, device_attribute) \
    X(cuDevicePrimaryCtxRetain, primary_retain) \
    X(cuCtxGetCurrent, ctx_get_current) \
    X(cuCtxSetCurrent, ctx_set_current) \
    X(cuCtxPushCurrent, ctx_push) \
    X(cuCtxPopCurrent, ctx_pop) \
    X(cuCtxGetDevice, ctx_get_device) \
    X(cuCtxGetId, ctx_get_id) \
    X(cuStreamGetCtx, stream_get_ctx) \
    X(cuStreamGetId, stream_get_id) \
    X(cuStreamCreate, stream_create) \
    X(cuStreamCreateWithPriority, make_handle_flags_priority) \
    X(cuEventCreate, event_create) \
    X(cuStreamGetCaptureInfo, capture_info) \
    X(cuStreamIsCapturing, is_capturing) \
    X(cuThreadExchangeStreamCaptureMode, exchange_capture_mode) \
    X(cuLibraryLoadData, library_load) \
    X(cuLibraryGetKernel, library_kernel) \
    X(cuKernelGetFunction, kernel_function) \
    X(cuKernelGetParamInfo, kernel_param_info) \
    X(cuKernelGetAttribute, kernel_attribute) \
    X(cuFuncGetAttribute, func_attribute) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, occupancy) \
    X(cuPointerGetAttributes, pointer_attributes) \
    X(cuPointerGetAttribute, pointer_attribute) \
    X(cuMemAlloc, mem_alloc) \
    X(cuGetErrorName, error_name) \
    X(cuGetErrorString, error_string) \
    X(cuLaunchKernel, launch_kernel) \
    X(cuLaunchKernelEx, launch_kernel_ex) \
    X(cuEventRecord, event_record) \
    X(cuEventQuery, event_query) \
    X(cuEventSynchronize, event_synchronize) \
    X(cuEventDestroy, event_destroy) \
    X(cuStreamWaitEvent, stream_wait_event) \
    X(cuStreamSynchronize, stream_synchronize) \
    X(cuStreamDestroy, stream_destroy) \
    X(cuCtxSynchronize, ctx_synchronize) \
    X(cuUserObjectCreate, user_object_create) \
    X(cuUserObjectRelease, user_object_release) \
    X(cuGraphRetainUserObject, graph_retain_user_object)

enum {
#define AS_INDEX(name, fn) AT_##name,
    ENTRIES(AS_INDEX)
#undef AS_INDEX
    AT_other,
    COUNTED
};
static const char *const counted_names[COUNTED] = {
#define AS_NAME(name, fn) #name,
    ENTRIES(AS_NAME)
#undef AS_NAME
    "other",
};
static unsigned long long counts[COUNTED];
#define COUNT(name) __atomic_fetch_add(&counts[AT_##name], 1, __ATOMIC_RELAXED)

unsigned long long stub_driver_calls(const char *name) {
    unsigned long long n = 0;
    for (int i = 0; i < COUNTED; i++) {
        if (name == NULL || strcmp(name, counted_names[i]) == 0) {
            n += __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
        }
    }
    return n;
}

/* The name of counter `i` (0, 1, ... until NULL), for listing every count. */
const char *stub_driver_call_name(int i) {
    return i >= 0 && i < COUNTED ? counted_names[i] : NULL;
}

void stub_driver_calls_reset(void) {
    for (int i = 0; i < COUNTED; i++) __atomic_store_n(&counts[i], 0, __ATOMIC_RELAXED);
}

/* Every entry point the stub does not name: success, counted as "other". */
static CUresult generic(void) { COUNT(other); return SUCCESS; }

/* Entry points the launch path calls whose out-parameters nobody reads: success, counted. */
#define COUNTED_SUCCESS(name, fn) static CUresult fn(void) { COUNT(name); return SUCCESS; }
COUNTED_SUCCESS(cuLaunchKernel, launch_kernel)
COUNTED_SUCCESS(cuLaunchKernelEx, launch_kernel_ex)
COUNTED_SUCCESS(cuEventRecord, event_record)
COUNTED_SUCCESS(cuEventDestroy, event_destroy)
COUNTED_SUCCESS(cuStreamWaitEvent, stream_wait_event)
COUNTED_SUCCESS(cuStreamDestroy, stream_destroy)
COUNTED_SUCCESS(cuGraphRetainUserObject, graph_retain_user_object)

#define NOT_READY 600
static int busy;      /* stub_set_busy */
static int capturing; /* stub_set_capturing */

void stub_set_busy(int on) { __atomic_store_n(&busy, on, __ATOMIC_SEQ_CST); }
void stub_set_capturing(int on) { __atomic_store_n(&capturing, on, __ATOMIC_SEQ_CST); }

static CUresult event_query(void *event) {
    COUNT(cuEventQuery);
    (void)event;
    return __atomic_load_n(&busy, __ATOMIC_SEQ_CST) ? NOT_READY : SUCCESS;
}
/* A synchronisation waits for the work: here, it finishes it. */
static CUresult finish_work(void) { stub_set_busy(0); return SUCCESS; }
static CUresult event_synchronize(void *e) { COUNT(cuEventSynchronize); (void)e; return finish_work(); }
static CUresult stream_synchronize(void *s) { COUNT(cuStreamSynchronize); (void)s; return finish_work(); }
static CUresult ctx_synchronize(void) { COUNT(cuCtxSynchronize); return finish_work(); }

/* User objects: kept until stub_destroy_graphs() (or a release of the last reference). */
typedef void (*destructor)(void *);
struct user_object { void *ptr; destructor destroy; int live; };
static struct user_object user_objects[1024];
static int n_user_objects;
static int user_object_lock;
static void lock_objects(void) { while (__atomic_exchange_n(&user_object_lock, 1, __ATOMIC_ACQUIRE)) {} }
static void unlock_objects(void) { __atomic_store_n(&user_object_lock, 0, __ATOMIC_RELEASE); }

static int refuse_user_objects;
void stub_refuse_user_objects(int on) { __atomic_store_n(&refuse_user_objects, on, __ATOMIC_SEQ_CST); }

static CUresult user_object_create(void **out, void *ptr, destructor destroy, unsigned refs, unsigned flags) {
    COUNT(cuUserObjectCreate);
    (void)refs; (void)flags;
    if (__atomic_load_n(&refuse_user_objects, __ATOMIC_SEQ_CST)) return INVALID_VALUE;
    lock_objects();
    if (n_user_objects == 1024) { unlock_objects(); return INVALID_VALUE; }
    struct user_object *o = &user_objects[n_user_objects++];
    o->ptr = ptr; o->destroy = destroy; o->live = 1;
    unlock_objects();
    *out = o;
    return SUCCESS;
}
static CUresult user_object_release(void *object, unsigned refs) {
    COUNT(cuUserObjectRelease);
    (void)refs;
    struct user_object *o = object;
    lock_objects();
    int live = o->live;
    o->live = 0;
    unlock_objects();
    if (live) o->destroy(o->ptr);
    return SUCCESS;
}
/* Destroys the graphs: runs the destructor of every live user object, once. */
void stub_destroy_graphs(void) {
    for (;;) {
        struct user_object *found = NULL;
        lock_objects();
        for (int i = 0; i < n_user_objects; i++) {
            if (user_objects[i].live) { user_objects[i].live = 0; found = &user_objects[i]; break; }
        }
        if (!found) n_user_objects = 0;
        unlock_objects();
        if (!found) return;
        found->destroy(found->ptr);
    }
}
int stub_user_objects(void) {
    int n = 0;
    lock_objects();
    for (int i = 0; i < n_user_objects; i++) n += user_objects[i].live;
    unlock_objects();
    return n;
}

static int context_storage;
static __thread void *ctx_stack[64];
static __thread int ctx_depth;
static void *primary = &context_storage;

static void *fresh(void) {
    return malloc(16);
}

CUresult cuInit(unsigned flags) { COUNT(cuInit); (void)flags; return SUCCESS; }
static CUresult driver_version(int *v) { COUNT(cuDriverGetVersion); *v = 13000; return SUCCESS; }
static CUresult device_count(int *n) { COUNT(cuDeviceGetCount); *n = 1; return SUCCESS; }
static CUresult device_get(int *d, int ordinal) { COUNT(cuDeviceGet); *d = ordinal; return ordinal == 0 ? SUCCESS : INVALID_VALUE; }
static CUresult device_name(char *name, int len, int dev) {
    COUNT(cuDeviceGetName);
    (void)dev;
    strncpy(name, "cuda_stub", (size_t)len);
    return SUCCESS;
}
static CUresult device_total_mem(size_t *bytes, int dev) { COUNT(cuDeviceTotalMem); (void)dev; *bytes = (size_t)141 << 30; return SUCCESS; }

static CUresult device_attribute(int *v, int attribute, int dev) {
    COUNT(cuDeviceGetAttribute);
    (void)dev;
    switch (attribute) {
    case 1: *v = 1024; break;                        /* max threads per block */
    case 2: case 3: *v = 1024; break;                /* max block dim x, y */
    case 4: *v = 64; break;                          /* max block dim z */
    case 5: *v = 2147483647; break;                  /* max grid dim x */
    case 6: case 7: *v = 65535; break;               /* max grid dim y, z */
    case 8: *v = 49152; break;                       /* shared memory per block */
    case 10: *v = 32; break;                         /* warp size */
    case 16: *v = 132; break;                        /* multiprocessors */
    case 75: *v = 9; break;                          /* compute capability major */
    case 76: *v = 0; break;                          /* compute capability minor */
    case 97: *v = 232448; break;                     /* shared memory per block, opt-in */
    default: *v = 1; break;
    }
    return SUCCESS;
}

static CUresult primary_retain(void **ctx, int dev) { COUNT(cuDevicePrimaryCtxRetain); (void)dev; *ctx = primary; return SUCCESS; }
static CUresult ctx_get_current(void **ctx) { COUNT(cuCtxGetCurrent); *ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; return SUCCESS; }
static CUresult ctx_set_current(void *ctx) {
    COUNT(cuCtxSetCurrent);
    if (ctx_depth == 0) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return SUCCESS;
}
static CUresult ctx_push(void *ctx) {
    COUNT(cuCtxPushCurrent);
    if (ctx_depth >= 64) return INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return SUCCESS;
}
static CUresult ctx_pop(void **ctx) {
    COUNT(cuCtxPopCurrent);
    if (ctx_depth == 0) return INVALID_VALUE;
    void *c = ctx_stack[--ctx_depth];
    if (ctx) *ctx = c;
    return SUCCESS;
}
static CUresult ctx_get_device(int *d) { COUNT(cuCtxGetDevice); *d = 0; return SUCCESS; }
static CUresult ctx_get_id(void *ctx, unsigned long long *id) { COUNT(cuCtxGetId); (void)ctx; *id = 1; return SUCCESS; }
static CUresult stream_get_ctx(void *s, void **ctx) { COUNT(cuStreamGetCtx); (void)s; *ctx = primary; return SUCCESS; }
/* A stream's id: its handle (the stub never destroys a stream's handle for another). */
static CUresult stream_get_id(void *s, unsigned long long *id) { COUNT(cuStreamGetId); *id = (unsigned long long)(uintptr_t)s; return SUCCESS; }

static CUresult make_handle(void **out) { *out = fresh(); return SUCCESS; }
static CUresult stream_create(void **out, unsigned flags) { COUNT(cuStreamCreate); (void)flags; return make_handle(out); }
static CUresult event_create(void **out, unsigned flags) { COUNT(cuEventCreate); (void)flags; return make_handle(out); }
static CUresult make_handle_flags_priority(void **out, unsigned flags, int priority) {
    COUNT(cuStreamCreateWithPriority); (void)flags; (void)priority; return make_handle(out);
}

static CUresult capture_info(void *stream, int *status, uint64_t *id, void **graph,
                             const void **deps, const void **edges, size_t *n) {
    COUNT(cuStreamGetCaptureInfo);
    (void)stream;
    int on = __atomic_load_n(&capturing, __ATOMIC_SEQ_CST);
    if (status) *status = on; /* 1: CU_STREAM_CAPTURE_STATUS_ACTIVE */
    if (id) *id = on;
    if (graph) *graph = on ? (void *)&user_objects : NULL;
    if (deps) *deps = NULL;
    if (edges) *edges = NULL;
    if (n) *n = 0;
    return SUCCESS;
}
static CUresult is_capturing(void *stream, int *status) {
    COUNT(cuStreamIsCapturing); (void)stream; *status = __atomic_load_n(&capturing, __ATOMIC_SEQ_CST); return SUCCESS;
}
static CUresult exchange_capture_mode(int *mode) { COUNT(cuThreadExchangeStreamCaptureMode); *mode = 0; return SUCCESS; }

static CUresult library_load(void **lib, const void *code, void *jo, void **jv, unsigned nj,
                             void *lo, void **lv, unsigned nl) {
    COUNT(cuLibraryLoadData);
    (void)code; (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    return make_handle(lib);
}
static CUresult library_kernel(void **kernel, void *lib, const char *name) {
    COUNT(cuLibraryGetKernel);
    (void)lib; (void)name; return make_handle(kernel);
}
static CUresult kernel_function(void **f, void *kernel) { COUNT(cuKernelGetFunction); (void)kernel; return make_handle(f); }
static CUresult kernel_param_info(void *kernel, size_t index, size_t *offset, size_t *size) {
    COUNT(cuKernelGetParamInfo);
    (void)kernel;
    if (index >= 7) return INVALID_VALUE;
    if (offset) *offset = 8 * index;
    if (size) *size = 8;
    return SUCCESS;
}
static CUresult attribute_answer(int *v, int attribute) {
    switch (attribute) {
    case 0: *v = 1024; break;     /* max threads per block */
    case 4: *v = 16; break;       /* registers */
    case 5: case 6: *v = 90; break;
    case 8: *v = 49152; break;    /* max dynamic shared memory */
    default: *v = 0; break;
    }
    return SUCCESS;
}
static CUresult kernel_attribute(int *v, int attribute, void *kernel, int dev) {
    COUNT(cuKernelGetAttribute); (void)kernel; (void)dev; return attribute_answer(v, attribute);
}
static CUresult func_attribute(int *v, int attribute, void *f) {
    COUNT(cuFuncGetAttribute); (void)f; return attribute_answer(v, attribute);
}
static CUresult occupancy(int *blocks, void *f, int threads, size_t shared) {
    COUNT(cuOccupancyMaxActiveBlocksPerMultiprocessor);
    (void)f; (void)threads; (void)shared; *blocks = 1; return SUCCESS;
}

static CUresult pointer_answer(unsigned n, int *attributes, void **data, uint64_t ptr) {
    int managed = (ptr >> 40) == 0x6d, host = (ptr >> 40) == 0x68;
    for (unsigned i = 0; i < n; i++) {
        switch (attributes[i]) {
        case 2: *(unsigned *)data[i] = host ? 1 : 2; break;        /* memory type: host, device */
        case 8: *(unsigned char *)data[i] = managed; break;          /* is managed */
        case 9: *(int *)data[i] = managed || host ? 1 : 0; break;   /* device ordinal */
        default: break;
        }
    }
    return SUCCESS;
}
static CUresult pointer_attributes(unsigned n, int *attributes, void **data, uint64_t ptr) {
    COUNT(cuPointerGetAttributes);
    return pointer_answer(n, attributes, data, ptr);
}
static CUresult pointer_attribute(void *data, int attribute, uint64_t ptr) {
    COUNT(cuPointerGetAttribute);
    int a = attribute;
    void *d = data;
    return pointer_answer(1, &a, &d, ptr);
}

static uint64_t next_address = 0x7f0000000000ull;
static CUresult mem_alloc(uint64_t *ptr, size_t bytes) {
    COUNT(cuMemAlloc);
    *ptr = next_address;
    next_address += (bytes + 0xffff) & ~(size_t)0xffff;
    return SUCCESS;
}

static CUresult error_name(CUresult e, const char **s) { COUNT(cuGetErrorName); (void)e; *s = "stub"; return SUCCESS; }
static CUresult error_string(CUresult e, const char **s) { COUNT(cuGetErrorString); (void)e; *s = "stub"; return SUCCESS; }

struct entry { const char *name; void *fn; };
static const struct entry entries[] = {
#define AS_ENTRY(name, fn) {#name, (void *)fn},
    ENTRIES(AS_ENTRY)
#undef AS_ENTRY
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    (void)version; (void)flags;
    *pfn = (void *)generic;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        if (strcmp(entries[i].name, symbol) == 0) {
            *pfn = entries[i].fn;
            break;
        }
    }
    if (status) *status = 0;
    return SUCCESS;
}
