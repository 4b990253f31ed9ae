/*
 * A stand-in for libcuda.so.1 that does no GPU work, for counting the host instructions of
 * tile-launch's launch path with callgrind on a machine without a GPU (`cargo xtask profile`).
 *
 * Every entry point resolves (cuGetProcAddress_v2 hands out a function returning
 * CUDA_SUCCESS for any name it does not implement); the ones whose out-parameters the launch
 * path reads are implemented with fixed, plausible answers: one device of compute capability
 * 9.0, a primary context, streams and events as distinct addresses, every event complete,
 * every stream idle and not capturing, every kernel with seven 8-byte parameters, and every
 * address device memory of device 0. A launch returns at once.
 *
 * Its costs are not the driver's: callgrind's counts for these functions only say how often
 * tile-launch calls them. Instruction counts of tile-launch's own code are what it is for.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
#define SUCCESS 0
#define INVALID_VALUE 1

static CUresult generic(void) { return SUCCESS; }

static int context_storage;
static __thread void *ctx_stack[64];
static __thread int ctx_depth;
static void *primary = &context_storage;

static void *fresh(void) {
    return malloc(16);
}

CUresult cuInit(unsigned flags) { (void)flags; return SUCCESS; }
static CUresult driver_version(int *v) { *v = 13000; return SUCCESS; }
static CUresult device_count(int *n) { *n = 1; return SUCCESS; }
static CUresult device_get(int *d, int ordinal) { *d = ordinal; return ordinal == 0 ? SUCCESS : INVALID_VALUE; }
static CUresult device_name(char *name, int len, int dev) {
    (void)dev;
    strncpy(name, "cuda_stub", (size_t)len);
    return SUCCESS;
}
static CUresult device_total_mem(size_t *bytes, int dev) { (void)dev; *bytes = (size_t)141 << 30; return SUCCESS; }

static CUresult device_attribute(int *v, int attribute, int dev) {
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

static CUresult primary_retain(void **ctx, int dev) { (void)dev; *ctx = primary; return SUCCESS; }
static CUresult ctx_get_current(void **ctx) { *ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; return SUCCESS; }
static CUresult ctx_set_current(void *ctx) {
    if (ctx_depth == 0) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return SUCCESS;
}
static CUresult ctx_push(void *ctx) {
    if (ctx_depth >= 64) return INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return SUCCESS;
}
static CUresult ctx_pop(void **ctx) {
    if (ctx_depth == 0) return INVALID_VALUE;
    void *c = ctx_stack[--ctx_depth];
    if (ctx) *ctx = c;
    return SUCCESS;
}
static CUresult ctx_get_device(int *d) { *d = 0; return SUCCESS; }
static CUresult ctx_get_id(void *ctx, unsigned long long *id) { (void)ctx; *id = 1; return SUCCESS; }
static CUresult stream_get_ctx(void *s, void **ctx) { (void)s; *ctx = primary; return SUCCESS; }

static CUresult make_handle(void **out) { *out = fresh(); return SUCCESS; }
static CUresult make_handle_flags(void **out, unsigned flags) { (void)flags; return make_handle(out); }
static CUresult make_handle_flags_priority(void **out, unsigned flags, int priority) {
    (void)flags; (void)priority; return make_handle(out);
}

static CUresult capture_info(void *stream, int *status, uint64_t *id, void **graph,
                             const void **deps, const void **edges, size_t *n) {
    (void)stream;
    if (status) *status = 0;
    if (id) *id = 0;
    if (graph) *graph = NULL;
    if (deps) *deps = NULL;
    if (edges) *edges = NULL;
    if (n) *n = 0;
    return SUCCESS;
}
static CUresult is_capturing(void *stream, int *status) { (void)stream; *status = 0; return SUCCESS; }
static CUresult exchange_capture_mode(int *mode) { *mode = 0; return SUCCESS; }

static CUresult library_load(void **lib, const void *code, void *jo, void **jv, unsigned nj,
                             void *lo, void **lv, unsigned nl) {
    (void)code; (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    return make_handle(lib);
}
static CUresult library_kernel(void **kernel, void *lib, const char *name) {
    (void)lib; (void)name; return make_handle(kernel);
}
static CUresult kernel_function(void **f, void *kernel) { (void)kernel; return make_handle(f); }
static CUresult kernel_param_info(void *kernel, size_t index, size_t *offset, size_t *size) {
    (void)kernel;
    if (index >= 7) return INVALID_VALUE;
    if (offset) *offset = 8 * index;
    if (size) *size = 8;
    return SUCCESS;
}
static CUresult kernel_attribute(int *v, int attribute, void *kernel, int dev) {
    (void)kernel; (void)dev;
    switch (attribute) {
    case 0: *v = 1024; break;     /* max threads per block */
    case 4: *v = 16; break;       /* registers */
    case 5: case 6: *v = 90; break;
    case 8: *v = 49152; break;    /* max dynamic shared memory */
    default: *v = 0; break;
    }
    return SUCCESS;
}
static CUresult func_attribute(int *v, int attribute, void *f) { return kernel_attribute(v, attribute, f, 0); }
static CUresult occupancy(int *blocks, void *f, int threads, size_t shared) {
    (void)f; (void)threads; (void)shared; *blocks = 1; return SUCCESS;
}

