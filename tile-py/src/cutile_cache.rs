//! `tile_py.cutile`'s cached launch: the specialisation key of a cuTile kernel's launch computed
//! from the exported DLPack descriptors, the compiled kernel looked up by it, and the launch made
//! with those very exports, all without running Python.
//!
//! `tile_py.cutile.launch` is [`launch`]. It converts each argument once, as a
//! launch converts it (the DLPack handshake with the launch stream), computes the features cuTile
//! specialises on from the validated descriptors (the same ones `tile_py.cutile._array_key`
//! names: dtype, rank, base alignment, disjointness, 32-bit fit, per-dimension stride and extent
//! divisibility, and the values of statically annotated extents and strides), and looks the
//! compiled kernel up here. On a hit it launches through the checked launch
//! ([`launch_converted`]): the exports it keyed on are the ones launched, each descriptor read
//! once. Anything else hands every claim back and calls Python's path (`cutile._launch`),
//! telling it what was found:
//!
//! - `None`: the kernel has no plan yet (`_cutile_plan` registers one: which parameters are
//!   compile-time constants and which have static annotations);
//! - `False`: this launch is not one the cache takes (tuples, lists, cluster dimensions, a
//!   stream or grid only Python reads, an argument that does not convert, overlapping arrays):
//!   Python's path launches it, and raises what it raises;
//! - a key object: no kernel compiled for it yet; Python's path compiles (or finds) it and
//!   registers it under that key (`_cutile_register`).
//!
//! A key is sound because it carries at least what Python's key carries, for the only
//! arguments it is computed for (no tuples or lists): equal keys mean equal cuTile
//! specialisations. The CPU test `test_rust_features_match_python_features` holds the two
//! feature functions against each other.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyTuple};
use smallvec::SmallVec;
use tile_dlpack::TensorView;
use tile_launch::{LaunchConfig, Param};

use crate::completion::LaunchHandle;
use crate::convert::INLINE;
use crate::convert::{Converted, Handshake, convert_array, convert_scalar};
use crate::kernel::Kernel;
use crate::release::COUNTERS;
use crate::request::arg_list;
use crate::submit::{Target, submit_converted};

/// cuTile's largest grid dimension (`tile_py.cutile.MAX_GRID_DIM`).
const MAX_GRID_DIM: u64 = (1 << 24) - 1;

/// The words of one launch's key (tags and features, see [`key_words`]).
pub(crate) type Words = SmallVec<[u64; 24]>;

/// FNV-1a over the key's words: keys are short and not attacker-chosen.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
    fn write_u64(&mut self, v: u64) {
        let h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        self.0 = (h ^ v).wrapping_mul(0x0100_0000_01b3).rotate_left(23);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// What one compiled specialisation launches: the tile kernel, and per argument whether it is
/// passed (compile-time constants are not).
struct Entry {
    kernel: Py<Kernel>,
    keep: Vec<bool>,
}

/// Per cuTile kernel: what its parameters are, and its compiled specialisations by compute
/// capability and key.
struct Plan {
    /// Keeps the kernel object alive, so that its address (the map's key) is not reused.
    _kernel: Py<PyAny>,
    /// Per parameter: a compile-time constant (`ct.Constant`).
    constant: Vec<bool>,
    /// Per parameter: the dimensions of its statically annotated extents and strides.
    statics: Vec<Option<(Vec<i64>, Vec<i64>)>>,
    entries: FastMap<(u32, u32, Words), Entry>,
}

static PLANS: Mutex<Option<FastMap<usize, Plan>>> = Mutex::new(None);

/// Launches found here (`tile_py.cutile.cache_info()["hits"]` adds them).
static HITS: AtomicU64 = AtomicU64::new(0);

/// A key of a launch that found no compiled kernel; registered with one by Python.
#[pyclass(frozen, module = "tile_py._tile_py")]
pub(crate) struct CutileKey {
    kernel: usize,
    cc: (u32, u32),
    words: Words,
}

#[pymethods]
impl CutileKey {
    /// Keys are equal when they name one kernel, compute capability and specialisation.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<CutileKey>().is_ok_and(|o| {
            let o = o.get();
            o.kernel == self.kernel && o.cc == self.cc && o.words == self.words
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "CutileKey(sm_{}{}, {} words)",
            self.cc.0,
            self.cc.1,
            self.words.len()
        )
    }
}

