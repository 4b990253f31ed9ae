//! Descriptor validation ([`Meta`]) and the borrowed view it hands out ([`TensorView`]).
//!
//! The checks are written here rather than taken from dlpark's `Managed::validate` /
//! `TensorRef::from_raw`: those accept any dtype and device, have no rank limit, no alignment
//! rule for dtypes without a Rust element type, no byte extent for arbitrary strides, reject
//! null strides for DLPack >= 1.2, and their errors do not carry the values our error table
//! promises.

use std::fmt;

use dlpark::DlpackFlags;

use crate::ffi::DLTensor;
use crate::{DType, DescriptorError, Device, MAX_NDIM};

/// The bytes a tensor can touch, relative to its data pointer (`data + byte_offset`).
///
/// `start <= 0 <= end`: `start` is below zero when some stride is negative, `end` is one past
/// the last byte reachable through positive strides. An empty tensor (a dimension of 0) has
/// `0..0`; a 0-d tensor has `0..itemsize`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ByteExtent {
    /// First byte, relative to the data pointer (`<= 0`).
    pub start: i64,
    /// One past the last byte, relative to the data pointer (`>= 0`).
    pub end: i64,
}

/// What validation established about a descriptor, computed once.
///
/// It holds no pointer into the descriptor: [`Meta::view`] is given the descriptor again, so
/// an owner (`Used`, `Unused`) stays `Send`/`Sync` exactly when its handle is.
#[derive(Debug)]
pub(crate) struct Meta {
    ndim: usize,
    /// Compact row-major strides, when the descriptor's strides pointer is null and `ndim > 0`.
    compact_strides: Option<Box<[i64]>>,
    device: Device,
    dtype: DType,
    numel: u64,
    data_ptr: u64,
    extent: ByteExtent,
    read_only: bool,
    copied: bool,
    versioned: bool,
}

