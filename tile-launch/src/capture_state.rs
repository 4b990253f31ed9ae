//! A stream's capture status and the calling thread's capture mode: the driver queries and the
//! mode switch that the launch path, the release queue, streams, contexts and kernels share
//! (every one of tile's "potentially unsafe" driver calls runs through [`relaxed`], so that it
//! never invalidates a global-mode capture another thread has in progress).

use cuda_sys::{
    CUgraph, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, CuResultExt,
    CudaError, Driver,
};

/// A stream's capture status, the id of its capture sequence and the graph being captured
/// (`cuStreamGetCaptureInfo`, one call).
fn capture_info(
    d: &Driver,
    stream: CUstream,
) -> Result<(CUstreamCaptureStatus, u64, CUgraph), CudaError> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; the optional dependency outputs are null (not wanted).
    unsafe {
        (d.cuStreamGetCaptureInfo)(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .check("cuStreamGetCaptureInfo")?;
    Ok((status, id, graph))
}

/// The graph `stream` is capturing into and the capture's id, or `None` when it is not
/// capturing (`cuStreamGetCaptureInfo`, one call).
///
/// An invalidated capture is an error (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`): a launch into
/// it would fail anyway.
pub(crate) fn capturing_graph(
    d: &Driver,
    stream: CUstream,
) -> Result<Option<(CUgraph, u64)>, CudaError> {
    match capture_info(d, stream)? {
        (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, ..) => Ok(None),
        (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, id, graph) => {
            Ok(Some((graph, id)))
        }
        _ => Err(CudaError::new(
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            "cuStreamGetCaptureInfo",
        )),
    }
}

/// Whether `ptr` lies in memory that an allocation node of `graph` (or of a graph nested in it,
/// `depth` levels down so far) allocates: `cuGraphGetNodes`, then per node `cuGraphNodeGetType`
/// and `cuGraphMemAllocNodeGetParams` (or `cuGraphChildGraphNodeGetGraph`). Only asked for a
/// pointer the driver does not know while its stream captures, to tell a graph allocation (no
/// backing until the graph runs) from host memory labelled as device memory. Queries only: the
/// capture is not disturbed.
#[doc(alias = "cuGraphMemAllocNodeGetParams")]
pub(crate) fn graph_allocates(
    d: &Driver,
    graph: cuda_sys::CUgraph,
    ptr: u64,
    depth: u32,
) -> Result<bool, CudaError> {
    use cuda_sys::{CUDA_MEM_ALLOC_NODE_PARAMS, CUgraphNode, CUgraphNodeType};
    // Graphs nest as deep as their makers nest them; past this, nothing is assumed allocated.
    const MAX_DEPTH: u32 = 16;
    if depth > MAX_DEPTH {
        return Ok(false);
    }
    let mut n: usize = 0;
    // SAFETY: a null node array asks for the count only; `graph` is the live graph of a capture
    // in progress (or a child of it), which may be queried.
    unsafe { (d.cuGraphGetNodes)(graph, std::ptr::null_mut(), &mut n) }.check("cuGraphGetNodes")?;
    if n == 0 {
        return Ok(false);
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` has room for `n` handles; the driver writes at most `n`.
    unsafe { (d.cuGraphGetNodes)(graph, nodes.as_mut_ptr(), &mut n) }.check("cuGraphGetNodes")?;
    nodes.truncate(n);
    for node in nodes {
        let mut ty = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` is a node of `graph`; out-pointer to a local.
        unsafe { (d.cuGraphNodeGetType)(node, &mut ty) }.check("cuGraphNodeGetType")?;
        if ty == CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            // SAFETY: a plain C struct of integers and pointers, for which all-zero is valid.
            let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: an allocation node; the driver fills the whole parameter struct (its
            // access descriptors stay owned by the node).
            unsafe { (d.cuGraphMemAllocNodeGetParams)(node, &mut p) }
                .check("cuGraphMemAllocNodeGetParams")?;
            let start = p.dptr;
            if ptr >= start && ptr - start < p.bytesize as u64 {
                return Ok(true);
            }
        } else if ty == CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH {
            let mut child: cuda_sys::CUgraph = std::ptr::null_mut();
            // SAFETY: a child-graph node; the handle returned is owned by the node.
            unsafe { (d.cuGraphChildGraphNodeGetGraph)(node, &mut child) }
                .check("cuGraphChildGraphNodeGetGraph")?;
            if graph_allocates(d, child, ptr, depth + 1)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether `stream` is capturing (active or invalidated), with `cuStreamIsCapturing`.
pub(crate) fn is_capturing(d: &Driver, stream: CUstream) -> Result<bool, CudaError> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local.
    unsafe { (d.cuStreamIsCapturing)(stream, &mut status) }.check("cuStreamIsCapturing")?;
    Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Runs `f` with the calling thread's stream-capture mode set to relaxed, then restores it
/// (`cuThreadExchangeStreamCaptureMode`, twice). Every "potentially unsafe" call tile makes
/// outside a launch (creating and destroying streams and events, querying and waiting on
/// events, retaining and releasing contexts, loading libraries and kernels, setting kernel
/// attributes, running deleters) goes through it: in global mode such a call, from any
/// thread, fails and invalidates the capture another thread has in progress.
pub(crate) fn relaxed<R>(
    d: &Driver,
    f: impl FnOnce() -> Result<R, CudaError>,
) -> Result<R, CudaError> {
    relaxed_with(d, f)
}

/// [`relaxed`] for a closure with any error type a [`CudaError`] converts into (tile's own
/// first-use calls: loading a library, looking up a kernel, setting its attributes, occupancy).
pub(crate) fn relaxed_with<R, E: From<CudaError>>(
    d: &Driver,
    f: impl FnOnce() -> Result<R, E>,
) -> Result<R, E> {
    let previous = exchange_mode(d, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    // Restore even if `f` panics.
    struct Restore<'a>(&'a Driver, CUstreamCaptureMode);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            if let Err(e) = exchange_mode(self.0, self.1) {
                log::error!("{e}");
            }
        }
    }
    let _restore = Restore(d, previous);
    f()
}

/// Sets the calling thread's stream-capture mode to `mode` and returns the one it replaces
/// (`cuThreadExchangeStreamCaptureMode`). [`relaxed`] for a scope; the graph release thread
/// calls it once, to stay relaxed for its whole life.
pub(crate) fn exchange_mode(
    d: &Driver,
    mode: CUstreamCaptureMode,
) -> Result<CUstreamCaptureMode, CudaError> {
    let mut mode = mode;
    // SAFETY: in/out pointer to a local holding a valid mode.
    unsafe { (d.cuThreadExchangeStreamCaptureMode)(&mut mode) }
        .check("cuThreadExchangeStreamCaptureMode")?;
    Ok(mode)
}

/// The capture sequence `stream` belongs to: `Some(id)` while it captures (active or
/// invalidated), `None` otherwise (`cuStreamGetCaptureInfo`).
pub(crate) fn capture_id(d: &Driver, stream: CUstream) -> Result<Option<u64>, CudaError> {
    let (status, id, _) = capture_info(d, stream)?;
    Ok((status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
}