fn plans() -> std::sync::MutexGuard<'static, Option<FastMap<usize, Plan>>> {
    PLANS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers `kernel`'s plan: per parameter whether it is a compile-time constant, and the
/// (extent dims, stride dims) of its static annotations (None where it has none). A kernel
/// keeps its first plan (and its entries): a kernel's parameters do not change.
#[pyfunction]
pub(crate) fn _cutile_plan(
    kernel: &Bound<'_, PyAny>,
    constant: Vec<bool>,
    statics: Vec<Option<(Vec<i64>, Vec<i64>)>>,
) -> PyResult<()> {
    if constant.len() != statics.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "constant and statics must have one entry per parameter",
        ));
    }
    let plan = Plan {
        _kernel: kernel.clone().unbind(),
        constant,
        statics,
        entries: FastMap::default(),
    };
    plans()
        .get_or_insert_with(FastMap::default)
        .entry(kernel.as_ptr() as usize)
        .or_insert(plan);
    Ok(())
}

/// Registers the compiled `tile_kernel` (with `keep`, per parameter whether it is passed) for
/// the launches that key to `key`. Ignored when the kernel's plan was dropped meanwhile
/// (`_cutile_clear`).
#[pyfunction]
pub(crate) fn _cutile_register(
    key: &Bound<'_, CutileKey>,
    tile_kernel: Bound<'_, Kernel>,
    keep: Vec<bool>,
) -> PyResult<()> {
    let key = key.get();
    let mut guard = plans();
    let Some(plan) = guard.as_mut().and_then(|m| m.get_mut(&key.kernel)) else {
        return Ok(());
    };
    if keep.len() != plan.constant.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "keep must have one entry per parameter",
        ));
    }
    plan.entries.insert(
        (key.cc.0, key.cc.1, key.words.clone()),
        Entry {
            kernel: tile_kernel.unbind(),
            keep,
        },
    );
    Ok(())
}

/// Forgets every plan and compiled entry (`tile_py.cutile.clear_cache()`).
#[pyfunction]
pub(crate) fn _cutile_clear() {
    let old = plans().take();
    drop(old);
}

/// `(hits, entries)` of the cache.
#[pyfunction]
pub(crate) fn _cutile_info() -> (u64, usize) {
    let n = plans()
        .as_ref()
        .map_or(0, |m| m.values().map(|p| p.entries.len()).sum());
    (HITS.load(Ordering::Relaxed), n)
}

/// What a launch's argument is to the key.
enum Leaf<'a, 'py> {
    /// A compile-time constant or a Python scalar: its words are already in the key.
    Scalar(&'a Bound<'py, PyAny>),
    /// A converted tensor (index into the converted list).
    Tensor,
}

/// Tags of the key's words (one per argument, then its features).
mod tag {
    pub const CONST_BOOL: u64 = 1;
    pub const CONST_INT: u64 = 2;
    pub const CONST_FLOAT: u64 = 3;
    pub const BOOL: u64 = 4;
    pub const INT: u64 = 5;
    pub const FLOAT: u64 = 6;
    pub const ARRAY: u64 = 7;
}

