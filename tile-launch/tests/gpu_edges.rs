//! GPU tests of the pointer-memory check (bad-input table row 27): what
//! `Context::memory_of_pointer` reports for device, managed, page-locked host and plain host
//! memory, and its cost; a launch whose tensor is host memory labelled as device memory is
//! refused before anything is consumed, and the context stays usable. Ignored unless asked for
//! (`--include-ignored`), and then they fail on a machine without a CUDA device.

mod gpu_common;

use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use cuda_sys::CuResultExt;
use cudarc::driver::DevicePtr;
use gpu_common::{address, gpu, random, vector_add, vector_add_args, view};
use tile_launch::{Context, Error, LaunchConfig, MemoryKind, Stream};

const N: usize = 1 << 12;

#[test]
#[ignore = "needs a CUDA device"]
fn memory_of_pointer_kinds_and_cost() -> Result<()> {
    let g = gpu(0)?;
    let dev = g.producer.alloc_zeros::<f32>(N)?;
    let dev_ptr = address(&dev);
    let m = Context::memory_of_pointer(dev_ptr).context("device memory not known")?;
    ensure!(m.kind == MemoryKind::Device && m.device == Some(0), "{m:?}");
    ensure!(Context::device_of_pointer(dev_ptr) == Some(0));
    // Inside an allocation too (a view's data pointer).
    let inner = Context::memory_of_pointer(dev_ptr + 4 * 100).context("inner address")?;
    ensure!(inner.kind == MemoryKind::Device, "{inner:?}");

    let host = vec![1.0f32; N];
    let host_ptr = host.as_ptr() as u64;
    ensure!(
        Context::memory_of_pointer(host_ptr).is_none(),
        "plain host memory reported as {:?}",
        Context::memory_of_pointer(host_ptr)
    );
    ensure!(Context::device_of_pointer(host_ptr).is_none());

    let cu = g.producer.context().clone();
    // SAFETY: the memory is only asked about, never read.
    let pinned = unsafe { cu.alloc_pinned::<f32>(N) }?;
    let pinned_ptr = pinned.as_ptr()? as u64;
    let p = Context::memory_of_pointer(pinned_ptr).context("pinned memory not known")?;
    ensure!(p.kind == MemoryKind::Host, "{p:?}");

    // SAFETY: the memory is only asked about, never read.
    let managed = unsafe { cu.alloc_unified::<f32>(N, true) }?;
    let (managed_ptr, sync) = managed.device_ptr(&g.producer);
    drop(sync);
    let u = Context::memory_of_pointer(managed_ptr).context("managed memory not known")?;
    ensure!(u.kind == MemoryKind::Managed, "{u:?}");

    // The cost of the check a launch makes per untrusted tensor: one cuPointerGetAttributes.
    for (what, ptr) in [("device", dev_ptr), ("plain host", host_ptr)] {
        let calls = 200_000u32;
        let t = Instant::now();
        let mut known = 0u32;
        for _ in 0..calls {
            known += u32::from(std::hint::black_box(Context::memory_of_pointer(ptr)).is_some());
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(calls);
        println!("memory_of_pointer on {what} memory: {ns:.1} ns per call ({known} known)");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn host_memory_labelled_as_device_is_refused_before_consuming() -> Result<()> {
    let g = gpu(0)?;
    let add = vector_add(&g.ctx)?;
    let stream = Stream::new(&g.ctx)?;
    let a_host = random(N, 7);
    let b = g.producer.clone_htod(&random(N, 8))?;
    let out = g.producer.alloc_zeros::<f32>(N)?;
    g.producer.synchronize()?;
    // A NumPy-like host buffer described as `(kDLCUDA, 0)`.
    let (ta, ca) = view(a_host.as_ptr() as u64, N, 0)?;
    let (tb, cb) = view(address(&b), N, 0)?;
    let (tc, cc) = view(address(&out), N, 0)?;
    let e = stream
        .launch(
            &add,
            &LaunchConfig::for_elements(N as u64, 256),
            vector_add_args(ta, tb, tc, 1, N),
        )
        .err()
        .context("host memory labelled as device memory was launched")?;
    match &e {
        Error::NotDeviceMemory { index, address, .. } => {
            ensure!(*index == 0 && *address == a_host.as_ptr() as u64, "{e}");
        }
        other => anyhow::bail!("expected NotDeviceMemory, got {other}"),
    }
    ensure!(e.to_string().starts_with("argument 0: "), "{e}");
    // The views were already owned (`Used`): released at once, exactly once, nothing launched.
    ensure!((ca.get(), cb.get(), cc.get()) == (1, 1, 1));
    let st = stream.stats();
    ensure!(st.pending_guards == 0 && st.held_guards == 0, "{st:?}");

    // The context is not poisoned: a correct launch on the same stream works.
    let a = g.producer.clone_htod(&a_host)?;
    g.producer.synchronize()?;
    let (ta, _) = view(address(&a), N, 0)?;
    let (tb, _) = view(address(&b), N, 0)?;
    let (tc, _) = view(address(&out), N, 0)?;
    stream
        .launch(
            &add,
            &LaunchConfig::for_elements(N as u64, 256),
            vector_add_args(ta, tb, tc, 1, N),
        )?
        .retire()?;
    let got = g.producer.clone_dtoh(&out)?;
    let hb = g.producer.clone_dtoh(&b)?;
    ensure!(
        got.iter()
            .zip(a_host.iter().zip(&hb))
            .all(|(c, (x, y))| *c == x + y),
        "wrong sums after the refused launch"
    );
    Ok(())
}

/// Issue 24, class 1: kernels compiled and looked up before the process has any CUDA context
/// (kernels built at import, the context made later by another library), then launched onto
/// a stream busy with a 1.5 s kernel: the launch call must not wait for that kernel (it used to
/// return after about 0.75 s, loading the module lazily at the first launch). Runs in a fresh
/// process, where nothing made a context before the lookup.
#[test]
#[ignore = "needs a CUDA device"]
fn first_launch_of_a_kernel_looked_up_without_a_context_does_not_wait() -> Result<()> {
    const NAME: &str = "first_launch_of_a_kernel_looked_up_without_a_context_does_not_wait";
    if !gpu_common::is_child(NAME) {
        return gpu_common::run_in_child(NAME);
    }
    cuda_sys::driver().context("no CUDA driver")?;
    ensure!(
        gpu_common::current_context_raw()?.is_null(),
        "a context is current before the lookup"
    );
    // At "import": compile and look up with no context current.
    let lib = tile_launch::Library::from_cuda_source(gpu_common::VECTOR_ADD, &[])?;
    let add = lib.kernel("vector_add", gpu_common::vector_add_signature())?;
    let spin = lib.kernel(
        "spin",
        tile_launch::Signature::new([tile_launch::Param::scalar(tile_launch::ScalarType::U64)]),
    )?;
    ensure!(
        gpu_common::current_context_raw()?.is_null(),
        "the lookup left a context current"
    );
    // Later, another library makes the context and its buffers.
    let g = gpu(0)?;
    let n = 1 << 20;
    let a = g.producer.clone_htod(&random(n, 24))?;
    let b = g.producer.clone_htod(&random(n, 25))?;
    let c = g.producer.alloc_zeros::<f32>(n)?;
    g.producer.synchronize()?;
    let s = Stream::new(&g.ctx)?;
    let busy = s.launch(&spin, &LaunchConfig::new(1, 1), [1_500_000_000u64.into()])?;
    let (ta, ca) = view(address(&a), n, 0)?;
    let (tb, cb) = view(address(&b), n, 0)?;
    let (tc, cc) = view(address(&c), n, 0)?;
    let t = Instant::now();
    let h = s.launch(
        &add,
        &LaunchConfig::for_elements(n as u64, 256),
        vector_add_args(ta, tb, tc, 1, n),
    )?;
    let took = t.elapsed();
    println!("first launch of a kernel looked up without a context: {took:?}");
    ensure!(
        !busy.is_complete()?,
        "the 1.5 s kernel finished before the launch returned: the launch waited for it"
    );
    ensure!(
        took.as_millis() < 100,
        "the first launch took {took:?} behind a busy stream (it waited for queued work)"
    );
    h.retire()?;
    busy.retire()?;
    ensure!((ca.get(), cb.get(), cc.get()) == (1, 1, 1));
    let (ha, hb, hc) = (
        g.producer.clone_dtoh(&a)?,
        g.producer.clone_dtoh(&b)?,
        g.producer.clone_dtoh(&c)?,
    );
    g.producer.synchronize()?;
    let wrong = (0..n).filter(|&i| hc[i] != ha[i] + hb[i]).count();
    ensure!(wrong == 0, "{wrong} of {n} elements wrong");
    Ok(())
}

/// Issue 24, class 5: a stream another library owns, wrapped with `Stream::from_raw_launch_only`,
/// launched on (deferred) and then synchronised and destroyed by its owner without telling tile:
/// polls release every tensor from the markers recorded at launch, never naming the destroyed
/// stream (no error counted), and the stream is forgettable afterwards.
#[test]
#[ignore = "needs a CUDA device"]
fn a_launch_only_stream_destroyed_after_its_work_is_never_touched_again() -> Result<()> {
    let g = gpu(0)?;
    let k = vector_add(&g.ctx)?;
    let d = cuda_sys::driver()?;
    let n = 1 << 16;
    let a = g.producer.clone_htod(&random(n, 41))?;
    let b = g.producer.clone_htod(&random(n, 42))?;
    let c = g.producer.alloc_zeros::<f32>(n)?;
    g.producer.synchronize()?;
    let _bound = g.ctx.bind()?;
    let mut raw: cuda_sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; the context is current.
    unsafe { (d.cuStreamCreate)(&mut raw, 1) }.check("cuStreamCreate")?;
    // SAFETY: `raw` is a live stream of the context during the launches, and names it until
    // their work is done (synchronised below before it is destroyed).
    let s = unsafe { Stream::from_raw_launch_only(&g.ctx, raw) }?;
    let mut counts = Vec::new();
    for _ in 0..3 {
        let (ta, ca) = view(address(&a), n, 0)?;
        let (tb, cb) = view(address(&b), n, 0)?;
        let (tc, cc) = view(address(&c), n, 0)?;
        s.launch_queued(
            &k,
            &LaunchConfig::for_elements(n as u64, 256),
            vector_add_args(ta, tb, tc, 1, n),
        )?;
        counts.extend([ca, cb, cc]);
    }
    ensure!(s.stats().markers_recorded == 3, "{:?}", s.stats());
    // SAFETY: `raw` is ours; nothing tile makes names it after the launches.
    unsafe { (d.cuStreamSynchronize)(raw) }.check("cuStreamSynchronize")?;
    // SAFETY: as above.
    unsafe { (d.cuStreamDestroy)(raw) }.check("cuStreamDestroy")?;
    let mut released = 0;
    for _ in 0..5 {
        released += s.poll();
    }
    s.synchronize()?;
    let st = s.stats();
    ensure!(released == 9, "released {released} of 9: {st:?}");
    ensure!(st.errors == 0 && st.guards_leaked == 0, "{st:?}");
    ensure!(
        counts.iter().all(|c| c.get() == 1),
        "a deleter did not run once"
    );
    ensure!(s.is_forgettable(), "{st:?}");
    Ok(())
}
