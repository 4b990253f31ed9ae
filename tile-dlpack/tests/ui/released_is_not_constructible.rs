use tile_dlpack::Released;

fn main() {
    let _forged = Released { _private: () };
}
