//! One launch path, run `N` times in a loop, for counting host instructions per launch with
//! callgrind against the stub driver of `bench/profile/cuda_stub.c`: `cargo xtask profile`
//! runs it for every path and prints instructions per launch and where they go. It also runs
//! against a real driver (then it launches the empty kernel image of a real library, which
//! fails: use the stub).
//!
//! ```text
//! launch_profile PATH N
//! ```
//!
//! `PATH` is one of `raw` (`cuLaunchKernel` with the parameters packed by hand), `export`
//! (three DLPack tensors made and released, nothing launched), `deferred` (three tensors,
//! `Stream::launch_queued`), `scalars` (seven scalars, `launch_queued`), `bound` (three
//! tensors, `BoundLaunch::launch_queued`) and `queued` (three tensors,
//! `Checked::queue_guards` then `launch`, the handle dropped). The measured loop is the function
//! `measured_loop`, which callgrind is told to count alone (`--toggle-collect`).

use std::ffi::c_void;
use std::hint::black_box;

use anyhow::{Context as _, Result, bail};
use cuda_sys::{CUdeviceptr, CUfunction, CuResultExt, driver};
use tile_launch::{Arg, Context, Kernel, LaunchConfig, Library, Stream};

#[path = "common/mod.rs"]
mod common;

use common::{N, raw_pointer_signature, tensor, vector_add_signature};

#[inline(never)]
fn measured_loop(n: u64, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    for _ in 0..n {
        body()?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, n] = args.as_slice() else {
        bail!("usage: launch_profile raw|export|deferred|scalars|bound|queued N");
    };
    let n: u64 = n.parse().context("N must be a count")?;
    let d = driver()?;
    let ctx = Context::new(0)?;
    let _bound = ctx.bind()?;
    let stream = Stream::new(&ctx)?;
    // The stub accepts any image; a real driver would refuse this one.
    let lib = Library::from_image(b"\x7fELF stub image\0")?;
    let add: Kernel = lib.kernel("vector_add", vector_add_signature())?;
    let add_raw_ptrs: Kernel = lib.kernel("vector_add", raw_pointer_signature())?;
    let mut bufs = [0 as CUdeviceptr; 3];
    for b in &mut bufs {
        // SAFETY: a valid out-pointer.
        unsafe { (d.cuMemAlloc)(b, N * 4) }.check("cuMemAlloc")?;
    }
    let [a, b, c] = bufs;
    let cfg = LaunchConfig::for_elements(N as u64, 256);
    let tensors = || -> Result<[Arg<'static>; 7]> {
        Ok([
            tensor(a, ())?.into(),
            1i64.into(),
            tensor(b, ())?.into(),
            1i64.into(),
            tensor(c, ())?.into(),
            1i64.into(),
            (N as u64).into(),
        ])
    };
    let bound = stream.bind(&add, &cfg)?;
    let (mut pa, mut pb, mut pc, mut one, mut len) = (a, b, c, 1i64, N as u64);
    let mut params: [*mut c_void; 7] = [
        (&raw mut pa).cast(),
        (&raw mut one).cast(),
        (&raw mut pb).cast(),
        (&raw mut one).cast(),
        (&raw mut pc).cast(),
        (&raw mut one).cast(),
        (&raw mut len).cast(),
    ];
    let f = add.raw() as CUfunction;
    let raw_stream = stream.raw();
    let mut body: Box<dyn FnMut() -> Result<()>> = match path.as_str() {
        "raw" => Box::new(move || {
            // SAFETY: `params` point at live values of the kernel's parameter types.
            unsafe {
                (d.cuLaunchKernel)(
                    f,
                    cfg.grid.x,
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    raw_stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .check("cuLaunchKernel")?;
            Ok(())
        }),
        "export" => Box::new(|| {
            black_box(tensors()?);
            Ok(())
        }),
        "deferred" => Box::new(|| Ok(stream.launch_queued(&add, &cfg, tensors()?)?)),
        "scalars" => Box::new(|| {
            let args: [Arg<'static>; 7] = [
                a.into(),
                1i64.into(),
                b.into(),
                1i64.into(),
                c.into(),
                1i64.into(),
                (N as u64).into(),
            ];
            Ok(stream.launch_queued(&add_raw_ptrs, &cfg, args)?)
        }),
        "bound" => Box::new(|| Ok(bound.launch_queued(tensors()?)?)),
        "queued" => Box::new(|| {
            let mut checked = stream.check(&add, &cfg, tensors()?)?;
            checked.queue_guards();
            let h = checked.launch()?;
            drop(h);
            Ok(())
        }),
        other => bail!("unknown path `{other}`"),
    };
    // Warm-up (outside the counted function): first-call costs, queue growth.
    for _ in 0..256 {
        body()?;
    }
    measured_loop(n, &mut *body)?;
    drop(body);
    stream.synchronize()?;
    Ok(())
}
