//! `tile_py.Library`, `tile_py.Kernel` and the parameter declarations `In`, `Out`, `InOut`,
//! `Scalar`.

use std::path::PathBuf;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::types::PyString;
use tile_dlpack::DType;
use tile_launch::{
    ArrayAssumptions, IndexType, Intent, MAX_ASSUMED_DIMS, Param, ScalarType, Signature,
};

use crate::exceptions::{Kind, err, launch_err, reraise_or, show};
use crate::prepared::BoundLaunch;

/// One declared kernel parameter (made by `In`, `Out`, `InOut` or `Scalar`).
#[pyclass(frozen, name = "Param", module = "tile_py")]
#[derive(Clone)]
pub(crate) struct PyParam {
    pub inner: Param,
}

#[pymethods]
impl PyParam {
    fn __repr__(&self) -> String {
        match self.inner {
            Param::Tensor {
                dtype,
                intent,
                strided,
            } => {
                let strided = if strided { ", strided=True" } else { "" };
                format!(
                    "tile_py.{}({:?}{strided})",
                    intent_fn(intent),
                    dtype.to_string()
                )
            }
            Param::Scalar(t) => format!("tile_py.Scalar({:?})", t.name()),
            Param::Array {
                dtype,
                intent,
                ndim,
                index,
                assume,
            } => format!(
                "tile_py.{}({:?}, ndim={ndim}, index={:?}{})",
                intent_fn(intent),
                dtype.to_string(),
                index.name(),
                if assume.is_none() { "" } else { ", assume=..." }
            ),
            _ => format!("<tile_py.Param {}>", self.inner),
        }
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
    /// Whether the parameter is a tensor (`In`, `Out`, `InOut`, arrays included) rather than a
    /// scalar.
    #[getter]
    fn is_tensor(&self) -> bool {
        matches!(self.inner, Param::Tensor { .. } | Param::Array { .. })
    }
    /// Whether the kernel writes the parameter's tensor (`Out`, `InOut`).
    #[getter]
    fn writes(&self) -> bool {
        matches!(
            self.inner,
            Param::Tensor {
                intent: tile_launch::Intent::Write | tile_launch::Intent::ReadWrite,
                ..
            } | Param::Array {
                intent: tile_launch::Intent::Write | tile_launch::Intent::ReadWrite,
                ..
            }
        )
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyParam>()
            .map(|o| o.get().inner == self.inner)
            .unwrap_or(false)
    }
}

fn name_of(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let py = obj.py();
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_string());
    }
    // NumPy dtypes (`np.dtype('f4').name`), then classes (`np.float32.__name__`), then str()
    // (`torch.float32` prints `torch.float32`).
    for attr in [intern!(py, "name"), intern!(py, "__name__")] {
        if let Ok(n) = obj.getattr(attr)
            && let Ok(n) = n.extract::<String>()
        {
            return Ok(n);
        }
    }
    Ok(obj.str()?.to_string())
}

/// Parses a dtype name: `float32`, `f32`, `torch.bfloat16`, `np.float16`, ...
pub(crate) fn parse_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    // Python's own number types mean what NumPy and PyTorch make of them (`float` is a double,
    // `int` a 64-bit integer), not the C types their names also spell.
    let py = obj.py();
    if obj.is(py.get_type::<pyo3::types::PyFloat>()) {
        return Ok(DType::F64);
    }
    if obj.is(py.get_type::<pyo3::types::PyInt>()) {
        return Ok(DType::I64);
    }
    if obj.is(py.get_type::<pyo3::types::PyBool>()) {
        return Ok(DType::BOOL);
    }
    if obj.is(py.get_type::<pyo3::types::PyComplex>()) {
        return Ok(DType::C128);
    }
    parse_name(
        obj,
        DType::from_name,
        "dtype",
        "use a name such as 'float32', 'bfloat16' or 'int64'",
    )
}

/// A dtype name in tile-dlpack's spelling (its one table of names): PyTorch's `torch.` prefix
/// dropped, and PyTorch's and NumPy's other spellings (`long`, `half`, `bool_`, ...) mapped.
fn canonical(name: &str) -> &str {
    match name.strip_prefix("torch.").unwrap_or(name) {
        "bool_" => "bool",
        "short" => "int16",
        "int" => "int32",
        "long" => "int64",
        "half" => "float16",
        "float" => "float32",
        "double" => "float64",
        "cfloat" => "complex64",
        "cdouble" => "complex128",
        other => other,
    }
}

