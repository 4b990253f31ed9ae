//! GPU tests: run on a machine with an NVIDIA GPU (`cargo xtask gpu-bundle`, then the bundle's
//! `run.sh`). On a machine without one they are ignored, never passed.

mod gpu_common;

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use cudarc::driver::{CudaSlice, DevicePtr};
use gpu_common::{Layout, random, ready_tensor, vector_add_args, view, view_with};
use tile_launch::{LaunchConfig, Stream};

use gpu_common::Kernels as Fixture;

fn fixture() -> Result<Fixture> {
    gpu_common::kernels(0)
}

/// a + b on a launch stream other than the producer's, for a layout given by element stride
/// and element offset of each vector inside its buffer; checks against the CPU.
fn add_case(f: &Fixture, n: usize, stride: usize, offset: usize) -> Result<()> {
    let launch = Stream::new(&f.ctx)?;
    let len = offset + n.saturating_sub(1) * stride + 1;
    let ha = random(len, n as u64 + 1);
    let hb = random(len, n as u64 + 2);
    let poison = vec![f32::NAN; len];
    let a = f.producer.clone_htod(&ha)?;
    let b = f.producer.clone_htod(&hb)?;
    let bo = (offset * 4) as u64;
    let (ta, ca) = ready_tensor(
        a,
        Layout {
            n,
            stride,
            byte_offset: bo,
        },
    )?;
    let (tb, cb) = ready_tensor(
        b,
        Layout {
            n,
            stride,
            byte_offset: bo,
        },
    )?;
    // The output is written through a view too; keep its slice to read it back afterwards.
    let mut out = f.producer.alloc_zeros::<f32>(len)?;
    f.producer.memcpy_htod(&poison, &mut out)?;
    let out_ptr = {
        let (p, s) = out.device_ptr(&f.producer);
        drop(s);
        p
    };
    let out_tensor = view_with(
        out_ptr,
        Layout {
            n,
            stride,
            byte_offset: bo,
        },
        0,
    )?;
    let h = launch.launch(
        &f.add,
        &LaunchConfig::for_elements(n as u64, 256),
        vector_add_args(ta, tb, out_tensor.0, stride as i64, n),
    )?;
    h.retire()?;
    ensure!(
        ca.get() == 1 && cb.get() == 1 && out_tensor.1.get() == 1,
        "deleters: {} {} {}",
        ca.get(),
        cb.get(),
        out_tensor.1.get()
    );
    let hc = f.producer.clone_dtoh(&out)?;
    f.producer.synchronize()?;
    for i in 0..len {
        let in_view =
            i >= offset && (i - offset).is_multiple_of(stride) && (i - offset) / stride < n;
        if in_view {
            let want = ha[i] + hb[i];
            ensure!(
                hc[i] == want,
                "n={n} stride={stride} offset={offset}: c[{i}] = {} want {want}",
                hc[i]
            );
        } else {
            ensure!(hc[i].is_nan(), "element {i} outside the view was written");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn vector_add_contiguous_sizes() -> Result<()> {
    let f = fixture()?;
    for n in [1usize, 255, 256, 4097, 1 << 20, 3_000_001] {
        add_case(&f, n, 1, 0)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn vector_add_strided_and_offset_views() -> Result<()> {
    let f = fixture()?;
    for (n, stride, offset) in [
        (1000usize, 2usize, 0usize),
        (4096, 3, 5),
        (77777, 1, 13),
        (1 << 16, 7, 1),
    ] {
        add_case(&f, n, stride, offset)?;
    }
    Ok(())
}

/// The cuTile failure, made visible: the launch stream is held busy, the producer's memory is
/// freed (stream-ordered) when its deleter runs, and right after `launch` returns the producer
/// allocates and writes a sentinel on its own stream. Releasing before the kernel ran would let
/// the sentinel land in the inputs' memory before the kernel reads it.
#[test]
#[ignore = "needs a CUDA device"]
fn premature_release_is_not_possible() -> Result<()> {
    let f = fixture()?;
    let n = 1usize << 24;
    for trial in 0..3 {
        let launch = Stream::new(&f.ctx)?;
        let wrong = gpu_common::premature_release_trial(&f, &launch, n, 100 + trial, |args| {
            launch.launch(&f.add, &LaunchConfig::for_elements(n as u64, 256), args)
        })?;
        println!(
            "premature release, trial {trial}: {wrong} of {n} elements wrong; deleters 0 while \
             the kernel was pending, 1 each after retire"
        );
    }
    Ok(())
}

/// Stream ordering: the producer's write is still pending on its own stream (queued behind a
/// spin) when the launch happens on another stream; the kernel must see the finished write.
#[test]
#[ignore = "needs a CUDA device"]
fn kernel_sees_pending_producer_write() -> Result<()> {
    let f = fixture()?;
    let n = 1usize << 22;
    let launch = Stream::new(&f.ctx)?;
    let producer = Stream::from_cudarc(&f.ctx, &f.producer)?;
    let ha = random(n, 7);
    let hb = random(n, 8);
    let mut a = f.producer.alloc_zeros::<f32>(n)?;
    let b = f.producer.clone_htod(&hb)?;
    f.producer.synchronize()?;
    // Hold the producer stream, then queue the real data behind the spin.
    producer
        .launch(&f.spin, &LaunchConfig::new(1, 1), [100_000_000u64.into()])?
        .defer();
    f.producer.memcpy_htod(&ha, &mut a)?;
    let c = f.producer.alloc_zeros::<f32>(n)?;
    let c_ptr = {
        let (p, s) = c.device_ptr(&f.producer);
        drop(s);
        p
    };
    let (ta, ca) = ready_tensor(a, Layout::contiguous(n))?;
    let (tb, cb) = ready_tensor(b, Layout::contiguous(n))?;
    let (tc, cc) = view(c_ptr, n, 0)?;
    let h = launch.launch(
        &f.add,
        &LaunchConfig::for_elements(n as u64, 256),
        vector_add_args(ta, tb, tc, 1, n),
    )?;
    ensure!(
        !h.is_complete()?,
        "the launch must wait for the producer's spin"
    );
    h.retire()?;
    ensure!(
        (ca.get(), cb.get(), cc.get()) == (1, 1, 1),
        "deleters after retire"
    );
    let hc = f.producer.clone_dtoh(&c)?;
    f.producer.synchronize()?;
    let wrong = (0..n).filter(|&i| hc[i] != ha[i] + hb[i]).count();
    ensure!(
        wrong == 0,
        "{wrong} of {n} elements did not see the producer's write"
    );
    println!("stream ordering: {wrong} of {n} elements missed the producer's pending write");
    drop(producer);
    Ok(())
}

/// Deferred launches (`defer` and `launch_queued`) are released by later launches and by
/// synchronize, each exactly once.
#[test]
#[ignore = "needs a CUDA device"]
fn deferred_release_exactly_once() -> Result<()> {
    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let n = 4096usize;
    let mut counts = Vec::new();
    for i in 0..500u64 {
        let a = f.producer.clone_htod(&random(n, i))?;
        let b = f.producer.clone_htod(&random(n, i + 1000))?;
        let c = f.producer.alloc_zeros::<f32>(n)?;
        let (ta, ca) = ready_tensor(a, Layout::contiguous(n))?;
        let (tb, cb) = ready_tensor(b, Layout::contiguous(n))?;
        let (tc, cc) = ready_tensor(c, Layout::contiguous(n))?;
        let cfg = LaunchConfig::for_elements(n as u64, 256);
        let args = vector_add_args(ta, tb, tc, 1, n);
        // Both ways of deferring: a handle's `defer`, and `launch_queued` (no handle).
        if i % 2 == 0 {
            launch.launch(&f.add, &cfg, args)?.defer();
        } else {
            launch.launch_queued(&f.add, &cfg, args)?;
        }
        counts.extend([ca, cb, cc]);
    }
    launch.synchronize()?;
    std::thread::sleep(Duration::from_millis(1));
    let stats = launch.stats();
    ensure!(
        counts.iter().all(|c| c.get() == 1),
        "some deleter did not run exactly once"
    );
    ensure!(
        stats.pending_guards == 0,
        "pending after synchronize: {}",
        stats.pending_guards
    );
    ensure!(
        stats.guards_released == 1500,
        "released {}",
        stats.guards_released
    );
    ensure!(
        stats.held_guards == 0 && stats.launches == 500,
        "held {}, launches {}",
        stats.held_guards,
        stats.launches
    );
    Ok(())
}

/// Argument checks fail before anything is consumed or launched.
#[test]
#[ignore = "needs a CUDA device"]
fn bad_arguments_consume_nothing() -> Result<()> {
    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let a = f.producer.clone_htod(&random(16, 1))?;
    let (ta, ca) = ready_tensor(a, Layout::contiguous(16))?;
    // Wrong count.
    let e = launch
        .launch(&f.add, &LaunchConfig::new(1, 16), [ta.into()])
        .unwrap_err();
    ensure!(e.to_string().contains("expects 7 arguments"), "{e}");
    // `ta` was a Used (owned) tensor: the failed launch released it at once (nothing launched).
    ensure!(
        ca.get() == 1,
        "owned tensor released once on a failed launch, got {}",
        ca.get()
    );
    // Block too large.
    let e = launch
        .launch(&f.spin, &LaunchConfig::new(1, 2048), [1u64.into()])
        .unwrap_err();
    ensure!(e.to_string().contains("block"), "{e}");
    ensure!(launch.stats().launches == 0, "nothing launched");
    Ok(())
}

/// The negative control for `premature_release_is_not_possible`: the same scenario, but the
/// inputs are passed as borrowed views and their memory is freed right after `launch` returns,
/// as a launcher that releases early would. The sentinel then reaches the kernel's inputs. This
/// shows that the scenario detects an early release, so the positive test is not vacuous.
#[test]
#[ignore = "needs a CUDA device"]
fn negative_control_early_free_corrupts_the_output() -> Result<()> {
    let f = fixture()?;
    let n = 1usize << 24;
    let launch = Stream::new(&f.ctx)?;
    let ha = random(n, 300);
    let hb = random(n, 400);
    let a = f.producer.clone_htod(&ha)?;
    let b = f.producer.clone_htod(&hb)?;
    let mut c = f.producer.alloc_zeros::<f32>(n)?;
    f.producer.memcpy_htod(&vec![f32::NAN; n], &mut c)?;
    f.producer.synchronize()?;
    let ptr = |s: &CudaSlice<f32>| {
        let (p, sync) = s.device_ptr(&f.producer);
        drop(sync);
        p
    };
    let (ta, _) = view(ptr(&a), n, 0)?;
    let (tb, _) = view(ptr(&b), n, 0)?;
    let (tc, _) = view(ptr(&c), n, 0)?;
    launch
        .launch(&f.spin, &LaunchConfig::new(1, 1), [200_000_000u64.into()])?
        .defer();
    let h = launch.launch(
        &f.add,
        &LaunchConfig::for_elements(n as u64, 256),
        vector_add_args(ta, tb, tc, 1, n),
    )?;
    // Free the inputs now, stream-ordered on the producer's stream, then reuse the memory.
    drop((a, b));
    let mut s1 = f.producer.alloc_zeros::<f32>(n)?;
    let mut s2 = f.producer.alloc_zeros::<f32>(n)?;
    f.producer.memcpy_htod(&vec![-7.0f32; n], &mut s1)?;
    f.producer.memcpy_htod(&vec![-7.0f32; n], &mut s2)?;
    f.producer.synchronize()?;
    h.retire()?;
    let hc = f.producer.clone_dtoh(&c)?;
    f.producer.synchronize()?;
    let wrong = (0..n).filter(|&i| hc[i] != ha[i] + hb[i]).count();
    println!("negative control: {wrong} of {n} elements wrong after an early free");
    ensure!(
        wrong > 0,
        "an early free went unnoticed: the scenario cannot detect premature release"
    );
    drop((s1, s2));
    Ok(())
}

/// The whole launch path validates each tensor's descriptor once: the check validates it, and
/// consuming, the byte count and the enqueue trust that (`Stream::check` returns the proof). A
/// descriptor changed after the check (its dtype code made one no table knows) is therefore
/// launched as checked, where a second validation would refuse it.
#[test]
#[ignore = "needs a CUDA device"]
fn each_descriptor_is_validated_once_per_launch() -> Result<()> {
    use tile_dlpack::DType;
    use tile_dlpack::dlpark::ffi::DLDataTypeCode;
    use tile_dlpack::testing::{RawTensor, TensorSpec, counted_raw};
    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let n = 4096usize;
    let (ha, hb) = (random(n, 11), random(n, 12));
    let a = f.producer.clone_htod(&ha)?;
    let b = f.producer.clone_htod(&hb)?;
    let c = f.producer.clone_htod(&vec![f32::NAN; n])?;
    f.producer.synchronize()?;
    let spec = |p: u64| TensorSpec::new(&[n as i64], DType::F32).data(p);
    let (ra, da) = counted_raw(&spec(gpu_common::address(&a)));
    let (rb, db) = counted_raw(&spec(gpu_common::address(&b)));
    let (rc, dc) = counted_raw(&spec(gpu_common::address(&c)));
    // SAFETY: fresh exports, consumed by the launch only.
    let (ua, ub, uc) = unsafe { (ra.unused(), rb.unused(), rc.unused()) };
    let args = vector_add_args(ua.into(), ub.into(), uc.into(), 1, n);
    let cfg = LaunchConfig::for_elements(n as u64, 256);
    let checked = launch.check(&f.add, &cfg, args)?;
    ensure!(checked.tensors() == 3 && checked.queue_bytes() == 0);
    for raw in [ra, rb, rc] {
        let RawTensor::Versioned(ptr) = raw else {
            bail!("a versioned export")
        };
        // SAFETY: a live, unconsumed export; nothing holds a reference into it now.
        unsafe { (*ptr).dl_tensor.dtype.code = DLDataTypeCode(200) };
    }
    let h = checked.launch()?;
    h.retire()?;
    ensure!(
        (da.get(), db.get(), dc.get()) == (1, 1, 1),
        "each deleter once"
    );
    let out = f.producer.clone_dtoh(&c)?;
    let wrong = (0..n).filter(|&i| out[i] != ha[i] + hb[i]).count();
    ensure!(wrong == 0, "{wrong} of {n} elements wrong");
    Ok(())
}

/// Borrowed tensors (`TensorArg::borrowed`, the way XLA's buffers are passed): the kernel reads
/// and writes them like consumed ones, ordered after the producer's pending write, while the
/// launch holds nothing, queues nothing and records no completion marker; their descriptors
/// (on the stack here, without a deleter) are never touched after the launch call.
#[test]
#[ignore = "needs a CUDA device"]
fn borrowed_tensors_are_launched_without_being_held() -> Result<()> {
    use tile_dlpack::Unused;
    use tile_dlpack::dlpark::DlpackFlags;
    use tile_dlpack::dlpark::ffi::{
        DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    };
    use tile_launch::TensorArg;

    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let n = 1 << 20;
    let (ha, hb) = (random(n, 71), random(n, 72));
    let mut a = f.producer.clone_htod(&ha)?;
    let b = f.producer.clone_htod(&hb)?;
    let c = f.producer.alloc_zeros::<f32>(n)?;
    f.producer.synchronize()?;
    let mut shape = [n as i64];
    let mut strides = [1i64];
    let describe = |ptr: u64, shape: *mut i64, strides: *mut i64| DLManagedTensorVersioned {
        version: DLPackVersion { major: 1, minor: 1 },
        manager_ctx: std::ptr::null_mut(),
        deleter: None,
        flags: DlpackFlags::empty(),
        dl_tensor: DLTensor {
            data: ptr as usize as *mut std::ffi::c_void,
            device: DLDevice::cuda(0),
            ndim: 1,
            dtype: DLDataType::from(tile_dlpack::DType::F32),
            shape,
            strides,
            byte_offset: 0,
        },
    };
    let cfg = LaunchConfig::for_elements(n as u64, 256);
    let before = launch.stats();
    for round in 0..2 {
        // The producer's write of `a` (a + 1 on round 1) is still pending when the launch is
        // made: `ready_on` orders the kernel after it.
        if round == 1 {
            let plus: Vec<f32> = ha.iter().map(|x| x + 1.0).collect();
            let mut a2 = f.producer.alloc_zeros::<f32>(n)?;
            f.producer.memcpy_htod(&plus, &mut a2)?;
            f.producer.memcpy_dtod(&a2, &mut a)?;
        }
        let (sp, st) = (shape.as_mut_ptr(), strides.as_mut_ptr());
        let mut ds = [
            describe(gpu_common::address(&a), sp, st),
            describe(gpu_common::address(&b), sp, st),
            describe(gpu_common::address(&c), sp, st),
        ];
        let producer = f.producer.cu_stream() as cuda_sys::CUstream;
        let [da, db, dc] = ds.each_mut().map(|d| d as *mut DLManagedTensorVersioned);
        // SAFETY: the slices outlive the synchronize below; the descriptors outlive the launch
        // call; `producer` is a live stream of this context.
        let lend = |d| unsafe { TensorArg::borrowed(Unused::from_versioned(d)).ready_on(producer) };
        let args = vector_add_args(lend(da), lend(db), lend(dc), 1, n);
        if round == 0 {
            launch.launch_queued(&f.add, &cfg, args)?;
            // A queued launch holding nothing goes past the release queue: no sequence number,
            // no completion marker (asked before the synchronisation below, which records one).
            let now = launch.stats();
            ensure!(
                now.launches == before.launches && now.markers_recorded == before.markers_recorded,
                "a launch that holds nothing used the release queue: {now:?}"
            );
        } else {
            let handle = launch.launch(&f.add, &cfg, args)?;
            ensure!(!handle.is_captured());
            handle.retire()?;
        }
        // The kernel may still run: nothing reads a descriptor after the launch call.
        for d in &mut ds {
            d.dl_tensor.data = std::ptr::null_mut();
            d.dl_tensor.ndim = -1;
        }
        std::hint::black_box(&ds);
        launch.synchronize()?;
        let got = f.producer.clone_dtoh(&c)?;
        let plus = if round == 1 { 1.0 } else { 0.0 };
        let wrong = (0..n).filter(|&i| got[i] != ha[i] + plus + hb[i]).count();
        ensure!(wrong == 0, "round {round}: {wrong} of {n} elements wrong");
    }
    let after = launch.stats();
    ensure!(
        after.pending_guards == 0
            && after.held_guards == 0
            && after.guards_released == before.guards_released,
        "a borrowed tensor was held: {after:?}"
    );
    println!("borrowed: 2 launches, {after:?}");
    Ok(())
}

/// The options of a checked launch: `hold` keeps an owner alive until the work is done (and a
/// `Checked` dropped unlaunched releases it at once, leaving `Unused` tensors to their
/// producer); `release_with` routes each consumed tensor through the caller's function;
/// `queue_guards` returns a handle that owns nothing but still waits for the launch.
#[test]
#[ignore = "needs a CUDA device"]
fn checked_launch_options_hold_release_with_and_queue_guards() -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tile_dlpack::testing::{TensorSpec, counted_tensor};
    use tile_dlpack::{DType, Used};
    use tile_launch::Guard;

    static RELEASED_WITH: AtomicUsize = AtomicUsize::new(0);
    fn release(t: Used) {
        RELEASED_WITH.fetch_add(1, Ordering::SeqCst);
        drop(t);
    }
    struct Owner(Arc<AtomicUsize>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    use std::sync::Arc;

    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let n = 1 << 20;
    let (ha, hb) = (random(n, 81), random(n, 82));
    let a = f.producer.clone_htod(&ha)?;
    let b = f.producer.clone_htod(&hb)?;
    let c = f.producer.clone_htod(&vec![f32::NAN; n])?;
    f.producer.synchronize()?;
    let spec = |p: u64| TensorSpec::new(&[n as i64], DType::F32).data(p);
    let cfg = LaunchConfig::for_elements(n as u64, 256);
    let tensors = || {
        let (ua, da) = counted_tensor(&spec(gpu_common::address(&a)));
        let (ub, db) = counted_tensor(&spec(gpu_common::address(&b)));
        let (uc, dc) = counted_tensor(&spec(gpu_common::address(&c)));
        (
            vector_add_args(ua.into(), ub.into(), uc.into(), 1, n),
            [da, db, dc],
        )
    };

    // Dropped unlaunched: the owner goes at once, the producer keeps its tensors.
    let dropped = Arc::new(AtomicUsize::new(0));
    let (args, counts) = tensors();
    let mut checked = launch.check(&f.add, &cfg, args)?;
    checked.hold([Guard::Owner(Box::new(Owner(Arc::clone(&dropped))))]);
    ensure!(checked.tensors() == 3);
    drop(checked);
    ensure!(
        dropped.load(Ordering::SeqCst) == 1,
        "the held owner was not released once"
    );
    ensure!(
        counts.iter().all(|c| c.get() == 0),
        "an unlaunched tensor was consumed"
    );

    // Launched with every option: the owner and the tensors live until the work is done, the
    // tensors are released through `release`, and the handle (owning nothing) waits.
    let held = Arc::new(AtomicUsize::new(0));
    let (args, counts) = tensors();
    let before = RELEASED_WITH.load(Ordering::SeqCst);
    let mut checked = launch.check(&f.add, &cfg, args)?;
    checked
        .hold([Guard::Owner(Box::new(Owner(Arc::clone(&held))))])
        .release_with(release)
        .queue_guards();
    let h = checked.launch()?;
    h.retire()?;
    launch.synchronize()?;
    ensure!(
        held.load(Ordering::SeqCst) == 1,
        "the held owner was not released once"
    );
    ensure!(counts.iter().all(|c| c.get() == 1), "each deleter once");
    ensure!(
        RELEASED_WITH.load(Ordering::SeqCst) - before == 3,
        "release_with saw {} tensors",
        RELEASED_WITH.load(Ordering::SeqCst) - before
    );
    let got = f.producer.clone_dtoh(&c)?;
    let wrong = (0..n).filter(|&i| got[i] != ha[i] + hb[i]).count();
    ensure!(wrong == 0, "{wrong} of {n} elements wrong");
    Ok(())
}