/// The features cuTile specialises an array on, as `tile_py.cutile._array_key` computes them,
/// appended to `out`: the DLPack dtype, the rank, one word of flags (16-byte aligned base,
/// disjoint, every extent and stride fits 32 bits) and, for at most 5 dimensions, one word of
/// per-dimension bits (stride in bytes divisible by 16, stride 1, extent divisible by 16,
/// extent 1; the stride-1 bit only without static strides), then the values at the statically
/// annotated dimensions.
pub(crate) fn array_words(
    view: &TensorView<'_>,
    statics: Option<&(Vec<i64>, Vec<i64>)>,
    out: &mut Words,
) {
    let dt = view.dtype();
    let bits = i128::from(dt.bits) * i128::from(dt.lanes);
    let (shape, strides) = (view.shape(), view.strides());
    out.push(tag::ARRAY);
    out.push(u64::from(dt.code) | u64::from(dt.bits) << 8 | u64::from(dt.lanes) << 16);
    out.push(shape.len() as u64);
    let aligned = view.data_ptr() & 15 == 0;
    let fits32 = shape
        .iter()
        .chain(strides)
        .all(|&v| (-(1i64 << 31)..(1i64 << 31)).contains(&v));
    out.push(
        u64::from(aligned) | u64::from(disjoint(shape, strides)) << 1 | u64::from(fits32) << 2,
    );
    // With static strides annotated, cuTile infers no stride of 1 elsewhere (`_keyed_features`).
    let unit_strides = statics.is_none_or(|(_, stride_dims)| stride_dims.is_empty());
    if shape.len() <= 5 {
        let mut w = 0u64;
        for (d, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            let (n, s) = (i128::from(n), i128::from(s));
            let sb = s * bits;
            let f = u64::from(sb % 8 == 0 && (sb / 8) % 16 == 0)
                | u64::from(unit_strides && s == 1) << 1
                | u64::from((n * bits) % 8 == 0 && n % 16 == 0) << 2
                | u64::from(n == 1) << 3;
            w |= f << (4 * d);
        }
        out.push(w);
    }
    if let Some((shape_dims, stride_dims)) = statics {
        for (values, dims) in [(shape, shape_dims), (strides, stride_dims)] {
            for &d in dims {
                let n = values.len() as i64;
                match (-n..n).contains(&d) {
                    true => {
                        out.push(1);
                        out.push(values[d.rem_euclid(n) as usize] as u64);
                    }
                    false => out.push(0),
                }
            }
        }
    }
}

/// Whether no two elements of the layout share memory (`tile_py.cutile._disjoint`).
fn disjoint(shape: &[i64], strides: &[i64]) -> bool {
    let mut dims: SmallVec<[(i64, i64); 8]> =
        strides.iter().copied().zip(shape.iter().copied()).collect();
    dims.sort_unstable();
    let Some(first) = dims.first() else {
        return true;
    };
    if first.0 <= 0 {
        return false;
    }
    dims.windows(2)
        .all(|w| w[1].0 > 0 && i128::from(w[1].0) >= i128::from(w[0].0) * i128::from(w[0].1))
}

/// The bytes `[lo, hi)` an array can touch, or None when it is empty (`_span`).
pub(crate) fn span(view: &TensorView<'_>) -> Option<(i128, i128)> {
    let dt = view.dtype();
    let bits = i128::from(dt.bits) * i128::from(dt.lanes);
    let ptr = i128::from(view.data_ptr());
    let (mut lo, mut hi) = (ptr, ptr);
    for (&n, &s) in view.shape().iter().zip(view.strides()) {
        if n == 0 {
            return None;
        }
        let off = (i128::from(n) - 1) * i128::from(s) * bits;
        let off = off.div_euclid(8);
        if off < 0 {
            lo += off;
        } else {
            hi += off;
        }
    }
    Some((lo, hi + (bits / 8).max(1)))
}

