//! `tile_py._tile_py._export`: one DLPack export of a launch argument, made as a launch makes it (the
//! `__dlpack__` handshake with the launch stream), and the layout its descriptor states, for a
//! caller that must pick the kernel from the layout before launching (`tile_py.cutile`). The
//! capsule is handed back unconsumed, to be launched: nothing here renames it or runs its
//! deleter.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::critical_section::with_critical_section;
use pyo3::types::PyCapsule;

use crate::convert::{
    ANY_INPUT, DlpackMethod, Handshake, call_dlpack, capsule_tensor, capsule_unused, offered_stream,
};
use crate::exceptions::{Kind, arg_err, launch_err, show};
use crate::producers::Screened;

/// What `_export` returns besides the capsule: `((code, bits, lanes), (device_type,
/// device_id), data_ptr, shape, strides)`, strides in elements (compact row-major when the
/// descriptor has none).
type Layout = ((u8, u8, u16), (i32, i32), u64, Vec<i64>, Vec<i64>);

/// Exports `obj` for a launch on `stream` and reads the descriptor: `(capsule, stream_value,
/// layout)`. A producer is called as a launch on `stream` calls it (`__dlpack__(stream=...,
/// max_version=(1, 3))`, with the same retries and the same refusal of a host producer), and
/// `stream_value` is the `stream=` it was offered, which `tile_py.launch` on `stream` offers
/// too (a torch tensor is screened first as a launch's input is: a lazy view is refused, one
/// that requires grad is exported through its `detach()`); a DLPack capsule (`obj` itself) is read as it is, and `stream_value` is then `None`.
/// The descriptor is validated as a launch validates it, its device included (device memory
/// of the launch stream's device, pinned host or managed memory). Nothing is consumed: the
/// capsule keeps its name, and dropping it unlaunched releases the export through its
/// destructor.
/// `index` names the argument in error messages. `device` is the launch stream's device
/// ordinal, which the descriptor's device is checked against; when it is `None` the stream is
/// resolved (which loads the driver) to read it.
///
/// # Errors
///
/// As `tile_py.launch` raises for the stream and for this argument's export and descriptor.
#[pyfunction]
#[pyo3(signature = (obj, stream, index = 0, device = None))]
pub(crate) fn _export<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    stream: &Bound<'py, PyAny>,
    index: usize,
    device: Option<i32>,
) -> PyResult<(Bound<'py, PyAny>, Option<i64>, Layout)> {
    let parsed = crate::stream_arg::StreamArg::parse(stream)?;
    let dlpack_stream = parsed.spec.dlpack_value();
    let device = match device {
        Some(d) => d,
        None => parsed.resolve(py)?.context().ordinal(),
    };
    let (cap, offered) = if obj.cast::<PyCapsule>().is_ok() {
        (obj.clone(), None)
    } else {
        // Screened as a launch screens a producer it exports through `__dlpack__` (an input:
        // tile cannot tell which arrays a cuTile kernel writes): a lazy torch view is refused,
        // and a torch tensor that requires grad, whose `__dlpack__` refuses it, is exported
        // through its `detach()`, as the launch's own export of it is.
        let family = crate::producers::classify(&obj.get_type());
        let detached;
        let obj = match crate::producers::check(index, obj, family, &ANY_INPUT, true, None)? {
            Screened::AsIs => obj,
            Screened::Detached(d) => {
                detached = d;
                &detached
            }
        };
        let hs = Handshake::new(dlpack_stream, true, device);
        let no_dlpack = || {
            arg_err(
                Kind::Type,
                index,
                format!(
                    "expected an object with __dlpack__ or a DLPack capsule, got {}",
                    show(obj)
                ),
            )
        };
        let Some(method) = obj.getattr_opt(intern!(py, "__dlpack__"))? else {
            return Err(no_dlpack());
        };
        let offer = offered_stream(&hs);
        let Some((cap, _ready_on)) =
            call_dlpack(py, index, obj, &DlpackMethod::Attr(method), &hs, offer)?
        else {
            return Err(no_dlpack());
        };
        (cap, Some(offer.0))
    };
    let layout = describe(py, index, &cap, device)?;
    Ok((cap, offered, layout))
}

