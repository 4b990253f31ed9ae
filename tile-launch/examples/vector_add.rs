//! The end-to-end example, the Rust program of the README: c = a + b on the GPU, with `a` and `b`
//! moved into the launch as DLPack tensors (freed once the kernel has finished) and `c` lent.
//!
//! Run: `cargo run --release -p tile-launch --features cudarc,nvrtc --example vector_add`
//!
//! `cargo xtask test` checks that the README's program is this file below this comment.

use std::error::Error;

use tile_launch::cudarc_interop;
use tile_launch::tile_dlpack::DType;
use tile_launch::{Context, LaunchConfig, Library, Param, ScalarType, Signature, Stream};

/// tile-launch/kernels/vector_add.cu. `extern "C"` keeps the name unmangled: the library knows
/// the kernel as "vector_add".
const SOURCE: &str = r#"
extern "C" __global__ void vector_add(const float* a, long long stride_a,
                                      const float* b, long long stride_b,
                                      float* c, long long stride_c,
                                      unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[(long long)i * stride_c] = a[(long long)i * stride_a] + b[(long long)i * stride_b];
    }
}
"#;

fn main() {
    // The error's message on one line (a `main` returning `Result` would print its Debug form).
    if let Err(e) = run() {
        eprintln!("vector_add: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let n: usize = 1 << 24;
    let ctx = Context::new(0)?; // device 0's primary context; fails first without a driver
    let stream = Stream::new(&ctx)?;
    let lib = Library::from_cuda_source(SOURCE, &[])?; // NVRTC; or Library::from_ptx / from_file
    let add = lib.kernel(
        "vector_add",
        Signature::new([
            Param::input(DType::F32).strided(), // a, any layout: its stride comes next
            Param::scalar(ScalarType::I64),
            Param::input(DType::F32).strided(),
            Param::scalar(ScalarType::I64),
            Param::output(DType::F32).strided(),
            Param::scalar(ScalarType::I64),
            Param::scalar(ScalarType::U64),
        ]),
    )?; // checked against the compiled kernel's parameters

    // The producer: cudarc, on a stream of its own; the launch is ordered after its uploads.
    let producer = cudarc_interop::context(0)?.new_stream()?;
    let ha: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
    let hb: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
    let a = producer.clone_htod(&ha)?;
    let b = producer.clone_htod(&hb)?;
    let mut c = producer.alloc_zeros::<f32>(n)?;

    let handle = stream.launch(
        &add,
        &LaunchConfig::for_elements(n as u64, 256),
        [
            cudarc_interop::tensor(a)?.into(), // moved in: freed after the kernel
            1i64.into(),
            cudarc_interop::tensor(b)?.into(),
            1i64.into(),
            // SAFETY: `c` is read back only after `retire` below has waited for the kernel.
            unsafe { cudarc_interop::borrowed(&mut c) }?.into(),
            1i64.into(),
            (n as u64).into(),
        ],
    )?;
    let retired = handle.retire()?; // waits for the kernel, then runs the deleters

    let hc = producer.clone_dtoh(&c)?;
    producer.synchronize()?;
    let wrong = (0..n).filter(|&i| hc[i] != ha[i] + hb[i]).count();
    println!(
        "vector_add on {}: {} of {n} elements match the CPU; {} tensors released after the kernel",
        ctx.name()?,
        n - wrong,
        retired.released
    );
    if wrong != 0 {
        return Err(format!("{wrong} elements differ from the CPU").into());
    }
    Ok(())
}
