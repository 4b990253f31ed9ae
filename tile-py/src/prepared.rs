//! `tile_py.BoundLaunch` (made by `Kernel.bind`): a kernel, a launch configuration and a stream
//! bound once, launched many times with new arguments.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::exceptions::{Kind, err, launch_err, show};
use crate::kernel::Kernel;
use crate::launch::{LaunchHandle, LaunchRequest, RequestArgs, Target, call_args, submit};

/// A kernel bound to a stream and a launch configuration (`Kernel.bind`). Calling it,
/// `bound(*args, sync=True)`, launches as `tile_py.launch` does and returns a `LaunchHandle`;
/// the configuration was checked against the device once, at bind time.
#[pyclass(frozen, module = "tile_py")]
pub(crate) struct BoundLaunch {
    kernel: Py<Kernel>,
    inner: tile_launch::BoundLaunch,
    /// The stream value producers are told (`__dlpack__(stream=...)`).
    stream_value: i64,
}

impl BoundLaunch {
    /// `Kernel.bind` and `BoundLaunch(...)` (`func` names the call in the keyword errors, as
    /// Python names a call's own; a value's error says `Kernel.bind` for both, as it always
    /// has): reads the request, checks the configuration against the device once and prepares
    /// the kernel for it.
    pub(crate) fn bind(
        func: &'static str,
        stream: &Bound<'_, PyAny>,
        grid: &Bound<'_, PyAny>,
        kernel: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<BoundLaunch> {
        let py = stream.py();
        let k = BindKeywords::read(func, config)?;
        let r = LaunchRequest::parse(
            py,
            &RequestArgs {
                func: "Kernel.bind",
                stream,
                grid,
                block: &k.block,
                shared_mem: k.shared_mem.as_ref(),
                cluster: k.cluster.as_ref(),
                cooperative: k.cooperative.as_ref(),
                programmatic_dependent_launch: k.programmatic_dependent_launch.as_ref(),
                sync: None,
                kernel,
                args: None,
            },
        )?;
        let kernel = r.kernel;
        let inner = r
            .stream
            .bind(&kernel.get().inner, &r.config)
            .map_err(|e| launch_err(py, e, |_| None))?;
        Ok(BoundLaunch {
            kernel: kernel.clone().unbind(),
            inner,
            stream_value: r.stream_value,
        })
    }
}

/// The keywords of `Kernel.bind` / `BoundLaunch(...)`, read from the call's `**config`.
struct BindKeywords<'py> {
    block: Bound<'py, PyAny>,
    shared_mem: Option<Bound<'py, PyAny>>,
    cluster: Option<Bound<'py, PyAny>>,
    cooperative: Option<Bound<'py, PyAny>>,
    programmatic_dependent_launch: Option<Bound<'py, PyAny>>,
}

impl<'py> BindKeywords<'py> {
    /// `TypeError`, in Python's words, for a keyword `func` does not take or a missing `block`.
    fn read(func: &str, config: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let (mut block, mut shared_mem, mut cluster, mut cooperative, mut pdl) =
            (None, None, None, None, None);
        for (key, value) in config.into_iter().flat_map(|d| d.iter()) {
            // `optional`: None means "not given", as `tile_py.launch`'s signature reads it
            // (`block=None` stays a bad block, reported as such).
            let name = key.extract::<&str>().ok();
            let (slot, optional) = match name.unwrap_or("") {
                "block" => (&mut block, false),
                "shared_mem" => (&mut shared_mem, true),
                "cluster" => (&mut cluster, true),
                "cooperative" => (&mut cooperative, true),
                "programmatic_dependent_launch" => (&mut pdl, true),
                _ => {
                    // Python's own words: the name quoted, without its type.
                    let name = name.map_or_else(|| show(&key), |n| format!("'{n}'"));
                    return Err(err(
                        Kind::Type,
                        format!("{func}() got an unexpected keyword argument {name}"),
                    ));
                }
            };
            *slot = (!optional || !value.is_none()).then_some(value);
        }
        let Some(block) = block else {
            return Err(err(
                Kind::Type,
                format!("{func}() missing required keyword-only argument: 'block'"),
            ));
        };
        Ok(BindKeywords {
            block,
            shared_mem,
            cluster,
            cooperative,
            programmatic_dependent_launch: pdl,
        })
    }
}

#[pymethods]
impl BoundLaunch {
    /// Binds `kernel` to `stream` and a launch configuration; the arguments are as for
    /// `tile_py.launch`. `Kernel.bind(stream, grid, block=...)` is the same.
    #[new]
    #[pyo3(signature = (stream, grid, kernel, **config),
           text_signature = "(stream, grid, kernel, *, block, shared_mem=None, cluster=None, \
                             cooperative=False, programmatic_dependent_launch=False)")]
    pub(crate) fn new(
        stream: &Bound<'_, PyAny>,
        grid: &Bound<'_, PyAny>,
        kernel: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<BoundLaunch> {
        BoundLaunch::bind("BoundLaunch", stream, grid, kernel, config)
    }

    /// Launches the bound kernel with `args` (one per declared parameter), as
    /// `tile_py.launch` does, and returns its `LaunchHandle`.
    #[pyo3(signature = (*args, sync = true))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        sync: bool,
    ) -> PyResult<LaunchHandle> {
        let kernel = self.kernel.get();
        let args = call_args(py, kernel, args.as_any())?;
        submit(
            py,
            &Target {
                stream: self.inner.stream(),
                stream_value: self.stream_value,
                kernel,
                config: self.inner.config(),
                bound: Some(&self.inner),
            },
            &args,
            sync,
        )
    }

    /// The bound kernel.
    #[getter]
    fn kernel(&self, py: Python<'_>) -> Py<Kernel> {
        self.kernel.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        let c = self.inner.config();
        let dims = |d: tile_launch::Dim3| format!("({}, {}, {})", d.x, d.y, d.z);
        format!(
            "<tile_py.BoundLaunch {} grid={} block={} shared_mem={}>",
            self.kernel.get().inner.name(),
            dims(c.grid),
            dims(c.block),
            c.shared_mem_bytes
        )
    }
}
