//! View construction and the layout checks of an arbitrary DLPack export, against brute force.
//!
//! For each input accepted by `peek` with at most 4096 elements, every element's address is
//! enumerated (in `i128`) and compared with what the view says: the byte extent is exactly the
//! span of the elements, `is_contiguous` holds exactly when element `i` (row-major) sits at
//! offset `i`, and `check_writable` accepts only tensors whose elements all have distinct
//! addresses. The producer deletes the export afterwards; the deleter runs exactly once.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tile_dlpack::DescriptorError;
use tile_dlpack::testing::counted_raw;
use tile_fuzz::{Input, offsets};

fuzz_target!(|input: Input| {
    let spec = input.spec();
    let (raw, count) = counted_raw(&spec);
    {
        // SAFETY: a fresh export; the `Unused` is gone before the producer deletes it.
        let unused = unsafe { raw.unused() };
        if let Ok(view) = unused.peek() {
            let (shape, strides) = (view.shape(), view.strides());
            assert_eq!((shape.len(), strides.len()), (view.ndim(), view.ndim()));
            if let Some(offs) = offsets(shape, strides, 4096) {
                assert_eq!(offs.len() as u64, view.numel());
                let itemsize = i128::from(view.dtype().itemsize());
                let extent = view.byte_extent();
                match (offs.iter().min(), offs.iter().max()) {
                    (Some(&lo), Some(&hi)) => {
                        assert_eq!(i128::from(extent.start), lo * itemsize);
                        assert_eq!(i128::from(extent.end), (hi + 1) * itemsize);
                    }
                    _ => assert_eq!((extent.start, extent.end), (0, 0)),
                }
                let row_major = offs.iter().enumerate().all(|(i, &o)| o == i as i128);
                assert_eq!(view.is_contiguous(), row_major, "{view:?}");
                let mut sorted = offs.clone();
                sorted.sort_unstable();
                let distinct = sorted.windows(2).all(|w| w[0] != w[1]);
                match view.check_writable() {
                    Ok(()) => assert!(
                        distinct && !view.is_read_only() && !view.is_copied(),
                        "{view:?}"
                    ),
                    Err(DescriptorError::ReadOnly) => assert!(view.is_read_only()),
                    Err(DescriptorError::Copied) => {
                        assert!(view.is_copied() && !view.is_read_only());
                    }
                    Err(DescriptorError::InternalOverlap { .. }) => {
                        // Conservative: a broadcast or a compact layout is always judged right.
                        assert!(!row_major, "{view:?}");
                    }
                    Err(other) => panic!("check_writable: unexpected {other:?}"),
                }
            }
        }
    }
    assert_eq!(count.get(), 0);
    // SAFETY: never consumed; this is its only deletion.
    unsafe { raw.delete() };
    assert_eq!(count.get(), 1);
});
