//! GPU tests of `cudarc_interop`'s edges (issue 16, classes 2, 3(b), 4(b) and 6): writes racing
//! a producer's pending reads, exports while the slice's stream captures, the caller's current
//! context, and refusals that hand the slice back. Ignored without a GPU, never passed; the
//! two-GPU test prints `skipped: needs two GPUs` on one.

mod gpu_common;

use std::sync::Arc;

use anyhow::{Context as _, Result, ensure};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use gpu_common::{
    current_context_raw as current, gpu, non_primary_context as non_primary,
    set_current_context as set_current, vector_add_library,
};
use tile_dlpack::DType;
use tile_launch::cudarc_interop::{self, ExportError};
use tile_launch::{
    Context, Error, Kernel, LaunchConfig, LaunchHandle, LayoutError, Param, ScalarType, Signature,
    Stream,
};

/// 4M elements: long enough copies and fills that a race shows.
const N: usize = 1 << 22;
/// How long a spin holds a stream back, in nanoseconds.
const SPIN_NS: u64 = 300_000_000;

struct Fixture {
    ctx: Arc<Context>,
    cu: Arc<CudaContext>,
    /// The slices' own stream (cudarc, event tracking on: several streams exist).
    producer: Arc<CudaStream>,
    spin: Kernel,
    /// `fill(x, value, n)`, with `x` declared in-out.
    fill: Kernel,
}

fn fixture() -> Result<Fixture> {
    let g = gpu(0)?;
    let lib = vector_add_library(&g.ctx)?;
    let (spin, fill) = {
        let _bound = g.ctx.bind()?;
        (
            lib.kernel("spin", Signature::new([Param::scalar(ScalarType::U64)]))?,
            lib.kernel(
                "fill",
                Signature::new([
                    Param::inout(DType::F32),
                    Param::scalar(ScalarType::F32),
                    Param::scalar(ScalarType::U64),
                ]),
            )?,
        )
    };
    let cu = Arc::clone(g.producer.context());
    ensure!(
        cu.is_managing_stream_synchronization(),
        "cudarc tracks slices with events"
    );
    Ok(Fixture {
        ctx: g.ctx,
        cu,
        producer: g.producer,
        spin,
        fill,
    })
}

impl Fixture {
    /// Holds `stream` back for `SPIN_NS`.
    fn spin_on(&self, stream: &Stream) -> Result<LaunchHandle> {
        Ok(stream.launch(&self.spin, &LaunchConfig::new(1u32, 1u32), [SPIN_NS.into()])?)
    }

    /// `fill(x, value)` over `N` elements on `stream`.
    fn fill_on(
        &self,
        stream: &Stream,
        x: tile_launch::TensorArg<'static>,
        value: f32,
    ) -> Result<LaunchHandle> {
        Ok(stream.launch(
            &self.fill,
            &LaunchConfig::for_elements(N as u64, 256),
            [x.into(), value.into(), (N as u64).into()],
        )?)
    }

    fn slice(&self, value: f32) -> Result<CudaSlice<f32>> {
        let s = self.producer.clone_htod(&vec![value; N])?;
        self.producer.synchronize()?;
        Ok(s)
    }
}

fn wrong(got: &[f32], want: f32) -> usize {
    got.iter().filter(|&&x| x != want).count()
}

/// Issue 16's class 2 input: `src` (all 1) is read by a device-to-device copy into a fresh
/// `dst` on another cudarc stream, behind a spin there.
struct PendingRead {
    dst: CudaSlice<f32>,
    reader: Arc<CudaStream>,
    /// The reader as a tile stream, kept: dropping it would wait for the spin.
    _on_reader: Stream,
    spin: LaunchHandle,
}

