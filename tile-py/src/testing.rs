//! `tile_py._testing`: test and benchmark hooks, kept out of `tile_py`'s namespace. They run a
//! launch's conversion and checks without a device, read tile_py's own counters and the
//! release thread's state, queue a release, run the process hooks by hand, and time a
//! producer's export. Nothing on the launch path calls them.

use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use smallvec::SmallVec;
use tile_launch::{Arg, Param};

use crate::convert::{Converted, Handshake, convert_args};
use crate::exceptions::launch_err;
use crate::launch::{arg_list, check_count, expected, parse_config};
use crate::release::{self, COUNTERS, PyGuard, drain};
use crate::{kernel, stream_arg};

/// The `_testing` submodule of the extension (re-exported as `tile_py._testing`).
#[pymodule(submodule)]
pub(crate) mod _testing {
    #[pymodule_export]
    use super::{
        check_args, debug_counters, exchange_api_cost, hold_release_queue_lock, pack_args,
        queue_release, release_thread, shutdown,
    };
    #[pymodule_export]
    use crate::process::after_fork_in_child;
    #[pymodule_export]
    use crate::xla::xla_roles;
}

/// Runs the conversion and the checks of `launch` against `params`, without a device: the
/// DLPack handshake (producers see `stream`), capsule claims, tile-launch's argument checks
/// (device `device`), then consumes and releases every tensor (`consume=True`) or rolls back
/// as a failed launch does (`consume=False`).
#[pyfunction]
#[pyo3(signature = (params, args, *, stream = None, device = 0, sync = true, consume = true,
                    grid = None, block = None))]
#[allow(clippy::too_many_arguments)]
fn check_args(
    py: Python<'_>,
    params: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    device: i32,
    sync: bool,
    consume: bool,
    grid: Option<&Bound<'_, PyAny>>,
    block: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    drain(py);
    crate::process::refuse_in_fork("launch")?;
    let none = py.None().into_bound(py);
    let spec = stream_arg::StreamArg::parse(stream.unwrap_or(&none))?.spec;
    let one = 1i32.into_pyobject(py)?.into_any();
    parse_config(grid.unwrap_or(&one), block.unwrap_or(&one), None, None)?;
    let (params, hs, mut conv) =
        convert_declared(py, "_check_args", &spec, params, args, device, sync, true)?;
    let sig = tile_launch::Signature::new(params.iter().copied());
    let r = match tile_launch::check_args("_check_args", &sig, &conv.args, hs.device) {
        Err(e) => Err(launch_err(py, e, expected(&params))),
        Ok(()) if !consume => Ok(()),
        Ok(()) => consume_all(py, &params, &mut conv),
    };
    if consume && r.is_ok() {
        conv.commit();
    } else {
        conv.abandon(py);
    }
    drain(py);
    r
}