/// The key words of a scalar argument, or None when only Python can key it.
fn scalar_words(obj: &Bound<'_, PyAny>, constant: bool, out: &mut Words) -> Option<()> {
    if let Ok(b) = obj.cast_exact::<PyBool>() {
        out.push(if constant { tag::CONST_BOOL } else { tag::BOOL });
        if constant {
            out.push(u64::from(b.is_true()));
        }
        return Some(());
    }
    if obj.cast_exact::<PyInt>().is_ok() {
        let v: i64 = obj.extract().ok()?;
        if constant {
            out.push(tag::CONST_INT);
            out.push(v as u64);
        } else {
            out.push(tag::INT);
            out.push(u64::from(i32::try_from(v).is_ok()));
        }
        return Some(());
    }
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        out.push(if constant {
            tag::CONST_FLOAT
        } else {
            tag::FLOAT
        });
        if constant {
            out.push(f.value().to_bits());
        }
        return Some(());
    }
    None
}

/// A cuTile grid an int or a tuple of at most 3 ints, each in `1..=MAX_GRID_DIM`; None for
/// anything else (Python reads it, and raises cuTile's errors).
fn grid_dims(grid: &Bound<'_, PyAny>) -> Option<[u32; 3]> {
    let one = |v: &Bound<'_, PyAny>| -> Option<u32> {
        v.cast_exact::<PyInt>().ok()?;
        let v: u64 = v.extract().ok()?;
        (1..=MAX_GRID_DIM).contains(&v).then_some(v as u32)
    };
    let mut dims = [1u32; 3];
    if let Ok(t) = grid.cast_exact::<PyTuple>() {
        if t.len() > 3 {
            return None;
        }
        for (d, v) in dims.iter_mut().zip(t.iter()) {
            *d = one(&v)?;
        }
    } else {
        dims[0] = one(grid)?;
    }
    Some(dims)
}

/// The outcome of a launch for Python (see the module docs).
enum Outcome {
    Launched(LaunchHandle),
    NoPlan,
    NotCached,
    Miss(CutileKey),
}

/// The Python function that launches what the cached launch does not (`tile_py.cutile`'s
/// `_launch`), set once when `tile_py.cutile` is imported.
static FALLBACK: std::sync::OnceLock<Py<PyAny>> = std::sync::OnceLock::new();

/// Sets the function [`launch`] calls for a launch the cache does not take (once; later calls
/// are ignored).
#[pyfunction]
pub(crate) fn _cutile_set_fallback(f: Py<PyAny>) {
    let _ = FALLBACK.set(f);
}

/// Launches the cuTile kernel ``kernel`` (``@ct.kernel``) on ``stream`` with ``grid`` blocks
/// and ``args``, as ``ct.launch(stream, grid, kernel, args)`` does, through tile's checked
/// launch with block (1, 1, 1) (a tile kernel takes its thread count from its compiled code).
/// Returns the ``tile_py.LaunchHandle`` to wait on or poll (the consumed tensors stay on the
/// stream's release queue until the kernel has finished).
///
/// Takes what ``ct.launch`` takes: ``stream`` a torch, CuPy or numba-cuda stream, an object
/// with ``__cuda_stream__`` (cuda.core) or an int handle (0 and 1 the legacy default stream);
/// ``grid`` a tuple of at most 3 ints (padded with 1s; ``()`` is one block), each at most
/// ``MAX_GRID_DIM`` (2**24 - 1, cuTile's limit), or an int; ``args`` PyTorch tensors, any
/// ``__dlpack__`` producer, DLPack capsules, ``__cuda_array_interface__`` objects, scalars,
/// tuples of these and lists of arrays. Every array is exported once, with the launch stream;
/// its descriptor picks the compiled kernel, and that export is the one launched.
///
/// ``programmatic_dependent_launch``, ``cooperative`` and ``block_in_cluster_count`` (cluster
/// dimensions) are ``ct.launch_extended``'s launch attributes.
///
/// A launch whose specialisation (see ``specialization_key``) was compiled before is found
/// without running Python: the key is computed from the exported descriptors. The first launch
/// with a new specialisation on a device of a new compute capability compiles and exports the
/// kernel (seconds). Raises cuTile's errors first where ``ct.launch`` raises them (the grid,
/// the argument count, and what compiling the kernel for these arguments raises, also when
/// their arrays overlap), then ``NotImplementedError`` naming a parameter kind tile_py.cutile
/// cannot pass, ``ValueError`` for overlapping arrays or a tensor that breaks the compiled
/// assumptions, and every error of ``tile_py.launch``; all before anything is consumed.
#[pyfunction(name = "_cutile_launch")]
#[pyo3(signature = (stream, grid, kernel, args, /, *, programmatic_dependent_launch = false,
                    cooperative = false, block_in_cluster_count = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch<'py>(
    py: Python<'py>,
    stream: &Bound<'py, PyAny>,
    grid: &Bound<'py, PyAny>,
    kernel: &Bound<'py, PyAny>,
    args: &Bound<'py, PyAny>,
    programmatic_dependent_launch: bool,
    cooperative: bool,
    block_in_cluster_count: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let found = match block_in_cluster_count {
        Some(c) if !c.is_none() => PyBool::new(py, false).to_owned().into_any(),
        _ => {
            let found = _cutile_try(
                py,
                stream,
                grid,
                kernel,
                args,
                cooperative,
                programmatic_dependent_launch,
            )?;
            if found.is_instance_of::<LaunchHandle>() {
                return Ok(found);
            }
            found
        }
    };
    let Some(fallback) = FALLBACK.get() else {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "tile_py.cutile is not imported (import tile_py.cutile, which sets up its launch)",
        ));
    };
    let cluster = match block_in_cluster_count {
        Some(c) => c.clone(),
        None => py.None().into_bound(py),
    };
    fallback.bind(py).call1((
        stream,
        grid,
        kernel,
        args,
        found,
        programmatic_dependent_launch,
        cooperative,
        cluster,
    ))
}