fn pending_read(f: &Fixture, src: &CudaSlice<f32>) -> Result<PendingRead> {
    let reader = f.cu.new_stream()?;
    let mut dst = f.slice(0.0)?;
    let on_reader = Stream::from_cudarc(&f.ctx, &reader)?;
    let spin = f.spin_on(&on_reader)?;
    reader.memcpy_dtod(src, &mut dst)?; // cudarc records src's read event on `reader`
    Ok(PendingRead {
        dst,
        reader,
        _on_reader: on_reader,
        spin,
    })
}

/// Class 2(a): a borrowed slice that another stream is still reading, bound as the in-out
/// tensor of a launch on a third stream. The copy must see the values from before the launch.
#[test]
#[ignore = "needs a CUDA device"]
fn borrowed_output_waits_for_a_pending_read() -> Result<()> {
    let f = fixture()?;
    let mut src = f.slice(1.0)?;
    let PendingRead {
        dst,
        reader,
        _on_reader,
        spin,
    } = pending_read(&f, &src)?;
    let launch = Stream::new(&f.ctx)?;
    // SAFETY: `src` outlives the launch, which is retired before `src` is used again.
    let t = unsafe { cudarc_interop::borrowed(&mut src) }?;
    let h = f.fill_on(&launch, t, 2.0)?;
    h.retire()?;
    spin.retire()?;
    let copied = reader.clone_dtoh(&dst)?;
    let filled = f.producer.clone_dtoh(&src)?;
    f.producer.synchronize()?;
    ensure!(
        wrong(&copied, 1.0) == 0,
        "the pending copy saw tile's writes: {} of {N} wrong",
        wrong(&copied, 1.0)
    );
    ensure!(wrong(&filled, 2.0) == 0, "the fill did not run everywhere");
    f.cu.check_err()?;
    Ok(())
}

/// Class 2(b): the same, with the slice moved in (`tensor`) as the in-out tensor and freed by
/// its deleter after the launch.
#[test]
#[ignore = "needs a CUDA device"]
fn moved_in_inout_waits_for_a_pending_read_and_is_freed_after() -> Result<()> {
    let f = fixture()?;
    let src = f.slice(1.0)?;
    let PendingRead {
        dst,
        reader,
        _on_reader,
        spin,
    } = pending_read(&f, &src)?;
    let launch = Stream::new(&f.ctx)?;
    let t = cudarc_interop::tensor(src)?;
    let h = f.fill_on(&launch, t, 2.0)?;
    let retired = h.retire()?;
    ensure!(retired.released == 1, "deleters run: {}", retired.released);
    spin.retire()?;
    let copied = reader.clone_dtoh(&dst)?;
    reader.synchronize()?;
    f.producer.synchronize()?;
    ensure!(
        wrong(&copied, 1.0) == 0,
        "the pending copy saw tile's writes: {} of {N} wrong",
        wrong(&copied, 1.0)
    );
    f.cu.check_err()?; // the free (cudarc's drop in the deleter) reported nothing
    Ok(())
}

/// The other direction: after `order_after`, cudarc's next reader of a borrowed slice waits
/// for tile's kernel without the launch being retired first.
#[test]
#[ignore = "needs a CUDA device"]
fn order_after_makes_cudarcs_next_reader_wait_for_the_launch() -> Result<()> {
    let f = fixture()?;
    let mut out = f.slice(0.0)?;
    let launch = Stream::new(&f.ctx)?;
    let spin = f.spin_on(&launch)?;
    // SAFETY: `out` outlives the launch; cudarc's later uses are ordered by `order_after`.
    let t = unsafe { cudarc_interop::borrowed(&mut out) }?;
    let h = f.fill_on(&launch, t, 3.0)?;
    cudarc_interop::order_after(&mut out, &launch)?;
    let reader = f.cu.new_stream()?;
    let got = reader.clone_dtoh(&out)?; // waits for out's write event on the device
    reader.synchronize()?;
    ensure!(
        wrong(&got, 3.0) == 0,
        "cudarc read before tile's kernel wrote: {} of {N} wrong",
        wrong(&got, 3.0)
    );
    spin.retire()?;
    h.retire()?;
    f.cu.check_err()?;
    Ok(())
}

