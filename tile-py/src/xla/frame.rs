//! Reading XLA's FFI call frame (`XLA_FFI_CallFrame`, the C ABI of `xla/ffi/api/c_api.h` as
//! bound in [`crate::xla_ffi_sys`]): the metadata query, the buffers, the attributes, the stream,
//! and errors handed back through XLA's error API. Nothing here launches or knows a kernel.

use std::ffi::{CString, c_void};

use tile_dlpack::DType;

use crate::xla_ffi_sys as sys;

/// An error for XLA: its code and message (made into an `XLA_FFI_Error` by [`Frame::error`]).
#[derive(Debug)]
pub(crate) struct FfiError {
    pub(crate) code: sys::XLA_FFI_Error_Code,
    pub(crate) message: String,
}

impl FfiError {
    /// `INVALID_ARGUMENT` with `message`.
    pub(crate) fn invalid(message: impl Into<String>) -> FfiError {
        FfiError {
            code: sys::XLA_FFI_Error_Code::XLA_FFI_Error_Code_INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    /// `INTERNAL` with `message`.
    pub(crate) fn internal(message: impl Into<String>) -> FfiError {
        FfiError {
            code: sys::XLA_FFI_Error_Code::XLA_FFI_Error_Code_INTERNAL,
            message: message.into(),
        }
    }
}

/// A struct's `struct_size` against the size of the prefix tile reads: a caller built against an
/// older header than the one bound passes a smaller struct, which tile refuses rather than read
/// past its end.
fn covers(what: &str, given: usize, needed: u32) -> Result<(), FfiError> {
    if given < needed as usize {
        return Err(FfiError::invalid(format!(
            "tile_py.jax: {what} has struct_size {given}, below the {needed} bytes of the XLA FFI \
             API {}.{} tile_py is built against",
            sys::XLA_FFI_API_MAJOR,
            sys::XLA_FFI_API_MINOR
        )));
    }
    Ok(())
}

/// XLA's call frame, once its sizes were checked against the bound header.
pub(crate) struct Frame<'a> {
    raw: &'a sys::XLA_FFI_CallFrame,
    api: &'a sys::XLA_FFI_Api,
}

/// What a call frame asks of the handler.
pub(crate) enum Call<'a> {
    /// XLA's metadata query (at registration): answered by [`answer_metadata`].
    Metadata(&'a mut sys::XLA_FFI_Metadata_Extension),
    /// A call to execute.
    Execute,
}

/// The traits tile's handler declares: compatible with XLA's command buffers (its launches are
/// captured into CUDA graphs correctly, see `xla::handler`).
pub(crate) const TRAITS: sys::XLA_FFI_Handler_Traits =
    sys::XLA_FFI_Handler_TraitsBits::XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE.0;

impl<'a> Frame<'a> {
    /// The frame's API table, if both are there and large enough to hold what tile calls
    /// (`XLA_FFI_Error_Create`, `XLA_FFI_Stream_Get`).
    ///
    /// # Safety
    ///
    /// `frame` must be null or point to a call frame XLA passed to a handler, valid for `'a`.
    pub(crate) unsafe fn new(frame: *mut sys::XLA_FFI_CallFrame) -> Option<Frame<'a>> {
        // SAFETY: the caller's contract: null or a valid frame for 'a.
        let raw = unsafe { frame.as_ref() }?;
        // SAFETY: a frame's `api` is null or XLA's API table, which outlives every call.
        let api = unsafe { raw.api.as_ref() }?;
        let needed = std::mem::offset_of!(sys::XLA_FFI_Api, XLA_FFI_Stream_Get)
            + std::mem::size_of::<sys::XLA_FFI_Stream_Get>();
        (api.struct_size >= needed && api.XLA_FFI_Error_Create.is_some())
            .then_some(Frame { raw, api })
    }

