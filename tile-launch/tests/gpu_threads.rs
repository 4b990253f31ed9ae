//! GPU tests of the core promise across threads and contexts: thread-relative stream handles
//! (the legacy and the per-thread default stream) retired, polled and synchronised from other
//! threads, deleters run with the stream's context current, and the caller's current context
//! left as it was. Run by the GPU bundle; ignored, never passed, without a GPU.

mod gpu_common;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use cuda_sys::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, CUcontext, CUstream};
use cudarc::driver::{CudaSlice, DevicePtr};
use gpu_common::{Count, current_context_raw as current, random, vector_add_args, view};
use tile_launch::{Context, LaunchConfig, Stream};

const N: usize = 1 << 20;
/// How long the spin kernel holds the launch stream, in nanoseconds.
const SPIN_NS: u64 = 800_000_000;

use gpu_common::Kernels as Fixture;

fn fixture() -> Result<Fixture> {
    fixture_on(0)
}

fn fixture_on(ordinal: i32) -> Result<Fixture> {
    gpu_common::kernels(ordinal)
}

/// Inputs whose deleters free their memory (stream-ordered on the producer stream), an output
/// poisoned with NaN that the test keeps, and the expected sums.
struct Case {
    a: gpu_common::Count,
    b: gpu_common::Count,
    c_count: Count,
    c: CudaSlice<f32>,
    expected: Vec<f32>,
}

type Args = [tile_launch::Arg<'static>; 7];

/// A case and its launch arguments (which stay on the thread that made them: not `Send`).
fn case(f: &Fixture, seed: u64) -> Result<(Case, Args)> {
    case_with(f, seed, true)
}

/// [`case`]; with `ordered` false, the producer stream is synchronised instead of the tensors
/// being made ready on it.
fn case_with(f: &Fixture, seed: u64, ordered: bool) -> Result<(Case, Args)> {
    let ha = random(N, seed);
    let hb = random(N, seed + 1);
    let a = f.producer.clone_htod(&ha)?;
    let b = f.producer.clone_htod(&hb)?;
    let mut c = f.producer.alloc_zeros::<f32>(N)?;
    f.producer.memcpy_htod(&vec![f32::NAN; N], &mut c)?;
    let c_ptr = {
        let (p, s) = c.device_ptr(&f.producer);
        drop(s);
        p
    };
    let producer = f.producer.cu_stream() as CUstream;
    let (ta, ca) = gpu_common::owned_tensor(a, f.ordinal)?;
    let (tb, cb) = gpu_common::owned_tensor(b, f.ordinal)?;
    let (tc, cc) = view(c_ptr, N, f.ordinal)?;
    let (ta, tb, tc) = if ordered {
        // SAFETY: the producer stream is kept alive by the fixture for the whole test; the
        // inputs' uploads and `c`'s poisoning are pending there, and the launch is ordered
        // after them.
        unsafe {
            (
                ta.ready_on(producer),
                tb.ready_on(producer),
                tc.ready_on(producer),
            )
        }
    } else {
        f.producer.synchronize()?;
        (ta, tb, tc)
    };
    Ok((
        Case {
            a: ca,
            b: cb,
            c_count: cc,
            c,
            expected: ha.iter().zip(&hb).map(|(x, y)| x + y).collect(),
        },
        vector_add_args(ta, tb, tc, 1, N),
    ))
}

impl Case {
    fn counts(&self) -> (usize, usize, usize) {
        (self.a.get(), self.b.get(), self.c_count.get())
    }

    /// Right after the launch: the producer allocates and writes a sentinel where the inputs
    /// were, as a caching allocator would hand their memory out again once freed.
    fn reuse_freed_memory(f: &Fixture) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        let mut s1 = f.producer.alloc_zeros::<f32>(N)?;
        let mut s2 = f.producer.alloc_zeros::<f32>(N)?;
        f.producer.memcpy_htod(&vec![-7.0f32; N], &mut s1)?;
        f.producer.memcpy_htod(&vec![-7.0f32; N], &mut s2)?;
        Ok((s1, s2))
    }

    fn wrong(&self, f: &Fixture) -> Result<usize> {
        let hc = f.producer.clone_dtoh(&self.c)?;
        f.producer.synchronize()?;
        Ok((0..N).filter(|&i| hc[i] != self.expected[i]).count())
    }
}