impl Meta {
    /// Validates every field of `tensor`. `flags` is `None` for a legacy (unversioned) tensor.
    /// The version of a versioned tensor must have been checked by the caller (it decides
    /// whether `tensor` may be read at all).
    ///
    /// Checks, in this order (the first failure is returned): `ndim` in `0..=MAX_NDIM`; shape
    /// pointer non-null when `ndim > 0`; no negative dimension; dtype in the table; no padded
    /// sub-byte data; device type known and ordinal non-negative; element count fits `u64`;
    /// data non-null unless empty; `data + byte_offset` fits `u64`; compact strides (for a null
    /// strides pointer) fit `i64`; byte extent fits `i64`; and, for a non-empty tensor,
    /// `data_ptr + extent` fits `u64` and `data_ptr` is aligned for the dtype.
    ///
    /// # Safety
    ///
    /// When `0 < tensor.ndim <= MAX_NDIM`, `tensor.shape` and `tensor.strides` must each be
    /// null or point to `tensor.ndim` readable `i64` values.
    pub(crate) unsafe fn validate(
        tensor: &DLTensor,
        flags: Option<DlpackFlags>,
    ) -> Result<Self, DescriptorError> {
        let ndim = usize::try_from(tensor.ndim)
            .ok()
            .filter(|&n| n <= MAX_NDIM as usize)
            .ok_or(DescriptorError::NdimOutOfRange {
                ndim: tensor.ndim,
                limit: MAX_NDIM,
            })?;
        // SAFETY: `ndim` is in range; the caller guarantees the shape pointer is null or valid
        // for `ndim` values.
        let shape = unsafe { raw_slice(tensor.shape, ndim) }
            .ok_or(DescriptorError::NullShape { ndim: tensor.ndim })?;
        if let Some((axis, &value)) = shape.iter().enumerate().find(|&(_, &dim)| dim < 0) {
            return Err(DescriptorError::NegativeDimension { axis, value });
        }

        let dtype = DType::from(tensor.dtype);
        dtype.check()?;
        let flags_or_empty = flags.unwrap_or(DlpackFlags::empty());
        if dtype.is_sub_byte() && flags_or_empty.contains(DlpackFlags::IS_SUBBYTE_TYPE_PADDED) {
            return Err(DescriptorError::PaddedSubByte { dtype });
        }
        let device = Device::from(tensor.device);
        device.check()?;

        let numel = element_count(shape).ok_or(DescriptorError::Overflow {
            what: "element count",
        })?;
        let data = tensor.data.addr() as u64;
        if data == 0 && numel > 0 {
            return Err(DescriptorError::NullData { numel });
        }
        let data_ptr = data
            .checked_add(tensor.byte_offset)
            .ok_or(DescriptorError::Overflow {
                what: "data pointer + byte_offset",
            })?;

        // SAFETY: as for the shape: null, or valid for `ndim` values.
        let explicit_strides = unsafe { raw_slice(tensor.strides, ndim) };
        let compact_strides = match explicit_strides {
            Some(_) => None,
            None => Some(compact_strides(shape).ok_or(DescriptorError::Overflow {
                what: "compact strides",
            })?),
        };
        let strides = explicit_strides
            .or(compact_strides.as_deref())
            .unwrap_or_default();

        let extent = if numel == 0 {
            ByteExtent::default()
        } else {
            let extent =
                byte_extent(shape, strides, dtype.itemsize()).ok_or(DescriptorError::Overflow {
                    what: "byte extent",
                })?;
            let in_address_space = data_ptr.checked_add_signed(extent.start).is_some()
                && data_ptr.checked_add(extent.end.unsigned_abs()).is_some();
            if !in_address_space {
                return Err(DescriptorError::Overflow {
                    what: "address range",
                });
            }
            let alignment = dtype.alignment();
            if data_ptr % alignment != 0 {
                return Err(DescriptorError::Misaligned {
                    address: data_ptr,
                    alignment,
                    dtype,
                });
            }
            extent
        };

        Ok(Self {
            ndim,
            compact_strides,
            device,
            dtype,
            numel,
            data_ptr,
            extent,
            read_only: flags_or_empty.contains(DlpackFlags::READ_ONLY),
            copied: flags_or_empty.contains(DlpackFlags::IS_COPIED),
            versioned: flags.is_some(),
        })
    }

    /// A view of `tensor` with what validation computed.
    ///
    /// # Safety
    ///
    /// `tensor` must be the descriptor `self` was validated from, unchanged, with its shape
    /// and strides still readable for `'a`.
    pub(crate) unsafe fn view<'a>(&'a self, tensor: &'a DLTensor) -> TensorView<'a> {
        // SAFETY: validation proved the shape pointer non-null for `ndim > 0`, and the caller
        // guarantees it is still valid for `ndim` values.
        let shape = unsafe { raw_slice(tensor.shape, self.ndim) }.unwrap_or_default();
        let strides = match &self.compact_strides {
            Some(strides) => strides,
            // SAFETY: the strides pointer was non-null (or `ndim == 0`) at validation, and the
            // caller guarantees it is still valid for `ndim` values.
            None => unsafe { raw_slice(tensor.strides, self.ndim) }.unwrap_or_default(),
        };
        TensorView {
            shape,
            strides,
            meta: self,
        }
    }
}

