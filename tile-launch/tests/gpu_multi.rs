//! GPU tests on two devices. Ignored unless asked for (`--include-ignored`), and then they fail
//! on a machine with fewer than two CUDA devices: never passed without two GPUs.

mod gpu_common;

use anyhow::{Result, ensure};
use gpu_common::{Gpu, address, gpu, owned_tensor, random, vector_add, vector_add_args, view};
use tile_launch::{Context, Error, LaunchConfig, Stream};

fn two() -> Result<(Gpu, Gpu)> {
    let n = Context::device_count()?;
    ensure!(n >= 2, "this test needs two CUDA devices, found {n}");
    Ok((gpu(0)?, gpu(1)?))
}

const N: usize = 1 << 16;

fn current_context() -> Result<cuda_sys::CUcontext> {
    let d = cuda_sys::driver()?;
    let mut c: cuda_sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { (d.cuCtxGetCurrent)(&mut c) }.result_name_check()?;
    Ok(c)
}

trait Check {
    fn result_name_check(self) -> Result<()>;
}
impl Check for cuda_sys::CUresult {
    fn result_name_check(self) -> Result<()> {
        use cuda_sys::CuResultExt;
        Ok(self.check("cuCtxGetCurrent")?)
    }
}

#[test]
#[ignore = "needs two CUDA devices"]
fn launches_on_both_devices_from_one_thread() -> Result<()> {
    let (g0, g1) = two()?;
    let mut pending = Vec::new();
    for g in [&g0, &g1] {
        let k = vector_add(&g.ctx)?;
        let s = Stream::new(&g.ctx)?;
        let ha = random(N, g.ordinal as u64 + 1);
        let hb = random(N, g.ordinal as u64 + 2);
        let a = g.producer.clone_htod(&ha)?;
        let b = g.producer.clone_htod(&hb)?;
        let out = g.producer.alloc_zeros::<f32>(N)?;
        g.producer.synchronize()?;
        let (ta, ca) = owned_tensor(a, g.ordinal)?;
        let (tb, cb) = owned_tensor(b, g.ordinal)?;
        let (tc, cc) = view(address(&out), N, g.ordinal)?;
        ensure!(
            s.checks_pointer_devices(),
            "pointer check is on with two devices"
        );
        let h = s.launch(
            &k,
            &LaunchConfig::for_elements(N as u64, 256),
            vector_add_args(ta, tb, tc, 1, N),
        )?;
        let want: Vec<f32> = ha.iter().zip(&hb).map(|(x, y)| x + y).collect();
        pending.push((g, s, h, out, want, [ca, cb, cc]));
    }
    for (g, _s, h, out, want, counts) in pending {
        h.retire()?;
        ensure!(
            counts.iter().all(|c| c.get() == 1),
            "device {}: deleters",
            g.ordinal
        );
        let got = g.producer.clone_dtoh(&out)?;
        g.producer.synchronize()?;
        ensure!(got == want, "device {}: wrong sums", g.ordinal);
    }
    Ok(())
}

#[test]
#[ignore = "needs two CUDA devices"]
fn tensor_on_device_1_is_refused_by_a_stream_on_device_0() -> Result<()> {
    let (g0, g1) = two()?;
    let k = vector_add(&g0.ctx)?;
    let s0 = Stream::new(&g0.ctx)?;
    let a1 = g1.producer.alloc_zeros::<f32>(N)?;
    let b0 = g0.producer.alloc_zeros::<f32>(N)?;
    let c0 = g0.producer.alloc_zeros::<f32>(N)?;
    g0.producer.synchronize()?;
    g1.producer.synchronize()?;
    let before = s0.stats();
    // (a) described as cuda:1.
    let (ta, ca) = view(address(&a1), N, 1)?;
    let (tb, _) = view(address(&b0), N, 0)?;
    let (tc, _) = view(address(&c0), N, 0)?;
    let e = s0
        .launch(
            &k,
            &LaunchConfig::for_elements(N as u64, 256),
            vector_add_args(ta, tb, tc, 1, N),
        )
        .unwrap_err();
    ensure!(
        matches!(
            e,
            Error::DeviceMismatch {
                index: 0,
                stream_device: 0,
                ..
            }
        ),
        "{e}"
    );
    ensure!(
        e.to_string().contains("cuda:1") && e.to_string().contains("cuda:0"),
        "{e}"
    );
    ensure!(
        ca.get() == 1,
        "the refused tensor is released once, by its owner"
    );
    // (b) described as cuda:0 but its memory is on device 1: the pointer check refuses it.
    let (ta, _) = view(address(&a1), N, 0)?;
    let (tb, _) = view(address(&b0), N, 0)?;
    let (tc, _) = view(address(&c0), N, 0)?;
    let e = s0
        .launch(
            &k,
            &LaunchConfig::for_elements(N as u64, 256),
            vector_add_args(ta, tb, tc, 1, N),
        )
        .unwrap_err();
    ensure!(
        matches!(
            e,
            Error::PointerDeviceMismatch {
                index: 0,
                pointer_device: 1,
                stream_device: 0,
                ..
            }
        ),
        "{e}"
    );
    let after = s0.stats();
    ensure!(after.launches == before.launches, "something was launched");
    Ok(())
}

#[test]
#[ignore = "needs two CUDA devices"]
fn launch_restores_the_callers_current_context() -> Result<()> {
    let (g0, g1) = two()?;
    let k = vector_add(&g0.ctx)?;
    let s0 = Stream::new(&g0.ctx)?;
    let out = g0.producer.alloc_zeros::<f32>(N)?;
    let a = g0.producer.clone_htod(&random(N, 5))?;
    g0.producer.synchronize()?;
    let (ta, _) = owned_tensor(a, 0)?;
    let (tc, _) = view(address(&out), N, 0)?;
    let (tb, _) = view(address(&out), N, 0)?;
    let _on1 = g1.ctx.bind()?; // the caller's current device is 1
    let before = current_context()?;
    ensure!(before == g1.ctx.raw());
    s0.launch(
        &k,
        &LaunchConfig::for_elements(N as u64, 256),
        vector_add_args(ta, tb, tc, 1, N),
    )?
    .retire()?;
    ensure!(
        current_context()? == before,
        "the launch left another context current"
    );
    Ok(())
}
