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
//! (three DLPack tensors made, and released in batches of 64 launches' worth as the release
//! queue releases them, nothing launched), `deferred` (three tensors,
//! `Stream::launch_queued`), `scalars` (seven scalars, `launch_queued`), `bound` (three
//! tensors, `BoundLaunch::launch_queued`), `queued` (three tensors,
//! `Checked::queue_guards` then `launch`, the handle dropped) and `int` (three tensors,
//! `launch_queued` on a launch-only stream, as an int handle from another library is wrapped:
//! a marker per launch), and `hold` (three tensors, `Stream::hold`: what another launcher's
//! launch would hand over, nothing launched). The measured loop is the function
//! `measured_loop`, which callgrind is told to count alone (`--toggle-collect`).
//!
//! Against the stub, which counts the driver calls it answers, it prints the driver calls the
//! measured loop made per launch: a line `driver calls per launch: TOTAL`, then one line per
//! entry point called (`  NAME PER_LAUNCH`).

use std::ffi::c_void;
use std::hint::black_box;

use anyhow::{Context as _, Result, bail};
use cuda_sys::{CUdeviceptr, CUfunction, CuResultExt, driver};
use tile_launch::{Arg, Context, Guard, Kernel, LaunchConfig, Library, Stream};

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
        bail!("usage: launch_profile raw|export|deferred|scalars|bound|queued|int|hold N");
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
    // SAFETY: the handle of `stream`, alive until the end of `main`.
    let int_stream = unsafe { Stream::from_raw_launch_only(&ctx, stream.raw()) }?;
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
        "export" => {
            // Released as the release queue releases a launch's tensors: in batches, once the
            // amortised marker (every 64 launches) is found complete. Dropped at once, each
            // export's memory would come back from the allocator's fastest cache, which the
            // launch paths never see: their difference from this row would count allocator
            // work that is the producer's.
            let mut kept = Vec::with_capacity(64);
            Box::new(move || {
                kept.push(black_box(tensors()?));
                if kept.len() == 64 {
                    kept.clear();
                }
                Ok(())
            })
        }
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
        "int" => Box::new(|| Ok(int_stream.launch_queued(&add, &cfg, tensors()?)?)),
        "hold" => Box::new(|| {
            let held = [tensor(a, ())?, tensor(b, ())?, tensor(c, ())?];
            Ok(stream.hold(held.map(Guard::from))?)
        }),
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
    let counts = DriverCounts::open();
    if let Some(c) = &counts {
        c.reset();
    }
    measured_loop(n, &mut *body)?;
    if let Some(c) = &counts {
        c.print(n);
    }
    drop(body);
    int_stream.synchronize()?;
    stream.synchronize()?;
    Ok(())
}

/// The stub driver's call counters (`stub_driver_calls` and its siblings in
/// `bench/profile/cuda_stub.c`), found in the library `TILE_LIBCUDA` names; `None` for a real
/// driver.
struct DriverCounts {
    lib: libloading::Library,
}

impl DriverCounts {
    fn open() -> Option<Self> {
        let path = std::env::var_os("TILE_LIBCUDA")?;
        // SAFETY: the driver the launches already use: loading it again runs no initialiser.
        let lib = unsafe { libloading::Library::new(path) }.ok()?;
        // SAFETY: looked up only to see whether the stub's counters are there.
        let present = unsafe { lib.get::<unsafe extern "C" fn()>(b"stub_driver_calls_reset\0") };
        present.is_ok().then_some(Self { lib })
    }

    fn reset(&self) {
        // SAFETY: `void stub_driver_calls_reset(void)`, present (checked in `open`).
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn()>(b"stub_driver_calls_reset\0")
                .expect("checked in `open`");
            f()
        }
    }

    fn print(&self, launches: u64) {
        type Calls = unsafe extern "C" fn(*const std::ffi::c_char) -> u64;
        type Name = unsafe extern "C" fn(std::ffi::c_int) -> *const std::ffi::c_char;
        // SAFETY: the stub's `unsigned long long stub_driver_calls(const char *)` and
        // `const char *stub_driver_call_name(int)`.
        let (calls, name) = unsafe {
            let (Ok(calls), Ok(name)) = (
                self.lib.get::<Calls>(b"stub_driver_calls\0"),
                self.lib.get::<Name>(b"stub_driver_call_name\0"),
            ) else {
                return;
            };
            (calls, name)
        };
        let per = |n: u64| n as f64 / launches as f64;
        // SAFETY: null asks for the total.
        let total = unsafe { calls(std::ptr::null()) };
        println!("driver calls per launch: {:.3}", per(total));
        for i in 0.. {
            // SAFETY: any index is accepted; null past the last.
            let p = unsafe { name(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: a NUL-terminated static string of the stub; `calls` reads it.
            let (n, text) = unsafe { (calls(p), std::ffi::CStr::from_ptr(p)) };
            if n > 0 {
                println!("  {} {:.3}", text.to_string_lossy(), per(n));
            }
        }
    }
}