/// 1(a): a launch on the per-thread default stream from a worker thread, behind an 800 ms
/// kernel, retired (and polled, queried) from the main thread. Nothing may be released before
/// the kernel has finished, and every output must be right.
#[test]
#[ignore = "needs a CUDA device"]
fn per_thread_stream_launch_retired_from_another_thread() -> Result<()> {
    let f = Arc::new(fixture()?);
    // SAFETY: the per-thread default stream is always valid in its context.
    let stream = unsafe { Stream::from_raw(&f.ctx, CU_STREAM_PER_THREAD) }?;
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let worker = {
        let (f, stream) = (Arc::clone(&f), stream.clone());
        std::thread::spawn(move || -> Result<()> {
            let (c, args) = case(&f, 11)?;
            stream
                .launch(&f.spin, &LaunchConfig::new(1, 1), [SPIN_NS.into()])?
                .defer();
            let h = stream.launch(&f.add, &LaunchConfig::for_elements(N as u64, 256), args)?;
            tx.send((c, h, Instant::now()))
                .map_err(|_| anyhow::anyhow!("main thread gone"))?;
            // Stay alive until the main thread is done with this thread's stream.
            let _ = done_rx.recv_timeout(Duration::from_secs(60));
            Ok(())
        })
    };
    let (c, h, launched) = rx.recv_timeout(Duration::from_secs(60))?;
    let reused = Case::reuse_freed_memory(&f)?;
    f.producer.synchronize()?;
    for _ in 0..100 {
        stream.poll();
    }
    ensure!(
        !h.is_complete()?,
        "the 800 ms kernel should still be running"
    );
    ensure!(
        c.counts() == (0, 0, 0),
        "released while the kernel runs: {:?}",
        c.counts()
    );
    h.retire()?;
    let after = launched.elapsed();
    ensure!(
        c.counts() == (1, 1, 1),
        "deleters after retire: {:?}",
        c.counts()
    );
    ensure!(
        after >= Duration::from_millis(700),
        "retire returned {after:?} after the launch, before the 800 ms kernel could finish"
    );
    let wrong = c.wrong(&f)?;
    ensure!(wrong == 0, "{wrong} of {N} outputs wrong");
    ensure!(
        stream.stats().guards_leaked == 0,
        "leaked: {:?}",
        stream.stats()
    );
    done_tx.send(())?;
    worker.join().expect("worker panicked")?;
    drop(reused);
    println!(
        "per-thread stream, retired from another thread: released {after:?} after the launch, \
         {wrong} of {N} wrong"
    );
    Ok(())
}

