//! `tile_py.LaunchHandle`: what `tile_py.launch` returns, to wait on or poll.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::exceptions::launch_err;
use crate::release::drain;
use crate::stream_cache;

/// The result of `tile_py.launch`: waits for the launch, or asks whether it is done. The
/// launch's tensors are on its stream's release queue from the moment it is enqueued (released
/// once a later call sees the work done), so the handle owns nothing and dropping it does
/// nothing.
#[pyclass(module = "tile_py")]
pub(crate) struct LaunchHandle {
    /// The launch; gone once retired.
    pub(crate) inner: Mutex<Option<tile_launch::LaunchHandle>>,
}

impl LaunchHandle {
    fn take(&self) -> Option<tile_launch::LaunchHandle> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// In a forked child: retires the handle without a driver call, never dropping what it
    /// holds (a drop could make one).
    fn forget_inherited(&self) {
        if let Ok(mut g) = self.inner.try_lock() {
            std::mem::forget(g.take());
        }
    }

    fn put_back(&self, h: tile_launch::LaunchHandle) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
    }
}

#[pymethods]
impl LaunchHandle {
    /// Blocks until the launched work is done (the GIL is released meanwhile), then runs the
    /// deleters of its tensors (and of every other queued launch known done). Idempotent. In a
    /// child made by `os.fork()`, a handle inherited from the parent returns at once: the work
    /// is the parent's, its tensors are leaked (counted at the fork). Raises `tile_py.CudaError`
    /// when the driver reports the wait failed.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        if crate::process::forked() {
            self.forget_inherited();
            return Ok(());
        }
        if let Some(h) = self.take() {
            let r = py.detach(move || h.retire().map(drop));
            // A barrier: waits for this launch's tensors if another thread is releasing them.
            crate::release::settle(py);
            stream_cache::forget_idle_streams();
            r.map_err(|e| launch_err(py, e, |_| None))?;
        }
        Ok(())
    }

    /// Whether the launched work is done (non-blocking). When it is, the tensors are released.
    /// In a child made by `os.fork()`: True, the inherited handle retired as in `wait`. Raises
    /// `tile_py.CudaError` as `wait` does.
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        if crate::process::forked() {
            self.forget_inherited();
            return Ok(true);
        }
        let Some(h) = self.take() else {
            return Ok(true);
        };
        let r = match h.is_complete() {
            Ok(true) => match h.try_retire() {
                Ok(_) => {
                    stream_cache::forget_idle_streams();
                    Ok(true)
                }
                Err(h) => {
                    self.put_back(h);
                    Ok(false)
                }
            },
            Ok(false) => {
                self.put_back(h);
                Ok(false)
            }
            Err(e) => {
                self.put_back(h);
                Err(launch_err(py, e, |_| None))
            }
        };
        drain(py);
        r
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.wait(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            "pending"
        } else {
            "retired"
        };
        format!("<tile_py.LaunchHandle {state}>")
    }
}
