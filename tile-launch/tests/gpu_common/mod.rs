//! Fixtures shared by the GPU tests of issue 5 (`gpu_capture.rs`, `gpu_config.rs`,
//! `gpu_multi.rs`): a device's context and producer stream, the test kernels compiled with
//! NVRTC, and DLPack tensors over `cudarc` buffers whose deleters free and count.

#![allow(dead_code)] // not every test file uses every helper

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use tile_dlpack::dlpark::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned};
use tile_dlpack::dlpark::metadata::Dynamic;
use tile_dlpack::{DType, Used};
use tile_launch::{Arg, Context, Kernel, Library, Param, ScalarType, Signature, TensorArg};

pub const VECTOR_ADD: &str = include_str!("../../kernels/vector_add.cu");
pub const LAUNCH_CONFIG: &str = include_str!("../../kernels/launch_config.cu");

/// One device: our context, a `cudarc` context and producer stream.
pub struct Gpu {
    pub ordinal: i32,
    pub ctx: Arc<Context>,
    pub producer: Arc<CudaStream>,
}

pub fn gpu(ordinal: i32) -> Result<Gpu> {
    // Probe through cuda-sys first: cudarc panics when libcuda is missing.
    cuda_sys::driver().context("no CUDA driver")?;
    let ctx = Context::new(ordinal)?;
    let cu = CudaContext::new(ordinal as usize)?;
    let producer = cu.new_stream()?;
    Ok(Gpu {
        ordinal,
        ctx,
        producer,
    })
}

/// `kernels/vector_add.cu` (`vector_add`, `spin`, `fill`), compiled while `ctx` is current.
pub fn vector_add_library(ctx: &Context) -> Result<Library> {
    let _bound = ctx.bind()?;
    Ok(Library::from_cuda_source(VECTOR_ADD, &[])?)
}

/// The parameters of `vector_add(a, stride, b, stride, c, stride, n)`; the kernel takes each
/// tensor's stride, so its pointer parameters are declared strided.
pub fn vector_add_signature() -> Signature {
    Signature::new([
        Param::input(DType::F32).strided(),
        Param::scalar(ScalarType::I64),
        Param::input(DType::F32).strided(),
        Param::scalar(ScalarType::I64),
        Param::output(DType::F32).strided(),
        Param::scalar(ScalarType::I64),
        Param::scalar(ScalarType::U64),
    ])
}

/// The arguments of `vector_add(a, stride, b, stride, c, stride, n)`, in that order.
pub fn vector_add_args(
    a: TensorArg<'static>,
    b: TensorArg<'static>,
    c: TensorArg<'static>,
    stride: i64,
    n: usize,
) -> [Arg<'static>; 7] {
    [
        a.into(),
        stride.into(),
        b.into(),
        stride.into(),
        c.into(),
        stride.into(),
        (n as u64).into(),
    ]
}

/// `vector_add` of `kernels/vector_add.cu`, loaded while `ctx` is current.
pub fn vector_add(ctx: &Context) -> Result<Kernel> {
    let lib = vector_add_library(ctx)?;
    let _bound = ctx.bind()?;
    Ok(lib.kernel("vector_add", vector_add_signature())?)
}

/// `kernels/launch_config.cu`, compiled for compute capability 9.0.
pub fn config_library(ctx: &Context) -> Result<Library> {
    let _bound = ctx.bind()?;
    Ok(Library::from_cuda_source(
        LAUNCH_CONFIG,
        &["-arch=compute_90"],
    )?)
}