/// 1(a), deferred: launches deferred on the per-thread stream by two workers, then
/// `Stream::synchronize` from the main thread must wait for both workers' kernels, not for the
/// main thread's own (idle) per-thread stream.
#[test]
#[ignore = "needs a CUDA device"]
fn per_thread_stream_synchronize_waits_for_every_thread() -> Result<()> {
    let f = Arc::new(fixture()?);
    // SAFETY: the per-thread default stream is always valid in its context.
    let stream = unsafe { Stream::from_raw(&f.ctx, CU_STREAM_PER_THREAD) }?;
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let done_rx = Arc::new(std::sync::Mutex::new(done_rx));
    let mut workers = Vec::new();
    for seed in [21, 31] {
        let (f, stream, tx, done_rx) = (
            Arc::clone(&f),
            stream.clone(),
            tx.clone(),
            Arc::clone(&done_rx),
        );
        workers.push(std::thread::spawn(move || -> Result<()> {
            let (c, args) = case(&f, seed)?;
            stream.launch_queued(&f.spin, &LaunchConfig::new(1, 1), [SPIN_NS.into()])?;
            stream.launch_queued(&f.add, &LaunchConfig::for_elements(N as u64, 256), args)?;
            tx.send((c, Instant::now()))
                .map_err(|_| anyhow::anyhow!("main thread gone"))?;
            let _ = done_rx
                .lock()
                .expect("lock")
                .recv_timeout(Duration::from_secs(60));
            Ok(())
        }));
    }
    // Only the workers hold senders now: a worker that fails ends the wait instead of hanging.
    drop(tx);
    let (c1, l1) = rx.recv_timeout(Duration::from_secs(60))?;
    let (c2, l2) = rx.recv_timeout(Duration::from_secs(60))?;
    let (cases, launched) = ([c1, c2], [l1, l2]);
    let reused = Case::reuse_freed_memory(&f)?;
    f.producer.synchronize()?;
    stream.poll();
    for c in &cases {
        ensure!(
            c.counts() == (0, 0, 0),
            "released while the kernels run: {:?}",
            c.counts()
        );
    }
    stream.synchronize()?;
    let waited = launched
        .iter()
        .map(Instant::elapsed)
        .min()
        .unwrap_or_default();
    ensure!(
        waited >= Duration::from_millis(700),
        "synchronize returned {waited:?} after the launches"
    );
    for c in &cases {
        ensure!(
            c.counts() == (1, 1, 1),
            "after synchronize: {:?}",
            c.counts()
        );
        let wrong = c.wrong(&f)?;
        ensure!(wrong == 0, "{wrong} of {N} outputs wrong");
    }
    for _ in &workers {
        done_tx.send(())?;
    }
    for w in workers {
        w.join().expect("worker panicked")?;
    }
    drop(reused);
    ensure!(
        stream.stats().guards_leaked == 0,
        "leaked: {:?}",
        stream.stats()
    );
    println!("per-thread stream, two workers, synchronize from main: waited {waited:?}");
    Ok(())
}

