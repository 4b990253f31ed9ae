//! GPU tests of prepared launches (`Stream::bind`, `BoundLaunch`) and of the release queue's
//! byte bound (a launch never waits for work already on the stream because its tensors are
//! large). Run on a machine with an NVIDIA GPU (`cargo xtask gpu-bundle`, then `run.sh`); on a
//! machine without one they are ignored, never passed.

mod gpu_common;

use std::time::Instant;

use anyhow::{Result, ensure};
use gpu_common::{Layout, random, ready_tensor, vector_add_args, view};
use tile_launch::{Error, LaunchConfig, Stream};

use gpu_common::Kernels as Fixture;

fn fixture() -> Result<Fixture> {
    gpu_common::kernels(0)
}

/// Premature release made visible, through a bound launch: the launch stream is held busy, the
/// producer's memory is freed (stream-ordered) when its deleter runs, and right after the call
/// returns the producer allocates and writes a sentinel on its own stream. The deleters must not
/// run before the kernel has, and the output must be right.
#[test]
#[ignore = "needs a CUDA device"]
fn bound_launch_keeps_tensors_until_the_kernel_ran() -> Result<()> {
    let f = fixture()?;
    let n = 1usize << 24;
    let launch = Stream::new(&f.ctx)?;
    let bound = launch.bind(&f.add, &LaunchConfig::for_elements(n as u64, 256))?;
    for trial in 0..3u64 {
        gpu_common::premature_release_trial(&f, &launch, n, 500 + trial, |args| {
            bound.launch(args)
        })?;
    }
    Ok(())
}

/// `BoundLaunch::launch_queued`: many launches with fresh tensors, each released exactly
/// once, the results right.
#[test]
#[ignore = "needs a CUDA device"]
fn bound_launch_queued_releases_each_tensor_once() -> Result<()> {
    let f = fixture()?;
    let n = 4096usize;
    let launch = Stream::new(&f.ctx)?;
    let bound = launch.bind(&f.add, &LaunchConfig::for_elements(n as u64, 256))?;
    let mut counts = Vec::new();
    let mut outputs = Vec::new();
    for i in 0..300u64 {
        let (ha, hb) = (random(n, i), random(n, i + 10_000));
        let a = f.producer.clone_htod(&ha)?;
        let b = f.producer.clone_htod(&hb)?;
        let c = f.producer.clone_htod(&vec![f32::NAN; n])?;
        let c_ptr = gpu_common::address(&c);
        let (ta, ca) = ready_tensor(a, Layout::contiguous(n))?;
        let (tb, cb) = ready_tensor(b, Layout::contiguous(n))?;
        let (tc, cc) = view(c_ptr, n, 0)?;
        bound.launch_queued(vector_add_args(ta, tb, tc, 1, n))?;
        counts.extend([ca, cb, cc]);
        outputs.push((c, ha, hb));
    }
    launch.synchronize()?;
    ensure!(
        counts.iter().all(|c| c.get() == 1),
        "some deleter did not run exactly once"
    );
    let stats = launch.stats();
    ensure!(
        (stats.guards_released, stats.pending_guards, stats.launches) == (900, 0, 300),
        "{stats:?}"
    );
    for (i, (c, ha, hb)) in outputs.iter().enumerate() {
        let hc = f.producer.clone_dtoh(c)?;
        f.producer.synchronize()?;
        let wrong = (0..n).filter(|&j| hc[j] != ha[j] + hb[j]).count();
        ensure!(wrong == 0, "launch {i}: {wrong} of {n} elements wrong");
    }
    Ok(())
}

/// A bound launch checks its arguments on every call: a refused call consumes nothing that was
/// not handed over already consumed, launches nothing, and names the argument. A bad
/// configuration is refused at bind time.
#[test]
#[ignore = "needs a CUDA device"]
fn bound_launch_checks_arguments_per_call_and_config_at_bind() -> Result<()> {
    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let n = 64usize;
    let bound = launch.bind(&f.add, &LaunchConfig::for_elements(n as u64, 64))?;
    let a = f.producer.clone_htod(&random(n, 1))?;
    let (ta, ca) = ready_tensor(a, Layout::contiguous(n))?;
    // Wrong count: refused; `ta` (handed over already consumed) released at once, once.
    let e = bound.launch([ta.into()]).unwrap_err();
    ensure!(
        matches!(e, Error::ArgumentCount { .. }),
        "want ArgumentCount, got {e:?}"
    );
    ensure!(ca.get() == 1, "released once, got {}", ca.get());
    // A scalar where a tensor is declared (argument 2): refused naming it.
    let a = f.producer.clone_htod(&random(n, 2))?;
    let c = f.producer.alloc_zeros::<f32>(n)?;
    let (ta, ca) = ready_tensor(a, Layout::contiguous(n))?;
    let (tc, cc) = view(gpu_common::address(&c), n, 0)?;
    let e = bound
        .launch([
            ta.into(),
            1i64.into(),
            7u64.into(),
            1i64.into(),
            tc.into(),
            1i64.into(),
            (n as u64).into(),
        ])
        .unwrap_err();
    ensure!(
        matches!(e, Error::ArgumentKind { index: 2, .. }),
        "want ArgumentKind at 2, got {e:?}"
    );
    ensure!(
        (ca.get(), cc.get()) == (1, 1),
        "each released exactly once: {} {}",
        ca.get(),
        cc.get()
    );
    ensure!(launch.stats().launches == 0, "nothing launched");
    // Bind time: a block over the device's limit, and more dynamic shared memory than the
    // opt-in limit.
    let e = launch
        .bind(&f.add, &LaunchConfig::new(1, 2048))
        .unwrap_err();
    ensure!(
        matches!(e, Error::InvalidConfig { .. }),
        "want InvalidConfig, got {e:?}"
    );
    let mut too_much = LaunchConfig::new(1, 64);
    too_much.shared_mem_bytes = f.ctx.limits().max_shared_mem_per_block_optin + 1;
    let e = launch.bind(&f.add, &too_much).unwrap_err();
    ensure!(
        matches!(e, Error::InvalidConfig { .. }),
        "want InvalidConfig, got {e:?}"
    );
    ensure!(launch.stats().launches == 0, "nothing launched");
    Ok(())
}