/// Class 3(b): exporting slices while their own stream captures is refused with the slice
/// handed back, and the capture stays active and ends into a graph that launches.
#[test]
#[ignore = "needs a CUDA device"]
fn export_while_the_slices_stream_captures_leaves_the_capture_intact() -> Result<()> {
    let f = fixture()?;
    let a = f.slice(1.0)?;
    let mut b = f.slice(1.0)?;
    let on_producer = Stream::from_cudarc(&f.ctx, &f.producer)?;
    f.producer
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let a = match cudarc_interop::tensor(a) {
        Ok(_) => anyhow::bail!("export during capture was accepted"),
        Err(e) => {
            ensure!(
                matches!(
                    e.error(),
                    Error::CaptureInProgress {
                        call: "cudarc_interop::export",
                        ..
                    }
                ),
                "{e}"
            );
            e.into_slice()
        }
    };
    ensure!(a.len() == N, "the slice came back whole");
    let a = match cudarc_interop::strided_tensor(a, &[N as i64], &[1]) {
        Ok(_) => anyhow::bail!("strided export during capture was accepted"),
        Err(e) => {
            ensure!(matches!(e.error(), Error::CaptureInProgress { .. }), "{e}");
            e.into_slice()
        }
    };
    // SAFETY: refused, so nothing is launched on `b`.
    let refused = unsafe { cudarc_interop::borrowed(&mut b) };
    ensure!(
        matches!(
            refused,
            Err(Error::CaptureInProgress {
                call: "cudarc_interop::borrowed",
                ..
            })
        ),
        "borrowed export during capture was not refused as a capture in progress"
    );
    let status = f.producer.capture_status()?;
    ensure!(
        status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        "capture status after the refusals: {status:?}"
    );
    // The capture is still usable: capture a launch, end it, replay it.
    let captured = on_producer.launch(&f.spin, &LaunchConfig::new(1u32, 1u32), [1000u64.into()])?;
    ensure!(captured.is_captured());
    drop(captured);
    let graph = f.producer.end_capture(CUgraphInstantiate_flags(0))?;
    let graph = graph.ok_or_else(|| anyhow::anyhow!("the capture produced no graph"))?;
    graph.launch()?;
    f.producer.synchronize()?;
    drop(graph);
    f.cu.check_err()?;
    // The handed-back slices are intact.
    ensure!(wrong(&f.producer.clone_dtoh(&a)?, 1.0) == 0);
    ensure!(wrong(&f.producer.clone_dtoh(&b)?, 1.0) == 0);
    Ok(())
}

/// Issue 24, 3(a): a refused export converted with `?` into tile's `Error` keeps the slice for
/// the caller (`Error::take_slice`), and one dropped unclaimed while its stream captures (the
/// error, or the `ExportError` itself) is leaked rather than freed into the capture: the capture
/// stays active and ends into a graph that launches.
#[test]
#[ignore = "needs a CUDA device"]
fn refused_exports_keep_the_slice_whatever_they_are_converted_to() -> Result<()> {
    let f = fixture()?;
    let a = f.slice(4.0)?;
    let dropped = f.slice(5.0)?;
    let dropped_too = f.slice(6.0)?;
    let on_producer = Stream::from_cudarc(&f.ctx, &f.producer)?;
    f.producer
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    fn with_question_mark(
        s: CudaSlice<f32>,
    ) -> std::result::Result<tile_launch::TensorArg<'static>, Error> {
        Ok(cudarc_interop::tensor(s)?)
    }
    let mut e = match with_question_mark(a) {
        Ok(_) => anyhow::bail!("export during capture was accepted"),
        Err(e) => e,
    };
    ensure!(
        matches!(&e, Error::ExportRefused { source, .. }
            if matches!(**source, Error::CaptureInProgress { .. })),
        "{e:?}"
    );
    ensure!(
        e.take_slice::<f64>().is_none(),
        "a slice of another element type"
    );
    let a = e
        .take_slice::<f32>()
        .context("the error did not hold the slice")?;
    ensure!(a.len() == N && e.take_slice::<f32>().is_none());
    drop(e);
    // Dropped unclaimed during the capture: as an Error, and as the ExportError itself.
    drop(with_question_mark(dropped));
    drop(cudarc_interop::tensor(dropped_too));
    let status = f.producer.capture_status()?;
    ensure!(
        status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        "capture status after the refused exports were dropped: {status:?}"
    );
    let captured = on_producer.launch(&f.spin, &LaunchConfig::new(1u32, 1u32), [1000u64.into()])?;
    drop(captured);
    let graph = f.producer.end_capture(CUgraphInstantiate_flags(0))?;
    let graph = graph.ok_or_else(|| anyhow::anyhow!("the capture produced no graph"))?;
    graph.launch()?;
    f.producer.synchronize()?;
    drop(graph);
    f.cu.check_err()?;
    ensure!(
        wrong(&f.producer.clone_dtoh(&a)?, 4.0) == 0,
        "the kept slice lost its data"
    );
    Ok(())
}

