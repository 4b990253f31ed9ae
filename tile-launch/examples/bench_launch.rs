//! Launch-overhead benchmark (Rust side): a 4096-element float32 vector add with three tensor
//! arguments, per launch, on one stream.
//!
//! Measures, in one process: the raw `cuLaunchKernel` loop through `cuda-sys` (the floor), the
//! raw `cuLaunchKernelEx` loop, DLPack export alone (three tensors made and released), and
//! `tile-launch` with three DLPack tensors and deferred release (`Stream::launch_queued`; also
//! `launch` then `LaunchHandle::defer`), and with `retire` after every launch; then the release latency (kernel completion to deleters run, while launching), and
//! a scale run (1,000,000 deferred launches with producers that free on release).
//!
//! Two timings, both reported:
//!
//! - **Burst** (host cost): bursts of `--burst` launches (default 64) timed with no sync inside,
//!   the stream synchronised, untimed, between bursts, so the launch queue never fills; per
//!   path the median over `--rounds` interleaved rounds of `--bursts` bursts each (the path
//!   order rotates every round, so drift hits every path alike). Paths: raw `cuLaunchKernel`,
//!   tile-launch deferred (3 DLPack tensors, their export included), retired, 7 scalars, and
//!   prepared (a [`BoundLaunch`](tile_launch::BoundLaunch), deferred).
//! - **Saturated**: host time from the first enqueue to the end of a stream synchronisation,
//!   over `--launches` launches after `--warmup` launches, median of `--reps` repetitions; once
//!   the queue is full this measures how fast the GPU retires tiny kernels.
//!
//! Never on zeros: inputs are random. Prints a table; writes all figures as JSON to `--out` (a
//! file), with the ratio `burst.rust_vs_raw` (tile-launch deferred ÷ raw `cuLaunchKernel`,
//! burst mode). It asserts no time.
//!
//! Run: `cargo run --release -p tile-launch --features nvrtc --example bench_launch -- --out r.json`

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use cuda_sys::{CUdeviceptr, CUfunction, CUlaunchConfig, CuResultExt, driver};
use tile_launch::{Arg, Context, Kernel, LaunchConfig, Library, ReleaseConfig, Stream};

const KERNELS: &str = include_str!("../kernels/vector_add.cu");
#[path = "common/mod.rs"]
mod common;

use common::{N, raw_pointer_signature, tensor, vector_add_signature};

struct Opts {
    launches: usize,
    warmup: usize,
    reps: usize,
    scale: usize,
    burst: usize,
    bursts: usize,
    rounds: usize,
    out: Option<String>,
}

