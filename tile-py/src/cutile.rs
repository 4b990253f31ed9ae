//! `tile_py.cutile.launch`: a cuTile kernel (`@ct.kernel`) launched through tile's checked
//! launch, its compiled specialisation found by a key computed here, and only here.
//!
//! Each argument is converted once, as a launch converts it (the DLPack handshake with the
//! launch stream); the key is read from those validated descriptors, and the exports it was
//! read from are the ones launched: each is put where the launch's argument list holds it when
//! the walk meets it, and every other leaf leaves a slot there, which is filled once the
//! specialisation (and so the declared type of each scalar) is known. The key holds everything cuTile derives a kernel's
//! assumptions from: per array the dtype, rank, 16-byte base alignment, disjoint elements,
//! whether every extent and stride fits 32 bits, per dimension (up to 5) whether the stride is
//! 1 or a multiple of 16 bytes and whether the extent is 1 or a multiple of 16, and the values
//! of statically annotated extents and strides; per scalar its type (and for an int whether it
//! fits 32 bits); per constant its value (a float by its bits, as cuTile tells `0.0` from
//! `-0.0`); the shape of tuples and lists. Equal keys are equal cuTile specialisations, and
//! every assumption a kernel was compiled under is declared to tile, which checks it on every
//! launch besides.
//!
//! A hit runs no Python, and a launch of the specialisation its thread launched last takes no
//! lock either ([`Last`]). A miss calls into `tile_py.cutile` by name: `_plan_of` once per kernel
//! (which parameters are constants, tuples, lists, static annotations), and `_compile_miss`
//! once per specialisation, whose tile kernel is registered here under the key. List arguments
//! are read (`_list_arg`) and staged (`_stage`) by Python, on every launch that has one: the
//! staged descriptor buffer is made through PyTorch.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyCapsule, PyDict, PyFloat, PyInt, PyList, PyTuple};
use smallvec::SmallVec;
use tile_launch::{Arg, ArrayAssumptions, Dim3, LaunchConfig, Param};

use crate::convert::INLINE;
use crate::convert::{
    ANY_INPUT, Converted, Handshake, Tensor, convert_scalar, convert_tensor, int_scalar,
    parse_typestr,
};
use crate::exceptions::{Kind, err, launch_err};
use crate::kernel::Kernel;
use crate::launch::{LaunchHandle, Target, submit_converted};
use crate::pytypes::TypeCache;
use crate::release::COUNTERS;

/// cuTile's largest grid dimension (`tile_py.cutile.MAX_GRID_DIM`): larger ones may compute
/// wrong tile block IDs.
const MAX_GRID_DIM: i64 = (1 << 24) - 1;

/// The words of a registered key: the compute capability, then the arguments'.
type Words = SmallVec<[u64; 24]>;

/// The words of one launch's key as its walk writes them: inline up to [`KeyBuf::INLINE`]
/// (a push is a store), on the heap past that.
struct KeyBuf {
    len: usize,
    inline: [u64; KeyBuf::INLINE],
    spilled: Vec<u64>,
}

impl KeyBuf {
    const INLINE: usize = 32;