/// Class 4(b), one GPU: with a non-primary context current, `tensor`, `borrowed`, a refused
/// export, the launch and the deleters leave it current.
#[test]
#[ignore = "needs a CUDA device"]
fn exports_keep_a_non_primary_current_context() -> Result<()> {
    let f = fixture()?;
    let start = current()?;
    let mine = non_primary(0)?;
    mine.bind_to_thread()?;
    let before = current()?;
    ensure!(before == mine.cu_ctx() as cuda_sys::CUcontext);
    let result = keeps_current(&f, before);
    set_current(start)?;
    drop(mine);
    set_current(start)?;
    result
}

/// Class 4(b), two GPUs: with device 1's primary context current, the same.
#[test]
#[ignore = "needs a CUDA device"]
fn exports_keep_device_1_current() -> Result<()> {
    let n = Context::device_count()?;
    if n < 2 {
        println!("skipped: needs two GPUs, this machine has {n}");
        return Ok(());
    }
    let f = fixture()?;
    let ctx1 = Context::new(1)?;
    let _on1 = ctx1.bind()?;
    let before = current()?;
    ensure!(before == ctx1.raw());
    keeps_current(&f, before)
}

fn keeps_current(f: &Fixture, before: cuda_sys::CUcontext) -> Result<()> {
    // cudarc makes its own context current when it allocates: allocate first, then put the
    // caller's back.
    let a = f.slice(1.0)?;
    let b = f.slice(1.0)?;
    let mut out = f.slice(0.0)?;
    set_current(before)?;
    let check = |what: &str| -> Result<()> {
        ensure!(current()? == before, "{what} left another context current");
        Ok(())
    };
    let t = cudarc_interop::tensor(a)?;
    check("tensor")?;
    // SAFETY: `out` outlives the launch, which is retired below.
    let o = unsafe { cudarc_interop::borrowed(&mut out) }?;
    check("borrowed")?;
    let b = match cudarc_interop::strided_tensor(b, &[2 * N as i64], &[1]) {
        Ok(_) => anyhow::bail!("a layout past the slice was accepted"),
        Err(e) => e.into_slice(),
    };
    check("a refused export")?;
    let launch = Stream::new(&f.ctx)?;
    check("Stream::new")?;
    let h = f.fill_on(&launch, t, 2.0)?;
    check("the launch")?;
    let retired = h.retire()?; // runs the moved-in slice's deleter (cudarc's free)
    ensure!(retired.released == 1);
    check("the retire and the deleter")?;
    drop(o);
    cudarc_interop::order_after(&mut out, &launch)?;
    check("order_after")?;
    drop((out, b));
    f.cu.check_err()?;
    Ok(())
}

