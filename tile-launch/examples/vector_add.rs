//! The end-to-end example: c = a + b on the GPU, with all three vectors passed as DLPack
//! tensors and kept alive by tile-launch until the kernel has finished.
//!
//! Inputs are random vectors uploaded with `cudarc` on a producer stream; the kernel runs on a
//! different stream, which is ordered after the producer's uploads on the device. The inputs
//! are moved into the launch (their memory is freed when the launch releases them), and the
//! producer's own stream handle is dropped right after `launch` returns. The result is checked
//! against the CPU.
//!
//! Run: `cargo run --release -p tile-launch --features cudarc,nvrtc --example vector_add [n]`

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, ensure};
use cudarc::driver::CudaContext;
use tile_dlpack::DType;
use tile_launch::cudarc_interop;
use tile_launch::{Context, LaunchConfig, Library, Param, ScalarType, Signature, Stream};

const KERNELS: &str = include_str!("../kernels/vector_add.cu");

fn main() -> ExitCode {
    // Fail with one clear line on a machine without an NVIDIA driver (cudarc would panic).
    if let Err(e) = cuda_sys::driver() {
        eprintln!("vector_add: {e}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vector_add: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1 << 24);
    let ctx = Context::new(0)?;
    println!(
        "device: {} (cuda:0), driver {}",
        ctx.name()?,
        cuda_sys::driver()?.version()
    );

    let lib = Library::from_cuda_source(KERNELS, &[])?;
    let add = lib.kernel(
        "vector_add",
        Signature::new([
            Param::input(DType::F32).strided(),
            Param::scalar(ScalarType::I64),
            Param::input(DType::F32).strided(),
            Param::scalar(ScalarType::I64),
            Param::output(DType::F32).strided(),
            Param::scalar(ScalarType::I64),
            Param::scalar(ScalarType::U64),
        ]),
    )?;

    // The producer: cudarc, on its own stream.
    let cu = CudaContext::new(0)?;
    let producer = cu.new_stream()?;
    let ha = random(n, 1);
    let hb = random(n, 2);
    let a = producer.clone_htod(&ha)?;
    let b = producer.clone_htod(&hb)?;
    let mut c = producer.alloc_zeros::<f32>(n)?;

    // The launch stream: ours, a different one.
    let stream = Stream::new(&ctx)?;
    let start = Instant::now();
    let handle = stream.launch(
        &add,
        &LaunchConfig::for_elements(n as u64, 256),
        [
            cudarc_interop::tensor(a)?.into(),
            1i64.into(),
            cudarc_interop::tensor(b)?.into(),
            1i64.into(),
            // SAFETY: `c` is read back only after the handle is retired below.
            unsafe { cudarc_interop::borrowed(&mut c) }?.into(),
            1i64.into(),
            (n as u64).into(),
        ],
    )?;
    let launch_us = start.elapsed().as_secs_f64() * 1e6;
    let held = stream.stats().held_guards;
    let done_at_launch = handle.is_complete()?;
    let retired = handle.retire()?;
    let total_ms = start.elapsed().as_secs_f64() * 1e3;

    let hc = producer.clone_dtoh(&c)?;
    producer.synchronize()?;
    drop(producer);
    let wrong = (0..n).filter(|&i| hc[i] != ha[i] + hb[i]).count();
    let stats = stream.stats();
    println!("elements:        {n}");
    println!("launch call:     {launch_us:.1} us (host time of Stream::launch)");
    println!("launch + retire: {total_ms:.3} ms");
    println!(
        "guards:          {held} held at launch (work complete then: {done_at_launch}), {} released by retire, {} released in total, {} leaked",
        retired.released, stats.guards_released, stats.guards_leaked
    );
    println!(
        "result:          {} of {n} elements match the CPU reference",
        n - wrong
    );
    ensure!(wrong == 0, "{wrong} elements differ from the CPU reference");
    ensure!(stats.guards_leaked == 0, "tensors leaked");
    println!("OK");
    Ok(())
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 200.0 - 100.0
        })
        .collect()
}