    fn new() -> KeyBuf {
        KeyBuf {
            len: 0,
            inline: [0; KeyBuf::INLINE],
            spilled: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, w: u64) {
        match self.inline.get_mut(self.len) {
            Some(slot) => *slot = w,
            None => self.spill(w),
        }
        self.len += 1;
    }

    #[cold]
    fn spill(&mut self, w: u64) {
        if self.spilled.is_empty() {
            self.spilled.extend_from_slice(&self.inline);
        }
        self.spilled.push(w);
    }

    /// Appends `words[..n]`: the five stored at once when they fit inline (the words past
    /// `n` are stored too, and are no part of the key).
    #[inline]
    fn extend_five(&mut self, words: [u64; 5], n: usize) {
        match self.inline.get_mut(self.len..self.len + 5) {
            Some(slots) => {
                slots.copy_from_slice(&words);
                self.len += n;
            }
            None => self.extend(words[..n].iter().copied()),
        }
    }

    #[inline]
    fn extend(&mut self, words: impl IntoIterator<Item = u64>) {
        for w in words {
            self.push(w);
        }
    }

    fn as_slice(&self) -> &[u64] {
        match self.inline.get(..self.len) {
            Some(words) => words,
            None => &self.spilled,
        }
    }
}

/// A multiply-and-rotate hash taken a word at a time (a key's words are hashed as their bytes):
/// keys are short and not attacker-chosen.
#[derive(Default)]
struct WordHash(u64);

impl WordHash {
    fn mix(h: u64, v: u64) -> u64 {
        (h ^ v).wrapping_mul(0x0100_0000_01b3).rotate_left(23)
    }
}

impl Hasher for WordHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let w: [u8; 8] = w.try_into().expect("chunks of 8 bytes");
            self.0 = Self::mix(self.0, u64::from_ne_bytes(w));
        }
        for b in words.remainder() {
            self.0 = Self::mix(self.0, u64::from(*b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = Self::mix(self.0, v);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHash>>;

/// A static annotation's (extent dimensions, stride dimensions).
type Statics = (Vec<i64>, Vec<i64>);

/// What a parameter's annotation tells the key, as `tile_py.cutile._plan_of` reads it.
struct Node {
    constant: bool,
    statics: Option<Statics>,
    items: Items,
    /// The static annotation of a list's elements.
    list_statics: Option<Statics>,
}

/// The annotations of a tuple's items.
enum Items {
    /// Each item has the tuple's own annotation.
    Same,
    /// A homogeneous tuple: every item has this one.
    Each(Box<Node>),
    /// A heterogeneous tuple: item `i` has the `i`-th (items past them: none).
    Listed(Vec<Node>),
}

/// No annotation.
static BARE: Node = Node {
    constant: false,
    statics: None,
    items: Items::Same,
    list_statics: None,
};

impl Node {
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Node> {
        let (constant, statics, kind, children, list_statics): (
            bool,
            Option<Statics>,
            u8,
            Vec<Bound<'_, PyAny>>,
            Option<Statics>,
        ) = obj.extract()?;
        let mut nodes = children.iter().map(Node::from_py);
        let items = match kind {
            1 => Items::Each(Box::new(nodes.next().unwrap_or(Ok(Node::bare()))?)),
            2 => Items::Listed(nodes.collect::<PyResult<_>>()?),
            _ => Items::Same,
        };
        Ok(Node {
            constant,
            statics,
            items,
            list_statics,
        })
    }

    fn bare() -> Node {
        Node {
            constant: false,
            statics: None,
            items: Items::Same,
            list_statics: None,
        }
    }

    fn item(&self, i: usize) -> &Node {
        match &self.items {
            Items::Same => self,
            Items::Each(n) => n,
            Items::Listed(v) => v.get(i).unwrap_or(&BARE),
        }
    }
}

/// A kernel's parameters as the key reads them, and their names.
struct Params {
    nodes: Vec<Node>,
    names: Vec<String>,
}

/// What one compiled specialisation launches: the tile kernel, and per leaf argument (tuples
/// flattened) whether it is passed (compile-time constants are not). Never changed once
/// registered: an entry found under a key is the one compiled for it.
struct Entry {
    kernel: Py<Kernel>,
    keep: Box<[bool]>,
}

/// Per cuTile kernel: its parameters and its compiled specialisations by key.
struct Plan {
    /// Keeps the kernel object alive, so that its address (the map's key) is not reused.
    _kernel: Py<PyAny>,
    params: Arc<Params>,
    entries: FastMap<Words, Arc<Entry>>,
}

static PLANS: Mutex<Option<FastMap<usize, Plan>>> = Mutex::new(None);
static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);

/// How many times [`_cutile_clear`] emptied the table. A [`Last`] of an earlier generation is
/// stale: its entry was dropped, and its kernel's address may now be another kernel's.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The specialisation this thread launched last, found again without a lock or a hash: a
/// launch of the same cuTile kernel (`kid`, its address, in the same [`GENERATION`], so the
/// same object: its plan kept it alive) whose key equals `key` word for word is exactly a hit
/// of the table, which holds the same entry under the same key.
struct Last {
    generation: u64,
    kid: usize,
    params: Arc<Params>,
    key: Words,
    entry: Arc<Entry>,
}

thread_local! {
    static LAST: std::cell::RefCell<Option<Rc<Last>>> = const { std::cell::RefCell::new(None) };
}

/// This thread's [`Last`] when it is of kernel `kid` in the current generation. A launch takes
/// it once, before its walk, and keeps it: what the walk's Python code does meanwhile changes
/// nothing it holds (an entry is never changed; `kid` is the launch's own kernel, alive for the
/// call), so an equal key after the walk is a hit still. A `clear_cache()` during the walk
/// leaves that launch its entry, as it leaves another thread the entry it found.
fn last_of(kid: usize) -> Option<Rc<Last>> {
    let generation = GENERATION.load(Ordering::Acquire);
    LAST.with_borrow(|l| {
        l.as_ref()
            .filter(|l| l.kid == kid && l.generation == generation)
            .cloned()
    })
}

fn plans() -> MutexGuard<'static, Option<FastMap<usize, Plan>>> {
    PLANS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Values the key holds by identity number: constants that are not a bool, an i64 or a float,
/// and scalars of other types. Numbers are never reused, so a number in a registered key keeps
/// its meaning after [`_cutile_clear`] empties the table.
static INTERNED: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
static NEXT_INTERNED: AtomicU64 = AtomicU64::new(0);

/// `tile_py.cutile`, whose functions a miss calls by name.
static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn call_module<'py>(
    py: Python<'py>,
    name: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let m = MODULE.get_or_try_init(py, || py.import("tile_py.cutile").map(Bound::unbind))?;
    m.bind(py).getattr(name)?.call1(args)
}

/// Drops every plan and compiled entry (`tile_py.cutile.clear_cache()`).
#[pyfunction]
pub(crate) fn _cutile_clear(py: Python<'_>) {
    // Stale first: no thread's `Last` is found again once a kernel's address can be reused.
    GENERATION.fetch_add(1, Ordering::AcqRel);
    let old = plans().take();
    drop(old);
    let last = LAST.take();
    drop(last);
    if let Some(d) = INTERNED.get(py) {
        d.bind(py).clear();
    }
}

/// `(hits, misses, entries)`: launches that found a compiled kernel, specialisations compiled
/// and registered, and specialisations held.
#[pyfunction]
pub(crate) fn _cutile_info() -> (u64, u64, usize) {
    let n = plans()
        .as_ref()
        .map_or(0, |m| m.values().map(|p| p.entries.len()).sum());
    (
        HITS.load(Ordering::Relaxed),
        MISSES.load(Ordering::Relaxed),
        n,
    )
}

/// Tags of the key's words.
mod tag {
    pub const CONST_BOOL: u64 = 1;
    pub const CONST_INT: u64 = 2;
    pub const CONST_FLOAT: u64 = 3;
    pub const INTERNED: u64 = 4;
    pub const BOOL: u64 = 5;
    pub const INT: u64 = 6;
    pub const FLOAT: u64 = 7;
    pub const ARRAY: u64 = 8;
    pub const TUPLE: u64 = 9;
    pub const LIST: u64 = 10;
}

/// An array's layout, as its descriptor states it (strides in elements).
struct Layout<'a> {
    code: u8,
    bits: u8,
    lanes: u16,
    ptr: u64,
    shape: &'a [i64],
    strides: &'a [i64],
}

