//! Recognising a Python type by the classes it derives from, without importing their packages.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// Whether `pred(module, name)` holds for a class in `ty`'s MRO (`__module__` and `__name__`;
/// either is `""` when it is not a str).
pub(crate) fn mro_any(ty: &Bound<'_, PyType>, mut pred: impl FnMut(&str, &str) -> bool) -> bool {
    let py = ty.py();
    let text = |c: &Bound<'_, PyAny>, attr: &Bound<'_, pyo3::types::PyString>| {
        c.getattr(attr)
            .ok()
            .and_then(|m| m.extract::<String>().ok())
            .unwrap_or_default()
    };
    ty.mro().iter().any(|c| {
        pred(
            &text(&c, intern!(py, "__module__")),
            &text(&c, intern!(py, "__name__")),
        )
    })
}

/// Whether `module` is package `package` or one of its submodules.
pub(crate) fn in_package(module: &str, package: &str) -> bool {
    module
        .strip_prefix(package)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}