/// `Some(&[])` for `len == 0`, `None` for a null pointer, else the slice.
///
/// # Safety
///
/// A non-null `ptr` must point to `len` readable `i64` values that stay unchanged for `'a`.
unsafe fn raw_slice<'a>(ptr: *const i64, len: usize) -> Option<&'a [i64]> {
    if len == 0 {
        Some(&[])
    } else if ptr.is_null() {
        None
    } else {
        // SAFETY: non-null and valid for `len` values, by the caller's contract; `i64` has no
        // invalid bit patterns.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

/// Product of non-negative dimensions; 0 when any is 0 (whatever the others), `None` when
/// the product of non-empty dimensions overflows `u64`.
fn element_count(shape: &[i64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape
        .iter()
        .try_fold(1u64, |acc, &dim| acc.checked_mul(dim.unsigned_abs()))
}

/// Row-major compact strides: `strides[i]` is the product of `shape[i + 1..]`. `None` when
/// one of them overflows `i64` (each is computed from the next, so an overflow means that
/// stride's exact value does not fit). dlpark's `compact_strides` also multiplies in the
/// leading dimension, so it fails on strides that fit (shape `[2^62, 2]`).
fn compact_strides(shape: &[i64]) -> Option<Box<[i64]>> {
    let mut strides = vec![1i64; shape.len()].into_boxed_slice();
    for axis in (1..shape.len()).rev() {
        strides[axis - 1] = strides[axis].checked_mul(shape[axis])?;
    }
    Some(strides)
}

/// Byte extent of a non-empty tensor (every dimension >= 1): `itemsize` times the lowest
/// element offset, and `itemsize` times one past the highest. `None` when a value overflows
/// `i64`. All terms of each sum share a sign, so a checked intermediate overflows only when
/// the final value would.
fn byte_extent(shape: &[i64], strides: &[i64], itemsize: u64) -> Option<ByteExtent> {
    let itemsize = i64::try_from(itemsize).ok()?;
    let (mut low, mut high) = (0i64, 0i64);
    for (&dim, &stride) in shape.iter().zip(strides) {
        let reach = (dim - 1).checked_mul(stride)?;
        if reach < 0 {
            low = low.checked_add(reach)?;
        } else {
            high = high.checked_add(reach)?;
        }
    }
    Some(ByteExtent {
        start: low.checked_mul(itemsize)?,
        end: high.checked_add(1)?.checked_mul(itemsize)?,
    })
}

/// A validated, borrowed view of a tensor's metadata.
///
/// Obtained from [`Used::view`](crate::Used::view) or [`Unused::peek`](crate::Unused::peek);
/// it borrows from that value, so it cannot outlive it (nor survive
/// [`Used::release`](crate::Used::release)). Every accessor is a field read: the values were
/// computed and checked once, at validation.
///
/// [`data_ptr`](Self::data_ptr) is a plain address: the integer itself can be copied out of
/// the borrow, and using it after the owner is gone is the caller's responsibility.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    shape: &'a [i64],
    strides: &'a [i64],
    meta: &'a Meta,
}

impl<'a> TensorView<'a> {
    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.meta.device
    }

    /// The element type (always one of the [supported dtypes](DType)).
    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }

    /// Number of dimensions, `0..=MAX_NDIM`.
    pub fn ndim(&self) -> usize {
        self.meta.ndim
    }

    /// Dimensions, each `>= 0`; empty for a 0-d tensor.
    pub fn shape(&self) -> &'a [i64] {
        self.shape
    }

    /// Strides in elements, one per dimension. When the descriptor's strides pointer is null
    /// these are the compact row-major strides computed at validation.
    pub fn strides(&self) -> &'a [i64] {
        self.strides
    }

    /// The address of the first element: `data + byte_offset`, in the device's address space.
    /// For an empty tensor it may be `byte_offset` alone (data may be null).
    pub fn data_ptr(&self) -> u64 {
        self.meta.data_ptr
    }

    /// Number of elements: the product of the shape (1 for a 0-d tensor, 0 when empty).
    pub fn numel(&self) -> u64 {
        self.meta.numel
    }

    /// The bytes the tensor can touch, relative to [`data_ptr`](Self::data_ptr).
    pub fn byte_extent(&self) -> ByteExtent {
        self.meta.extent
    }

    /// Bytes between the lowest and the highest byte the tensor can touch
    /// (`end - start` of [`byte_extent`](Self::byte_extent)); 0 when empty.
    pub fn nbytes_spanned(&self) -> u64 {
        self.meta.extent.end.abs_diff(self.meta.extent.start)
    }

    /// The `READ_ONLY` flag of a versioned tensor; always `false` for a legacy one, which
    /// has no flags (so whether a legacy tensor may be written is the producer's word alone).
    pub fn is_read_only(&self) -> bool {
        self.meta.read_only
    }

    /// The `IS_COPIED` flag of a versioned tensor (the producer made a copy that only this
    /// consumer holds); always `false` for a legacy tensor.
    pub fn is_copied(&self) -> bool {
        self.meta.copied
    }

    /// Whether the descriptor is a `DLManagedTensorVersioned`.
    pub fn is_versioned(&self) -> bool {
        self.meta.versioned
    }

    /// Whether the elements are laid out compact and row-major, ignoring dimensions of size 1
    /// (whose stride never matters). Empty tensors count as contiguous.
    pub fn is_contiguous(&self) -> bool {
        if self.meta.numel == 0 {
            return true;
        }
        // The running product never exceeds numel (a u64), so it fits i128.
        let mut expected = 1i128;
        for (&dim, &stride) in self.shape.iter().zip(self.strides).rev() {
            if dim == 1 {
                continue;
            }
            if i128::from(stride) != expected {
                return false;
            }
            expected *= i128::from(dim);
        }
        true
    }

    /// Checks that the tensor may be written by a kernel: not read-only, not a private copy
    /// (`IS_COPIED`), and no two elements at the same address.
    ///
    /// The overlap check is conservative. Contiguous and empty tensors pass. Otherwise the
    /// dimensions of size > 1 are sorted by `|stride|`, and each must step further than
    /// everything the smaller-stride dimensions reach together
    /// (`|stride_k| > Σ_{j<k} |stride_j| * (shape_j - 1)`); that proves every element has its
    /// own address. Broadcasts (stride 0) always fail it, as do some exotic layouts that are in
    /// fact disjoint (shape `[3, 3]`, strides `[3, 4]`): those are reported as overlapping too.
    ///
    /// # Errors
    ///
    /// [`DescriptorError::ReadOnly`] when the `READ_ONLY` flag is set;
    /// [`DescriptorError::Copied`] when the `IS_COPIED` flag is set (the writes would reach a
    /// copy only this consumer holds);
    /// [`DescriptorError::InternalOverlap`] with the first axis (in the sorted order) at which
    /// disjointness is not proven.
    pub fn check_writable(&self) -> Result<(), DescriptorError> {
        if self.meta.read_only {
            return Err(DescriptorError::ReadOnly);
        }
        if self.meta.copied {
            return Err(DescriptorError::Copied);
        }
        if self.is_contiguous() {
            return Ok(());
        }
        // (|stride|, axis, reach of this axis = |stride| * (dim - 1)); at most MAX_NDIM entries.
        let mut dims = [(0u128, 0usize, 0u128); MAX_NDIM as usize];
        let mut len = 0;
        for (axis, (&dim, &stride)) in self.shape.iter().zip(self.strides).enumerate() {
            if dim > 1 {
                let step = u128::from(stride.unsigned_abs());
                dims[len] = (step, axis, step * u128::from(dim.unsigned_abs() - 1));
                len += 1;
            }
        }
        let dims = &mut dims[..len];
        dims.sort_unstable();
        let mut reached = 0u128;
        for &(step, axis, reach) in dims.iter() {
            if step <= reached {
                return Err(DescriptorError::InternalOverlap { axis });
            }
            reached = reached.saturating_add(reach);
        }
        Ok(())
    }
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("device", &format_args!("{}", self.device()))
            .field("dtype", &format_args!("{}", self.dtype()))
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("data_ptr", &format_args!("{:#x}", self.data_ptr()))
            .field("byte_extent", &self.byte_extent())
            .field("read_only", &self.is_read_only())
            .field("copied", &self.is_copied())
            .field("versioned", &self.is_versioned())
            .finish()
    }
}