fn handed_back<T>(
    r: Result<tile_launch::TensorArg<'static>, ExportError<T>>,
) -> Result<(Error, CudaSlice<T>)> {
    match r {
        Ok(_) => anyhow::bail!("the export was accepted"),
        Err(e) => Ok(e.into_parts()),
    }
}

/// Class 6: refused layouts hand the slice back, its memory intact.
#[test]
#[ignore = "needs a CUDA device"]
fn refused_layouts_hand_the_slice_back() -> Result<()> {
    let f = fixture()?;
    let mut s = f.slice(7.0)?;
    let n = N as i64;
    let out_of_bounds =
        |e: &Error| matches!(e, Error::Layout(l) if matches!(**l, LayoutError::OutOfBounds { .. }));
    let rank_mismatch = |e: &Error| matches!(e, Error::Layout(l) if matches!(**l, LayoutError::RankMismatch { .. }));
    let descriptor = |e: &Error| matches!(e, Error::Descriptor { .. });
    type Check = fn(&Error) -> bool;
    let refused: [(&[i64], &[i64], Check); 5] = [
        (&[n + 1], &[1], out_of_bounds),               // one past the end
        (&[4], &[1, 1], rank_mismatch),                // rank mismatch
        (&[4], &[-1], out_of_bounds),                  // before the start
        (&[2, n / 2 + 1], &[n / 2, 1], out_of_bounds), // past the end in two dimensions
        (&[-1], &[1], descriptor), // negative dimension (refused by descriptor validation)
    ];
    for (shape, strides, expected) in refused {
        let (e, back) = handed_back(cudarc_interop::strided_tensor(s, shape, strides))?;
        ensure!(
            back.len() == N,
            "{shape:?}/{strides:?}: slice came back shortened"
        );
        ensure!(expected(&e), "{shape:?} {strides:?}: {e}");
        s = back;
    }
    let deep = vec![1i64; 65];
    let (e, back) = handed_back(cudarc_interop::strided_tensor(s, &deep, &deep))?;
    ensure!(matches!(e, Error::Descriptor { .. }), "rank 65: {e}");
    s = back;
    let (_, back) = match cudarc_interop::export(s, &[n + 1], &[1]) {
        Ok(_) => anyhow::bail!("export accepted a layout past the slice"),
        Err(e) => e.into_parts(),
    };
    s = back;
    let got = f.producer.clone_dtoh(&s)?;
    f.producer.synchronize()?;
    ensure!(wrong(&got, 7.0) == 0, "the handed-back slice lost its data");
    f.cu.check_err()?;
    Ok(())
}

/// Class 6: `Stream::from_cudarc` and the exports refuse a non-primary cudarc context.
#[test]
#[ignore = "needs a CUDA device"]
fn non_primary_cudarc_contexts_are_refused() -> Result<()> {
    let f = fixture()?;
    let start = current()?;
    let other = non_primary(0)?;
    let result = (|| -> Result<()> {
        let stream = other.new_stream()?;
        let e = Stream::from_cudarc(&f.ctx, &stream).expect_err("a non-primary stream");
        ensure!(
            matches!(
                e,
                Error::NonPrimaryContext {
                    what: "cudarc stream",
                    device: 0,
                    ..
                }
            ),
            "{e}"
        );
        let s = stream.clone_htod(&vec![5.0f32; 1024])?;
        stream.synchronize()?;
        let (e, s) = handed_back(cudarc_interop::tensor(s))?;
        ensure!(
            matches!(
                e,
                Error::NonPrimaryContext {
                    what: "CudaSlice",
                    ..
                }
            ),
            "{e}"
        );
        ensure!(s.len() == 1024);
        drop(s);
        stream.synchronize()?;
        other.check_err()?;
        Ok(())
    })();
    set_current(start)?;
    drop(other);
    set_current(start)?;
    Stream::from_cudarc(&f.ctx, &f.producer)?; // the primary context's stream is accepted
    result
}