/// `obj`'s name ([`name_of`], [`canonical`]) looked up with `from_name`, or a `ValueError`:
/// an unknown `what`, and `hint`.
fn parse_name<T>(
    obj: &Bound<'_, PyAny>,
    from_name: impl FnOnce(&str) -> Option<T>,
    what: &str,
    hint: &str,
) -> PyResult<T> {
    let name = name_of(obj)?;
    from_name(canonical(&name))
        .ok_or_else(|| err(Kind::Value, format!("unknown {what} {}: {hint}", show(obj))))
}

fn parse_scalar_type(obj: &Bound<'_, PyAny>) -> PyResult<ScalarType> {
    parse_name(
        obj,
        ScalarType::from_name,
        "scalar type",
        "use one of bool, i8..i64, u8..u64, f32, f64",
    )
}

fn intent_fn(intent: Intent) -> &'static str {
    match intent {
        Intent::Read => "In",
        Intent::Write => "Out",
        Intent::ReadWrite => "InOut",
    }
}

fn parse_index_type(obj: &Bound<'_, PyAny>) -> PyResult<IndexType> {
    parse_name(
        obj,
        IndexType::from_name,
        "index type",
        "use 'i32', 'u32' or 'i64'",
    )
}

/// A tensor parameter: a pointer (no `ndim`), or an array parameter (`ndim` given: the pointer,
/// then `ndim` extents, then `ndim` strides in elements, in `index`, default `i64`).
/// Parses `assume={...}` of an array parameter (see `In`).
fn parse_assumptions(d: &Bound<'_, PyDict>, ndim: u8) -> PyResult<ArrayAssumptions> {
    let mut a = ArrayAssumptions::none();
    let dims = usize::from(ndim).min(MAX_ASSUMED_DIMS);
    let bad = |key: &str, what: String| err(Kind::Value, format!("assume[{key:?}]: {what}"));
    for (k, v) in d.iter() {
        let key: String = k.extract().map_err(|_| {
            err(
                Kind::Type,
                format!("assume's keys are names (str), got {}", show(&k)),
            )
        })?;
        let flag = |v: &Bound<'_, PyAny>| -> PyResult<bool> {
            v.cast::<pyo3::types::PyBool>()
                .map(|b| b.is_true())
                .map_err(|_| bad(&key, format!("expected True or False, got {}", show(v))))
        };
        // A sequence of ints, or the assumption's error naming `what` it must hold.
        fn ints<'py, T: FromPyObjectOwned<'py>>(
            v: &Bound<'py, PyAny>,
            bad: impl FnOnce() -> PyErr,
        ) -> PyResult<Vec<T>> {
            v.extract().map_err(|e| reraise_or(v.py(), e, bad))
        }
        let per_dim = |v: &Bound<'_, PyAny>| -> PyResult<[u32; MAX_ASSUMED_DIMS]> {
            let xs: Vec<u32> = ints(v, || {
                bad(
                    &key,
                    format!("expected a sequence of positive ints, got {}", show(v)),
                )
            })?;
            if xs.len() != usize::from(ndim) || xs.len() > dims {
                return Err(bad(
                    &key,
                    format!(
                        "expected {ndim} entries (at most {MAX_ASSUMED_DIMS}), got {}",
                        xs.len()
                    ),
                ));
            }
            let mut out = [1u32; MAX_ASSUMED_DIMS];
            out[..xs.len()].copy_from_slice(&xs);
            Ok(out)
        };
        let mask = |v: &Bound<'_, PyAny>| -> PyResult<u8> {
            let xs: Vec<usize> = ints(v, || {
                bad(
                    &key,
                    format!("expected a sequence of dimensions, got {}", show(v)),
                )
            })?;
            let mut m = 0u8;
            for x in xs {
                if x >= dims {
                    return Err(bad(&key, format!("dimension {x} is not below {dims}")));
                }
                m |= 1 << x;
            }
            Ok(m)
        };
        match key.as_str() {
            "base_addr_divisible_by" => {
                if v.cast::<pyo3::types::PyBool>().is_ok() {
                    return Err(bad(&key, format!("expected an int, got {}", show(&v))));
                }
                a.base_addr_divisible_by = v.extract::<u32>().map_err(|e: PyErr| {
                    let overflow = e.is_instance_of::<pyo3::exceptions::PyOverflowError>(v.py());
                    reraise_or(v.py(), e, || {
                        if overflow {
                            bad(
                                &key,
                                format!("{} is out of range (0 to 2**32 - 1)", show(&v)),
                            )
                        } else {
                            bad(&key, format!("expected an int, got {}", show(&v)))
                        }
                    })
                })?;
            }
            "stride_divisible_by" => a.stride_divisible_by = per_dim(&v)?,
            "shape_divisible_by" => a.shape_divisible_by = per_dim(&v)?,
            "unit_stride" => a.unit_stride = mask(&v)?,
            "unit_shape" => a.unit_shape = mask(&v)?,
            "nonnegative_strides" => a.nonnegative_strides = flag(&v)?,
            "disjoint" => a.disjoint = flag(&v)?,
            _ => {
                return Err(err(
                    Kind::Value,
                    format!(
                        "unknown assumption {key:?}: use base_addr_divisible_by, \
                         stride_divisible_by, shape_divisible_by, unit_stride, unit_shape, \
                         nonnegative_strides or disjoint"
                    ),
                ));
            }
        }
    }
    Ok(a)
}