impl Layout<'_> {
    /// Appends the array's features (the module docs list them): the dtype, the rank, a word of
    /// flags, a word of 4 bits per dimension, then `(1, value)` per statically annotated
    /// dimension (`0` for one out of range).
    fn words(&self, statics: Option<&Statics>, out: &mut KeyBuf) {
        let bits = u64::from(self.bits) * u64::from(self.lanes);
        let (shape, strides) = (self.shape, self.strides);
        // With static strides annotated, cuTile infers no stride of 1 in other dimensions.
        let unit_strides = statics.is_none_or(|(_, stride_dims)| stride_dims.is_empty());
        let mut fits32 = true;
        let mut per_dim = 0u64;
        for (d, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            fits32 &= i64::from(n as i32) == n && i64::from(s as i32) == s;
            if d < 5 {
                // A multiple of 16 bytes is a multiple of 128 bits: the low 7 bits of the
                // product, which wrapping keeps. An extent that is a multiple of 16 is one of
                // whole bytes.
                let f = u64::from((s as u64).wrapping_mul(bits) & 127 == 0)
                    | u64::from(unit_strides && s == 1) << 1
                    | u64::from(n & 15 == 0) << 2
                    | u64::from(n == 1) << 3;
                per_dim |= f << (4 * d);
            }
        }
        let head = [
            tag::ARRAY,
            u64::from(self.code) | u64::from(self.bits) << 8 | u64::from(self.lanes) << 16,
            shape.len() as u64,
            u64::from(self.ptr & 15 == 0)
                | u64::from(ArrayAssumptions::is_disjoint(shape, strides)) << 1
                | u64::from(fits32) << 2,
            per_dim,
        ];
        // The per-dimension word only up to 5 dimensions.
        out.extend_five(head, if shape.len() <= 5 { 5 } else { 4 });
        if let Some((shape_dims, stride_dims)) = statics {
            for (values, dims) in [(shape, shape_dims), (strides, stride_dims)] {
                let n = values.len() as i64;
                for &d in dims {
                    if (-n..n).contains(&d) {
                        out.extend([1, values[d.rem_euclid(n) as usize] as u64]);
                    } else {
                        out.push(0);
                    }
                }
            }
        }
    }
}

impl Layout<'_> {
    /// The bytes `[lo, hi)` a non-empty array of packed sub-byte elements can touch (a byte
    /// per element at least).
    #[cold]
    fn sub_byte_span(&self) -> (u64, u64) {
        let bits = i128::from(self.bits) * i128::from(self.lanes);
        let (mut lo, mut hi) = (i128::from(self.ptr), i128::from(self.ptr));
        for (&n, &s) in self.shape.iter().zip(self.strides) {
            let off = ((i128::from(n) - 1) * i128::from(s) * bits) >> 3; // floor(bits / 8)
            if off < 0 {
                lo += off;
            } else {
                hi += off;
            }
        }
        let addr = |v: i128| v.clamp(0, i128::from(u64::MAX)) as u64;
        (addr(lo), addr(hi + 1))
    }
}

/// How an argument's type is read as an array.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ArrayKind {
    /// Tensor attributes (`data_ptr`, `stride`: PyTorch's), which cuTile reads itself.
    Attributes,
    /// Only through DLPack: cuTile is shown the export's layout instead.
    Dlpack,
    /// Neither; an instance may still have `__cuda_array_interface__`.
    Other,
}

thread_local! {
    static LAST_ARRAY_TYPE: std::cell::Cell<(usize, Option<ArrayKind>)> =
        const { std::cell::Cell::new((0, None)) };
}
static ARRAY_TYPES: TypeCache<ArrayKind> = TypeCache::new(&LAST_ARRAY_TYPE);

/// A leaf argument (tuples flattened) as the launch passes it. A slot is the leaf's index in
/// the walk's [`Converted`] arguments (before the fill of [`fill_slots`]).
enum Leaf<'py> {
    /// A scalar or a constant, converted against the compiled kernel's parameter into its
    /// slot (None for a parameter annotated as a constant, which has none), and the value of
    /// an exact int that fits 64 bits (read once, for the key).
    Scalar(Bound<'py, PyAny>, Option<i64>, Option<usize>),
    /// A converted array, in its slot, and whether cuTile is shown the export's layout (it
    /// cannot read the object's own), which a miss reads again from the claim.
    Array(usize, bool),
    /// A list of arrays (`tile_py.cutile._ListArg`), its length, the elements as cuTile is
    /// shown them, and its two slots (the staged descriptor buffer, the length) from this one.
    List(Bound<'py, PyAny>, usize, Bound<'py, PyAny>, usize),
}