/// 1(b) and 4(a): a launch on the legacy default stream (null and `CU_STREAM_LEGACY`), retired
/// from a fresh thread that has no current context. The wait must not fail for want of a
/// context, nothing may leak, the deleters (a `cudarc` buffer's free among them) must succeed,
/// and the fresh thread must still have no current context afterwards.
#[test]
#[ignore = "needs a CUDA device"]
fn legacy_stream_retired_from_a_thread_without_context() -> Result<()> {
    let f = fixture()?;
    for raw in [std::ptr::null_mut(), CU_STREAM_LEGACY] {
        // SAFETY: the legacy default stream is always valid in its context.
        let stream = unsafe { Stream::from_raw(&f.ctx, raw) }?;
        let (c, args) = case(&f, 41)?;
        // A moved-in `cudarc` buffer: its deleter frees it through cudarc (needs a context).
        let moved = f.producer.alloc_zeros::<f32>(N)?;
        let moved = tile_launch::cudarc_interop::tensor(moved)?;
        stream.launch_queued(&f.spin, &LaunchConfig::new(1, 1), [SPIN_NS.into()])?;
        let h = stream.launch(&f.add, &LaunchConfig::for_elements(N as u64, 256), args)?;
        let launched = Instant::now();
        let (retired, ctx_after) = std::thread::spawn(move || -> Result<_> {
            ensure!(current()?.is_null(), "a fresh thread has no context");
            let r = h.retire();
            Ok((r.map(|_| ()), current()?.is_null()))
        })
        .join()
        .expect("retiring thread panicked")?;
        retired?;
        ensure!(
            ctx_after,
            "retire left a context current on a thread that had none"
        );
        ensure!(
            launched.elapsed() >= Duration::from_millis(700),
            "retired before the kernel could finish"
        );
        ensure!(c.counts() == (1, 1, 1), "deleters: {:?}", c.counts());
        let wrong = c.wrong(&f)?;
        ensure!(wrong == 0, "{wrong} of {N} outputs wrong");
        // Deferred work on the legacy stream, polled and synchronised from fresh threads; a
        // moved-in cudarc buffer rides along, whose deleter frees it through cudarc (which
        // needs a current context, and keeps the error of a failed free).
        let scratch_b = f.producer.alloc_zeros::<f32>(N)?;
        let scratch_c = f.producer.alloc_zeros::<f32>(N)?;
        f.producer.synchronize()?;
        let (tb, nb) = view(gpu_common::address(&scratch_b), N, 0)?;
        let (tc, nc) = view(gpu_common::address(&scratch_c), N, 0)?;
        let released_before = stream.stats().guards_released;
        stream.launch_queued(&f.spin, &LaunchConfig::new(1, 1), [SPIN_NS.into()])?;
        stream.launch_queued(
            &f.add,
            &LaunchConfig::for_elements(N as u64, 256),
            vector_add_args(moved, tb, tc, 1, N),
        )?;
        let s2 = stream.clone();
        std::thread::spawn(move || s2.poll()).join().expect("poll");
        ensure!(
            (nb.get(), nc.get()) == (0, 0),
            "released while the kernel runs"
        );
        let s3 = stream.clone();
        std::thread::spawn(move || -> Result<()> {
            s3.synchronize()?;
            ensure!(current()?.is_null(), "synchronize left a context current");
            Ok(())
        })
        .join()
        .expect("synchronize thread panicked")?;
        ensure!((nb.get(), nc.get()) == (1, 1), "after synchronize");
        ensure!(
            stream.stats().guards_released >= released_before + 3,
            "the moved buffer's guard was not released: {:?}",
            stream.stats()
        );
        // A free that failed for want of a context would be kept here.
        f.cu.check_err()?;
        drop((scratch_b, scratch_c));
        let stats = stream.stats();
        ensure!(
            stats.guards_leaked == 0 && stats.errors == 0,
            "legacy stream {raw:?}: {stats:?}"
        );
        println!("legacy stream {raw:?}: retired and synchronised from fresh threads, {stats:?}");
    }
    Ok(())
}

/// 4(b): the caller's own context (a non-primary context, made with `cuCtxCreate`) is current
/// during launch, retire and synchronise; it must still be current after each call, and the
/// launch must still use the stream's context.
#[test]
#[ignore = "needs a CUDA device"]
fn caller_context_is_left_current() -> Result<()> {
    let f = fixture()?;
    // Destroyed when dropped, at the end of the test.
    let mine = gpu_common::non_primary_context(0)?;
    let own = mine.cu_ctx() as CUcontext;
    ensure!(
        current()? == own,
        "cuCtxCreate makes the new context current"
    );
    let stream = Stream::new(&f.ctx)?;
    ensure!(current()? == own, "Stream::new changed the current context");
    let (c, args) = case(&f, 51)?;
    // cudarc calls in `case` bind cudarc's context: put ours back.
    gpu_common::set_current_context(own)?;
    let h = stream.launch(&f.add, &LaunchConfig::for_elements(N as u64, 256), args)?;
    ensure!(current()? == own, "launch changed the current context");
    h.retire()?;
    ensure!(current()? == own, "retire changed the current context");
    stream.launch_queued(&f.spin, &LaunchConfig::new(1, 1), [1_000_000u64.into()])?;
    stream.synchronize()?;
    ensure!(current()? == own, "synchronize changed the current context");
    ensure!(c.counts() == (1, 1, 1), "deleters: {:?}", c.counts());
    let wrong = c.wrong(&f)?;
    ensure!(wrong == 0, "{wrong} of {N} outputs wrong");
    println!(
        "caller's non-primary context left current by Stream::new, launch, retire, synchronize"
    );
    Ok(())
}

/// The capture status of `stream` (`cuStreamIsCapturing` with its context bound).
fn capture_status(stream: &Stream) -> Result<cuda_sys::CUstreamCaptureStatus> {
    let _bound = stream.context().bind()?;
    gpu_common::capture_status(stream.raw())
}

