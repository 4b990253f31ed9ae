//! The one table of stream numbers: how the DLPack `stream=` convention (and the
//! `__cuda_array_interface__` `stream` entry, which follows it) names the default streams, and
//! how those names map to raw `CUstream` handles. Every conversion between the two goes
//! through here.

/// `stream=1`: the legacy default stream.
pub(crate) const LEGACY: i64 = 1;
/// `stream=2`: the per-thread default stream (its raw handle is `CU_STREAM_PER_THREAD`, 2).
pub(crate) const PER_THREAD: i64 = 2;
/// `stream=-1`: no synchronisation (`sync=False`).
pub(crate) const NO_SYNC: i64 = -1;
/// The raw handle of the legacy default stream as tile_py keeps it (the null stream; the handle
/// `CU_STREAM_LEGACY`, 1, names the same stream).
pub(crate) const LEGACY_RAW: usize = 0;

/// The raw handle of stream number `n` (1 is the legacy default stream, the null handle; any
/// other number is the handle itself, 2 the per-thread default stream).
pub(crate) fn to_raw(n: u64) -> usize {
    if n == LEGACY as u64 {
        LEGACY_RAW
    } else {
        n as usize
    }
}

/// The stream number of the raw handle `raw` (the null handle and `CU_STREAM_LEGACY` are the
/// legacy default stream's 1), or `None` for a handle no `stream=` value can carry (2**63 and
/// above, which would arrive negative).
pub(crate) fn to_number(raw: usize) -> Option<i64> {
    match raw {
        0 | 1 => Some(LEGACY),
        r => i64::try_from(r).ok(),
    }
}
