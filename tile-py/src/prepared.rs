//! `tile_py.BoundLaunch` (made by `Kernel.bind`): a kernel, a launch configuration and a stream
//! bound once, launched many times with new arguments.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::completion::LaunchHandle;
use crate::exceptions::launch_err;
use crate::kernel::Kernel;
use crate::request::{LaunchRequest, RequestArgs, call_args};
use crate::submit::{Target, submit};

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

#[pymethods]
impl BoundLaunch {
    /// Binds `kernel` to `stream` and a launch configuration; the arguments are as for
    /// `tile_py.launch`. `Kernel.bind(stream, grid, block=...)` is the same.
    #[new]
    #[pyo3(signature = (stream, grid, kernel, *, block, shared_mem = None, cluster = None,
                        cooperative = None, programmatic_dependent_launch = None),
           text_signature = "(stream, grid, kernel, *, block, shared_mem=None, cluster=None, \
                             cooperative=False, programmatic_dependent_launch=False)")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        py: Python<'_>,
        stream: &Bound<'_, PyAny>,
        grid: &Bound<'_, PyAny>,
        kernel: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        shared_mem: Option<&Bound<'_, PyAny>>,
        cluster: Option<&Bound<'_, PyAny>>,
        cooperative: Option<&Bound<'_, PyAny>>,
        programmatic_dependent_launch: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<BoundLaunch> {
        let r = LaunchRequest::parse(
            py,
            &RequestArgs {
                func: "Kernel.bind",
                stream,
                grid,
                block,
                shared_mem,
                cluster,
                cooperative,
                programmatic_dependent_launch,
                sync: None,
                kernel,
                args: None,
            },
        )?;
        let kernel = r.kernel;
        // The configuration is checked against the device, and the kernel prepared for it,
        // once, here.
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
