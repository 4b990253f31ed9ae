//! Hand-built DLPack tensors with a counting deleter, for tests (feature `testing`).
//!
//! A [`TensorSpec`] describes every field of a descriptor, including ones that are invalid on
//! purpose (negative `ndim`, a null shape, an unknown dtype, a misaligned data address).
//! [`counted_tensor`] builds it on the heap and returns it as an [`Unused`] together with a
//! [`DeleterCount`] that counts how often its deleter ran:
//!
//! ```
//! use tile_dlpack::{DType, testing::{counted_tensor, TensorSpec}};
//!
//! let (unused, deleted) = counted_tensor(&TensorSpec::new(&[2, 3], DType::F32));
//! let used = unused.consume().unwrap();
//! assert_eq!(used.view().shape(), &[2, 3]);
//! assert_eq!(deleted.get(), 0);
//! let _released = used.release();
//! assert_eq!(deleted.get(), 1);
//! ```
//!
//! The data address is a number, never dereferenced (nothing in `tile-dlpack` reads tensor
//! memory); set it to a real allocation when a test needs one.
//!
//! Memory: the export's allocations are freed once its deleter has run and every
//! `DeleterCount` for it is dropped. A deleter that runs twice while a `DeleterCount` is alive
//! is counted (2), not undefined behaviour, so a test sees it. An export that is never
//! consumed nor deleted (for instance an [`Unused`] that was only peeked at) is leaked, as a
//! producer's would be; use [`counted_raw`] and [`RawTensor::delete`] to play the producer's
//! part instead.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlpark::{DlpackFlags, ManagedTensorBase};

use crate::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use crate::{DType, Device, MAX_NDIM, Unused};

/// Which managed-tensor struct to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abi {
    /// `DLManagedTensor` (no version, no flags).
    Legacy,
    /// `DLManagedTensorVersioned` declaring this version (the 1.x layout is used whatever
    /// `major` says).
    Versioned {
        /// Declared major version.
        major: u32,
        /// Declared minor version.
        minor: u32,
    },
}

/// Every field of a hand-built descriptor.
///
/// Defaults from [`TensorSpec::new`]: null strides (compact), `ndim = shape.len()`, device
/// `cuda:0`, data address `0x7f00_0000_0000` (256-byte aligned, never dereferenced),
/// `byte_offset` 0, versioned 1.3, no flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Dimensions.
    pub shape: Vec<i64>,
    /// Strides in elements; `None` builds a null strides pointer.
    pub strides: Option<Vec<i64>>,
    /// Overrides `ndim` (default `shape.len()`). Entries past `shape.len()` (and
    /// `strides.len()`) read as 1, up to [`MAX_NDIM`] entries; nothing is allocated beyond.
    pub ndim: Option<i32>,
    /// Builds a null shape pointer.
    pub null_shape: bool,
    /// Element type (any `(code, bits, lanes)`, supported or not).
    pub dtype: DType,
    /// Device.
    pub device: Device,
    /// The data address; 0 builds a null data pointer.
    pub data: u64,
    /// `byte_offset`.
    pub byte_offset: u64,
    /// Legacy or versioned (and which version).
    pub abi: Abi,
    /// Raw `flags` bits (versioned only).
    pub flags: u64,
}

impl TensorSpec {
    /// A compact tensor of `shape` and `dtype` with the defaults listed on the type.
    pub fn new(shape: &[i64], dtype: DType) -> Self {
        Self {
            shape: shape.to_vec(),
            strides: None,
            ndim: None,
            null_shape: false,
            dtype,
            device: Device::cuda(0),
            data: 0x7f00_0000_0000,
            byte_offset: 0,
            abi: Abi::Versioned { major: 1, minor: 3 },
            flags: 0,
        }
    }

    /// Explicit strides (in elements).
    pub fn strides(mut self, strides: &[i64]) -> Self {
        self.strides = Some(strides.to_vec());
        self
    }

    /// Overrides `ndim`.
    pub fn ndim(mut self, ndim: i32) -> Self {
        self.ndim = Some(ndim);
        self
    }

    /// A null shape pointer.
    pub fn null_shape(mut self) -> Self {
        self.null_shape = true;
        self
    }

