//! Tests that need a CUDA device. Run with `cargo test -p tile-cuda-sys -- --ignored`; without a
//! driver or a device they fail.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cuda_sys::*;

#[test]
#[ignore = "needs a CUDA device"]
fn driver_loads_and_sees_a_device() {
    let cuda = driver().expect("a CUDA driver and device");
    println!("{cuda:?}: CUDA driver {}", cuda.version());
    assert!(cuda.version() >= 13000, "driver older than CUDA 13.0");

    let mut count = 0;
    // SAFETY: `count` is valid for a write and the driver is initialised.
    unsafe { (cuda.cuDeviceGetCount)(&mut count) }
        .check("cuDeviceGetCount")
        .unwrap();
    assert!(count >= 1, "no CUDA device");

    let mut device: CUdevice = 0;
    // SAFETY: ordinal 0 exists (count >= 1); `device` is valid for a write.
    unsafe { (cuda.cuDeviceGet)(&mut device, 0) }
        .check("cuDeviceGet")
        .unwrap();
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds `name.len()` bytes; the driver NUL-terminates what it writes.
    unsafe { (cuda.cuDeviceGetName)(name.as_mut_ptr(), name.len() as i32, device) }
        .check("cuDeviceGetName")
        .unwrap();
    // SAFETY: the driver wrote a NUL-terminated string into `name`.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
    let mut major = 0;
    // SAFETY: `major` is valid for a write; `device` is a valid device.
    unsafe {
        (cuda.cuDeviceGetAttribute)(
            &mut major,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            device,
        )
    }
    .check("cuDeviceGetAttribute")
    .unwrap();
    println!("{count} device(s); device 0: {name} (compute capability {major}.x)");
    assert!(!name.is_empty());

    let error = cuda_sys::CUresult::CUDA_ERROR_INVALID_VALUE
        .check("test")
        .unwrap_err();
    assert_eq!(error.description(), Some("invalid argument"));
    assert_eq!(
        error.to_string(),
        "test failed: CUDA_ERROR_INVALID_VALUE (invalid argument)"
    );
}

/// A kernel `write42(unsigned *out)` that stores 42 at `out`, as PTX for any GPU.
const WRITE42_PTX: &CStr = c"
.version 8.0
.target sm_52
.address_size 64
.visible .entry write42(.param .u64 out)
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 42;
    st.global.u32 [%rd2], %r1;
    ret;
}
";