/// 3(a): a tensor whose data is ready on a stream outside the capture, launched into a
/// capturing stream, is refused before anything is enqueued; the capture stays active, ends,
/// and its graph (with the launches captured before and after) replays with the right results.
#[test]
#[ignore = "needs a CUDA device"]
fn capture_refuses_a_producer_outside_the_capture() -> Result<()> {
    use cuda_sys::CUstreamCaptureStatus as S;
    let f = fixture()?;
    let stream = Stream::new(&f.ctx)?;
    let (c, args) = case(&f, 71)?;
    let out = f.producer.alloc_zeros::<f32>(N)?;
    let (c_addr, out_addr) = (gpu_common::address(&c.c), gpu_common::address(&out));
    f.producer.synchronize()?;
    let capture = stream.begin_capture(tile_launch::CaptureMode::Global)?;
    // A launch the graph keeps (no tensors).
    stream
        .launch(&f.spin, &LaunchConfig::new(1, 1), [1_000u64.into()])?
        .defer();
    let refused = stream.launch(&f.add, &LaunchConfig::for_elements(N as u64, 256), args);
    let index = match refused {
        Err(tile_launch::Error::ProducerOutsideCapture { index }) => index,
        Err(e) => anyhow::bail!("wrong error: {e}"),
        Ok(_) => anyhow::bail!("a launch ordered after a stream outside the capture was accepted"),
    };
    ensure!(index == 0, "refused argument {index}, want 0");
    ensure!(
        capture_status(&stream)? == S::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        "the refused launch disturbed the capture"
    );
    // The same data, made ready before: accepted into the capture.
    let (ta, na) = view(c_addr, N, 0)?;
    let (tb, nb) = view(c_addr, N, 0)?;
    let (tc, nc) = view(out_addr, N, 0)?;
    stream
        .launch(
            &f.add,
            &LaunchConfig::for_elements(N as u64, 256),
            vector_add_args(ta, tb, tc, 1, N),
        )?
        .defer();
    let graph = capture.end()?;
    let exec = graph.instantiate()?;
    // Fill c with 1.0 so the graph's add writes 2.0 everywhere.
    let mut c_slice = c.c;
    f.producer.memcpy_htod(&vec![1.0f32; N], &mut c_slice)?;
    f.producer.synchronize()?;
    exec.launch(&stream)?;
    stream.synchronize()?;
    let host = f.producer.clone_dtoh(&out)?;
    f.producer.synchronize()?;
    let wrong = host.iter().filter(|&&x| x != 2.0).count();
    ensure!(wrong == 0, "{wrong} of {N} wrong after replay");
    // The refused launch's own tensors were released (nothing uses them), exactly once.
    ensure!(
        (c.a.get(), c.b.get(), c.c_count.get()) == (1, 1, 1),
        "refused launch's deleters: {:?}",
        (c.a.get(), c.b.get(), c.c_count.get())
    );
    drop((exec, graph));
    na.expect_eventually(1, "captured tensor a")?;
    nb.expect_eventually(1, "captured tensor b")?;
    nc.expect_eventually(1, "captured tensor c")?;
    println!("capture: producer outside refused (argument {index}), capture intact, replay right");
    Ok(())
}