    /// The device.
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The data address (0 for null).
    pub fn data(mut self, data: u64) -> Self {
        self.data = data;
        self
    }

    /// The byte offset.
    pub fn byte_offset(mut self, byte_offset: u64) -> Self {
        self.byte_offset = byte_offset;
        self
    }

    /// A legacy `DLManagedTensor`.
    pub fn legacy(mut self) -> Self {
        self.abi = Abi::Legacy;
        self
    }

    /// A `DLManagedTensorVersioned` declaring `major.minor`.
    pub fn version(mut self, major: u32, minor: u32) -> Self {
        self.abi = Abi::Versioned { major, minor };
        self
    }

    /// Raw flag bits (versioned only).
    pub fn flags(mut self, flags: u64) -> Self {
        self.flags = flags;
        self
    }

    /// Sets the `READ_ONLY` flag.
    pub fn read_only(self) -> Self {
        let flags = self.flags | DlpackFlags::READ_ONLY.bits();
        self.flags(flags)
    }
}

/// How many times an export's deleter has run. Cloning shares the count.
#[derive(Clone)]
pub struct DeleterCount(Arc<Export>);

impl DeleterCount {
    /// Deleter calls so far.
    pub fn get(&self) -> usize {
        self.0.count.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for DeleterCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DeleterCount").field(&self.get()).finish()
    }
}

/// A raw export from [`counted_raw`]: a pointer to the managed tensor, as a producer hands
/// it out.
#[derive(Clone, Copy, Debug)]
pub enum RawTensor {
    /// A legacy export.
    Legacy(*mut DLManagedTensor),
    /// A versioned export.
    Versioned(*mut DLManagedTensorVersioned),
}

impl RawTensor {
    /// Wraps the export as an [`Unused`].
    ///
    /// # Safety
    ///
    /// The export must not have been consumed or deleted, and must not be deleted (through
    /// [`delete`](Self::delete)) while the `Unused`, or the `Used` made from it, exists.
    pub unsafe fn unused<'a>(self) -> Unused<'a> {
        match self {
            // SAFETY: a live export built by `counted_raw`: valid, unchanged, shape and
            // strides valid for the `ndim` entries read, deleter callable once from any
            // thread; the caller guarantees nobody else consumes or deletes it.
            Self::Legacy(ptr) => unsafe { Unused::from_legacy(ptr) },
            // SAFETY: as above.
            Self::Versioned(ptr) => unsafe { Unused::from_versioned(ptr) },
        }
    }

    /// Calls the deleter, as a producer's capsule destructor does for an export nobody
    /// consumed.
    ///
    /// # Safety
    ///
    /// The export must not have been consumed, and this is its only deletion. (A second call
    /// while a [`DeleterCount`] is alive is counted rather than undefined, but it is still a
    /// bug in the test.)
    pub unsafe fn delete(self) {
        match self {
            // SAFETY: a live, unconsumed export; `drop_raw` calls its deleter once.
            Self::Legacy(ptr) => unsafe { DLManagedTensor::drop_raw(ptr) },
            // SAFETY: as above.
            Self::Versioned(ptr) => unsafe { DLManagedTensorVersioned::drop_raw(ptr) },
        }
    }
}

/// Builds `spec` as a heap export with a counting deleter and wraps it as an [`Unused`].
///
/// `'static` is sound because the export lives until its deleter runs, and only consuming
/// this `Unused` can run it. An export that is never consumed is leaked (see the module docs).
pub fn counted_tensor(spec: &TensorSpec) -> (Unused<'static>, DeleterCount) {
    let (raw, count) = counted_raw(spec);
    // SAFETY: `raw` is fresh and only this `Unused` can consume it; nothing deletes it
    // otherwise.
    (unsafe { raw.unused() }, count)
}

