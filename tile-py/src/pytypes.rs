//! Recognising a Python type by the classes it derives from, without importing their packages,
//! and remembering per type what was found ([`TypeCache`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::LocalKey;

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

/// Whether a class in `ty`'s MRO defines `name` in its own `__dict__`: where an instance's
/// attribute lookup finds a method without an instance attribute or `__getattr__` (a metaclass's
/// attributes do not count; an instance never sees them). A dict that cannot be read counts as
/// not defining it.
pub(crate) fn defined_on_type(
    ty: &Bound<'_, PyType>,
    name: &Bound<'_, pyo3::types::PyString>,
) -> bool {
    let py = ty.py();
    ty.mro().iter().any(|c| {
        c.getattr(intern!(py, "__dict__"))
            .and_then(|d| d.contains(name))
            .unwrap_or(false)
    })
}

/// Whether `module` is package `package` or one of its submodules.
pub(crate) fn in_package(module: &str, package: &str) -> bool {
    module
        .strip_prefix(package)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// A type's address, the type (held so the address is not reused), and its value.
type TypeMap<V> = HashMap<usize, (Py<PyType>, V)>;

/// Per Python type, a value computed once. The map holds each type it keys (so a type's address
/// is not reused while it is a key), and a per-thread cell in front of it answers the common
/// case, the same type as this thread's last lookup, with one pointer compare: no lock, no hash,
/// no reference count touched.
pub(crate) struct TypeCache<V: Copy + 'static> {
    map: Mutex<Option<TypeMap<V>>>,
    /// This thread's last type (its address) and its value.
    last: &'static LocalKey<Cell<(usize, Option<V>)>>,
}

impl<V: Copy + 'static> TypeCache<V> {
    /// An empty cache whose per-thread cell is `last` (a `thread_local!` holding `(0, None)`).
    pub(crate) const fn new(last: &'static LocalKey<Cell<(usize, Option<V>)>>) -> Self {
        TypeCache {
            map: Mutex::new(None),
            last,
        }
    }

    /// The value for `ty`, if it was computed before.
    #[inline]
    pub(crate) fn get(&self, ty: &Bound<'_, PyType>) -> Option<V> {
        self.get_key(ty.as_ptr() as usize)
    }

    #[inline]
    fn get_key(&self, key: usize) -> Option<V> {
        if let (last, Some(v)) = self.last.with(Cell::get)
            && last == key
        {
            return Some(v);
        }
        let v = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|m| m.get(&key).map(|e| e.1))?;
        self.last.with(|c| c.set((key, Some(v))));
        Some(v)
    }

    /// Records `v` for `ty` unless a value is already there; returns the value kept.
    pub(crate) fn insert(&self, ty: &Bound<'_, PyType>, v: V) -> V {
        let key = ty.as_ptr() as usize;
        let v = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_insert_with(|| (ty.clone().unbind(), v))
            .1;
        self.last.with(|c| c.set((key, Some(v))));
        v
    }

    /// The value for the type of `obj`, computed by `f` (outside the lock: it may call into
    /// Python) the first time that type is seen.
    #[inline]
    pub(crate) fn of(&self, obj: &Bound<'_, PyAny>, f: impl FnOnce(&Bound<'_, PyType>) -> V) -> V {
        if let Some(v) = self.get_key(obj.get_type_ptr() as usize) {
            return v;
        }
        let ty = obj.get_type();
        let v = f(&ty);
        self.insert(&ty, v)
    }
}

/// `PyObject_VectorcallMethod`: calls a method without making a bound-method object. Part of
/// the stable ABI from Python 3.12 and exported, with this signature, by every CPython since
/// 3.9; the extension is built for the 3.10 limited API, which does not declare it, so it is
/// looked up in the running interpreter once.
type VectorcallMethod = unsafe extern "C" fn(
    name: *mut pyo3::ffi::PyObject,
    args: *const *mut pyo3::ffi::PyObject,
    nargsf: usize,
    kwnames: *mut pyo3::ffi::PyObject,
) -> *mut pyo3::ffi::PyObject;

/// `PY_VECTORCALL_ARGUMENTS_OFFSET`: `args[-1]` may be overwritten by the callee.
const ARGUMENTS_OFFSET: usize = 1 << (usize::BITS - 1);

fn vectorcall_method() -> Option<VectorcallMethod> {
    static F: std::sync::OnceLock<Option<VectorcallMethod>> = std::sync::OnceLock::new();
    *F.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        // SAFETY: the symbol, where the interpreter exports it, has exactly this signature
        // (CPython 3.9 and later); the library handle is the process itself, never unloaded.
        unsafe { this.get::<VectorcallMethod>(b"PyObject_VectorcallMethod\0") }
            .ok()
            .map(|f| *f)
    })
}

/// `obj.name()`, without arguments: through `PyObject_VectorcallMethod` where the interpreter
/// has it (no bound method is made), else `call_method0`.
pub(crate) fn call_method0<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let Some(f) = vectorcall_method() else {
        return obj.call_method0(name);
    };
    // `args[0]` is free for the callee (ARGUMENTS_OFFSET); the receiver is `args[1]`.
    let mut args = [std::ptr::null_mut(), obj.as_ptr()];
    // SAFETY: `name` is a str and `obj` a live object, both borrowed for the call; the array
    // is mutable and has the slot before the first argument that ARGUMENTS_OFFSET allows the
    // callee to overwrite.
    let r = unsafe {
        f(
            name.as_ptr(),
            args.as_mut_ptr().add(1),
            1 | ARGUMENTS_OFFSET,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference, or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, r) }
}

/// `obj.name(**dict(zip(names, values)))` without making a bound method or a keyword dict:
/// through `PyObject_VectorcallMethod` with `names` as its keyword-name tuple. `None` where the
/// interpreter does not export it: the caller then calls another way.
pub(crate) fn call_method_keywords<'py, const N: usize>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
    values: [&Bound<'py, PyAny>; N],
    names: &Bound<'py, pyo3::types::PyTuple>,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    let f = vectorcall_method()?;
    debug_assert_eq!(names.len(), N);
    let py = obj.py();
    // `args[0]` is free for the callee (ARGUMENTS_OFFSET); the receiver is `args[1]`, the
    // keyword values follow it.
    let mut args = [std::ptr::null_mut(); 8];
    assert!(N + 1 < args.len());
    args[1] = obj.as_ptr();
    for (slot, v) in args[2..].iter_mut().zip(values) {
        *slot = v.as_ptr();
    }
    // SAFETY: `name` is a str, `obj`, the values and `names` (a tuple of `N` str) are live for
    // the call; the array is mutable and has the slot before the receiver that
    // ARGUMENTS_OFFSET lets the callee overwrite; 1 positional argument (the receiver), `N`
    // keyword values after it.
    let r = unsafe {
        f(
            name.as_ptr(),
            args.as_mut_ptr().add(1),
            1 | ARGUMENTS_OFFSET,
            names.as_ptr(),
        )
    };
    // SAFETY: a new reference, or null with an exception set.
    Some(unsafe { Bound::from_owned_ptr_or_err(py, r) })
}
