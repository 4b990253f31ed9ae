/*
 * A C launcher that does what cuTile's does with a DLPack tensor -- read the data pointer from
 * the capsule, mark the capsule consumed ("rename" it), launch a kernel on a stream -- and then,
 * instead of calling the tensor's deleter at once (which frees memory the kernel may still be
 * reading), hands the tensor to tile, which calls the deleter once the kernel has finished.
 * The fix is the call to tile_hold_dlpack below, plus borrowing the stream once.
 *
 * Needs no CUDA toolkit: the few driver types and prototypes it uses are declared here, and the
 * driver is opened with dlopen (TILE_LIBCUDA names it, as for tile itself; default
 * libcuda.so.1). Build and run from the workspace root (see tile-capi/README.md):
 *
 *   cargo build -p tile-capi
 *   cc -std=c11 -Wall -Wextra -Itile-capi/include tile-capi/examples/launcher.c \
 *      -Ltarget/debug -ltile_capi -Wl,-rpath,"$PWD/target/debug" -ldl -o target/launcher
 *   target/launcher
 *
 * Against the stub driver of the tests (bench/profile/cuda_stub.c) the kernel "runs" until
 * the stream is synchronised (stub_set_busy), so the example also checks that the deleter did
 * not run before. It exits with 0 when the deleter ran exactly once, after the kernel.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tile.h"

/* The driver API used here (cuda.h, CUDA 12.0 and later). */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUfunc_st *CUfunction;
typedef unsigned long long CUdeviceptr;
#define CU_STREAM_NON_BLOCKING 1u

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuLibraryLoadData)(CUlibrary *, const void *, void *, void **, unsigned, void *,
                                  void **, unsigned);
    CUresult (*cuLibraryGetKernel)(CUkernel *, CUlibrary, const char *);
    CUresult (*cuKernelGetFunction)(CUfunction *, CUkernel);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
} cu;

/* The DLPack 1.x structs (dlpack.h), declared here so that the example stands alone. */
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape, *strides;
    uint64_t byte_offset;
} DLTensor;
struct DLManagedTensorVersioned {
    struct { uint32_t major, minor; } version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
};

/* A Python capsule, reduced to what a launcher touches: its name and its pointer. */
struct capsule { const char *name; void *pointer; };