/// 1(b), 4(a) and 4(b) on two GPUs: device 1's legacy and per-thread default streams, launched
/// while device 0's context is current on the launching thread, retired from a fresh thread.
/// The launch must run on device 1, nothing may be released early, the fresh thread must end
/// with no context current, and device 0's context must still be current on the launching one.
#[test]
#[ignore = "needs a CUDA device"]
fn default_streams_of_device_1_with_device_0_current() -> Result<()> {
    let n = Context::device_count()?;
    if n < 2 {
        println!("skipped: needs two GPUs (found {n})");
        return Ok(());
    }
    let f0 = fixture_on(0)?;
    let f1 = fixture_on(1)?;
    for raw in [std::ptr::null_mut(), CU_STREAM_LEGACY, CU_STREAM_PER_THREAD] {
        // SAFETY: the default streams are always valid in their context.
        let stream = unsafe { Stream::from_raw(&f1.ctx, raw) }?;
        let (c, args) = case(&f1, 81)?;
        let outer = f0.ctx.bind()?;
        let dev0 = current()?;
        ensure!(dev0 == f0.ctx.raw(), "device 0's context is current");
        stream
            .launch(&f1.spin, &LaunchConfig::new(1, 1), [SPIN_NS.into()])?
            .defer();
        let h = stream.launch(&f1.add, &LaunchConfig::for_elements(N as u64, 256), args)?;
        ensure!(current()? == dev0, "launch changed the current context");
        let launched = Instant::now();
        let ctx_after = std::thread::spawn(move || -> Result<bool> {
            h.retire()?;
            Ok(current()?.is_null())
        })
        .join()
        .expect("retiring thread panicked")?;
        ensure!(ctx_after, "retire left a context current on a fresh thread");
        ensure!(
            launched.elapsed() >= Duration::from_millis(700),
            "{raw:?}: retired before the kernel could finish"
        );
        ensure!(
            c.counts() == (1, 1, 1),
            "{raw:?}: deleters {:?}",
            c.counts()
        );
        stream.synchronize()?;
        ensure!(
            current()? == dev0,
            "synchronize changed the current context"
        );
        drop(outer);
        let wrong = c.wrong(&f1)?;
        ensure!(wrong == 0, "{raw:?}: {wrong} of {N} wrong");
        f1.cu.check_err()?;
        println!(
            "device 1 stream {raw:?} with device 0 current: retired on a fresh thread, {wrong} wrong"
        );
    }
    Ok(())
}

/// Short-lived threads (a thread pool's turnover) launching on one per-thread default stream:
/// each retires its own launch; the stream's totals count every launch and release exactly once
/// (the queues of finished threads are dropped once idle, their totals kept).
#[test]
#[ignore = "needs a CUDA device"]
fn per_thread_stream_many_short_lived_threads() -> Result<()> {
    let f = Arc::new(fixture()?);
    // SAFETY: the per-thread default stream is always valid in its context.
    let stream = unsafe { Stream::from_raw(&f.ctx, CU_STREAM_PER_THREAD) }?;
    let threads = 8;
    for seed in 0..threads {
        let (f, stream) = (Arc::clone(&f), stream.clone());
        std::thread::spawn(move || -> Result<()> {
            let (c, args) = case(&f, 100 + seed)?;
            stream
                .launch(&f.add, &LaunchConfig::for_elements(N as u64, 256), args)?
                .retire()?;
            ensure!(c.counts() == (1, 1, 1), "deleters: {:?}", c.counts());
            let wrong = c.wrong(&f)?;
            ensure!(wrong == 0, "{wrong} of {N} wrong");
            Ok(())
        })
        .join()
        .expect("thread panicked")?;
    }
    let stats = stream.stats();
    ensure!(
        stats.launches == threads
            && stats.guards_released == 3 * threads
            && stats.guards_leaked == 0,
        "{stats:?}"
    );
    println!("per-thread stream, {threads} short-lived threads: {stats:?}");
    Ok(())
}

/// Joins `worker` within `limit`, or says it did not end (the thread is then left running).
fn join_within<T: Send + 'static>(
    worker: std::thread::JoinHandle<T>,
    limit: Duration,
) -> Option<std::thread::Result<T>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(worker.join());
    });
    rx.recv_timeout(limit).ok()
}