/// One launch's walk over its arguments: the key, the leaves, the arguments converted in
/// place and the bytes each array spans (with its order of appearance), for the overlap check.
struct Walk<'a, 'py> {
    py: Python<'py>,
    /// The launch's handshake and stream; None for a key alone ([`_cutile_key`]), whose
    /// arrays are read from `__cuda_array_interface__`, not converted.
    launch: Option<(&'a Handshake, &'a Bound<'py, PyAny>)>,
    params: &'a Params,
    words: KeyBuf,
    leaves: SmallVec<[Leaf<'py>; INLINE]>,
    /// The launch's arguments in the order of the leaves: each array converted (and claimed)
    /// where the walk meets it, and a placeholder scalar per slot of any other leaf, which
    /// [`fill_slots`] fills once the kernel is known. An array is moved once, into here, and
    /// launched from here.
    conv: Converted,
    /// Per non-empty array, the bytes `[lo, hi)` its validated descriptor says it can touch,
    /// and its order of appearance.
    spans: SmallVec<[(u64, u64, usize); INLINE]>,
}

/// A slot's content until [`fill_slots`] converts the leaf into it.
const PLACEHOLDER: tile_launch::Scalar = tile_launch::Scalar::Bool(false);

impl<'py> Walk<'_, 'py> {
    /// One argument, or one item of a tuple. Inlined into the walk's loop, as the leaves
    /// common in a launch are (ints, arrays): one call per array, none per int.
    #[inline]
    fn arg(&mut self, obj: &Bound<'py, PyAny>, node: &Node, param: usize) -> PyResult<()> {
        // Type checks by `is_instance_of`: a failed `cast` makes an error holding the type.
        if obj.is_instance_of::<PyTuple>()
            && let Ok(t) = obj.cast::<PyTuple>()
        {
            return self.tuple(t, node, param);
        }
        if !node.constant && obj.is_instance_of::<PyList>() {
            return self.list(obj, node, param);
        }
        self.leaf(obj, node)
    }

    #[inline(never)]
    fn tuple(&mut self, t: &Bound<'py, PyTuple>, node: &Node, param: usize) -> PyResult<()> {
        self.words.push(tag::TUPLE);
        self.words.push(t.len() as u64);
        for (i, item) in t.iter().enumerate() {
            self.arg(&item, node.item(i), param)?;
        }
        Ok(())
    }

    /// Reserves the next slot of the arguments, for a leaf that is not an array.
    fn slot(&mut self) -> usize {
        self.conv.push_scalar(PLACEHOLDER);
        self.conv.args.len() - 1
    }

    #[inline]
    fn leaf(&mut self, obj: &Bound<'py, PyAny>, node: &Node) -> PyResult<()> {
        if !node.constant {
            if obj.is_exact_instance_of::<PyInt>() {
                let v: Option<i64> = obj.extract().ok();
                self.words.push(tag::INT);
                self.words
                    .push(u64::from(v.is_some_and(|v| i32::try_from(v).is_ok())));
                let slot = self.slot();
                self.leaves.push(Leaf::Scalar(obj.clone(), v, Some(slot)));
                return Ok(());
            }
            // A bool or a float is no array; anything else is asked.
            if !obj.is_exact_instance_of::<PyBool>()
                && !obj.is_exact_instance_of::<PyFloat>()
                && let Some((hs, _)) = self.launch
                && let Some(shown_as_export) = array_kind(obj)
            {
                return self.array(obj, node, hs, shown_as_export);
            }
        }
        self.other_leaf(obj, node)
    }

    /// An array of a launch: converted, its features read from the validated descriptor, put
    /// in the arguments.
    #[inline(never)]
    fn array(
        &mut self,
        obj: &Bound<'py, PyAny>,
        node: &Node,
        hs: &Handshake,
        shown_as_export: bool,
    ) -> PyResult<()> {
        let py = self.py;
        let index = self.leaves.len();
        let t = convert_tensor(py, index, obj, &ANY_INPUT, hs)?;
        let at = self.spans.len();
        let read = t.view().map(|view| {
            let dt = view.dtype();
            let layout = Layout {
                code: dt.code,
                bits: dt.bits,
                lanes: dt.lanes,
                ptr: view.data_ptr(),
                shape: view.shape(),
                strides: view.strides(),
            };
            layout.words(node.statics.as_ref(), &mut self.words);
            // Validation computed the extent, and proved `ptr + extent` in the address space
            // for a non-empty tensor (an empty one has `0..0`, and so has one of packed
            // sub-byte elements, whose item size is 0 bytes).
            let e = view.byte_extent();
            if e.end > e.start {
                let ptr = layout.ptr;
                Some((
                    ptr.wrapping_add_signed(e.start),
                    ptr.wrapping_add_signed(e.end),
                ))
            } else {
                (view.numel() > 0).then(|| layout.sub_byte_span())
            }
        });
        let slot = self.conv.args.len();
        self.conv.push_tensor(t);
        let span = read.map_err(|source| {
            launch_err(py, tile_launch::Error::Descriptor { index, source }, |_| {
                None
            })
        })?;
        if let Some((lo, hi)) = span {
            self.spans.push((lo, hi, at));
        }
        self.leaves.push(Leaf::Array(slot, shown_as_export));
        Ok(())
    }

    /// Every leaf but an int and an array of a launch: constants, bools, floats, the arrays of
    /// a key alone, other scalars.
    #[inline(never)]
    fn other_leaf(&mut self, obj: &Bound<'py, PyAny>, node: &Node) -> PyResult<()> {
        let py = self.py;
        let index = self.leaves.len();
        if node.constant {
            constant_words(obj, &mut self.words)?;
            self.leaves.push(Leaf::Scalar(obj.clone(), None, None));
            return Ok(());
        } else if obj.is_exact_instance_of::<PyBool>() {
            self.words.push(tag::BOOL);
        } else if obj.is_exact_instance_of::<PyFloat>() {
            self.words.push(tag::FLOAT);
        } else if self.launch.is_none()
            && let Some(_) = array_kind(obj)
        {
            let (dt, ptr, shape, strides) = cai_layout(index, obj)?;
            let layout = Layout {
                code: dt.code,
                bits: dt.bits,
                lanes: dt.lanes,
                ptr,
                shape: &shape,
                strides: &strides,
            };
            layout.words(node.statics.as_ref(), &mut self.words);
            self.leaves.push(Leaf::Scalar(obj.clone(), None, None));
            return Ok(());
        } else if obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>() {
            let key = (intern!(py, "scalar"), obj.get_type());
            intern_words(key.into_pyobject(py)?.as_any(), obj, &mut self.words)?;
        } else if let Some(dtype) = obj.getattr_opt(intern!(py, "dtype"))? {
            let key = (intern!(py, "scalar"), obj.get_type(), dtype.str()?);
            intern_words(key.into_pyobject(py)?.as_any(), obj, &mut self.words)?;
        } else {
            // Only a constant can be this: its value decides the code.
            constant_words(obj, &mut self.words)?;
        }
        let slot = self.slot();
        self.leaves
            .push(Leaf::Scalar(obj.clone(), None, Some(slot)));
        Ok(())
    }

    fn list(&mut self, obj: &Bound<'py, PyAny>, node: &Node, param: usize) -> PyResult<()> {
        let py = self.py;
        let index = self.leaves.len();
        let name = &self.params.names[param];
        let Some((hs, stream)) = self.launch else {
            return Err(err(
                Kind::Type,
                format!("tile_py.cutile: parameter {name:?}: a list of arrays needs a launch"),
            ));
        };
        let (arg, shown, layouts): (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyList>) =
            call_module(py, "_list_arg", (obj, stream, index, name, hs.device))?.extract()?;
        self.words.push(tag::LIST);
        self.words.push(layouts.len() as u64);
        for (j, l) in layouts.iter().enumerate() {
            let ((code, bits, lanes), ptr, shape, strides): (
                (u8, u8, u16),
                u64,
                Vec<i64>,
                Vec<i64>,
            ) = l.extract()?;
            // cuTile compiles a list's elements, as every array, to have non-negative strides
            // (its list constraint's `stride_lower_bound_incl` is 0 whatever the elements), and
            // the staged words are no launch argument whose declared assumptions tile checks.
            if let Some((d, s)) = strides.iter().enumerate().find(|(_, s)| **s < 0) {
                let rule =
                    format!("element {j} of the list: the stride {s} of dimension {d} is negative");
                return Err(launch_err(
                    py,
                    tile_launch::Error::AssumptionBroken { index, rule },
                    |_| None,
                ));
            }
            let layout = Layout {
                code,
                bits,
                lanes,
                ptr,
                shape: &shape,
                strides: &strides,
            };
            // List elements are not part of the overlap check (see the module docs of
            // `tile_py.cutile`).
            layout.words(node.list_statics.as_ref(), &mut self.words);
        }
        let slot = self.slot();
        self.slot();
        self.leaves
            .push(Leaf::List(arg, layouts.len(), shown, slot));
        Ok(())
    }

    /// The overlap refusal's message, when two arrays share memory.
    fn overlap(&mut self) -> Option<String> {
        // Few arrays, none overlapping: every pair compared, nothing sorted.
        let spans = &self.spans;
        if spans.len() <= 4
            && spans
                .iter()
                .enumerate()
                .all(|(i, a)| spans[i + 1..].iter().all(|b| b.1 <= a.0 || a.1 <= b.0))
        {
            return None;
        }
        self.spans.sort_unstable();
        self.spans.windows(2).find(|w| w[1].0 < w[0].1).map(|w| {
            let (a, b) = (w[0].2.min(w[1].2), w[0].2.max(w[1].2));
            format!(
                "tile_py.cutile: array arguments {a} and {b} (in order of appearance) overlap \
                 in memory; cuTile compiles every array as not aliasing any other"
            )
        })
    }

    /// What cuTile is shown in place of a leaf it cannot read itself, by leaf index: an
    /// export's `(dtype, data_ptr, shape, strides)`, a list's elements.
    fn described(&self) -> PyResult<Bound<'py, PyDict>> {
        let py = self.py;
        let d = PyDict::new(py);
        for (i, leaf) in self.leaves.iter().enumerate() {
            match leaf {
                Leaf::Array(slot, true) => {
                    let Some(Some(claim)) = self.conv.claims.get(*slot) else {
                        return Err(mismatch(i));
                    };
                    let shown = claim.peek(py, i, |view| {
                        let dt = view.dtype();
                        (
                            (dt.code, dt.bits, dt.lanes),
                            view.data_ptr(),
                            view.shape().to_vec(),
                            view.strides().to_vec(),
                        )
                    })?;
                    d.set_item(i, shown)?;
                }
                Leaf::List(_, _, shown, _) => d.set_item(i, shown)?,
                _ => {}
            }
        }
        Ok(d)
    }
}

