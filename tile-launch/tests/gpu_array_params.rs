//! GPU tests of array parameters: a CUDA C++ kernel that takes each 2-D tensor as pointer,
//! extents and strides (`int` for the input, `long long` for the output) copies transposed,
//! reversed, broadcast and offset views element for element; a declaration whose index type
//! differs from the kernel's is refused when the kernel is looked up
//! (`cuKernelGetParamInfo`). Ignored without a GPU, never passed.

mod gpu_common;

use anyhow::{Result, ensure};
use gpu_common::{Count, address, gpu, random};
use tile_dlpack::dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLManagedTensorVersioned};
use tile_dlpack::dlpark::metadata::Dynamic;
use tile_dlpack::{DType, Used};
use tile_launch::{
    Error, IndexType, Intent, LaunchConfig, Library, Param, Signature, Stream, TensorArg,
};

const SOURCE: &str = r#"
extern "C" __global__ void copy2d(const float* x, int xn0, int xn1, int xs0, int xs1,
                                  float* y, long long yn0, long long yn1, long long ys0,
                                  long long ys1) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < (long long)xn0 * xn1 && xn0 == yn0 && xn1 == yn1) {
        long long r = i / xn1, c = i % xn1;
        y[r * ys0 + c * ys1] = x[r * (long long)xs0 + c * (long long)xs1];
    }
}
"#;

fn signature(input_index: IndexType) -> Signature {
    Signature::new([
        Param::array(DType::F32, Intent::Read, 2, input_index),
        Param::array(DType::F32, Intent::Write, 2, IndexType::I64),
    ])
}

/// A 2-D f32 view at `ptr + byte_offset` on cuda:0 whose deleter only counts.
fn view2(
    ptr: u64,
    shape: [i64; 2],
    strides: [i64; 2],
    byte_offset: u64,
) -> Result<(TensorArg<'static>, Count)> {
    let count = Count::default();
    let c = count.clone();
    let mut init = Dynamic::new(shape, strides)
        .prepare_as::<DLManagedTensorVersioned>()?
        .initialize(Box::new(Counted(c)));
    init.set_data(ptr as usize as *mut std::ffi::c_void)
        .set_device(DLDevice::cuda(0))
        .set_dtype(DLDataType {
            code: DLDataTypeCode::FLOAT,
            bits: 32,
            lanes: 1,
        })
        .set_byte_offset(byte_offset);
    // SAFETY: every field is set; the caller keeps the memory valid until the launch is retired.
    let managed = unsafe { init.finish() };
    Ok((
        TensorArg::from(Used::from_managed_versioned(managed)?),
        count,
    ))
}

/// One view: name, shape, strides, byte offset, and the source element at (i, j).
type Case<'a> = (
    &'static str,
    [i64; 2],
    [i64; 2],
    u64,
    Box<dyn Fn(i64, i64) -> f32 + 'a>,
);

struct Counted(Count);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_layout_is_read_through_its_extents_and_strides() -> Result<()> {
    let g = gpu(0)?;
    let lib = {
        let _bound = g.ctx.bind()?;
        Library::from_cuda_source(SOURCE, &[])?
    };
    let k = lib.kernel("copy2d", signature(IndexType::I32))?;
    let s = Stream::new(&g.ctx)?;
    let (rows, cols) = (64i64, 48i64);
    let host = random((rows * cols) as usize, 7);
    let src = g.producer.clone_htod(&host)?;
    let at = |r: i64, c: i64| host[(r * cols + c) as usize];
    let cases: Vec<Case<'_>> = vec![
        ("dense", [rows, cols], [cols, 1], 0, Box::new(at)),
        (
            "transposed",
            [cols, rows],
            [1, cols],
            0,
            Box::new(|i, j| at(j, i)),
        ),
        (
            "reversed rows",
            [rows, cols],
            [-cols, 1],
            ((rows - 1) * cols * 4) as u64,
            Box::new(|i, j| at(rows - 1 - i, j)),
        ),
        (
            "broadcast row 5",
            [10, cols],
            [0, 1],
            (5 * cols * 4) as u64,
            Box::new(|_, j| at(5, j)),
        ),
        (
            "offset slice, every other column",
            [20, 12],
            [cols, 2],
            ((3 * cols + 7) * 4) as u64,
            Box::new(|i, j| at(3 + i, 7 + 2 * j)),
        ),
    ];
    for (name, shape, strides, offset, pick) in cases {
        let n = (shape[0] * shape[1]) as usize;
        let out = g.producer.clone_htod(&vec![f32::NAN; n])?;
        g.producer.synchronize()?;
        let (x, cx) = view2(address(&src), shape, strides, offset)?;
        let (y, cy) = view2(address(&out), shape, [shape[1], 1], 0)?;
        let cfg = LaunchConfig::new(n.div_ceil(128) as u32, 128);
        s.launch(&k, &cfg, [x.into(), y.into()])?.retire()?;
        ensure!(
            cx.get() == 1 && cy.get() == 1,
            "{name}: deleters ran {} and {}",
            cx.get(),
            cy.get()
        );
        let got = g.producer.clone_dtoh(&out)?;
        g.producer.synchronize()?;
        let mut wrong = 0;
        for i in 0..shape[0] {
            for j in 0..shape[1] {
                if got[(i * shape[1] + j) as usize] != pick(i, j) {
                    wrong += 1;
                }
            }
        }
        ensure!(wrong == 0, "{name}: {wrong} of {n} elements wrong");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn an_index_type_the_kernel_does_not_take_is_refused_at_lookup() -> Result<()> {
    let g = gpu(0)?;
    let lib = {
        let _bound = g.ctx.bind()?;
        Library::from_cuda_source(SOURCE, &[])?
    };
    let e = lib.kernel("copy2d", signature(IndexType::I64)).unwrap_err();
    ensure!(matches!(e, Error::Signature { .. }), "{e}");
    let msg = e.to_string();
    ensure!(
        msg.contains(
            "kernel parameter 1 (extent 0 of parameter 0) is declared as input array of float32 \
             (ndim 2, index i64) (8 bytes) but the kernel's is 4 bytes"
        ),
        "{msg}"
    );
    // One dimension too few on the output: 8 kernel parameters declared, the kernel takes 10.
    let short = Signature::new([
        Param::array(DType::F32, Intent::Read, 2, IndexType::I32),
        Param::array(DType::F32, Intent::Write, 1, IndexType::I64),
    ]);
    let e = lib.kernel("copy2d", short).unwrap_err();
    ensure!(
        e.to_string()
            .contains("the signature declares 8 parameters but the kernel takes 10"),
        "{e}"
    );
    Ok(())
}