/// The cached launch alone: the `tile_py.LaunchHandle` when it launched, otherwise None (the
/// kernel has no plan), False (a launch it does not take) or the key to register a compiled
/// kernel under (see the module docs). Raises what the checked launch raises once the kernel
/// is found, after handing every claim back.
#[pyfunction]
#[pyo3(signature = (stream, grid, kernel, args, cooperative = false, programmatic_dependent_launch = false))]
pub(crate) fn _cutile_try<'py>(
    py: Python<'py>,
    stream: &Bound<'py, PyAny>,
    grid: &Bound<'py, PyAny>,
    kernel: &Bound<'py, PyAny>,
    args: &Bound<'py, PyAny>,
    cooperative: bool,
    programmatic_dependent_launch: bool,
) -> PyResult<Bound<'py, PyAny>> {
    try_or_key(
        py,
        stream,
        grid,
        kernel,
        args,
        cooperative,
        programmatic_dependent_launch,
        false,
    )
}

/// The key the cached launch computes for these arguments, launching nothing whether or not a
/// kernel is registered under it: None (no plan), False (a launch the cache does not take) or
/// the key. Every claim is handed back. `tile_py.cutile` registers a kernel it compiled only
/// under the key of the very exports it compiled it for (a producer that describes its tensor
/// differently from one export to the next must not map one layout to another's kernel).
#[pyfunction]
#[pyo3(signature = (stream, grid, kernel, args, cooperative = false, programmatic_dependent_launch = false))]
pub(crate) fn _cutile_key<'py>(
    py: Python<'py>,
    stream: &Bound<'py, PyAny>,
    grid: &Bound<'py, PyAny>,
    kernel: &Bound<'py, PyAny>,
    args: &Bound<'py, PyAny>,
    cooperative: bool,
    programmatic_dependent_launch: bool,
) -> PyResult<Bound<'py, PyAny>> {
    try_or_key(
        py,
        stream,
        grid,
        kernel,
        args,
        cooperative,
        programmatic_dependent_launch,
        true,
    )
}