/// How `obj` is read as an array, or None when it is not one: `Some(true)` when cuTile must be
/// shown the export's layout.
#[inline]
fn array_kind(obj: &Bound<'_, PyAny>) -> Option<bool> {
    if obj.is_instance_of::<PyCapsule>() {
        return Some(true);
    }
    let py = obj.py();
    let kind = ARRAY_TYPES.of(obj, |ty| {
        let has = |name| ty.hasattr(name).unwrap_or(false);
        if has(intern!(py, "data_ptr")) && has(intern!(py, "stride")) {
            ArrayKind::Attributes
        } else if has(intern!(py, "__dlpack__")) || has(intern!(py, "__dlpack_c_exchange_api__")) {
            ArrayKind::Dlpack
        } else {
            ArrayKind::Other
        }
    });
    match kind {
        ArrayKind::Attributes => Some(false),
        ArrayKind::Dlpack => Some(true),
        ArrayKind::Other => obj
            .getattr_opt(intern!(py, "__cuda_array_interface__"))
            .ok()
            .flatten()
            .filter(|c| c.cast::<PyDict>().is_ok())
            .map(|_| false),
    }
}

/// An array's `(dtype, data_ptr, shape, strides)` read from its `__cuda_array_interface__`
/// (strides in elements; compact row-major when it states none).
fn cai_layout(
    index: usize,
    obj: &Bound<'_, PyAny>,
) -> PyResult<(tile_dlpack::DType, u64, Vec<i64>, Vec<i64>)> {
    let py = obj.py();
    let cai = obj.getattr(intern!(py, "__cuda_array_interface__"))?;
    let typestr: String = cai.get_item("typestr")?.extract()?;
    let dt = parse_typestr(index, &typestr, "typestr")?;
    let shape: Vec<i64> = cai.get_item("shape")?.extract()?;
    let item = (i64::from(dt.bits) * i64::from(dt.lanes) / 8).max(1);
    let strides = match cai.get_item("strides").ok().filter(|s| !s.is_none()) {
        Some(s) => s.extract::<Vec<i64>>()?.iter().map(|b| b / item).collect(),
        None => {
            let mut st = vec![1i64; shape.len()];
            for d in (0..shape.len().saturating_sub(1)).rev() {
                st[d] = st[d + 1] * shape[d + 1];
            }
            st
        }
    };
    let ptr: u64 = cai.get_item("data")?.get_item(0)?.extract()?;
    Ok((dt, ptr, shape, strides))
}

/// Appends a constant's words: its value decides the code.
fn constant_words(obj: &Bound<'_, PyAny>, out: &mut KeyBuf) -> PyResult<()> {
    if let Ok(b) = obj.cast_exact::<PyBool>() {
        out.extend([tag::CONST_BOOL, u64::from(b.is_true())]);
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        // A float subclass too (NumPy's float64): cuTile reads its value as a float, so
        // `np.float64(-0.0)` is `-0.0`, never the `0.0` an equality-keyed entry would find.
        out.extend([tag::CONST_FLOAT, f.value().to_bits()]);
    } else if let Some(v) = obj
        .cast_exact::<PyInt>()
        .ok()
        .and_then(|i| i.extract::<i64>().ok())
    {
        out.extend([tag::CONST_INT, v as u64]);
    } else {
        let key = (intern!(obj.py(), "constant"), obj.get_type(), obj);
        intern_words(key.into_pyobject(obj.py())?.as_any(), obj, out)?;
    }
    Ok(())
}