fn opts() -> Result<Opts> {
    let mut o = Opts {
        launches: 20_000,
        warmup: 2_000,
        reps: 5,
        scale: 1_000_000,
        burst: 64,
        bursts: 50,
        rounds: 20,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().context("missing value");
        match a.as_str() {
            "--launches" => o.launches = val()?.parse()?,
            "--warmup" => o.warmup = val()?.parse()?,
            "--reps" => o.reps = val()?.parse()?,
            "--scale" => o.scale = val()?.parse()?,
            "--burst" => o.burst = val()?.parse()?,
            "--bursts" => o.bursts = val()?.parse()?,
            "--rounds" => o.rounds = val()?.parse()?,
            "--out" => o.out = Some(val()?),
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(o)
}

fn main() -> std::process::ExitCode {
    if let Err(e) = driver() {
        eprintln!("bench_launch: {e}");
        return std::process::ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_launch: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Device buffers for a, b, c, filled with random values.
struct Buffers {
    a: CUdeviceptr,
    b: CUdeviceptr,
    c: CUdeviceptr,
}

fn buffers() -> Result<Buffers> {
    let d = driver()?;
    let alloc = || -> Result<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; a context is current.
        unsafe { (d.cuMemAlloc)(&mut p, N * 4) }.check("cuMemAlloc")?;
        Ok(p)
    };
    let (a, b, c) = (alloc()?, alloc()?, alloc()?);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for p in [a, b] {
        let host: Vec<f32> = (0..N)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect();
        // SAFETY: `host` holds N floats; `p` is an allocation of N floats.
        unsafe { (d.cuMemcpyHtoD)(p, host.as_ptr().cast(), N * 4) }.check("cuMemcpyHtoD")?;
    }
    Ok(Buffers { a, b, c })
}

/// Counts deleter calls (and, for the latency run, stamps the time of the first).
struct Owner {
    count: Arc<AtomicUsize>,
    stamp: Option<Arc<AtomicU64>>,
    _payload: Vec<u8>,
    origin: Instant,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(s) = &self.stamp {
            s.store(self.origin.elapsed().as_nanos() as u64, Ordering::SeqCst);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

/// When the host function after a sampled launch ran (ns since `.1`).
type CompletionStamp = (AtomicU64, Instant);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One measured path: its loop body and how to wait for its work.
struct Path<'a> {
    name: &'static str,
    body: Box<dyn FnMut() -> Result<()> + 'a>,
    sync: Box<dyn FnMut() -> Result<()> + 'a>,
    us: Vec<f64>,
}

/// Runs every path `reps` times, interleaved (the path order rotates each repetition so that
/// drift over the run favours no path). Each run: `warmup` iterations, a sync, then `launches`
/// iterations timed from the first enqueue to the end of a sync.
fn measure(o: &Opts, paths: &mut [Path<'_>]) -> Result<()> {
    for rep in 0..o.reps {
        for k in 0..paths.len() {
            let n = paths.len();
            let p = &mut paths[(k + rep) % n];
            for _ in 0..o.warmup {
                (p.body)()?;
            }
            (p.sync)()?;
            let t = Instant::now();
            for _ in 0..o.launches {
                (p.body)()?;
            }
            (p.sync)()?;
            p.us.push(t.elapsed().as_secs_f64() * 1e6 / o.launches as f64);
        }
    }
    Ok(())
}

/// Burst mode: `rounds` interleaved rounds (the path order rotates each round); in each, per
/// path, one untimed warm-up burst, then `bursts` bursts of `burst` launches, each timed from
/// the first enqueue to the return of the last launch (no sync inside), with the stream
/// synchronised, untimed, after each. Pushes µs per launch of every burst into `us`.
fn measure_bursts(o: &Opts, paths: &mut [Path<'_>]) -> Result<()> {
    let burst = o.burst.max(1);
    for round in 0..o.rounds {
        for k in 0..paths.len() {
            let n = paths.len();
            let p = &mut paths[(k + round) % n];
            for _ in 0..burst {
                (p.body)()?;
            }
            (p.sync)()?;
            for _ in 0..o.bursts {
                let t = Instant::now();
                for _ in 0..burst {
                    (p.body)()?;
                }
                let us = t.elapsed().as_secs_f64() * 1e6 / burst as f64;
                (p.sync)()?;
                p.us.push(us);
            }
        }
    }
    Ok(())
}

/// Host time per call of `f`, in nanoseconds (median of 5 runs of 100,000 calls).
fn ns_per_call(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut v = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..100_000 {
            f()?;
        }
        v.push(t.elapsed().as_secs_f64() * 1e9 / 100_000.0);
    }
    Ok(median(v))
}

fn run() -> Result<()> {
    let o = opts()?;
    let d = driver()?;
    let ctx = Context::new(0)?;
    let _bound = ctx.bind()?;
    let stream = Stream::with_config(&ctx, ReleaseConfig::default())?;
    let lib = Library::from_cuda_source(KERNELS, &[])?;
    let add: Kernel = lib.kernel("vector_add", vector_add_signature())?;
    // The same kernel with its pointers declared as plain 64-bit scalars: a launch through
    // tile-launch that consumes no tensor, to separate the fixed cost from the tensors' cost.
    let add_raw_ptrs: Kernel = lib.kernel("vector_add", raw_pointer_signature())?;
    let buf = buffers()?;
    let cfg = LaunchConfig::for_elements(N as u64, 256);
    let grid = cfg.grid.x;
    let raw = stream.raw();
    let sync = || -> Result<()> {
        // SAFETY: `raw` is a live stream.
        unsafe { (d.cuStreamSynchronize)(raw) }.check("cuStreamSynchronize")?;
        Ok(())
    };

    // Paths: raw floors (no ownership), DLPack export alone, tile-launch deferred and retired.
    let (mut pa, mut pb, mut pc) = (buf.a, buf.b, buf.c);
    let (mut one, mut n) = (1i64, N as u64);
    let mut params: [*mut c_void; 7] = [
        (&raw mut pa).cast(),
        (&raw mut one).cast(),
        (&raw mut pb).cast(),
        (&raw mut one).cast(),
        (&raw mut pc).cast(),
        (&raw mut one).cast(),
        (&raw mut n).cast(),
    ];
    let params_ptr = params.as_mut_ptr();
    let f = add.raw() as CUfunction;
    let ex_cfg = CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 256,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: raw,
        attrs: std::ptr::null_mut(),
        numAttrs: 0,
    };
    let count = Arc::new(AtomicUsize::new(0));
    let origin = Instant::now();
    let owner = |stamp: Option<Arc<AtomicU64>>| Owner {
        count: Arc::clone(&count),
        stamp,
        _payload: Vec::with_capacity(64),
        origin,
    };
    let args = |stamp: Option<Arc<AtomicU64>>| -> Result<[Arg<'static>; 7]> {
        Ok([
            tensor(buf.a, owner(stamp))?.into(),
            1i64.into(),
            tensor(buf.b, owner(None))?.into(),
            1i64.into(),
            tensor(buf.c, owner(None))?.into(),
            1i64.into(),
            (N as u64).into(),
        ])
    };
    // The producer's share of a 3-tensor launch: the three exports made and released, nothing
    // launched (a row of both tables, and the Rust bound).
    let export3 = || -> Result<()> {
        let t = [
            tensor(buf.a, owner(None))?,
            tensor(buf.b, owner(None))?,
            tensor(buf.c, owner(None))?,
        ];
        drop(t);
        Ok(())
    };
    // Deferred release: the tensors go straight to the release queue.
    let launch = |stamp: Option<Arc<AtomicU64>>| -> Result<()> {
        Ok(stream.launch_queued(&add, &cfg, args(stamp)?)?)
    };
    let stream_sync = || -> Result<()> { Ok(stream.synchronize()?) };
    // A stream whose release queue records and polls rarely, to show what markers cost.
    let sparse = Stream::with_config(
        &ctx,
        ReleaseConfig {
            marker_every: 1024,
            poll_every: 256,
            ..ReleaseConfig::default()
        },
    )?;
    // A prepared launch: kernel, configuration and stream bound once.
    let bound = stream.bind(&add, &cfg)?;
    let prepared = || -> Result<()> { Ok(bound.launch_queued(args(None)?)?) };
    // The floor: the kernel launched with plain driver calls (one closure for both modes).
    let raw_launch = || -> Result<()> {
        // SAFETY: `params` point at live values of the kernel's parameter types.
        unsafe {
            (d.cuLaunchKernel)(
                f,
                grid,
                1,
                1,
                256,
                1,
                1,
                0,
                raw,
                params_ptr,
                std::ptr::null_mut(),
            )
        }
        .check("cuLaunchKernel")?;
        Ok(())
    };
    let mut paths = vec![
        Path {
            name: "raw cuLaunchKernel (floor)",
            body: Box::new(raw_launch),
            sync: Box::new(sync),
            us: Vec::new(),
        },
        Path {
            name: "raw cuLaunchKernelEx",
            body: Box::new(|| {
                // SAFETY: as above.
                unsafe { (d.cuLaunchKernelEx)(&ex_cfg, f, params_ptr, std::ptr::null_mut()) }
                    .check("cuLaunchKernelEx")?;
                Ok(())
            }),
            sync: Box::new(sync),
            us: Vec::new(),
        },
        Path {
            name: "DLPack export of 3 tensors alone (make + release)",
            body: Box::new(export3),
            sync: Box::new(|| Ok(())),
            us: Vec::new(),
        },
        Path {
            name: "tile-launch, 3 DLPack tensors, deferred release",
            body: Box::new(|| launch(None)),
            sync: Box::new(stream_sync),
            us: Vec::new(),
        },
        Path {
            name: "tile-launch, 3 DLPack tensors, retire each launch",
            body: Box::new(|| {
                stream.launch(&add, &cfg, args(None)?)?.retire()?;
                Ok(())
            }),
            sync: Box::new(stream_sync),
            us: Vec::new(),
        },
        Path {
            name: "tile-launch, no tensors (7 scalars), deferred",
            body: Box::new(|| {
                let args: [Arg<'static>; 7] = [
                    buf.a.into(),
                    1i64.into(),
                    buf.b.into(),
                    1i64.into(),
                    buf.c.into(),
                    1i64.into(),
                    (N as u64).into(),
                ];
                stream.launch_queued(&add_raw_ptrs, &cfg, args)?;
                Ok(())
            }),
            sync: Box::new(stream_sync),
            us: Vec::new(),
        },
        Path {
            name: "tile-launch, 3 tensors, deferred, marker 1/1024, poll 1/256",
            body: Box::new(|| {
                let args: [Arg<'static>; 7] = [
                    tensor(buf.a, owner(None))?.into(),
                    1i64.into(),
                    tensor(buf.b, owner(None))?.into(),
                    1i64.into(),
                    tensor(buf.c, owner(None))?.into(),
                    1i64.into(),
                    (N as u64).into(),
                ];
                sparse.launch_queued(&add, &cfg, args)?;
                Ok(())
            }),
            sync: Box::new(|| Ok(sparse.synchronize()?)),
            us: Vec::new(),
        },
        Path {
            name: "tile-launch, 3 DLPack tensors, handle then defer()",
            body: Box::new(|| {
                stream.launch(&add, &cfg, args(None)?)?.defer();
                Ok(())
            }),
            sync: Box::new(stream_sync),
            us: Vec::new(),
        },
    ];
    paths.push(Path {
        name: "tile-launch, 3 DLPack tensors, prepared (bound), deferred",
        body: Box::new(prepared),
        sync: Box::new(stream_sync),
        us: Vec::new(),
    });
    measure(&o, &mut paths)?;
    let med: Vec<f64> = paths.iter().map(|p| median(p.us.clone())).collect();
    let (fl, ex, de) = (med[0], med[2], med[3]);

    // Burst mode: the host's cost per launch, the launch queue never full.
    let scalars = || -> Result<()> {
        let args: [Arg<'static>; 7] = [
            buf.a.into(),
            1i64.into(),
            buf.b.into(),
            1i64.into(),
            buf.c.into(),
            1i64.into(),
            (N as u64).into(),
        ];
        stream.launch_queued(&add_raw_ptrs, &cfg, args)?;
        Ok(())
    };
    fn burst_path<'a>(
        name: &'static str,
        body: Box<dyn FnMut() -> Result<()> + 'a>,
        sync: Box<dyn FnMut() -> Result<()> + 'a>,
    ) -> Path<'a> {
        Path {
            name,
            body,
            sync,
            us: Vec::new(),
        }
    }
    let mut bursts = vec![
        burst_path(
            "raw cuLaunchKernel (cuda-sys)",
            Box::new(raw_launch),
            Box::new(sync),
        ),
        burst_path(
            "tile-launch deferred, 3 DLPack tensors (export included)",
            Box::new(|| launch(None)),
            Box::new(stream_sync),
        ),
        burst_path(
            "tile-launch retired, 3 DLPack tensors",
            Box::new(|| {
                stream.launch(&add, &cfg, args(None)?)?.retire()?;
                Ok(())
            }),
            Box::new(stream_sync),
        ),
        burst_path(
            "tile-launch, 7 scalars, deferred",
            Box::new(scalars),
            Box::new(stream_sync),
        ),
        burst_path(
            "tile-launch prepared (bound), 3 DLPack tensors, deferred",
            Box::new(prepared),
            Box::new(stream_sync),
        ),
        burst_path(
            "DLPack export of 3 tensors alone (make + release)",
            Box::new(export3),
            Box::new(|| Ok(())),
        ),
    ];
    measure_bursts(&o, &mut bursts)?;
    let burst_med: Vec<f64> = bursts.iter().map(|p| median(p.us.clone())).collect();
    let rust_vs_raw = burst_med[1] / burst_med[0];
    // What bounds `burst.rust_vs_raw` from below, measured in this run: tile-launch's cost with
    // no tensor at all (the 7-scalar launch) plus the producer's export of the 3 tensors that the
    // measured row includes, over raw. A launch with no per-tensor work would still cost this.
    let rust_floor_vs_raw = (burst_med[3] + burst_med[5]) / burst_med[0];

    // What single driver calls of the launch path cost here (host ns per call).
    let mut status = cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut capture_id = 0u64;
    let mut graph: cuda_sys::CUgraph = std::ptr::null_mut();
    let mut cur: cuda_sys::CUcontext = std::ptr::null_mut();
    let mut ev: cuda_sys::CUevent = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; a context is current (2 = CU_EVENT_DISABLE_TIMING).
    unsafe { (d.cuEventCreate)(&mut ev, 2) }.check("cuEventCreate")?;
    // SAFETY: `ev` and `raw` are live.
    unsafe { (d.cuEventRecord)(ev, raw) }.check("cuEventRecord")?;
    sync()?;
    let mut ordinal = 0i32;
    let costs: Vec<(&str, f64)> = vec![
        (
            "cuCtxGetCurrent",
            ns_per_call(|| {
                // SAFETY: out-pointer to a local.
                Ok(unsafe { (d.cuCtxGetCurrent)(&mut cur) }.check("cuCtxGetCurrent")?)
            })?,
        ),
        (
            "cuStreamGetCaptureInfo",
            ns_per_call(|| {
                // SAFETY: out-pointers to locals; `raw` is live; optional outputs null.
                Ok(unsafe {
                    (d.cuStreamGetCaptureInfo)(
                        raw,
                        &mut status,
                        &mut capture_id,
                        &mut graph,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                }
                .check("cuStreamGetCaptureInfo")?)
            })?,
        ),
        (
            "cuStreamIsCapturing",
            ns_per_call(|| {
                // SAFETY: out-pointer to a local; `raw` is live.
                Ok(unsafe { (d.cuStreamIsCapturing)(raw, &mut status) }
                    .check("cuStreamIsCapturing")?)
            })?,
        ),
        (
            "cuEventQuery (completed event)",
            ns_per_call(|| {
                // SAFETY: `ev` is live.
                Ok(unsafe { (d.cuEventQuery)(ev) }.check("cuEventQuery")?)
            })?,
        ),
        (
            "cuPointerGetAttribute (device ordinal)",
            ns_per_call(|| {
                // SAFETY: out-pointer to a local of the attribute's type; `buf.a` is device memory.
                Ok(unsafe {
                    (d.cuPointerGetAttribute)(
                        (&raw mut ordinal).cast(),
                        cuda_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                        buf.a,
                    )
                }
                .check("cuPointerGetAttribute")?)
            })?,
        ),
    ];
    // SAFETY: `ev` is no longer used.
    unsafe { (d.cuEventDestroy)(ev) }.check("cuEventDestroy")?;

    // 4. Release latency: a host function after each sampled launch stamps the kernel's
    // completion; the deleter stamps its run. Launching goes on meanwhile.
    extern "C" fn stamp_now(user: *mut c_void) {
        // SAFETY: `user` is a `*const Stamp` kept alive until the stream is synchronised.
        let s = unsafe { &*(user as *const CompletionStamp) };
        s.0.store(s.1.elapsed().as_nanos() as u64, Ordering::SeqCst);
    }
    let mut samples: Vec<(Box<CompletionStamp>, Arc<AtomicU64>)> = Vec::new();
    for i in 0..o.launches {
        if i % 97 == 0 {
            let done: Box<CompletionStamp> = Box::new((AtomicU64::new(0), origin));
            let released = Arc::new(AtomicU64::new(0));
            launch(Some(Arc::clone(&released)))?;
            // SAFETY: `done` lives in `samples` until after the synchronisation below.
            unsafe {
                (d.cuLaunchHostFunc)(
                    raw,
                    Some(stamp_now),
                    (&*done as *const CompletionStamp) as *mut c_void,
                )
            }
            .check("cuLaunchHostFunc")?;
            samples.push((done, released));
        } else {
            launch(None)?;
        }
    }
    stream.synchronize()?;
    let mut lat: Vec<f64> = samples
        .iter()
        .map(|(done, rel)| {
            (rel.load(Ordering::SeqCst) as f64 - done.0.load(Ordering::SeqCst) as f64) / 1e3
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let lat_med = lat[lat.len() / 2];
    let lat_p99 = lat[(lat.len() * 99 / 100).min(lat.len() - 1)];

    // 5. Scale: deferred launches with producers that free on release.
    let rss = || -> u64 {
        std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |pages| pages * 4096)
    };
    stream.synchronize()?;
    let before = count.load(Ordering::SeqCst);
    let rss_start = rss();
    let (mut max_pending, mut max_bytes, mut max_rss) = (0usize, 0u64, rss_start);
    let t = Instant::now();
    for i in 0..o.scale {
        launch(None)?;
        if i % 1000 == 0 {
            let s = stream.stats();
            max_pending = max_pending.max(s.pending_guards);
            max_bytes = max_bytes.max(s.pending_bytes);
            max_rss = max_rss.max(rss());
        }
    }
    stream.synchronize()?;
    let scale_s = t.elapsed().as_secs_f64();
    let rss_end = rss();
    let deleters = count.load(Ordering::SeqCst) - before;
    let stats = stream.stats();

    println!(
        "burst mode: per launch, 4096-element f32 vector add, median over {} interleaved rounds x {} bursts of {} launches (no sync inside a burst; untimed sync between bursts)",
        o.rounds, o.bursts, o.burst
    );
    println!("{:<58} {:>9} {:>9}", "path", "us/launch", "x raw");
    for (p, m) in bursts.iter().zip(&burst_med) {
        println!("{:<58} {:>9.3} {:>9.3}", p.name, m, m / burst_med[0]);
    }
    println!("burst.rust_vs_raw (deferred / raw):        {rust_vs_raw:.3}  (target <= 1.15)");
    println!(
        "bound.rust_scalars_plus_export_vs_raw:     {rust_floor_vs_raw:.3}  ((7 scalars + export of 3) / raw: no per-tensor work)"
    );
    println!();
    println!(
        "saturated: per launch, 4096-element f32 vector add, 3 tensors, median of {} interleaved reps x {} launches",
        o.reps, o.launches
    );
    println!("{:<58} {:>9}", "path", "us/launch");
    for (p, m) in paths.iter().zip(&med) {
        println!("{:<58} {:>9.3}", p.name, m);
    }
    println!(
        "ratio deferred / floor:                    {:.3}  (target <= 1.10)",
        de / fl
    );
    println!(
        "ratio (deferred - export) / floor:         {:.3}  (launcher alone)",
        (de - ex) / fl
    );
    for (name, ns) in &costs {
        println!("driver call {name:<40} {ns:>7.0} ns");
    }
    println!(
        "release latency (completion -> deleter):   median {lat_med:.1} us, p99 {lat_p99:.1} us ({} samples)",
        lat.len()
    );
    println!(
        "scale: {} launches in {scale_s:.1} s; deleters {deleters} (expected {}); max pending guards {max_pending}, max pending bytes {max_bytes}; RSS start {} KiB, max {} KiB, end {} KiB; leaked {}",
        o.scale,
        o.scale * 3,
        rss_start / 1024,
        max_rss / 1024,
        rss_end / 1024,
        stats.guards_leaked
    );
    if let Some(path) = &o.out {
        let list = |x: &[f64]| {
            x.iter()
                .map(|f| format!("{f:.4}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let per_path = paths
            .iter()
            .map(|p| format!("    \"{}\": [{}]", p.name, list(&p.us)))
            .collect::<Vec<_>>()
            .join(",\n");
        let per_call = costs
            .iter()
            .map(|(n, ns)| format!("    \"{n}\": {ns:.1}"))
            .collect::<Vec<_>>()
            .join(",\n");
        let burst_rows = bursts
            .iter()
            .zip(&burst_med)
            .map(|(p, m)| {
                format!(
                    "    \"{}\": {{ \"median_us\": {m:.4}, \"bursts\": {} }}",
                    p.name,
                    p.us.len()
                )
            })
            .collect::<Vec<_>>()
            .join(",\n");
        let json = format!(
            "{{\n  \"date_unix_s\": {},\n  \"burst\": {{\n  \"size\": {},\n  \"rounds\": {},\n  \"bursts_per_round\": {},\n  \"rows\": {{\n{burst_rows}\n  }}\n  }},\n  \"ratios\": {{ \"burst.rust_vs_raw\": {rust_vs_raw:.4} }},\n  \"bounds\": {{ \"bound.rust_scalars_plus_export_vs_raw\": {rust_floor_vs_raw:.4} }},\n  \"device\": \"{}\",\n  \"driver\": {},\n  \"launches\": {},\n  \"warmup\": {},\n  \"reps\": {},\n  \"us_per_launch\": {{\n{per_path}\n  }},\n  \"driver_call_ns\": {{\n{per_call}\n  }},\n  \"release_latency_us\": {{ \"median\": {lat_med:.2}, \"p99\": {lat_p99:.2}, \"samples\": {} }},\n  \"scale\": {{ \"launches\": {}, \"seconds\": {scale_s:.2}, \"deleters\": {deleters}, \"max_pending_guards\": {max_pending}, \"max_pending_bytes\": {max_bytes}, \"rss_start_bytes\": {rss_start}, \"rss_max_bytes\": {max_rss}, \"rss_end_bytes\": {rss_end}, \"leaked\": {} }}\n}}\n",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_secs()),
            o.burst,
            o.rounds,
            o.bursts,
            ctx.name()?,
            d.version(),
            o.launches,
            o.warmup,
            o.reps,
            lat.len(),
            o.scale,
            stats.guards_leaked
        );
        std::fs::write(path, json).with_context(|| format!("cannot write {path}"))?;
    }
    Ok(())
}