/// Counts deleter calls.
#[derive(Clone, Debug, Default)]
pub struct Count(pub Arc<AtomicUsize>);
impl Count {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits up to 5 s for the count to reach `n` (deleters of captured launches run on the
    /// release thread, after CUDA's destructor), then checks it stays there for a moment.
    pub fn expect_eventually(&self, n: usize, what: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.get() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        ensure!(
            self.get() == n,
            "{what}: deleter count {} want {n}",
            self.get()
        );
        Ok(())
    }
}

struct Owner<T> {
    slice: Option<T>,
    count: Count,
}
impl<T> Drop for Owner<T> {
    fn drop(&mut self) {
        drop(self.slice.take());
        self.count.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn f32_type() -> DLDataType {
    DLDataType {
        code: tile_dlpack::dlpark::ffi::DLDataTypeCode::FLOAT,
        bits: 32,
        lanes: 1,
    }
}

/// Where a 1-D f32 tensor lies: `n` elements, `stride` elements apart, starting `byte_offset`
/// bytes past the data pointer.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub n: usize,
    pub stride: usize,
    pub byte_offset: u64,
}

impl Layout {
    /// `n` contiguous elements from the data pointer.
    pub fn contiguous(n: usize) -> Layout {
        Layout {
            n,
            stride: 1,
            byte_offset: 0,
        }
    }
}

/// A versioned DLPack f32 tensor at `ptr` with `layout`, described as on `cuda:device`, whose
/// deleter drops `keep` (freeing whatever it owns) and then counts.
fn f32_tensor<T: Send + 'static>(
    ptr: u64,
    layout: Layout,
    device: i32,
    keep: Option<T>,
) -> Result<(Used, Count)> {
    let count = Count::default();
    let mut init = Dynamic::new([layout.n as i64], [layout.stride as i64])
        .prepare_as::<DLManagedTensorVersioned>()?
        .initialize(Box::new(Owner {
            slice: keep,
            count: count.clone(),
        }));
    init.set_data(ptr as usize as *mut std::ffi::c_void)
        .set_device(DLDevice::cuda(device))
        .set_dtype(f32_type())
        .set_byte_offset(layout.byte_offset);
    // SAFETY: every field is set; `keep` (owned by the deleter context) or the caller keeps the
    // data valid until the deleter runs.
    let managed = unsafe { init.finish() };
    Ok((Used::from_managed_versioned(managed)?, count))
}

/// A tensor over `slice` with `layout`, described as on `cuda:described_device`, whose deleter
/// frees the slice (stream-ordered, on its stream) and counts. No `ready_on`: the caller makes
/// sure the data is ready (usable inside a capture).
pub fn owned_tensor_with(
    slice: CudaSlice<f32>,
    layout: Layout,
    described_device: i32,
) -> Result<(TensorArg<'static>, Count)> {
    let ptr = address(&slice);
    let (used, count) = f32_tensor(ptr, layout, described_device, Some(slice))?;
    Ok((TensorArg::from(used), count))
}

/// As [`owned_tensor_with`], contiguous over the whole slice.
pub fn owned_tensor(
    slice: CudaSlice<f32>,
    described_device: i32,
) -> Result<(TensorArg<'static>, Count)> {
    let n = slice.len();
    owned_tensor_with(slice, Layout::contiguous(n), described_device)
}

/// As [`owned_tensor_with`] on device 0, ordered after the slice's own stream (`ready_on`), as
/// a producer whose writes may still be pending there.
pub fn ready_tensor(slice: CudaSlice<f32>, layout: Layout) -> Result<(TensorArg<'static>, Count)> {
    let ready = slice.stream().cu_stream() as cuda_sys::CUstream;
    let ptr = address(&slice);
    let (used, count) = f32_tensor(ptr, layout, 0, Some(slice))?;
    // SAFETY: the slice (inside the tensor's deleter context) holds its stream alive.
    Ok((unsafe { TensorArg::from(used).ready_on(ready) }, count))
}

/// An f32 view with `layout` at `ptr` on `cuda:device`, memory the caller keeps owning (the
/// deleter only counts).
pub fn view_with(ptr: u64, layout: Layout, device: i32) -> Result<(TensorArg<'static>, Count)> {
    let (used, count) = f32_tensor::<()>(ptr, layout, device, None)?;
    Ok((TensorArg::from(used), count))
}

/// A contiguous f32 view of `n` elements at `ptr` on `cuda:device` (see [`view_with`]).
pub fn view(ptr: u64, n: usize, device: i32) -> Result<(TensorArg<'static>, Count)> {
    view_with(ptr, Layout::contiguous(n), device)
}

/// The device address of a `cudarc` slice.
pub fn address<T>(slice: &CudaSlice<T>) -> u64 {
    let stream = slice.stream().clone();
    let (p, s) = slice.device_ptr(&stream);
    drop(s);
    p
}

pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 200.0 - 100.0
        })
        .collect()
}

/// The variable that tells a test binary started by [`run_in_child`] which test it runs.
pub const CHILD_ENV: &str = "TILE_TEST_CHILD";

/// Whether this process is the child [`run_in_child`] started for test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == name)
}

/// Runs test `name` (a top-level `#[ignore]`d test of this binary) again in a fresh process,
/// for tests that need a process where nothing else touched a device (or that reset one), and
/// fails unless it ran and passed there.
pub fn run_in_child(name: &str) -> Result<()> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, name)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- child {name} ---\n{stdout}{stderr}--- end of child {name} ---");
    ensure!(out.status.success(), "child {name} failed: {}", out.status);
    ensure!(
        stdout.contains("1 passed"),
        "child {name} did not run the test"
    );
    Ok(())
}

/// `cuStreamIsCapturing` of a raw stream.
pub fn capture_status(stream: cuda_sys::CUstream) -> Result<cuda_sys::CUstreamCaptureStatus> {
    use cuda_sys::CuResultExt;
    let d = cuda_sys::driver()?;
    let mut status = cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local; the caller passes a live stream.
    unsafe { (d.cuStreamIsCapturing)(stream, &mut status) }.check("cuStreamIsCapturing")?;
    Ok(status)
}

/// The calling thread's current context (`cuCtxGetCurrent`; null when none).
pub fn current_context_raw() -> Result<cuda_sys::CUcontext> {
    use cuda_sys::CuResultExt;
    let d = cuda_sys::driver()?;
    let mut c: cuda_sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { (d.cuCtxGetCurrent)(&mut c) }.check("cuCtxGetCurrent")?;
    Ok(c)
}