static CUresult pointer_attributes(unsigned n, int *attributes, void **data, uint64_t ptr) {
    (void)ptr;
    for (unsigned i = 0; i < n; i++) {
        switch (attributes[i]) {
        case 2: *(unsigned *)data[i] = 2; break;     /* memory type: device */
        case 8: *(unsigned char *)data[i] = 0; break; /* is managed */
        case 9: *(int *)data[i] = 0; break;          /* device ordinal */
        default: break;
        }
    }
    return SUCCESS;
}
static CUresult pointer_attribute(void *data, int attribute, uint64_t ptr) {
    int a = attribute;
    void *d = data;
    return pointer_attributes(1, &a, &d, ptr);
}

static uint64_t next_address = 0x7f0000000000ull;
static CUresult mem_alloc(uint64_t *ptr, size_t bytes) {
    *ptr = next_address;
    next_address += (bytes + 0xffff) & ~(size_t)0xffff;
    return SUCCESS;
}

static CUresult error_text(CUresult e, const char **s) { (void)e; *s = "stub"; return SUCCESS; }

struct entry { const char *name; void *fn; };
static const struct entry entries[] = {
    {"cuInit", (void *)cuInit},
    {"cuDriverGetVersion", (void *)driver_version},
    {"cuDeviceGetCount", (void *)device_count},
    {"cuDeviceGet", (void *)device_get},
    {"cuDeviceGetName", (void *)device_name},
    {"cuDeviceTotalMem", (void *)device_total_mem},
    {"cuDeviceGetAttribute", (void *)device_attribute},
    {"cuDevicePrimaryCtxRetain", (void *)primary_retain},
    {"cuCtxGetCurrent", (void *)ctx_get_current},
    {"cuCtxSetCurrent", (void *)ctx_set_current},
    {"cuCtxPushCurrent", (void *)ctx_push},
    {"cuCtxPopCurrent", (void *)ctx_pop},
    {"cuCtxGetDevice", (void *)ctx_get_device},
    {"cuCtxGetId", (void *)ctx_get_id},
    {"cuStreamGetCtx", (void *)stream_get_ctx},
    {"cuStreamCreate", (void *)make_handle_flags},
    {"cuStreamCreateWithPriority", (void *)make_handle_flags_priority},
    {"cuEventCreate", (void *)make_handle_flags},
    {"cuStreamGetCaptureInfo", (void *)capture_info},
    {"cuStreamIsCapturing", (void *)is_capturing},
    {"cuThreadExchangeStreamCaptureMode", (void *)exchange_capture_mode},
    {"cuLibraryLoadData", (void *)library_load},
    {"cuLibraryGetKernel", (void *)library_kernel},
    {"cuKernelGetFunction", (void *)kernel_function},
    {"cuKernelGetParamInfo", (void *)kernel_param_info},
    {"cuKernelGetAttribute", (void *)kernel_attribute},
    {"cuFuncGetAttribute", (void *)func_attribute},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor", (void *)occupancy},
    {"cuPointerGetAttributes", (void *)pointer_attributes},
    {"cuPointerGetAttribute", (void *)pointer_attribute},
    {"cuMemAlloc", (void *)mem_alloc},
    {"cuGetErrorName", (void *)error_text},
    {"cuGetErrorString", (void *)error_text},
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