/// Appends the identity number of `key` (see [`INTERNED`]); `obj` is named when it cannot be
/// a key.
fn intern_words(key: &Bound<'_, PyAny>, obj: &Bound<'_, PyAny>, out: &mut KeyBuf) -> PyResult<()> {
    let py = key.py();
    if key.hash().is_err() {
        return Err(err(
            Kind::Type,
            format!(
                "tile_py.cutile cannot key a kernel on the unhashable value {}",
                obj.repr()?
            ),
        ));
    }
    let table = INTERNED
        .get_or_init(py, || PyDict::new(py).unbind())
        .bind(py);
    let fresh = NEXT_INTERNED.fetch_add(1, Ordering::Relaxed);
    let id: u64 = table
        .call_method1(intern!(py, "setdefault"), (key, fresh))?
        .extract()?;
    out.extend([tag::INTERNED, id]);
    Ok(())
}

/// A grid (or cluster) as cuTile reads it: an int, or a tuple of at most 3 ints padded with 1s,
/// each at most [`MAX_GRID_DIM`], with cuTile's errors in its words.
fn grid_dims(grid: &Bound<'_, PyAny>) -> PyResult<Dim3> {
    // The common cases, an exact int or a tuple of exact ints in range: no allocation.
    let fits = |v: &Bound<'_, PyAny>| {
        v.is_exact_instance_of::<PyInt>()
            .then(|| v.extract::<u32>().ok())
            .flatten()
            .filter(|&n| i64::from(n) <= MAX_GRID_DIM)
    };
    if let Some(x) = fits(grid) {
        return Ok(Dim3::new(x, 1, 1));
    }
    if grid.is_exact_instance_of::<PyTuple>()
        && let Ok(t) = grid.cast::<PyTuple>()
        && t.len() <= 3
    {
        let mut dims = [1u32; 3];
        let mut all = true;
        for (d, v) in dims.iter_mut().zip(t.iter_borrowed()) {
            match fits(&v) {
                Some(n) => *d = n,
                None => all = false,
            }
        }
        if all {
            return Ok(Dim3::new(dims[0], dims[1], dims[2]));
        }
    }
    grid_dims_other(grid)
}

/// [`grid_dims`] for anything but exact ints in range (NumPy integers, errors).
#[inline(never)]
fn grid_dims_other(grid: &Bound<'_, PyAny>) -> PyResult<Dim3> {
    let py = grid.py();
    let items: SmallVec<[Bound<'_, PyAny>; 3]> =
        if grid.is_instance_of::<PyInt>() && !grid.is_instance_of::<PyBool>() {
            smallvec::smallvec![grid.clone()]
        } else if let Ok(t) = grid.cast::<PyTuple>() {
            t.iter().collect()
        } else {
            return Err(err(Kind::Type, "Grid must be a tuple"));
        };
    if items.len() > 3 {
        return Err(err(
            Kind::Value,
            format!(
                "Grid dimensions must be at most 3, got length {}",
                items.len()
            ),
        ));
    }
    let mut dims = [1u32; 3];
    for (i, (d, v)) in dims.iter_mut().zip(items).enumerate() {
        let v = if v.cast_exact::<PyInt>().is_ok() {
            v
        } else {
            py.import(intern!(py, "operator"))?
                .call_method1(intern!(py, "index"), (v,))?
        };
        let n: Option<i64> = v.extract().ok();
        if n.is_some_and(|n| n < 0) || (n.is_none() && v.lt(0)?) {
            return Err(err(Kind::Overflow, format!("Grid[{i}] is negative: {v}")));
        }
        match n.filter(|&n| n <= MAX_GRID_DIM) {
            Some(n) => *d = n as u32,
            None => {
                return Err(err(
                    Kind::Value,
                    format!(
                        "Grid[{i}] exceeds 24-bit limit: max={MAX_GRID_DIM}, got={v}. Use \
                         multiple kernel launches for larger workloads."
                    ),
                ));
            }
        }
    }
    Ok(Dim3::new(dims[0], dims[1], dims[2]))
}

/// A stream as cuTile takes it, in a form tile_py takes: the int handle 0 is the legacy default
/// stream (tile_py's 1); anything else as tile_py reads it (a numba-cuda stream included).
fn cutile_stream<'py>(stream: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if stream.is_exact_instance_of::<PyInt>() && stream.extract::<u64>().is_ok_and(|v| v == 0) {
        return Ok(1i32.into_pyobject(stream.py())?.into_any());
    }
    Ok(stream.clone())
}