/// Makes `c` current on the calling thread (`cuCtxSetCurrent`; null pops).
pub fn set_current_context(c: cuda_sys::CUcontext) -> Result<()> {
    use cuda_sys::CuResultExt;
    let d = cuda_sys::driver()?;
    // SAFETY: `c` is null or a context the test keeps alive.
    unsafe { (d.cuCtxSetCurrent)(c) }.check("cuCtxSetCurrent")?;
    Ok(())
}

/// A new non-primary context of device `ordinal` (`cuCtxCreate`), current on this thread;
/// destroyed when the last `Arc` goes.
pub fn non_primary_context(ordinal: i32) -> Result<Arc<CudaContext>> {
    use cudarc::driver::sys;
    let device = cudarc::driver::result::device::get(ordinal)?;
    let mut raw: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; null creation parameters ask for the defaults.
    let r = unsafe { sys::cuCtxCreate_v4(&mut raw, std::ptr::null_mut(), 0, device) };
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuCtxCreate: {r:?}");
    // SAFETY: `raw` was just created for `device`, and is handed over (destroyed on drop).
    Ok(unsafe { CudaContext::from_raw_context(ordinal as usize, device, raw) }?)
}

/// One device with the `vector_add` and `spin` kernels loaded: what most GPU tests need.
pub struct Kernels {
    pub ordinal: i32,
    pub ctx: Arc<Context>,
    /// The `cudarc` context of the producer stream (its sticky error: `check_err`).
    pub cu: Arc<CudaContext>,
    pub producer: Arc<CudaStream>,
    pub add: Kernel,
    pub spin: Kernel,
}

/// [`Kernels`] on device `ordinal`.
pub fn kernels(ordinal: i32) -> Result<Kernels> {
    let g = gpu(ordinal)?;
    let lib = vector_add_library(&g.ctx)?;
    let (add, spin) = {
        let _bound = g.ctx.bind()?;
        (
            lib.kernel("vector_add", vector_add_signature())?,
            lib.kernel(
                "spin",
                tile_launch::Signature::new([Param::scalar(ScalarType::U64)]),
            )?,
        )
    };
    Ok(Kernels {
        ordinal,
        ctx: g.ctx,
        cu: Arc::clone(g.producer.context()),
        producer: g.producer,
        add,
        spin,
    })
}

/// One trial of premature release made visible (the cuTile failure): inputs whose deleters free
/// their memory (stream-ordered on the producer stream), `launch` held busy for 200 ms by a
/// spin kernel, the add launched by `launch_add` with `vector_add` arguments, and right after it
/// returns an allocation and a sentinel write on the producer stream where the inputs were. The
/// deleters must not run while the kernel is pending (0 each after 100 polls), must run once
/// each at retire, and every output must be right. Returns the number of wrong outputs (0).
pub fn premature_release_trial(
    f: &Kernels,
    launch: &tile_launch::Stream,
    n: usize,
    seed: u64,
    launch_add: impl FnOnce([Arg<'static>; 7]) -> tile_launch::Result<tile_launch::LaunchHandle>,
) -> Result<usize> {
    let ha = random(n, seed);
    let hb = random(n, seed + 100);
    let a = f.producer.clone_htod(&ha)?;
    let b = f.producer.clone_htod(&hb)?;
    let mut c = f.producer.alloc_zeros::<f32>(n)?;
    f.producer.memcpy_htod(&vec![f32::NAN; n], &mut c)?;
    let c_ptr = address(&c);
    let (ta, ca) = ready_tensor(a, Layout::contiguous(n))?;
    let (tb, cb) = ready_tensor(b, Layout::contiguous(n))?;
    let (tc, cc) = view(c_ptr, n, 0)?;
    launch
        .launch(
            &f.spin,
            &tile_launch::LaunchConfig::new(1, 1),
            [200_000_000u64.into()],
        )?
        .defer();
    let h = launch_add(vector_add_args(ta, tb, tc, 1, n))?;
    // Right after launch: the producer allocates and writes a sentinel on its own stream.
    let mut s1 = f.producer.alloc_zeros::<f32>(n)?;
    let mut s2 = f.producer.alloc_zeros::<f32>(n)?;
    f.producer.memcpy_htod(&vec![-7.0f32; n], &mut s1)?;
    f.producer.memcpy_htod(&vec![-7.0f32; n], &mut s2)?;
    f.producer.synchronize()?;
    ensure!(!h.is_complete()?, "the spin kernel should still be running");
    for _ in 0..100 {
        launch.poll();
    }
    ensure!(
        (ca.get(), cb.get(), cc.get()) == (0, 0, 0),
        "released before the kernel finished"
    );
    h.retire()?;
    ensure!(
        (ca.get(), cb.get(), cc.get()) == (1, 1, 1),
        "deleters after retire: {} {} {}",
        ca.get(),
        cb.get(),
        cc.get()
    );
    let hc = f.producer.clone_dtoh(&c)?;
    f.producer.synchronize()?;
    let wrong = (0..n).filter(|&i| hc[i] != ha[i] + hb[i]).count();
    ensure!(wrong == 0, "seed {seed}: {wrong} of {n} elements wrong");
    drop((s1, s2));
    Ok(wrong)
}