/// The layout of the `__cuda_array_interface__` object `obj` (argument `index`) as a launch on
/// device `ordinal` reads it, in [`_export`]'s form (`(dtype, device, data_ptr, shape,
/// strides)`, strides in elements): the dict is parsed and validated as a launch parses it
/// (version, typestr, mask, strides that are whole items, extents, data pointer), and the
/// memory's device is checked against `ordinal` as [`_export`] checks a descriptor's. For a
/// caller that launches the pointer where the launch's own checks do not see it (an element of
/// a list argument, staged in a descriptor buffer). The object's `stream` entry is not read:
/// nothing is ordered here. The descriptor made to read it is released before returning.
///
/// # Errors
///
/// As `tile_py.launch` raises for this argument's `__cuda_array_interface__` and device.
#[pyfunction]
#[pyo3(signature = (obj, index, ordinal))]
pub(crate) fn _cai_layout(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    index: usize,
    ordinal: i32,
) -> PyResult<Layout> {
    let hs = Handshake::new(crate::stream_arg::NO_SYNC, false, ordinal);
    let t = crate::convert::from_cai(py, index, obj, &hs)?;
    let layout = t
        .view()
        .map_err(|source| tile_launch::Error::Descriptor { index, source })
        .and_then(|view| layout_on(index, &view, ordinal));
    t.release();
    layout.map_err(|e| launch_err(py, e, |_| None))
}

/// The layout of the tensor in the DLPack capsule `cap`, validated, without claiming it; its
/// device must be usable by a launch on device `ordinal` ([`tile_launch::check_device`]), as
/// a launch's own check requires of every tensor: the layout's pointer may be launched where
/// that check does not see it (staged in a list argument's descriptor buffer).
fn describe(
    py: Python<'_>,
    index: usize,
    cap: &Bound<'_, PyAny>,
    ordinal: i32,
) -> PyResult<Layout> {
    peek_capsule(py, index, cap, |view| layout_on(index, view, ordinal))?
        .map_err(|e| launch_err(py, e, |_| None))
}

/// `view`'s [`Layout`], once its device is found usable by a launch on device `ordinal`
/// ([`tile_launch::check_device`]).
fn layout_on(
    index: usize,
    view: &tile_dlpack::TensorView<'_>,
    ordinal: i32,
) -> Result<Layout, tile_launch::Error> {
    let (dtype, device) = (view.dtype(), view.device());
    tile_launch::check_device(index, device, ordinal)?;
    Ok((
        (dtype.code, dtype.bits, dtype.lanes),
        (device.device_type.0 as i32, device.device_id),
        view.data_ptr(),
        view.shape().to_vec(),
        view.strides().to_vec(),
    ))
}

/// Runs `f` on the validated view of the tensor in the DLPack capsule `cap` (argument `index`
/// in errors), without claiming it: the capsule keeps its name and nothing is released.
pub(crate) fn peek_capsule<R>(
    py: Python<'_>,
    index: usize,
    cap: &Bound<'_, PyAny>,
    f: impl FnOnce(&tile_dlpack::TensorView<'_>) -> R,
) -> PyResult<R> {
    with_critical_section(cap, || {
        let (versioned, ptr) = capsule_tensor(py, index, cap)?;
        // SAFETY: the capsule holds that tensor, valid until its deleter runs, which nobody can
        // call while we hold the capsule's critical section and a reference to it: the `Unused`
        // is only peeked at (no deleter call) and dropped here (dropping it does nothing).
        let unused = unsafe { capsule_unused(versioned, ptr) };
        let view = unused.peek().map_err(|source| {
            launch_err(py, tile_launch::Error::Descriptor { index, source }, |_| {
                None
            })
        })?;
        Ok(f(&view))
    })
}