    /// What XLA asks: the metadata query, or a call of the execute stage.
    ///
    /// # Errors
    ///
    /// A frame smaller than the bound header's, or a stage other than execute (tile registers
    /// an execute handler only).
    pub(crate) fn call(&self) -> Result<Call<'a>, FfiError> {
        let ext = self.raw.extension_start;
        // SAFETY: `extension_start` is null or XLA's first internal extension, valid during the
        // call; its header (size, type, next) is the same for every extension.
        if let Some(e) = unsafe { ext.as_ref() }
            && e.type_ == sys::XLA_FFI_InternalExtension_Type::XLA_FFI_Extension_Metadata
        {
            covers(
                "XLA_FFI_Metadata_Extension",
                e.struct_size,
                sys::XLA_FFI_Metadata_Extension_STRUCT_SIZE,
            )?;
            // SAFETY: an extension of type Metadata is an `XLA_FFI_Metadata_Extension` (whose
            // first field is the header), of at least the size checked above, which XLA lets
            // the handler write during the call.
            let m = unsafe { &mut *ext.cast::<sys::XLA_FFI_Metadata_Extension>() };
            return Ok(Call::Metadata(m));
        }
        covers(
            "XLA_FFI_CallFrame",
            self.raw.struct_size,
            sys::XLA_FFI_CallFrame_STRUCT_SIZE,
        )?;
        if self.raw.stage != sys::XLA_FFI_ExecutionStage::XLA_FFI_ExecutionStage_EXECUTE {
            return Err(FfiError::invalid(format!(
                "tile_py.jax: the handler was called for execution stage {}, it handles the \
                 execute stage ({}) only",
                self.raw.stage.0,
                sys::XLA_FFI_ExecutionStage::XLA_FFI_ExecutionStage_EXECUTE.0
            )));
        }
        Ok(Call::Execute)
    }

    /// The stream XLA runs the call on (`XLA_FFI_Stream_Get`): a `CUstream` on the CUDA
    /// platform.
    #[doc(alias = "XLA_FFI_Stream_Get")]
    pub(crate) fn stream(&self) -> Result<*mut c_void, FfiError> {
        let get = self
            .api
            .XLA_FFI_Stream_Get
            .ok_or_else(|| FfiError::internal("tile_py.jax: XLA has no XLA_FFI_Stream_Get"))?;
        let mut args = sys::XLA_FFI_Stream_Get_Args {
            struct_size: sys::XLA_FFI_Stream_Get_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            ctx: self.raw.ctx,
            stream: std::ptr::null_mut(),
        };
        // SAFETY: XLA's own entry point with its own call context and an argument struct of the
        // bound header's size; it writes `stream` or returns an error that we own.
        let e = unsafe { get(&mut args) };
        if !e.is_null() {
            let message = self.take_message(e);
            return Err(FfiError::internal(format!(
                "tile_py.jax: XLA_FFI_Stream_Get failed: {message}"
            )));
        }
        Ok(args.stream)
    }

    /// The call's operands and its results, each in order.
    pub(crate) fn buffers(&self) -> Result<(Buffers<'a>, Buffers<'a>), FfiError> {
        let (a, r) = (&self.raw.args, &self.raw.rets);
        Ok((
            buffers("operand", a.size, a.types.cast(), a.args, OPERAND_BUFFER)?,
            buffers("result", r.size, r.types.cast(), r.rets, RESULT_BUFFER)?,
        ))
    }

    /// The call's attributes, in XLA's order (sorted by name).
    pub(crate) fn attrs(&self) -> Result<Vec<(&'a str, Attr)>, FfiError> {
        let a = &self.raw.attrs;
        let n = usize::try_from(a.size)
            .map_err(|_| FfiError::invalid("tile_py.jax: negative attribute count"))?;
        if n > MAX_ENTRIES {
            return Err(FfiError::invalid(format!(
                "tile_py.jax: {n} attributes (at most {MAX_ENTRIES})"
            )));
        }
        if n > 0 && (a.types.is_null() || a.names.is_null() || a.attrs.is_null()) {
            return Err(FfiError::invalid("tile_py.jax: null attribute arrays"));
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: XLA's attribute arrays hold `size` entries each, valid during the call.
            let (ty, name, value) = unsafe { (*a.types.add(i), *a.names.add(i), *a.attrs.add(i)) };
            // SAFETY: each name is a byte span XLA keeps during the call.
            let name = unsafe { name.as_ref() }
                .filter(|s| !s.ptr.is_null())
                .map(|s| {
                    // SAFETY: a span of `len` bytes at the non-null `ptr`.
                    unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) }
                })
                .and_then(|b| std::str::from_utf8(b).ok())
                .ok_or_else(|| FfiError::invalid("tile_py.jax: an attribute without a name"))?;
            let attr = match ty {
                sys::XLA_FFI_AttrType::XLA_FFI_AttrType_SCALAR => {
                    // SAFETY: a scalar attribute is an `XLA_FFI_Scalar` whose value points to
                    // one element of its dtype (null refused).
                    let s = unsafe { value.cast::<sys::XLA_FFI_Scalar>().as_ref() }.ok_or_else(
                        || FfiError::invalid(format!("tile_py.jax: attribute `{name}` is null")),
                    )?;
                    Attr::Scalar(s.dtype, s.value.cast_const())
                }
                _ => Attr::Other,
            };
            out.push((name, attr));
        }
        Ok(out)
    }

    /// Hands `e` to XLA as an `XLA_FFI_Error` (`XLA_FFI_Error_Create`); XLA owns it from here.
    #[doc(alias = "XLA_FFI_Error_Create")]
    pub(crate) fn error(&self, e: &FfiError) -> *mut sys::XLA_FFI_Error {
        create_error(self.api, e)
    }

    /// The message of an error XLA returned, and the error destroyed (when XLA lets us).
    fn take_message(&self, e: *mut sys::XLA_FFI_Error) -> String {
        let mut message = String::from("(no message)");
        if let Some(details) = self.api.XLA_FFI_Error_GetDetails {
            let mut args = sys::XLA_FFI_Error_GetDetails_Args {
                struct_size: sys::XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE as usize,
                extension_start: std::ptr::null_mut(),
                error: e,
                message: std::ptr::null(),
                errc: sys::XLA_FFI_Error_Code::XLA_FFI_Error_Code_OK,
            };
            // SAFETY: XLA's entry point on an error it returned; `message` is then a C string
            // owned by the error.
            unsafe { details(&mut args) };
            if !args.message.is_null() {
                // SAFETY: a NUL-terminated string that lives as long as the error.
                message = unsafe { std::ffi::CStr::from_ptr(args.message) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        if let Some(destroy) = self.api.XLA_FFI_Error_Destroy {
            let mut args = sys::XLA_FFI_Error_Destroy_Args {
                struct_size: sys::XLA_FFI_Error_Destroy_Args_STRUCT_SIZE as usize,
                extension_start: std::ptr::null_mut(),
                error: e,
            };
            // SAFETY: XLA's entry point on an error it returned and we own.
            unsafe { destroy(&mut args) };
        }
        message
    }
}

/// `XLA_FFI_Error_Create` with `e`'s code and message.
fn create_error(api: &sys::XLA_FFI_Api, e: &FfiError) -> *mut sys::XLA_FFI_Error {
    let Some(create) = api.XLA_FFI_Error_Create else {
        return std::ptr::null_mut();
    };
    // A message with a NUL inside is cut there rather than lost.
    let text = e.message.split('\0').next().unwrap_or_default();
    let message = CString::new(text).unwrap_or_default();
    let mut args = sys::XLA_FFI_Error_Create_Args {
        struct_size: sys::XLA_FFI_Error_Create_Args_STRUCT_SIZE as usize,
        extension_start: std::ptr::null_mut(),
        message: message.as_ptr(),
        errc: e.code,
    };
    // SAFETY: XLA's entry point; it copies the message before returning.
    unsafe { create(&mut args) }
}

/// Answers XLA's metadata query: the API version of the bound header and [`TRAITS`].
///
/// # Errors
///
/// A metadata struct smaller than the bound header's.
pub(crate) fn answer_metadata(ext: &mut sys::XLA_FFI_Metadata_Extension) -> Result<(), FfiError> {
    // SAFETY: XLA's metadata extension points to a metadata struct it lets the handler write.
    let m = unsafe { ext.metadata.as_mut() }
        .ok_or_else(|| FfiError::invalid("tile_py.jax: a metadata query without metadata"))?;
    covers(
        "XLA_FFI_Metadata",
        m.struct_size,
        sys::XLA_FFI_Metadata_STRUCT_SIZE,
    )?;
    m.api_version = sys::XLA_FFI_Api_Version {
        struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE as usize,
        extension_start: std::ptr::null_mut(),
        major_version: sys::XLA_FFI_API_MAJOR as i32,
        minor_version: sys::XLA_FFI_API_MINOR as i32,
    };
    m.traits = TRAITS;
    // A field past the header's struct size is written only where the caller has it.
    let state = std::mem::offset_of!(sys::XLA_FFI_Metadata, state_type_id);
    if m.struct_size >= state + std::mem::size_of::<sys::XLA_FFI_TypeId>() {
        m.state_type_id = sys::XLA_FFI_TypeId { type_id: 0 };
    }
    Ok(())
}

/// An attribute's value, as far as tile reads attributes (scalars).
#[derive(Clone, Copy)]
pub(crate) enum Attr {
    /// A scalar: its dtype and a pointer to its value.
    Scalar(sys::XLA_FFI_DataType, *const c_void),
    /// An array, a dictionary or a string (tile's attributes are all scalars).
    Other,
}

impl Attr {
    /// The attribute as an `i64` scalar.
    pub(crate) fn i64(&self, name: &str) -> Result<i64, FfiError> {
        match *self {
            Attr::Scalar(sys::XLA_FFI_DataType::XLA_FFI_DataType_S64, p) if !p.is_null() => {
                // SAFETY: an S64 scalar's value points to one i64 (alignment not promised).
                Ok(unsafe { p.cast::<i64>().read_unaligned() })
            }
            _ => Err(FfiError::invalid(format!(
                "tile_py.jax: attribute `{name}` must be an int64 scalar"
            ))),
        }
    }
}

/// One of XLA's buffers: element type, data pointer and extents (dense, row-major: XLA hands
/// FFI calls their operands and results in the default layout).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Buffer<'a> {
    pub(crate) dtype: sys::XLA_FFI_DataType,
    pub(crate) data: *mut c_void,
    pub(crate) dims: &'a [i64],
}

/// A call's operands or results.
pub(crate) type Buffers<'a> = Vec<Buffer<'a>>;

/// The most operands, results or attributes a call frame may say it has: far above any call
/// tile makes, and a bound on what a malformed count makes the handler allocate.
const MAX_ENTRIES: usize = 1 << 16;

/// The type tags of a buffer among a call's operands and among its results.
const OPERAND_BUFFER: u32 = sys::XLA_FFI_ArgType::XLA_FFI_ArgType_BUFFER.0;
const RESULT_BUFFER: u32 = sys::XLA_FFI_RetType::XLA_FFI_RetType_BUFFER.0;

/// One of XLA's buffer arrays (`what`: `operand` or `result`): `size` entries, each tagged in
/// `types` and pointed to by `items`; every entry must be a buffer (tag `buffer`).
fn buffers<'a>(
    what: &str,
    size: i64,
    types: *const u32,
    items: *mut *mut c_void,
    buffer: u32,
) -> Result<Buffers<'a>, FfiError> {
    let n = usize::try_from(size)
        .map_err(|_| FfiError::invalid(format!("tile_py.jax: negative {what} count")))?;
    if n > MAX_ENTRIES {
        return Err(FfiError::invalid(format!(
            "tile_py.jax: {n} {what}s (at most {MAX_ENTRIES})"
        )));
    }
    if n > 0 && (types.is_null() || items.is_null()) {
        return Err(FfiError::invalid(format!(
            "tile_py.jax: null {what} arrays"
        )));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: XLA's type and pointer arrays hold `size` entries, valid during the call.
        let (ty, item) = unsafe { (*types.add(i), *items.add(i)) };
        if ty != buffer {
            return Err(FfiError::invalid(format!(
                "tile_py.jax: {what} {i} is not a buffer (type {ty})"
            )));
        }
        // SAFETY: a buffer entry is an `XLA_FFI_Buffer`, valid during the call.
        let b = unsafe { item.cast::<sys::XLA_FFI_Buffer>().as_ref() }
            .ok_or_else(|| FfiError::invalid(format!("tile_py.jax: {what} {i} is null")))?;
        let rank = usize::try_from(b.rank)
            .map_err(|_| FfiError::invalid(format!("tile_py.jax: {what} {i}: negative rank")))?;
        let dims = if rank == 0 {
            &[][..]
        } else if b.dims.is_null() || rank > 64 {
            return Err(FfiError::invalid(format!(
                "tile_py.jax: {what} {i}: rank {rank} without its extents (or above 64)"
            )));
        } else {
            // SAFETY: `dims` holds `rank` extents, valid during the call.
            unsafe { std::slice::from_raw_parts(b.dims, rank) }
        };
        out.push(Buffer {
            dtype: b.dtype,
            data: b.data,
            dims,
        });
    }
    Ok(out)
}