/// `obj` as a `bool` (`True` or `False` only), or a `TypeError` naming `what`.
pub(crate) fn bool_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    obj.cast::<pyo3::types::PyBool>()
        .map(|b| b.is_true())
        .map_err(|_| {
            err(
                Kind::Type,
                format!("{what} must be True or False, got {}", show(obj)),
            )
        })
}

/// `obj` as a `str`, or a `TypeError` naming `what` and what it must hold.
fn str_arg(obj: &Bound<'_, PyAny>, what: &str, holding: &str) -> PyResult<String> {
    obj.cast::<PyString>()
        .map_err(|_| {
            err(
                Kind::Type,
                format!("{what} must be a str ({holding}), got {}", show(obj)),
            )
        })?
        .to_str()
        .map(str::to_owned)
}

/// Declares the tensor parameter function `$name` (`In`, `Out`, `InOut`) of intent `$intent`.
/// `strided` is taken as an object so that a value that is not a bool gets tile_py's message;
/// the signature shown (and checked against the stub) keeps its default, False.
macro_rules! tensor_declaration {
    ($(#[doc = $doc:literal])* $name:literal, $func:ident, $intent:expr) => {
        $(#[doc = $doc])*
        #[pyfunction(name = $name)]
        #[pyo3(
            signature = (dtype, *, ndim = None, index = None, assume = None, strided = None),
            text_signature = "(dtype, *, ndim=None, index=None, assume=None, strided=False)"
        )]
        pub(crate) fn $func(
            dtype: &Bound<'_, PyAny>,
            ndim: Option<&Bound<'_, PyAny>>,
            index: Option<&Bound<'_, PyAny>>,
            assume: Option<&Bound<'_, PyAny>>,
            strided: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<PyParam> {
            let intent = $intent;
            let name = intent_fn(intent);
            let dtype = parse_dtype(dtype)?;
            let strided = match strided {
                Some(s) => bool_arg(s, &format!("{name}(strided=...)"))?,
                None => false,
            };
            let assume = match assume {
                None => None,
                Some(a) => Some(a.cast::<PyDict>().map_err(|_| {
                    err(
                        Kind::Type,
                        format!(
                            "{name}(assume=...) must be a dict of layout assumptions such as \
                             {{'base_addr_divisible_by': 16}}, got {}",
                            show(a)
                        ),
                    )
                })?),
            };
            // `strided=True` declares a pointer whose strides the kernel takes as separate scalars; an
            // array parameter (`ndim`) passes its strides itself. Both at once contradict each other.
            if strided && let Some(n) = ndim {
                return Err(err(
                    Kind::Type,
                    format!(
                        "{name}(strided=True) declares a pointer parameter, and ndim={} an array \
                         parameter (which passes its strides already): give one of them",
                        n.repr().map(|r| r.to_string()).unwrap_or_default()
                    ),
                ));
            }
            let inner = match (ndim, index) {
                (None, None) if assume.is_none() => {
                    let p = match intent {
                        Intent::Read => Param::input(dtype),
                        Intent::Write => Param::output(dtype),
                        Intent::ReadWrite => Param::inout(dtype),
                    };
                    if strided { p.strided() } else { p }
                }
                (None, _) => {
                    return Err(err(
                        Kind::Type,
                        "index and assume describe an array parameter: give ndim too",
                    ));
                }
                (Some(n), index) => {
                    let not_bool = n.cast::<pyo3::types::PyBool>().is_err();
                    let bad_ndim = || {
                        err(
                            Kind::Value,
                            format!("ndim must be an int from 0 to 32, got {}", show(n)),
                        )
                    };
                    let ndim = n
                        .extract::<u8>()
                        .map_err(|e| reraise_or(n.py(), e, bad_ndim))?;
                    if ndim > 32 || !not_bool {
                        return Err(bad_ndim());
                    }
                    let index = match index {
                        Some(i) => parse_index_type(i)?,
                        None => IndexType::I64,
                    };
                    let p = Param::array(dtype, intent, ndim, index);
                    match assume {
                        Some(d) => p.assuming(parse_assumptions(d, ndim)?),
                        None => p,
                    }
                }
            };
            Ok(PyParam { inner })
        }
    };
}

tensor_declaration!(
    /// A tensor the kernel reads. Without `ndim`, a pointer the kernel indexes densely: a tensor
    /// that is not dense row-major is refused, unless `strided=True` (the kernel is passed the
    /// strides itself). With `ndim`, an array parameter (any layout): the pointer, `ndim` extents
    /// and `ndim` strides in elements, in `index` (`'i32'`, `'u32'` or `'i64'`, default `'i64'`),
    /// with the layout assumptions of `assume` checked at each launch.
    "In", input, Intent::Read
);
tensor_declaration!(
    /// A tensor the kernel writes (read-only or self-overlapping tensors are refused). `ndim` and
    /// `index` as for `In`.
    "Out", output, Intent::Write
);
tensor_declaration!(
    /// A tensor the kernel reads and writes. `ndim` and `index` as for `In`.
    "InOut", inout, Intent::ReadWrite
);

/// A scalar passed by value: `bool`, `i8`..`i64`, `u8`..`u64`, `f32`, `f64`. Raises
/// `ValueError` for another name.
#[pyfunction(name = "Scalar")]
#[pyo3(signature = (ty, /))]
pub(crate) fn scalar(ty: &Bound<'_, PyAny>) -> PyResult<PyParam> {
    Ok(PyParam {
        inner: Param::scalar(parse_scalar_type(ty)?),
    })
}

/// Parses a parameter list (a sequence of `Param`).
pub(crate) fn parse_params(params: &Bound<'_, PyAny>) -> PyResult<Vec<Param>> {
    let mut out = Vec::new();
    for (i, p) in params.try_iter()?.enumerate() {
        let p = p?;
        match p.cast::<PyParam>() {
            Ok(p) => out.push(p.get().inner),
            Err(_) => {
                return Err(err(
                    Kind::Type,
                    format!(
                        "params[{i}] must be a tile_py.In/Out/InOut/Scalar declaration, got {}",
                        show(&p)
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// `obj` as a list of `str` (any iterable of them but a `str` or `bytes` itself), or `None`.
fn str_list(obj: &Bound<'_, PyAny>) -> Option<Vec<String>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>() {
        return None;
    }
    obj.try_iter()
        .ok()?
        .map(|o| {
            o.ok()?
                .cast::<PyString>()
                .ok()?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .collect()
}

/// Loaded device code: a cubin, fatbin or PTX, or CUDA C++ compiled with NVRTC.
///
/// Loading raises `TypeError` for an argument of the wrong type, `tile_py.CudaError` when the
/// driver refuses the image, its subclass `tile_py.DriverNotFoundError` when no CUDA driver
/// could be loaded, and `ValueError` in a child made by `os.fork()`.
#[pyclass(frozen, module = "tile_py")]
pub(crate) struct Library {
    inner: tile_launch::Library,
}

/// Loads a library with `load`, detached (loading and compiling may take long); refused in a
/// forked child.
fn load(
    py: Python<'_>,
    load: impl FnOnce() -> tile_launch::Result<tile_launch::Library> + Send,
) -> PyResult<Library> {
    crate::process::refuse_in_fork("load a library")?;
    let r = py.detach(load);
    crate::release::drain(py);
    r.map(|inner| Library { inner })
        .map_err(|e| launch_err(py, e, |_| None))
}

#[pymethods]
impl Library {
    /// Loads a cubin, fatbin or PTX file. Raises `OSError` (`FileNotFoundError`, ...) as
    /// `open()` does when the file cannot be read.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<Library> {
        let path: PathBuf = path.extract().map_err(|_| {
            err(
                Kind::Type,
                format!(
                    "Library.from_file: path must be a str or os.PathLike, got {}",
                    show(path)
                ),
            )
        })?;
        load(py, || tile_launch::Library::from_file(&path))
    }

    /// Loads a cubin, fatbin or PTX image from bytes.
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Library> {
        // A `str` is a sequence too, but of characters: PTX text goes to `from_ptx`.
        let data: Vec<u8> = (!data.is_instance_of::<PyString>())
            .then(|| data.extract().ok())
            .flatten()
            .ok_or_else(|| {
                err(
                    Kind::Type,
                    format!(
                        "Library.from_bytes: data must be bytes (a cubin, fatbin or PTX image; \
                         PTX text as a str goes to Library.from_ptx), got {}",
                        show(data)
                    ),
                )
            })?;
        load(py, || tile_launch::Library::from_image(&data))
    }

    /// Loads PTX text.
    #[staticmethod]
    fn from_ptx(py: Python<'_>, ptx: &Bound<'_, PyAny>) -> PyResult<Library> {
        let ptx = str_arg(
            ptx,
            "Library.from_ptx: ptx",
            "PTX text; an image as bytes goes to Library.from_bytes",
        )?;
        load(py, || tile_launch::Library::from_ptx(&ptx))
    }

    /// Compiles CUDA C++ with NVRTC and loads it. Declare kernels `extern "C"`. Raises
    /// `RuntimeError` with NVRTC's log when compilation fails, or when NVRTC cannot be loaded.
    #[staticmethod]
    #[pyo3(signature = (source, options = None), text_signature = "(source, options=())")]
    fn from_cuda_source(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Library> {
        let source = str_arg(source, "Library.from_cuda_source: source", "CUDA C++ text")?;
        let options = match options {
            None => Vec::new(),
            Some(o) => str_list(o).ok_or_else(|| {
                err(
                    Kind::Type,
                    format!(
                        "Library.from_cuda_source: options must be a list of str such as \
                         ['-O3'], got {}",
                        show(o)
                    ),
                )
            })?,
        };
        #[cfg(feature = "nvrtc")]
        {
            load(py, || {
                let opts: Vec<&str> = options.iter().map(String::as_str).collect();
                tile_launch::Library::from_cuda_source(&source, &opts)
            })
        }
        #[cfg(not(feature = "nvrtc"))]
        {
            let _ = (source, options);
            Err(pyo3::exceptions::PyNotImplementedError::new_err(
                "this build of tile_py has no NVRTC support (feature `nvrtc`)",
            ))
        }
    }

    /// Looks up kernel `name` and declares its parameters, checked against the compiled
    /// kernel's parameter sizes. Raises `TypeError` for a declaration that does not match them,
    /// `ValueError` for a name with a NUL and in a child made by `os.fork()`, and
    /// `tile_py.CudaError` for a name the library lacks (`CUDA_ERROR_NOT_FOUND`).
    fn kernel(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        params: &Bound<'_, PyAny>,
    ) -> PyResult<Kernel> {
        let name = str_arg(name, "Library.kernel: name", "the kernel's name")?;
        let name = name.as_str();
        let params = parse_params(params)?;
        let sig = Signature::new(params.iter().copied());
        crate::process::refuse_in_fork("look up a kernel")?;
        let k = self
            .inner
            .kernel(name, sig)
            .map_err(|e| launch_err(py, e, |_| None))?;
        Ok(Kernel { inner: k, params })
    }
}

/// A kernel with its declared parameters.
#[pyclass(frozen, module = "tile_py")]
pub(crate) struct Kernel {
    pub inner: tile_launch::Kernel,
    pub params: Vec<Param>,
}

#[pymethods]
impl Kernel {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The declared parameters.
    #[getter]
    fn params(&self) -> Vec<PyParam> {
        self.params.iter().map(|p| PyParam { inner: *p }).collect()
    }

    fn __repr__(&self) -> String {
        let ps: Vec<String> = self.params.iter().map(|p| p.to_string()).collect();
        format!("<tile_py.Kernel {}({})>", self.inner.name(), ps.join(", "))
    }

    /// Binds this kernel to `stream` and a launch configuration for repeated launches, and
    /// returns a `BoundLaunch` (the same as `BoundLaunch(stream, grid, kernel, block=..., ...)`):
    /// `bound(*args)` then launches as `launch(stream, grid, kernel, args, block=..., ...)`
    /// does. The configuration is checked against the device once, here; each call checks only
    /// its arguments. Raises what `tile_py.launch` raises for the stream and the configuration
    /// (`ValueError` in a child made by `os.fork()` among them).
    #[pyo3(signature = (stream, grid, **config),
           text_signature = "($self, stream, grid, *, block, shared_mem=None, cluster=None, \
                             cooperative=False, programmatic_dependent_launch=False)")]
    fn bind(
        slf: &Bound<'_, Self>,
        stream: &Bound<'_, PyAny>,
        grid: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<BoundLaunch> {
        BoundLaunch::bind("Kernel.bind", stream, grid, slf.as_any(), config)
    }
}
