use tile_dlpack::{Unused, Used};

fn view_after_release(used: Used) -> usize {
    let view = used.view();
    let _released = used.release();
    view.ndim()
}

fn view_after_drop(used: Used) -> usize {
    let view = used.view();
    drop(used);
    view.ndim()
}

fn peeked_view_after_consume(unused: Unused<'_>) -> usize {
    let view = unused.peek().unwrap();
    let _used = unused.consume();
    view.ndim()
}

fn main() {}
