//! The contexts tile_py uses: one primary context per device, retained once and retained afresh
//! after a reset; the stream cache makes them, releases run their deleters in them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tile_launch::Context;

static CONTEXTS: Mutex<Option<HashMap<i32, Arc<Context>>>> = Mutex::new(None);

/// Contexts found destroyed (a primary context reset by another library): kept, never
/// dropped, so that their retain is never released against the device's recreated primary
/// context.
static STALE: Mutex<Vec<Arc<Context>>> = Mutex::new(Vec::new());

/// tile_py's context for device `ordinal`: its primary context, retained once, and retained
/// afresh when the cached one was destroyed since (checked for each new stream only, one
/// `cuCtxGetId`), so that a launch on a new stream works after a reset.
pub(crate) fn context(ordinal: i32) -> tile_launch::Result<Arc<Context>> {
    let mut g = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(c) = map.get(&ordinal) {
        if c.is_alive() {
            return Ok(Arc::clone(c));
        }
        if let Some(stale) = map.remove(&ordinal) {
            STALE.lock().unwrap_or_else(|p| p.into_inner()).push(stale);
        }
    }
    let c = Context::new(ordinal)?;
    map.insert(ordinal, Arc::clone(&c));
    Ok(c)
}

/// The context tile_py made for device `ordinal`, if it made one (never makes one).
pub(crate) fn cached_context(ordinal: i32) -> Option<Arc<Context>> {
    let g = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    g.as_ref()?.get(&ordinal).cloned()
}

/// The context tile_py made for the lowest device ordinal, if it made any (never makes one).
pub(crate) fn first_cached_context() -> Option<Arc<Context>> {
    let g = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    g.as_ref()?
        .iter()
        .min_by_key(|(ordinal, _)| **ordinal)
        .map(|(_, c)| Arc::clone(c))
}