/// XLA's element types as tile's dtypes: the one table between the two. Sub-byte integer and
/// float types (which XLA may pack) and tokens have none.
pub(crate) fn dtype(t: sys::XLA_FFI_DataType) -> Option<DType> {
    use sys::XLA_FFI_DataType as X;
    Some(match t {
        X::XLA_FFI_DataType_PRED => DType::BOOL,
        X::XLA_FFI_DataType_S8 => DType::I8,
        X::XLA_FFI_DataType_S16 => DType::I16,
        X::XLA_FFI_DataType_S32 => DType::I32,
        X::XLA_FFI_DataType_S64 => DType::I64,
        X::XLA_FFI_DataType_U8 => DType::U8,
        X::XLA_FFI_DataType_U16 => DType::U16,
        X::XLA_FFI_DataType_U32 => DType::U32,
        X::XLA_FFI_DataType_U64 => DType::U64,
        X::XLA_FFI_DataType_F16 => DType::F16,
        X::XLA_FFI_DataType_BF16 => DType::BF16,
        X::XLA_FFI_DataType_F32 => DType::F32,
        X::XLA_FFI_DataType_F64 => DType::F64,
        X::XLA_FFI_DataType_C64 => DType::C64,
        X::XLA_FFI_DataType_C128 => DType::C128,
        X::XLA_FFI_DataType_F8E5M2 => DType::F8_E5M2,
        X::XLA_FFI_DataType_F8E3M4 => DType::F8_E3M4,
        X::XLA_FFI_DataType_F8E4M3 => DType::F8_E4M3,
        X::XLA_FFI_DataType_F8E4M3FN => DType::F8_E4M3FN,
        X::XLA_FFI_DataType_F8E4M3B11FNUZ => DType::F8_E4M3B11FNUZ,
        X::XLA_FFI_DataType_F8E5M2FNUZ => DType::F8_E5M2FNUZ,
        X::XLA_FFI_DataType_F8E4M3FNUZ => DType::F8_E4M3FNUZ,
        X::XLA_FFI_DataType_F8E8M0FNU => DType::F8_E8M0FNU,
        _ => return None,
    })
}