/// Builds `spec` as a heap export with a counting deleter and returns the raw pointer, for
/// tests that play the producer's part (and call [`RawTensor::delete`]).
pub fn counted_raw(spec: &TensorSpec) -> (RawTensor, DeleterCount) {
    let ndim = spec
        .ndim
        .unwrap_or_else(|| i32::try_from(spec.shape.len()).unwrap_or(i32::MAX));
    let readable = usize::try_from(ndim.clamp(0, MAX_NDIM)).unwrap_or(0);
    let padded = |values: &[i64]| -> *mut [i64] {
        let mut values = values.to_vec();
        if values.len() < readable {
            values.resize(readable, 1);
        }
        Box::into_raw(values.into_boxed_slice())
    };
    let shape = padded(&spec.shape);
    let strides = spec.strides.as_deref().map(padded);
    let tensor = DLTensor {
        data: std::ptr::without_provenance_mut(spec.data as usize),
        device: spec.device.into(),
        ndim,
        dtype: spec.dtype.into(),
        shape: if spec.null_shape {
            std::ptr::null_mut()
        } else {
            shape.cast()
        },
        strides: strides.map_or(std::ptr::null_mut(), |s| s.cast()),
        byte_offset: spec.byte_offset,
    };

    let raw = match spec.abi {
        Abi::Legacy => RawTensor::Legacy(Box::into_raw(Box::new(DLManagedTensor::from_parts(
            tensor,
            std::ptr::null_mut(),
            Some(counting_deleter::<DLManagedTensor>),
        )))),
        Abi::Versioned { major, minor } => {
            let mut managed = DLManagedTensorVersioned::from_parts(
                tensor,
                std::ptr::null_mut(),
                Some(counting_deleter::<DLManagedTensorVersioned>),
            );
            managed.version = DLPackVersion { major, minor };
            managed.flags = DlpackFlags::from_bits_retain(spec.flags);
            RawTensor::Versioned(Box::into_raw(Box::new(managed)))
        }
    };
    let export = Arc::new(Export {
        count: AtomicUsize::new(0),
        shape,
        strides,
        managed: raw,
    });
    // The export's own reference, released by the first deleter call.
    let ctx = Arc::into_raw(Arc::clone(&export))
        .cast_mut()
        .cast::<c_void>();
    match raw {
        // SAFETY: freshly allocated above and not handed out yet.
        RawTensor::Legacy(ptr) => unsafe { (*ptr).manager_ctx = ctx },
        // SAFETY: as above.
        RawTensor::Versioned(ptr) => unsafe { (*ptr).manager_ctx = ctx },
    }
    (raw, DeleterCount(export))
}

/// The allocations behind one export, freed when the last reference goes: the export's own
/// (held by `manager_ctx`, released by the first deleter call) or a [`DeleterCount`].
struct Export {
    count: AtomicUsize,
    shape: *mut [i64],
    strides: Option<*mut [i64]>,
    managed: RawTensor,
}

// SAFETY: the pointers are owned allocations, written only before the export is handed out
// and freed only in `Drop`; the count is atomic.
unsafe impl Send for Export {}
// SAFETY: as above; shared access only reads the pointers and updates the atomic count.
unsafe impl Sync for Export {}

impl Drop for Export {
    fn drop(&mut self) {
        // SAFETY: these came from `Box::into_raw` in `counted_raw` and are freed only here,
        // once, when no deleter can run any more (the export's reference is gone).
        unsafe {
            drop(Box::from_raw(self.shape));
            if let Some(strides) = self.strides {
                drop(Box::from_raw(strides));
            }
            match self.managed {
                RawTensor::Legacy(ptr) => drop(Box::from_raw(ptr)),
                RawTensor::Versioned(ptr) => drop(Box::from_raw(ptr)),
            }
        }
    }
}

/// The deleter of every export built here: counts the call and, the first time, gives up the
/// export's reference to its allocations.
///
/// # Safety
///
/// `managed` is an export built by [`counted_raw`] whose allocations are still alive (true
/// on the first call, and on later calls while a [`DeleterCount`] exists).
unsafe extern "C" fn counting_deleter<M: ManagedTensorBase>(managed: *mut M) {
    // SAFETY: `managed` is alive (this function's contract), and its context is the
    // `Arc<Export>` pointer `counted_raw` stored.
    let export = unsafe { (*managed).manager_ctx() }
        .cast::<Export>()
        .cast_const();
    // SAFETY: the `Export` is alive as long as `managed` is: it owns it.
    let previous = unsafe { (*export).count.fetch_add(1, Ordering::SeqCst) };
    if previous == 0 {
        // SAFETY: the reference `counted_raw` leaked into `manager_ctx`, given up once.
        drop(unsafe { Arc::from_raw(export) });
    }
}