static HOST_FN_CALLS: AtomicUsize = AtomicUsize::new(0);
static USER_OBJECT_DESTROYED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_host_fn(_: *mut c_void) {
    HOST_FN_CALLS.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn count_user_object_destroyed(_: *mut c_void) {
    USER_OBJECT_DESTROYED.fetch_add(1, Ordering::SeqCst);
}

/// Calls every entry point of `Driver` once, so that a wrong ABI version shows up as a failure or
/// a crash here rather than in `tile-launch`.
#[test]
#[ignore = "needs a CUDA device"]
fn every_entry_point_behaves_as_its_abi_says() {
    let cuda = driver().expect("a CUDA driver and device");

    // Every call below passes live handles from earlier calls and out pointers to locals that
    // are valid for the write; buffers are at least as large as the byte counts given.
    macro_rules! cu {
        ($f:ident($($arg:expr),* $(,)?)) => {
            // SAFETY: see the comment above the macro; arguments are checked call by call.
            unsafe { (cuda.$f)($($arg),*) }.check(stringify!($f)).unwrap()
        };
    }

    let mut text: *const c_char = ptr::null();
    cu!(cuGetErrorName(
        CUresult::CUDA_ERROR_INVALID_VALUE,
        &mut text
    ));
    // SAFETY: on success the driver points `text` at a static NUL-terminated string.
    let name = unsafe { CStr::from_ptr(text) };
    assert_eq!(name.to_str(), Ok("CUDA_ERROR_INVALID_VALUE"));
    let mut version = 0;
    cu!(cuDriverGetVersion(&mut version));
    assert_eq!(version, cuda.version());

    let mut device: CUdevice = 0;
    cu!(cuDeviceGet(&mut device, 0));
    let mut context: CUcontext = ptr::null_mut();
    cu!(cuDevicePrimaryCtxRetain(&mut context, device));
    cu!(cuCtxPushCurrent(context));
    let mut current: CUcontext = ptr::null_mut();
    cu!(cuCtxGetCurrent(&mut current));
    assert_eq!(current, context);
    cu!(cuCtxSetCurrent(context));
    let mut context_id = 0u64;
    cu!(cuCtxGetId(context, &mut context_id));
    assert_ne!(context_id, 0, "a context's unique id");
    let mut ctx_device: CUdevice = -1;
    cu!(cuCtxGetDevice(&mut ctx_device));
    assert_eq!(ctx_device, device);

    // Streams and events.
    let mut stream: CUstream = ptr::null_mut();
    cu!(cuStreamCreate(
        &mut stream,
        CUstream_flags::CU_STREAM_NON_BLOCKING.0
    ));
    let mut other: CUstream = ptr::null_mut();
    cu!(cuStreamCreateWithPriority(
        &mut other,
        CUstream_flags::CU_STREAM_NON_BLOCKING.0,
        0
    ));
    let mut stream_ctx: CUcontext = ptr::null_mut();
    cu!(cuStreamGetCtx(stream, &mut stream_ctx));
    assert_eq!(stream_ctx, context);
    let (mut id, mut other_id) = (0, 0);
    cu!(cuStreamGetId(stream, &mut id));
    cu!(cuStreamGetId(other, &mut other_id));
    assert_ne!(id, other_id);
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    cu!(cuStreamIsCapturing(stream, &mut status));
    assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    let (mut start, mut end): (CUevent, CUevent) = (ptr::null_mut(), ptr::null_mut());
    cu!(cuEventCreate(&mut start, CUevent_flags::CU_EVENT_DEFAULT.0));
    cu!(cuEventCreate(&mut end, CUevent_flags::CU_EVENT_DEFAULT.0));

    // Memory: synchronous and stream-ordered.
    let mut buffer: CUdeviceptr = 0;
    cu!(cuMemAlloc(&mut buffer, 1024));
    cu!(cuMemsetD8(buffer, 7, 1024));
    let mut host = [0u8; 1024];
    cu!(cuMemcpyDtoH(host.as_mut_ptr().cast(), buffer, 1024));
    assert!(host.iter().all(|&b| b == 7));
    let pattern: Vec<u8> = (0..=255).cycle().take(1024).collect();
    cu!(cuMemcpyHtoD(buffer, pattern.as_ptr().cast(), 1024));
    let mut ordinal: c_int = -1;
    cu!(cuPointerGetAttribute(
        (&raw mut ordinal).cast(),
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        buffer,
    ));
    assert_eq!(ordinal, 0);
    let mut memory_type: c_uint = 0;
    let mut attributes = [CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE];
    let mut values = [(&raw mut memory_type).cast::<c_void>()];
    cu!(cuPointerGetAttributes(
        1,
        attributes.as_mut_ptr(),
        values.as_mut_ptr(),
        buffer
    ));
    assert_eq!(memory_type, CUmemorytype::CU_MEMORYTYPE_DEVICE.0);

    let mut scratch: CUdeviceptr = 0;
    cu!(cuEventRecord(start, stream));
    cu!(cuMemAllocAsync(&mut scratch, 1024, stream));
    cu!(cuMemcpyDtoDAsync(scratch, buffer, 1024, stream));
    cu!(cuMemsetD32Async(buffer, 0xdead_beef, 256, stream));
    let mut round_trip = vec![0u8; 1024];
    cu!(cuMemcpyDtoHAsync(
        round_trip.as_mut_ptr().cast(),
        scratch,
        1024,
        stream
    ));
    cu!(cuMemFreeAsync(scratch, stream));
    cu!(cuLaunchHostFunc(
        stream,
        Some(count_host_fn),
        ptr::null_mut()
    ));
    cu!(cuEventRecord(end, stream));
    cu!(cuStreamWaitEvent(other, end, 0));
    cu!(cuMemcpyHtoDAsync(buffer, pattern.as_ptr().cast(), 4, other));
    cu!(cuStreamSynchronize(other));
    cu!(cuStreamQuery(stream));
    cu!(cuEventSynchronize(end));
    cu!(cuEventQuery(end));
    assert_eq!(round_trip, pattern);
    assert_eq!(HOST_FN_CALLS.load(Ordering::SeqCst), 1);
    let mut milliseconds = -1.0f32;
    cu!(cuEventElapsedTime(&mut milliseconds, start, end));
    assert!(milliseconds >= 0.0, "{milliseconds}");

    // Library, kernel, launches.
    let mut library: CUlibrary = ptr::null_mut();
    cu!(cuLibraryLoadData(
        &mut library,
        WRITE42_PTX.as_ptr().cast(),
        ptr::null_mut(),
        ptr::null_mut(),
        0,
        ptr::null_mut(),
        ptr::null_mut(),
        0,
    ));
    let mut kernel: CUkernel = ptr::null_mut();
    cu!(cuLibraryGetKernel(
        &mut kernel,
        library,
        c"write42".as_ptr()
    ));
    let (mut offset, mut size) = (usize::MAX, 0usize);
    cu!(cuKernelGetParamInfo(kernel, 0, &mut offset, &mut size));
    assert_eq!((offset, size), (0, 8));
    let mut max_threads = 0;
    cu!(cuKernelGetAttribute(
        &mut max_threads,
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        kernel,
        device,
    ));
    assert!(max_threads >= 32);
    let mut function: CUfunction = ptr::null_mut();
    cu!(cuKernelGetFunction(&mut function, kernel));
    let mut registers = -1;
    cu!(cuFuncGetAttribute(
        &mut registers,
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
        function
    ));
    assert!(registers >= 0);

    let mut out = buffer;
    let mut params = [(&raw mut out).cast::<c_void>()];
    cu!(cuMemsetD8(buffer, 0, 4));
    cu!(cuLaunchKernel(
        function,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        stream,
        params.as_mut_ptr(),
        ptr::null_mut()
    ));
    let mut word = 0u32;
    cu!(cuStreamSynchronize(stream));
    cu!(cuMemcpyDtoH((&raw mut word).cast(), buffer, 4));
    assert_eq!(word, 42);
    cu!(cuMemsetD8(buffer, 0, 4));
    let config = CUlaunchConfig {
        gridDimX: 1,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 1,
        blockDimY: 1,
        blockDimZ: 1,
        hStream: stream,
        ..Default::default()
    };
    cu!(cuLaunchKernelEx(
        &config,
        function,
        params.as_mut_ptr(),
        ptr::null_mut()
    ));
    cu!(cuCtxSynchronize());
    cu!(cuMemcpyDtoH((&raw mut word).cast(), buffer, 4));
    assert_eq!(word, 42);

    // Stream capture into a graph that owns a user object.
    cu!(cuMemsetD8(buffer, 0, 4));
    cu!(cuStreamBeginCapture(
        stream,
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    ));
    let mut capture_id = 0;
    let mut capture_graph: CUgraph = ptr::null_mut();
    let mut dependencies: *const CUgraphNode = ptr::null();
    let mut edges: *const CUgraphEdgeData = ptr::null();
    let mut count = usize::MAX;
    cu!(cuStreamGetCaptureInfo(
        stream,
        &mut status,
        &mut capture_id,
        &mut capture_graph,
        &mut dependencies,
        &mut edges,
        &mut count,
    ));
    assert_eq!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    assert!(!capture_graph.is_null());
    assert_eq!(count, 0);
    cu!(cuLaunchKernel(
        function,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        stream,
        params.as_mut_ptr(),
        ptr::null_mut()
    ));
    let mut graph: CUgraph = ptr::null_mut();
    cu!(cuStreamEndCapture(stream, &mut graph));
    assert_eq!(graph, capture_graph);
    let mut object: CUuserObject = ptr::null_mut();
    cu!(cuUserObjectCreate(
        &mut object,
        ptr::null_mut(),
        Some(count_user_object_destroyed),
        1,
        CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
    ));
    cu!(cuGraphRetainUserObject(
        graph,
        object,
        1,
        CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0
    ));
    let mut exec: CUgraphExec = ptr::null_mut();
    cu!(cuGraphInstantiate(&mut exec, graph, 0));
    cu!(cuGraphLaunch(exec, stream));
    cu!(cuStreamSynchronize(stream));
    cu!(cuMemcpyDtoH((&raw mut word).cast(), buffer, 4));
    assert_eq!(word, 42);
    assert_eq!(USER_OBJECT_DESTROYED.load(Ordering::SeqCst), 0);
    cu!(cuGraphExecDestroy(exec));
    cu!(cuGraphDestroy(graph));
    cu!(cuCtxSynchronize());
    let deadline = Instant::now() + Duration::from_secs(5);
    while USER_OBJECT_DESTROYED.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        USER_OBJECT_DESTROYED.load(Ordering::SeqCst),
        1,
        "user object destructor ran"
    );

    // A graph built directly, and a user object released by hand.
    let mut empty: CUgraph = ptr::null_mut();
    cu!(cuGraphCreate(&mut empty, 0));
    let mut cloned: CUgraph = ptr::null_mut();
    cu!(cuGraphClone(&mut cloned, empty));
    cu!(cuGraphDestroy(cloned));
    cu!(cuGraphDestroy(empty));

    // The thread's capture mode, swapped to relaxed and back.
    let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    cu!(cuThreadExchangeStreamCaptureMode(&mut mode));
    assert_eq!(mode, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
    cu!(cuThreadExchangeStreamCaptureMode(&mut mode));
    assert_eq!(mode, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);

    // Occupancy and the dynamic shared memory opt-in.
    let mut blocks = 0;
    cu!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
        &mut blocks,
        function,
        32,
        0
    ));
    assert!(blocks >= 1, "{blocks} blocks per SM");
    cu!(cuKernelSetAttribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        64 << 10,
        kernel,
        device
    ));
    let mut loose: CUuserObject = ptr::null_mut();
    cu!(cuUserObjectCreate(
        &mut loose,
        ptr::null_mut(),
        Some(count_user_object_destroyed),
        1,
        CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
    ));
    cu!(cuUserObjectRelease(loose, 1));

    // Teardown.
    cu!(cuLibraryUnload(library));
    cu!(cuMemFree(buffer));
    cu!(cuEventDestroy(start));
    cu!(cuEventDestroy(end));
    cu!(cuStreamDestroy(stream));
    cu!(cuStreamDestroy(other));
    let mut popped: CUcontext = ptr::null_mut();
    cu!(cuCtxPopCurrent(&mut popped));
    assert_eq!(popped, context);
    cu!(cuDevicePrimaryCtxRelease(device));
    println!("all {} entry points called", Driver::ENTRY_POINTS.len());
}
