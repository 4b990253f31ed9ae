use tile_dlpack::Released;

fn view_of_released(released: &Released) {
    let _ = released.view();
}

fn main() {}
