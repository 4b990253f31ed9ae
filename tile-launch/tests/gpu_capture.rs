//! GPU tests of graph capture: launches captured with tile-launch's own capture API keep their
//! tensors alive for as long as a graph, clone or executable graph holds them, and release them
//! exactly once after. Ignored without a GPU, never passed.

mod gpu_common;

use anyhow::{Result, ensure};
use cuda_sys::CuResultExt;
use cudarc::driver::CudaSlice;
use gpu_common::{
    Count, Gpu, address, gpu, owned_tensor, random, vector_add, vector_add_args, view,
};
use tile_launch::{CaptureMode, Kernel, LaunchConfig, Stream, TensorArg};

const N: usize = 1 << 16;

/// Inputs a, b (owned by their tensors: freed by the deleters) and an output buffer we keep.
struct Case {
    ta: TensorArg<'static>,
    tb: TensorArg<'static>,
    ca: Count,
    cb: Count,
    want: Vec<f32>,
}

fn case(g: &Gpu, seed: u64) -> Result<Case> {
    let ha = random(N, seed);
    let hb = random(N, seed + 1);
    let a = g.producer.clone_htod(&ha)?;
    let b = g.producer.clone_htod(&hb)?;
    // Captured launches cannot wait on a stream outside the capture: make the data ready now.
    g.producer.synchronize()?;
    let (ta, ca) = owned_tensor(a, g.ordinal)?;
    let (tb, cb) = owned_tensor(b, g.ordinal)?;
    let want = ha.iter().zip(&hb).map(|(x, y)| x + y).collect();
    Ok(Case {
        ta,
        tb,
        ca,
        cb,
        want,
    })
}

fn launch_add(
    s: &Stream,
    k: &Kernel,
    ta: TensorArg<'static>,
    tb: TensorArg<'static>,
    out: &CudaSlice<f32>,
    g: &Gpu,
) -> Result<(tile_launch::LaunchHandle, Count)> {
    let (tc, cc) = view(address(out), N, g.ordinal)?;
    let h = s.launch(
        k,
        &LaunchConfig::for_elements(N as u64, 256),
        vector_add_args(ta, tb, tc, 1, N),
    )?;
    Ok((h, cc))
}

fn poison(g: &Gpu, out: &mut CudaSlice<f32>) -> Result<()> {
    g.producer.memcpy_htod(&vec![f32::NAN; N], out)?;
    g.producer.synchronize()?;
    Ok(())
}