/// The kernel's parameters, read by `tile_py.cutile._plan_of` on its first launch (which
/// refuses an object that is not a cuTile kernel).
fn params_of(kernel: &Bound<'_, PyAny>) -> PyResult<Arc<Params>> {
    let kid = kernel.as_ptr() as usize;
    if let Some(p) = plans().as_ref().and_then(|m| m.get(&kid)) {
        return Ok(p.params.clone());
    }
    let (nodes, names): (Vec<Bound<'_, PyAny>>, Vec<String>) =
        call_module(kernel.py(), "_plan_of", (kernel,))?.extract()?;
    let params = Arc::new(Params {
        nodes: nodes.iter().map(Node::from_py).collect::<PyResult<_>>()?,
        names,
    });
    let mut g = plans();
    let plan = g
        .get_or_insert_with(FastMap::default)
        .entry(kid)
        .or_insert_with(|| Plan {
            _kernel: kernel.clone().unbind(),
            params,
            entries: FastMap::default(),
        });
    Ok(plan.params.clone())
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
/// tuples of these and lists of arrays (staged through PyTorch, kept with their exports until
/// the kernel is done). Every array is exported once, with the launch stream; its descriptor
/// picks the compiled kernel, and that export is the one launched.
///
/// ``programmatic_dependent_launch``, ``cooperative`` and ``block_in_cluster_count`` (cluster
/// dimensions) are ``ct.launch_extended``'s launch attributes.
///
/// A launch whose specialisation was compiled before finds it without running Python. The
/// first launch of a specialisation on a device of a new compute capability compiles the
/// kernel (a cubin, calling convention ``cutile_python_v2``; seconds) and keeps it in memory.
/// Raises cuTile's errors first where ``ct.launch`` raises them (the grid, the kernel, the
/// argument count, and what compiling the kernel for these arguments raises, also when their
/// arrays overlap), ``NotImplementedError`` naming a parameter kind tile_py.cutile cannot pass,
/// ``TypeError`` for a constant that cannot be a key (unhashable), ``ValueError`` for
/// overlapping arrays or a tensor that breaks the compiled assumptions, and every error of
/// ``tile_py.launch``; all before anything is consumed.
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
) -> PyResult<LaunchHandle> {
    let stream = cutile_stream(stream)?;
    let mut config = LaunchConfig::new(grid_dims(grid)?, 1u32);
    config.cluster = match block_in_cluster_count {
        Some(c) if !c.is_none() => Some(grid_dims(c)?),
        _ => None,
    };
    config.cooperative = cooperative;
    config.programmatic_dependent_launch = programmatic_dependent_launch;
    let kid = kernel.as_ptr() as usize;
    let last = last_of(kid);
    let read_params;
    let params = match &last {
        Some(l) => &l.params,
        None => {
            read_params = params_of(kernel)?;
            &read_params
        }
    };
    // A tuple is walked in place (its items cannot change); anything else is read once into
    // one, which is also what a miss shows cuTile.
    let read;
    let args: &Bound<'py, PyTuple> = match args.cast::<PyTuple>() {
        Ok(t) => t,
        Err(_) => {
            read = PyTuple::new(py, args.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
            &read
        }
    };
    let n = params.nodes.len();
    if args.len() != n {
        let e = call_module(py, "_count_error", (kernel, n, args.len()))?;
        return Err(PyErr::from_value(e));
    }
    crate::process::begin_launch(py)?;
    let (s, stream_value) = crate::stream_arg::launch_stream(py, &stream)?;
    let hs = Handshake::new(stream_value, true, s.context().ordinal());
    let cc = s.context().limits().compute_capability;

    let mut w = Walk {
        py,
        launch: Some((&hs, &stream)),
        params,
        words: KeyBuf::new(),
        leaves: SmallVec::new(),
        conv: Converted::new(),
        spans: SmallVec::new(),
    };
    w.words.push(u64::from(cc.0) << 32 | u64::from(cc.1));
    let walked = args
        .iter_borrowed()
        .zip(&params.nodes)
        .enumerate()
        .try_for_each(|(i, (a, node))| w.arg(&a, node, i));
    if let Err(e) = walked {
        w.conv.abandon(py);
        return Err(e);
    }
    // This thread's last specialisation, else the table (read now: the walk ran Python).
    let key = w.words.as_slice();
    let in_table;
    let found = match &last {
        Some(l) if l.key.as_slice() == key => Some(&l.entry),
        _ => {
            in_table = plans()
                .as_ref()
                .and_then(|m| m.get(&kid)?.entries.get(key).cloned());
            if let Some(e) = &in_table {
                remember(kid, params, key, e);
            }
            in_table.as_ref()
        }
    };
    let overlap = w.overlap();
    let registered;
    let entry = match (found, overlap) {
        (Some(found), None) => {
            HITS.fetch_add(1, Ordering::Relaxed);
            found
        }
        (found, overlap) => {
            let compiled = w.described().and_then(|d| {
                if found.is_some() {
                    return Ok(None);
                }
                Ok(Some(call_module(
                    py,
                    "_compile_miss",
                    (kernel, &args, d, cc),
                )?))
            });
            let compiled = match (compiled, overlap) {
                (Ok(Some(c)), None) => c,
                (Err(e), _) => {
                    w.conv.abandon(py);
                    return Err(e);
                }
                // cuTile's own refusal of these arguments came first; what it compiled for
                // overlapping arrays is not kept.
                (Ok(_), overlap) => {
                    w.conv.abandon(py);
                    return Err(err(Kind::Value, overlap.unwrap_or_default()));
                }
            };
            registered = match register(kid, params, w.words.as_slice(), &compiled) {
                Ok(e) => e,
                Err(e) => {
                    w.conv.abandon(py);
                    return Err(e);
                }
            };
            &registered
        }
    };
    launch_leaves(
        py,
        &mut w,
        &s,
        stream_value,
        &config,
        entry.kernel.bind(py),
        &entry.keep,
        &hs,
    )
}

/// Makes `entry`, found or registered under `key` for kernel `kid`, this thread's [`Last`].
fn remember(kid: usize, params: &Arc<Params>, key: &[u64], entry: &Arc<Entry>) {
    let last = Last {
        generation: GENERATION.load(Ordering::Acquire),
        kid,
        params: params.clone(),
        key: Words::from_slice(key),
        entry: entry.clone(),
    };
    // The one it replaces is dropped after the borrow: its kernel's references are let go of
    // with nothing borrowed.
    let old = LAST.replace(Some(Rc::new(last)));
    drop(old);
}

/// The key of `kernel` with `args`, for a caller that compiles through `tile_py.cutile` at
/// trace time (`tile_py.jax.cutile_call`): every array an `__cuda_array_interface__` object,
/// read as it states its layout, nothing converted.
#[pyfunction]
pub(crate) fn _cutile_key(
    kernel: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
) -> PyResult<Vec<u64>> {
    let py = kernel.py();
    let params = params_of(kernel)?;
    let mut w = Walk {
        py,
        launch: None,
        params: &params,
        words: KeyBuf::new(),
        leaves: SmallVec::new(),
        conv: Converted::new(),
        spans: SmallVec::new(),
    };
    for (i, (a, node)) in args.try_iter()?.zip(&params.nodes).enumerate() {
        w.arg(&a?, node, i)?;
    }
    Ok(w.words.as_slice().to_vec())
}

/// A grid as [`launch`] reads it, `(x, y, z)`, with cuTile's errors (`tile_py.cutile._dims`).
#[pyfunction]
pub(crate) fn _cutile_grid(grid: &Bound<'_, PyAny>) -> PyResult<(u32, u32, u32)> {
    let d = grid_dims(grid)?;
    Ok((d.x, d.y, d.z))
}

/// Registers what `_compile_miss` returned (`(tile_py.Kernel, keep)`) under `key`, unless the
/// kernel's plan was dropped meanwhile (`clear_cache()`) or the key was registered meanwhile
/// (a launch from the compile itself); returns the entry the launch launches.
fn register(
    kid: usize,
    params: &Arc<Params>,
    key: &[u64],
    compiled: &Bound<'_, PyAny>,
) -> PyResult<Arc<Entry>> {
    let (kernel, keep): (Bound<'_, Kernel>, Vec<bool>) = compiled.extract()?;
    let entry = Arc::new(Entry {
        kernel: kernel.unbind(),
        keep: keep.into(),
    });
    let mut g = plans();
    let Some(plan) = g.as_mut().and_then(|m| m.get_mut(&kid)) else {
        return Ok(entry);
    };
    let kept = plan
        .entries
        .entry(Words::from_slice(key))
        .or_insert_with(|| {
            MISSES.fetch_add(1, Ordering::Relaxed);
            entry.clone()
        })
        .clone();
    drop(g);
    remember(kid, params, key, &kept);
    Ok(entry)
}

/// Launches `kernel` with the walked arguments, their slots filled for it ([`fill_slots`]).
#[allow(clippy::too_many_arguments)]
fn launch_leaves(
    py: Python<'_>,
    w: &mut Walk<'_, '_>,
    s: &tile_launch::Stream,
    stream_value: i64,
    config: &LaunchConfig,
    kernel: &Bound<'_, Kernel>,
    keep: &[bool],
    hs: &Handshake,
) -> PyResult<LaunchHandle> {
    let tk = kernel.get();
    if let Err(e) = fill_slots(py, w, &tk.params, keep, hs) {
        w.conv.abandon(py);
        return Err(e);
    }
    COUNTERS.launches_attempted.fetch_add(1, Ordering::Relaxed);
    submit_converted(
        py,
        &Target {
            stream: s,
            stream_value,
            kernel: tk,
            config,
            bound: None,
        },
        &mut w.conv,
    )
}

/// Puts the walked arguments in the compiled kernel's order (`params`; `keep`, per leaf,
/// whether it is passed): each scalar converted to its declared type in its slot, each list
/// staged (its descriptor buffer and its length in its two slots), the slot of a leaf that is
/// not passed (a constant cuTile found in its value) removed. Arrays are always passed, as
/// converted: only constants are kept out. The kinds and the count are tile-launch's to check.
fn fill_slots(
    py: Python<'_>,
    w: &mut Walk<'_, '_>,
    params: &[Param],
    keep: &[bool],
    hs: &Handshake,
) -> PyResult<()> {
    if keep.len() != w.leaves.len() {
        return Err(err(
            Kind::Runtime,
            "tile_py.cutile: the compiled kernel's leaf count does not match its arguments \
             (a bug)",
        ));
    }
    let conv = &mut w.conv;
    // Slots removed so far: later slots are that many places earlier.
    let mut removed = 0;
    for (i, (leaf, &k)) in w.leaves.iter().zip(keep).enumerate() {
        match (leaf, k) {
            (Leaf::Array(..), _) | (Leaf::Scalar(_, _, None), false) => {}
            (Leaf::Scalar(obj, int, Some(slot)), true) => {
                let j = slot - removed;
                let Some(Param::Scalar(ty)) = params.get(j) else {
                    return Err(mismatch(i));
                };
                let v = match int.and_then(|v| int_scalar(v.into(), *ty)) {
                    Some(v) => v,
                    None => convert_scalar(i, obj, *ty)?,
                };
                // The placeholder's value replaced (nothing to drop).
                match &mut conv.args[j] {
                    Arg::Scalar(placeholder) => *placeholder = v,
                    Arg::Tensor(_) => return Err(mismatch(i)),
                }
            }
            (Leaf::Scalar(_, _, Some(slot)), false) => {
                let j = slot - removed;
                conv.args.remove(j);
                conv.claims.remove(j);
                removed += 1;
            }
            (Leaf::List(arg, len, _, slot), true) => {
                let j = slot - removed;
                let (t, n) = stage(py, i, arg, *len, params.get(j..).unwrap_or_default(), hs)?;
                // Into the first slot: appended, swapped in, the placeholder dropped.
                conv.push_tensor(t);
                let last = conv.args.len() - 1;
                conv.args.swap(j, last);
                conv.claims.swap(j, last);
                conv.args.pop();
                conv.claims.pop();
                conv.args[j + 1] = Arg::Scalar(n);
            }
            (Leaf::Scalar(_, _, None), true) | (Leaf::List(..), false) => {
                return Err(mismatch(i));
            }
        }
    }
    Ok(())
}

fn mismatch(i: usize) -> PyErr {
    err(
        Kind::Runtime,
        format!(
            "tile_py.cutile: argument {i} does not match the compiled kernel's parameters (a bug)"
        ),
    )
}

/// A list argument's staged descriptor buffer (`tile_py.cutile._stage`), converted, and its
/// length, against the next two declared parameters.
fn stage(
    py: Python<'_>,
    i: usize,
    arg: &Bound<'_, PyAny>,
    len: usize,
    params: &[Param],
    hs: &Handshake,
) -> PyResult<(Tensor, tile_launch::Scalar)> {
    let [buffer, Param::Scalar(ty), ..] = params else {
        return Err(mismatch(i));
    };
    if matches!(buffer, Param::Scalar(_)) {
        return Err(mismatch(i));
    }
    let staged = call_module(py, "_stage", (arg,))?;
    let n = convert_scalar(i, &len.into_pyobject(py)?.into_any(), *ty)?;
    Ok((convert_tensor(py, i, &staged, &ANY_INPUT, hs)?, n))
}