/// [`_cutile_try`] (`key_only` false) and [`_cutile_key`] (true).
#[allow(clippy::too_many_arguments)]
fn try_or_key<'py>(
    py: Python<'py>,
    stream: &Bound<'py, PyAny>,
    grid: &Bound<'py, PyAny>,
    kernel: &Bound<'py, PyAny>,
    args: &Bound<'py, PyAny>,
    cooperative: bool,
    programmatic_dependent_launch: bool,
    key_only: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let r = cached_launch(
        py,
        kernel,
        stream,
        grid,
        args,
        cooperative,
        programmatic_dependent_launch,
        key_only,
    )?;
    outcome_object(py, r)
}

fn outcome_object(py: Python<'_>, r: Outcome) -> PyResult<Bound<'_, PyAny>> {
    Ok(match r {
        Outcome::Launched(h) => Bound::new(py, h)?.into_any(),
        Outcome::NoPlan => py.None().into_bound(py),
        Outcome::NotCached => PyBool::new(py, false).to_owned().into_any(),
        Outcome::Miss(k) => Bound::new(py, k)?.into_any(),
    })
}

#[allow(clippy::too_many_arguments)]
fn cached_launch(
    py: Python<'_>,
    kernel: &Bound<'_, PyAny>,
    stream: &Bound<'_, PyAny>,
    grid: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    cooperative: bool,
    programmatic_dependent_launch: bool,
    key_only: bool,
) -> PyResult<Outcome> {
    let kid = kernel.as_ptr() as usize;
    // Per parameter: constant, static dims (copied out: the lock is not held while converting,
    // which runs Python).
    let (constant, statics) = {
        let g = plans();
        match g.as_ref().and_then(|m| m.get(&kid)) {
            None => return Ok(Outcome::NoPlan),
            Some(p) => (
                SmallVec::<[bool; INLINE]>::from_slice(&p.constant),
                p.statics
                    .iter()
                    .any(Option::is_some)
                    .then(|| p.statics.clone()),
            ),
        }
    };
    let Some(dims) = grid_dims(grid) else {
        return Ok(Outcome::NotCached);
    };
    let Ok(args) = arg_list(args) else {
        return Ok(Outcome::NotCached);
    };
    if args.len() != constant.len() {
        return Ok(Outcome::NotCached);
    }
    // cuTile's stream 0 is the legacy default stream, tile_py's 1.
    let one;
    let stream = match stream.cast_exact::<PyInt>() {
        Ok(i) if i.extract::<u64>().is_ok_and(|v| v == 0) => {
            one = 1i32.into_pyobject(py)?.into_any();
            &one
        }
        _ => stream,
    };
    crate::release::drain(py);
    if crate::process::refuse_launch().is_err() {
        return Ok(Outcome::NotCached);
    }
    let Ok((s, stream_value)) = crate::stream_arg::launch_stream(py, stream) else {
        return Ok(Outcome::NotCached);
    };
    let hs = Handshake::new(stream_value, true, s.context().ordinal());
    let cc = s.context().limits().compute_capability;

    // Convert every array argument once, and key the launch on what the descriptors say.
    let mut tensors = Converted::new();
    let mut leaves: SmallVec<[Leaf<'_, '_>; INLINE]> = SmallVec::new();
    let mut words = Words::new();
    let mut spans: SmallVec<[(i128, i128); INLINE]> = SmallVec::new();
    for (i, obj) in args.iter().enumerate() {
        let is_const = constant[i];
        let scalar_like = obj.cast::<PyInt>().is_ok() || obj.cast::<PyFloat>().is_ok();
        if is_const || scalar_like {
            if scalar_words(obj, is_const, &mut words).is_none() {
                tensors.abandon(py);
                return Ok(Outcome::NotCached);
            }
            leaves.push(Leaf::Scalar(obj));
            continue;
        }
        if obj.cast::<PyTuple>().is_ok() || obj.cast::<PyList>().is_ok() {
            tensors.abandon(py);
            return Ok(Outcome::NotCached);
        }
        let t = match convert_array(py, i, obj, &hs) {
            Ok(t) => t,
            Err(_) => {
                // Python's path converts it again and raises what it raises.
                tensors.abandon(py);
                return Ok(Outcome::NotCached);
            }
        };
        match t.view() {
            Ok(view) => {
                array_words(
                    &view,
                    statics.as_ref().and_then(|s| s[i].as_ref()),
                    &mut words,
                );
                if let Some(sp) = span(&view) {
                    spans.push(sp);
                }
            }
            Err(_) => {
                tensors.push_tensor(t);
                tensors.abandon(py);
                return Ok(Outcome::NotCached);
            }
        }
        leaves.push(Leaf::Tensor);
        tensors.push_tensor(t);
    }
    if spans.len() > 1 {
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[1].0 < w[0].1) {
            // Overlapping arrays: Python's path refuses them (after cuTile's own errors).
            tensors.abandon(py);
            return Ok(Outcome::NotCached);
        }
    }
    let lookup = (cc.0, cc.1, words);
    if key_only {
        tensors.abandon(py);
        return Ok(Outcome::Miss(CutileKey {
            kernel: kid,
            cc,
            words: lookup.2,
        }));
    }
    let found = {
        let g = plans();
        g.as_ref()
            .and_then(|m| m.get(&kid))
            .and_then(|p| p.entries.get(&lookup))
            .map(|e| {
                (
                    e.kernel.clone_ref(py),
                    SmallVec::<[bool; INLINE]>::from_slice(&e.keep),
                )
            })
    };
    let Some((tile_kernel, keep)) = found else {
        tensors.abandon(py);
        return Ok(Outcome::Miss(CutileKey {
            kernel: kid,
            cc,
            words: lookup.2,
        }));
    };

    // The launch's arguments in the compiled kernel's order: constants dropped, scalars
    // converted to the declared types, the tensors as converted (every array is passed: cuTile
    // keeps only constants out).
    let tk = tile_kernel.bind(py).get();
    let mut conv = Converted::new();
    conv.owners = std::mem::take(&mut tensors.owners);
    let mut converted = tensors.args.drain(..).zip(tensors.claims.drain(..));
    let mut params = tk.params.iter();
    let mut failed = None;
    for (i, (leaf, &k)) in leaves.iter().zip(&keep).enumerate() {
        let param = if k { params.next() } else { None };
        match (leaf, param) {
            (Leaf::Tensor, Some(p)) if !matches!(p, Param::Scalar(_)) => {
                let (arg, claim) = converted.next().expect("one converted tensor per array");
                conv.args.push(arg);
                conv.claims.push(claim);
            }
            (Leaf::Scalar(_), None) if !k => {}
            (Leaf::Scalar(obj), Some(Param::Scalar(ty))) => match convert_scalar(i, obj, *ty) {
                Ok(v) => conv.push_scalar(v),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            },
            _ => {
                failed = Some(pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "tile_py.cutile: argument {i} does not match the compiled kernel's \
                     parameters (a bug)"
                )));
                break;
            }
        }
    }
    // What was not moved (after a failure) is handed back with the rest.
    for (arg, claim) in converted {
        conv.args.push(arg);
        conv.claims.push(claim);
    }
    if failed.is_none() && conv.args.len() != tk.params.len() {
        failed = Some(pyo3::exceptions::PyRuntimeError::new_err(
            "tile_py.cutile: the compiled kernel's parameter count does not match its \
             arguments (a bug)",
        ));
    }
    if let Some(e) = failed {
        conv.abandon(py);
        return Err(e);
    }
    let mut config = LaunchConfig::new((dims[0], dims[1], dims[2]), 1u32);
    config.cooperative = cooperative;
    config.programmatic_dependent_launch = programmatic_dependent_launch;
    HITS.fetch_add(1, Ordering::Relaxed);
    COUNTERS.launches_attempted.fetch_add(1, Ordering::Relaxed);
    submit_converted(
        py,
        &Target {
            stream: &s,
            stream_value,
            kernel: tk,
            config: &config,
            bound: None,
        },
        &mut conv,
    )
    .map(Outcome::Launched)
}