/// A worker launches on its per-thread default stream, behind an 800 ms kernel, and returns
/// before the work completes; the main thread then retires the launch. The worker's exit must
/// return without waiting for the GPU, nothing may be released before the kernel finished, and
/// the outputs must be right.
///
/// The tensors are not ordered after another stream here: with driver 580 (CUDA 13.0), a thread
/// whose per-thread default stream holds a `cuStreamWaitEvent` behind running work never
/// finishes exiting (the driver's exit handler spins), with plain driver calls and no tile code
/// (spin kernel, `cuEventRecord` on another stream, `cuStreamWaitEvent` on the per-thread
/// stream, return). See the per-thread default stream notes on `Stream::from_raw`.
#[test]
#[ignore = "needs a CUDA device"]
fn per_thread_stream_worker_exits_before_retire() -> Result<()> {
    let f = Arc::new(fixture()?);
    // SAFETY: the per-thread default stream is always valid in its context.
    let stream = unsafe { Stream::from_raw(&f.ctx, CU_STREAM_PER_THREAD) }?;
    let worker = {
        let (f, stream) = (Arc::clone(&f), stream.clone());
        std::thread::spawn(move || -> Result<_> {
            let (c, args) = case_with(&f, 61, false)?;
            stream
                .launch(&f.spin, &LaunchConfig::new(1, 1), [SPIN_NS.into()])?
                .defer();
            let start = Instant::now();
            let h = stream.launch(&f.add, &LaunchConfig::for_elements(N as u64, 256), args)?;
            Ok((c, h, start.elapsed(), Instant::now()))
        })
    };
    let joining = Instant::now();
    let Some(joined) = join_within(worker, Duration::from_secs(10)) else {
        // Do not wait for the stream's work in its drop: it may never finish.
        std::mem::forget(stream);
        std::mem::forget(f);
        anyhow::bail!("the worker's exit did not return within 10 s");
    };
    let (c, h, launch_took, launched) = joined.expect("worker panicked")?;
    let join_took = joining.elapsed();
    let reused = Case::reuse_freed_memory(&f)?;
    ensure!(c.counts() == (0, 0, 0), "released early: {:?}", c.counts());
    h.retire()?;
    let after = launched.elapsed();
    ensure!(c.counts() == (1, 1, 1), "deleters: {:?}", c.counts());
    ensure!(
        after >= Duration::from_millis(600),
        "retired only {after:?} after the launch behind an 800 ms kernel"
    );
    // The add's launch is asynchronous: it returns long before the 800 ms kernel ahead of it.
    ensure!(
        launch_took < Duration::from_millis(100),
        "the launch behind the 800 ms kernel took {launch_took:?}"
    );
    let wrong = c.wrong(&f)?;
    ensure!(wrong == 0, "{wrong} of {N} outputs wrong");
    drop(reused);
    println!(
        "per-thread stream of an exited worker: launch {launch_took:?}, join {join_took:?}, \
         retired {after:?} after launch, {wrong} wrong"
    );
    Ok(())
}

/// The first launch of a kernel, onto a stream held busy by an 800 ms kernel, returns without
/// waiting for it: the kernel was loaded into the context when it was looked up, so the launch
/// does not load a module (which waits for the context's running work).
#[test]
#[ignore = "needs a CUDA device"]
fn first_launch_does_not_wait_for_the_busy_stream() -> Result<()> {
    let f = fixture()?;
    let stream = Stream::new(&f.ctx)?;
    stream
        .launch(&f.spin, &LaunchConfig::new(1, 1), [SPIN_NS.into()])?
        .defer();
    let (c, args) = case(&f, 71)?;
    let start = Instant::now();
    let h = stream.launch(&f.add, &LaunchConfig::for_elements(N as u64, 256), args)?;
    let took = start.elapsed();
    ensure!(c.counts() == (0, 0, 0), "released early: {:?}", c.counts());
    h.retire()?;
    let total = start.elapsed();
    ensure!(c.counts() == (1, 1, 1), "deleters: {:?}", c.counts());
    ensure!(c.wrong(&f)? == 0, "outputs wrong");
    ensure!(
        took * 8 < total,
        "the first launch took {took:?} of the {total:?} until its work finished"
    );
    println!("first launch onto a busy stream: returned after {took:?}, work done after {total:?}");
    Ok(())
}