/* add_one(float *x, uint64_t n): x[i] += 1 for i < n. */
static const char add_one_ptx[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry add_one(.param .u64 x, .param .u64 n)\n{\n"
    "  .reg .pred p;\n  .reg .b32 r<5>;\n  .reg .b64 rd<6>;\n  .reg .f32 f<3>;\n"
    "  ld.param.u64 rd1, [x];\n  ld.param.u64 rd2, [n];\n"
    "  mov.u32 r1, %ctaid.x;\n  mov.u32 r2, %ntid.x;\n  mov.u32 r3, %tid.x;\n"
    "  mad.lo.s32 r4, r1, r2, r3;\n  cvt.u64.u32 rd3, r4;\n"
    "  setp.ge.u64 p, rd3, rd2;\n  @p bra DONE;\n"
    "  cvta.to.global.u64 rd4, rd1;\n  shl.b64 rd5, rd3, 2;\n  add.s64 rd4, rd4, rd5;\n"
    "  ld.global.f32 f1, [rd4];\n  add.f32 f2, f1, 0f3F800000;\n  st.global.f32 [rd4], f2;\n"
    "DONE:\n  ret;\n}\n";

#define CU_CHECK(call)                                                                  \
    do {                                                                                \
        CUresult r_ = (call);                                                           \
        if (r_ != 0) { fprintf(stderr, "%s failed: CUresult %d\n", #call, r_); exit(1); } \
    } while (0)
#define TILE_CHECK(call)                                                                \
    do {                                                                                \
        tile_status s_ = (call);                                                        \
        if (s_ != TILE_OK) {                                                            \
            fprintf(stderr, "%s failed: %s: %s\n", #call, tile_error_string(s_),        \
                    tile_last_error_message());                                         \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* The producer's side: a 1-D float32 tensor on device 0, and the deleter that frees it. */
static int deleter_calls;

static void producer_deleter(struct DLManagedTensorVersioned *self) {
    cu.cuMemFree((CUdeviceptr)(uintptr_t)self->dl_tensor.data);
    free(self->dl_tensor.shape);
    free(self);
    __atomic_add_fetch(&deleter_calls, 1, __ATOMIC_SEQ_CST);
}

static struct capsule producer_export(int64_t n) {
    struct DLManagedTensorVersioned *t = calloc(1, sizeof *t);
    CUdeviceptr data;
    CU_CHECK(cu.cuMemAlloc(&data, (size_t)n * sizeof(float)));
    t->version.major = 1;
    t->version.minor = 1;
    t->deleter = producer_deleter;
    t->dl_tensor.data = (void *)(uintptr_t)data;
    t->dl_tensor.device = (DLDevice){2 /* kDLCUDA */, 0};
    t->dl_tensor.ndim = 1;
    t->dl_tensor.dtype = (DLDataType){2 /* kDLFloat */, 32, 1};
    t->dl_tensor.shape = malloc(sizeof(int64_t));
    t->dl_tensor.shape[0] = n;
    return (struct capsule){"dltensor_versioned", t};
}

static void open_driver(void **driver) {
    const char *path = getenv("TILE_LIBCUDA");
    *driver = dlopen(path ? path : "libcuda.so.1", RTLD_NOW);
    if (!*driver) { fprintf(stderr, "no CUDA driver: %s\n", dlerror()); exit(1); }
    CUresult (*get)(const char *, void **, int, uint64_t, int *) =
        (CUresult (*)(const char *, void **, int, uint64_t, int *))dlsym(*driver, "cuGetProcAddress_v2");
    if (!get) { fprintf(stderr, "the driver has no cuGetProcAddress_v2\n"); exit(1); }
#define GET(name) CU_CHECK(get(#name, (void **)&cu.name, 12000, 0, NULL))
    GET(cuInit); GET(cuDeviceGet); GET(cuDevicePrimaryCtxRetain); GET(cuCtxSetCurrent);
    GET(cuStreamCreate); GET(cuStreamDestroy); GET(cuMemAlloc); GET(cuMemFree);
    GET(cuLibraryLoadData); GET(cuLibraryGetKernel); GET(cuKernelGetFunction); GET(cuLaunchKernel);
#undef GET
}

int main(void) {
    void *driver;
    open_driver(&driver);
    /* Only the stub driver of the tests has it: makes the kernel "run" until synchronised. */
    void (*stub_set_busy)(int) = (void (*)(int))dlsym(driver, "stub_set_busy");

    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUlibrary lib;
    CUkernel kernel;
    CUfunction add_one;
    CU_CHECK(cu.cuInit(0));
    CU_CHECK(cu.cuDeviceGet(&dev, 0));
    CU_CHECK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_CHECK(cu.cuCtxSetCurrent(ctx));
    CU_CHECK(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_CHECK(cu.cuLibraryLoadData(&lib, add_one_ptx, NULL, NULL, 0, NULL, NULL, 0));
    CU_CHECK(cu.cuLibraryGetKernel(&kernel, lib, "add_one"));
    CU_CHECK(cu.cuKernelGetFunction(&add_one, kernel));

    /* Once per stream: tile's release queue for it. */
    tile_stream *held;
    TILE_CHECK(tile_stream_borrow(0, stream, &held));

    struct capsule capsule = producer_export(1 << 20);

    /* The launcher: read the pointer from the capsule and rename it, as cuTile does... */
    struct DLManagedTensorVersioned *t = capsule.pointer;
    capsule.name = "used_dltensor_versioned"; /* consumed: its destructor will not delete it */
    CUdeviceptr x = (CUdeviceptr)(uintptr_t)t->dl_tensor.data + t->dl_tensor.byte_offset;
    uint64_t n = (uint64_t)t->dl_tensor.shape[0];
    void *args[] = {&x, &n};
    if (stub_set_busy) stub_set_busy(1);
    CU_CHECK(cu.cuLaunchKernel(add_one, (unsigned)((n + 255) / 256), 1, 1, 256, 1, 1, 0, stream,
                               args, NULL));
    /* ...where it would now call t->deleter(t), freeing x under the running kernel. Instead: */
    TILE_CHECK(tile_hold_dlpack(held, t));

    /* The host goes on; later calls release what has finished, without blocking. */
    size_t released = 0;
    TILE_CHECK(tile_stream_poll(held, &released));
    printf("after the launch: %zu released, deleter calls %d\n", released, deleter_calls);
    if (stub_set_busy && deleter_calls != 0) {
        fprintf(stderr, "the deleter ran while the kernel was running\n");
        return 1;
    }
    TILE_CHECK(tile_stream_synchronize(held)); /* waits for the kernel, then releases */
    tile_stats stats;
    TILE_CHECK(tile_stream_stats(held, &stats));
    printf("after synchronize: deleter calls %d, pending %llu, released %llu\n", deleter_calls,
           (unsigned long long)stats.pending_guards, (unsigned long long)stats.guards_released);
    TILE_CHECK(tile_stream_release(held));
    CU_CHECK(cu.cuStreamDestroy(stream));
    if (deleter_calls != 1) {
        fprintf(stderr, "the deleter ran %d times, expected once\n", deleter_calls);
        return 1;
    }
    printf("ok: the deleter ran once, after the kernel\n");
    return 0;
}