/// Consumes every tensor of `conv` into a release guard, as tile-launch's launch does
/// (`Unused::consume`); each consumed tensor's claim is taken out of `conv`. The first
/// descriptor error is returned, after every tensor was tried.
fn consume_all(py: Python<'_>, params: &[Param], conv: &mut Converted) -> PyResult<()> {
    let mut r = Ok(());
    let args: SmallVec<[Arg<'static>; crate::convert::INLINE]> = conv.args.drain().collect();
    for (index, arg) in args.into_iter().enumerate() {
        let Arg::Tensor(t) = arg else { continue };
        match tile_launch::TensorArg::into_source(t) {
            tile_launch::TensorSource::Unused(u) => {
                conv.claims[index] = None;
                match u.consume() {
                    Ok(used) => {
                        COUNTERS.consumed.fetch_add(1, Ordering::Relaxed);
                        drop(PyGuard::tensor(used));
                    }
                    Err(source) if r.is_ok() => {
                        r = Err(launch_err(
                            py,
                            tile_launch::Error::Descriptor { index, source },
                            expected(params),
                        ));
                    }
                    Err(_) => {}
                }
            }
            tile_launch::TensorSource::Used(used) => drop(PyGuard::tensor(used)),
            tile_launch::TensorSource::Borrowed(_) => {}
        }
    }
    if r.is_ok() {
        for o in conv.owners.drain(..) {
            drop(PyGuard::object(o));
        }
    }
    r
}

/// What `check_args` and `pack_args` share: the declared parameters parsed, the argument
/// count checked, and the arguments converted with the handshake a launch on `spec` (device
/// `device` when the stream does not say) would make; with `count`, the attempt is counted as
/// a launch's is.
#[allow(clippy::too_many_arguments)]
fn convert_declared(
    py: Python<'_>,
    what: &str,
    spec: &stream_arg::StreamSpec,
    params: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    device: i32,
    sync: bool,
    count: bool,
) -> PyResult<(Vec<Param>, Handshake, Converted)> {
    let params = kernel::parse_params(params)?;
    let args = arg_list(args)?;
    check_count(what, &params, args.len())?;
    let hs = Handshake::new(spec.dlpack_value(), sync, spec.device.unwrap_or(device));
    if count {
        COUNTERS.launches_attempted.fetch_add(1, Ordering::Relaxed);
    }
    let converted = convert_args(py, &params, &args, &hs)?;
    Ok((params, hs, converted))
}

/// The kernel parameter values a launch with `params` and `args` would pass, one int per
/// kernel parameter (an array parameter gives its pointer, extents and strides), after the
/// conversion and checks of `check_args` (device `device`); nothing is consumed (every claim is
/// rolled back).
#[pyfunction]
#[pyo3(signature = (params, args, *, stream = None, device = 0))]
fn pack_args(
    py: Python<'_>,
    params: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    device: i32,
) -> PyResult<Vec<u64>> {
    drain(py);
    let none = py.None().into_bound(py);
    let spec = stream_arg::StreamArg::parse(stream.unwrap_or(&none))?.spec;
    let (params, hs, mut conv) =
        convert_declared(py, "_pack_args", &spec, params, args, device, true, false)?;
    let sig = tile_launch::Signature::new(params.iter().copied());
    let packed = tile_launch::pack_args("_pack_args", &sig, &conv.args, hs.device);
    conv.abandon(py);
    packed.map_err(|e| launch_err(py, e, expected(&params)))
}

/// The release thread's state: `{"running": bool, "period_ms": int, "cycles": int}`
/// (`cycles`: wake-ups that attached to poll and drain).
#[pyfunction]
fn release_thread(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    crate::release::describe_thread(py)
}

/// Holds the release queue's lock on another thread for `seconds` (as a thread releasing a
/// launch's tensors detached holds it); returns once it is held, without waiting.
#[pyfunction]
fn hold_release_queue_lock(py: Python<'_>, seconds: f64) {
    py.detach(|| release::hold_lock_for(seconds));
}

/// Queues the release of a reference to `obj` (its decref) as a launch's guard does once its
/// work is done, and starts the release thread, without draining.
#[pyfunction]
fn queue_release(obj: Py<PyAny>) {
    release::defer_release(release::Release::Object(obj));
    crate::release::start_thread();
}

/// The `atexit` hook, run by hand: waits up to `timeout` seconds in all for pending work and
/// releases under way, then stops releasing for good; returns the tensors leaked (0, at once,
/// when it has run already; the hook at exit then does nothing more).
#[pyfunction]
#[pyo3(signature = (timeout = 5.0))]
fn shutdown(py: Python<'_>, timeout: f64) -> PyResult<u64> {
    crate::lifecycle::_shutdown(py, timeout)
}

/// Debug counters of this process: launches attempted and issued, tensors consumed, released
/// (deleters run), leaked at exit, deleter errors, releases queued.
#[pyfunction]
fn debug_counters(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let c = &COUNTERS;
    d.set_item(
        "launches_attempted",
        c.launches_attempted.load(Ordering::Relaxed),
    )?;
    d.set_item("launches_issued", c.launches_issued.load(Ordering::Relaxed))?;
    d.set_item("consumed", c.consumed.load(Ordering::Relaxed))?;
    d.set_item("released", c.released.load(Ordering::Relaxed))?;
    d.set_item("leaked_at_exit", c.leaked_at_exit.load(Ordering::Relaxed))?;
    d.set_item("deleter_errors", c.deleter_errors.load(Ordering::Relaxed))?;
    d.set_item("queued_releases", release::queued())?;
    Ok(d)
}

/// What the producer's own side of a tensor argument costs, for the benchmark's bounds: `n`
/// exports of `obj` through its type's DLPack C exchange API
/// (`managed_tensor_from_py_object_no_sync`), each released at once by its deleter, and `n`
/// calls of the table's `current_work_stream` for the tensor's device. Returns host
/// nanoseconds per export + deleter and per `current_work_stream` call. Nothing is launched
/// or queued. `TypeError` if `type(obj)` has no usable exchange API.
#[pyfunction]
#[pyo3(signature = (obj, n = 64))]
fn exchange_api_cost(obj: &Bound<'_, PyAny>, n: u32) -> PyResult<(f64, f64)> {
    use std::time::Instant;
    use tile_dlpack::ffi::DLManagedTensorVersioned;

    let py = obj.py();
    let no_api = || {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{} has no usable DLPack C exchange API (__dlpack_c_exchange_api__)",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |s| s.to_string())
        ))
    };
    let api = crate::convert::lookup_exchange_api(py, &obj.get_type()).ok_or_else(no_api)?;
    let (Some(from_obj), Some(current_stream)) = api.entries() else {
        return Err(no_api());
    };
    let n = n.max(1);
    let mut device = None;
    let t = Instant::now();
    for _ in 0..n {
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: `obj` is an instance of the table's type; `out` is a valid out pointer.
        let rc = unsafe { from_obj(obj.as_ptr().cast(), &mut out) };
        if rc != 0 || out.is_null() {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("the exchange API export failed")
            }));
        }
        // SAFETY: `out` is an owning export nobody else holds; its deleter (when set) frees it
        // and is called exactly once, here.
        unsafe {
            device.get_or_insert((*out).dl_tensor.device);
            if let Some(deleter) = (*out).deleter {
                deleter(out);
            }
        }
    }
    let export_ns = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
    let dev = device.expect("n >= 1 exports were made");
    let t = Instant::now();
    for _ in 0..n {
        let mut s: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: plain values and a valid out pointer.
        let rc = unsafe { current_stream(dev.device_type, dev.device_id, &mut s) };
        if rc != 0 {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("current_work_stream failed")
            }));
        }
    }
    let stream_ns = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
    Ok((export_ns, stream_ns))
}