/// The byte bound scales with the device: a quarter of its memory by default.
#[test]
#[ignore = "needs a CUDA device"]
fn byte_bound_is_a_share_of_the_device() -> Result<()> {
    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let total = f.ctx.limits().total_memory;
    ensure!(total > 0, "cuDeviceTotalMem gave 0");
    ensure!(
        launch.max_pending_bytes() == total / 100 * 25,
        "bound {} for a device of {total} bytes",
        launch.max_pending_bytes()
    );
    Ok(())
}

/// A launch whose input is 4 GiB that the caller keeps owning, queued behind a 0.1 s kernel,
/// returns (launch and defer) in well under that kernel's time: a launch never waits for work
/// already on the stream because its tensors are large. The bytes are the caller's, so the
/// queue counts none of them.
#[test]
#[ignore = "needs a CUDA device"]
fn large_input_never_makes_a_launch_synchronous() -> Result<()> {
    let f = fixture()?;
    let launch = Stream::new(&f.ctx)?;
    let big_n = 1usize << 30; // 4 GiB of f32
    let n = 1usize << 20;
    let a = f.producer.alloc_zeros::<f32>(big_n)?;
    let hb = random(n, 77);
    let b = f.producer.clone_htod(&hb)?;
    let c = f.producer.clone_htod(&vec![f32::NAN; n])?;
    f.producer.synchronize()?;
    // A warm-up launch on the idle stream, so that what is timed is a launch, not the first one
    // of the kernel.
    {
        let (ta, _) = view(gpu_common::address(&b), n, 0)?;
        let (tb, _) = view(gpu_common::address(&b), n, 0)?;
        let (tc, _) = view(gpu_common::address(&c), n, 0)?;
        launch
            .launch(
                &f.add,
                &LaunchConfig::for_elements(n as u64, 256),
                vector_add_args(ta, tb, tc, 1, n),
            )?
            .retire()?;
    }
    for round in 0..2 {
        let t0 = Instant::now();
        launch
            .launch(&f.spin, &LaunchConfig::new(1, 1), [100_000_000u64.into()])?
            .defer();
        let t1 = Instant::now();
        // Round 0 through a handle that is deferred, round 1 straight into the queue.
        let (ta, ca) = view(gpu_common::address(&a), big_n, 0)?;
        let (tb, cb) = view(gpu_common::address(&b), n, 0)?;
        let (tc, cc) = view(gpu_common::address(&c), n, 0)?;
        let args = vector_add_args(ta, tb, tc, 1, n);
        let cfg = LaunchConfig::for_elements(n as u64, 256);
        if round == 0 {
            launch.launch(&f.add, &cfg, args)?.defer();
        } else {
            launch.launch_queued(&f.add, &cfg, args)?;
        }
        let launched = t1.elapsed();
        let pending_bytes = launch.stats().pending_bytes;
        launch.synchronize()?;
        let kernel = t0.elapsed();
        println!(
            "round {round}: launch of a 4 GiB input behind a 0.1 s kernel returned in {:?}; the \
             stream finished after {kernel:?}",
            launched
        );
        ensure!(
            launched < kernel / 10,
            "round {round}: the launch took {launched:?}, the kernel ahead of it {kernel:?}"
        );
        ensure!(
            pending_bytes == 0,
            "the caller's bytes are not the queue's: {pending_bytes}"
        );
        ensure!(
            (ca.get(), cb.get(), cc.get()) == (1, 1, 1),
            "round {round}: released once after synchronize"
        );
    }
    let hc = f.producer.clone_dtoh(&c)?;
    f.producer.synchronize()?;
    let wrong = (0..n).filter(|&i| hc[i] != hb[i]).count();
    ensure!(wrong == 0, "{wrong} of {n} elements wrong (c = 0 + b)");
    Ok(())
}
