use tile_dlpack::Unused;

fn main() {
    // SAFETY: null is allowed, and this file must not compile anyway.
    let unused = unsafe { Unused::from_legacy(std::ptr::null_mut()) };
    let _first = unused.consume();
    let _second = unused.consume();
}