fn check(g: &Gpu, out: &CudaSlice<f32>, want: &[f32], what: &str) -> Result<()> {
    let got = g.producer.clone_dtoh(out)?;
    g.producer.synchronize()?;
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        ensure!(x == y, "{what}: c[{i}] = {x} want {y}");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn captured_launch_keeps_tensors_until_graph_and_exec_are_destroyed() -> Result<()> {
    let g = gpu(0)?;
    let k = vector_add(&g.ctx)?;
    let s = Stream::new(&g.ctx)?;
    let mut out = g.producer.alloc_zeros::<f32>(N)?;
    let c = case(&g, 1)?;
    let cap = s.begin_capture(CaptureMode::ThreadLocal)?;
    let (h, cc) = launch_add(&s, &k, c.ta, c.tb, &out, &g)?;
    ensure!(h.is_captured(), "the launch was not seen as captured");
    ensure!(h.is_complete().is_err(), "is_complete of a captured launch");
    let r = h.retire()?;
    ensure!(
        r.released == 0,
        "retire of a captured launch released {}",
        r.released
    );
    let graph = cap.end()?;
    let exec = graph.instantiate()?;
    // Every producer reference is gone: the graph's user object is all that holds the inputs.
    for replay in 0..5 {
        poison(&g, &mut out)?;
        exec.launch(&s)?;
        s.synchronize()?;
        check(&g, &out, &c.want, &format!("replay {replay}"))?;
        ensure!(
            c.ca.get() == 0 && c.cb.get() == 0 && cc.get() == 0,
            "deleters ran during replays"
        );
    }
    drop(graph);
    std::thread::sleep(std::time::Duration::from_millis(50));
    ensure!(
        c.ca.get() == 0,
        "released while the exec still holds the graph's user object"
    );
    poison(&g, &mut out)?;
    exec.launch(&s)?;
    s.synchronize()?;
    check(&g, &out, &c.want, "replay after the graph was destroyed")?;
    drop(exec);
    c.ca.expect_eventually(1, "a")?;
    c.cb.expect_eventually(1, "b")?;
    cc.expect_eventually(1, "c")?;
    let stats = tile_launch::capture_stats();
    ensure!(stats.guards_leaked == 0, "{stats:?}");
    println!("capture stats: {stats:?}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn clone_outlives_the_source_graph() -> Result<()> {
    let g = gpu(0)?;
    let k = vector_add(&g.ctx)?;
    let s = Stream::new(&g.ctx)?;
    let mut out = g.producer.alloc_zeros::<f32>(N)?;
    let c = case(&g, 7)?;
    let cap = s.begin_capture(CaptureMode::Global)?;
    let (h, cc) = launch_add(&s, &k, c.ta, c.tb, &out, &g)?;
    h.defer();
    let graph = cap.end()?;
    let clone = graph.try_clone()?;
    drop(graph);
    let e1 = clone.instantiate()?;
    let e2 = clone.instantiate()?;
    for exec in [&e1, &e2] {
        poison(&g, &mut out)?;
        exec.launch(&s)?;
        s.synchronize()?;
        check(&g, &out, &c.want, "clone's exec")?;
    }
    drop(e1);
    drop(clone);
    std::thread::sleep(std::time::Duration::from_millis(50));
    ensure!(
        c.ca.get() == 0 && cc.get() == 0,
        "released while an exec holds them"
    );
    drop(e2);
    c.ca.expect_eventually(1, "a")?;
    c.cb.expect_eventually(1, "b")?;
    cc.expect_eventually(1, "c")
}

#[test]
#[ignore = "needs a CUDA device"]
fn aborted_capture_releases_its_tensors() -> Result<()> {
    let g = gpu(0)?;
    let k = vector_add(&g.ctx)?;
    let s = Stream::new(&g.ctx)?;
    let out = g.producer.alloc_zeros::<f32>(N)?;
    let c = case(&g, 11)?;
    let cap = s.begin_capture(CaptureMode::ThreadLocal)?;
    let (h, cc) = launch_add(&s, &k, c.ta, c.tb, &out, &g)?;
    h.defer();
    drop(cap); // abort: ends the capture and destroys the graph
    c.ca.expect_eventually(1, "a")?;
    c.cb.expect_eventually(1, "b")?;
    cc.expect_eventually(1, "c")?;
    // The stream works normally afterwards.
    let c2 = case(&g, 12)?;
    let (h, _) = launch_add(&s, &k, c2.ta, c2.tb, &out, &g)?;
    ensure!(!h.is_captured());
    h.retire()?;
    check(&g, &out, &c2.want, "launch after the aborted capture")?;
    ensure!(c2.ca.get() == 1 && c2.cb.get() == 1);
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn invalidated_capture_releases_its_tensors_and_refuses_further_launches() -> Result<()> {
    let g = gpu(0)?;
    let k = vector_add(&g.ctx)?;
    let s = Stream::new(&g.ctx)?;
    let out = g.producer.alloc_zeros::<f32>(N)?;
    let c = case(&g, 21)?;
    // Made before the capture: the producer's synchronising calls are illegal during it.
    let c2 = case(&g, 22)?;
    let cap = s.begin_capture(CaptureMode::Global)?;
    let (h, cc) = launch_add(&s, &k, c.ta, c.tb, &out, &g)?;
    h.defer();
    // An illegal call during capture invalidates it.
    let d = cuda_sys::driver()?;
    // SAFETY: a live stream; the call is refused (and invalidates the capture).
    let r = unsafe { (d.cuStreamSynchronize)(s.raw()) };
    ensure!(
        r != cuda_sys::CUresult::CUDA_SUCCESS,
        "synchronize during capture succeeded"
    );
    // A launch into the invalidated capture is refused before anything is consumed.
    let e = launch_add(&s, &k, c2.ta, c2.tb, &out, &g).unwrap_err();
    let code = e
        .downcast_ref::<tile_launch::Error>()
        .and_then(|e| e.cuda())
        .map(|e| e.code);
    ensure!(
        code == Some(cuda_sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        "{e}"
    );
    ensure!(
        cap.end().is_err(),
        "ending an invalidated capture succeeded"
    );
    c.ca.expect_eventually(1, "a")?;
    c.cb.expect_eventually(1, "b")?;
    cc.expect_eventually(1, "c")?;
    // The refused launch's tensors were owned by the caller and are released once too.
    c2.ca.expect_eventually(1, "a of the refused launch")?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn release_queues_do_not_break_a_global_capture() -> Result<()> {
    let g = gpu(0)?;
    let k = vector_add(&g.ctx)?;
    let s = Stream::new(&g.ctx)?;
    let other = Stream::new(&g.ctx)?;
    let out = g.producer.alloc_zeros::<f32>(N)?;
    let out2 = g.producer.alloc_zeros::<f32>(N)?;
    // Deferred launches pending on both streams before the capture.
    let mut counts = Vec::new();
    for i in 0..8 {
        for st in [&s, &other] {
            let c = case(&g, 100 + i)?;
            let (h, _) = launch_add(st, &k, c.ta, c.tb, &out2, &g)?;
            h.defer();
            counts.extend([c.ca, c.cb]);
        }
    }
    let c = case(&g, 200)?;
    // Which step, if any, invalidates the capture: checked after each one.
    let active = |step: &str| -> Result<()> {
        let d = cuda_sys::driver()?;
        let mut st = cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `s` is a live stream; out-pointer to a local.
        unsafe { (d.cuStreamIsCapturing)(s.raw(), &mut st) }.check("cuStreamIsCapturing")?;
        ensure!(
            st == cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
            "capture not active after {step}: status {}",
            st.0
        );
        Ok(())
    };
    let cap = s.begin_capture(CaptureMode::Global)?;
    let (h, _) = launch_add(&s, &k, c.ta, c.tb, &out, &g)?;
    active("a launch with tensors ready on the producer stream")?;
    h.defer();
    active("defer")?;
    // The capturing stream's queue: polling neither records nor queries anything illegal.
    s.poll();
    active("poll of the capturing stream")?;
    ensure!(
        s.synchronize().is_err(),
        "synchronize of a capturing stream must refuse, not invalidate"
    );
    active("synchronize of the capturing stream")?;
    // Another stream's queue, from the capturing thread: relaxed-mode queries and waits.
    other.poll();
    active("poll of another stream")?;
    other.synchronize()?;
    active("synchronize of another stream")?;
    let graph = cap.end()?;
    let exec = graph.instantiate()?;
    exec.launch(&s)?;
    s.synchronize()?;
    check(&g, &out, &c.want, "graph captured among queue activity")?;
    for (i, n) in counts.iter().enumerate() {
        ensure!(
            n.get() == 1,
            "deferred tensor {i}: deleter count {}",
            n.get()
        );
    }
    drop((exec, graph));
    c.ca.expect_eventually(1, "captured a")
}
