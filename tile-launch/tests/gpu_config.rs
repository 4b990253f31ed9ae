//! GPU tests of the launch attributes: a cluster kernel reading its cluster rank, a cooperative
//! kernel with a grid-wide barrier, a programmatic-dependent-launch pair, and dynamic shared
//! memory above the 48 KiB default. Ignored without a GPU, never passed.

mod gpu_common;

use anyhow::{Result, ensure};
use gpu_common::{address, config_library, gpu, view};
use tile_dlpack::DType;
use tile_launch::{Dim3, Error, LaunchConfig, Param, ScalarType, Signature, Stream};

#[test]
#[ignore = "needs a CUDA device"]
fn cluster_kernel_reads_its_cluster_rank() -> Result<()> {
    let g = gpu(0)?;
    let lib = config_library(&g.ctx)?;
    let k = lib.kernel("cluster_rank", Signature::new([Param::output(DType::F32)]))?;
    let s = Stream::new(&g.ctx)?;
    let blocks = 32usize;
    let out = g.producer.alloc_zeros::<f32>(blocks)?;
    g.producer
        .memcpy_htod(&vec![f32::NAN; blocks], &mut out.clone())?;
    g.producer.synchronize()?;
    let (t, count) = view(address(&out), blocks, 0)?;
    let cfg = LaunchConfig {
        cluster: Some(Dim3::new(4, 1, 1)),
        ..LaunchConfig::new(blocks as u32, 64)
    };
    s.launch(&k, &cfg, [t.into()])?.retire()?;
    ensure!(count.get() == 1);
    let got = g.producer.clone_dtoh(&out)?;
    g.producer.synchronize()?;
    for (b, r) in got.iter().enumerate() {
        ensure!(
            *r == (b % 4) as f32,
            "block {b}: cluster rank {r} want {}",
            b % 4
        );
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn cooperative_kernel_passes_a_grid_barrier() -> Result<()> {
    let g = gpu(0)?;
    let lib = config_library(&g.ctx)?;
    let k = lib.kernel(
        "grid_barrier",
        Signature::new([
            Param::inout(DType::F32),
            Param::output(DType::F32),
            Param::inout(DType::F32), // the u32 counter, as 4-byte words
        ]),
    )?;
    let s = Stream::new(&g.ctx)?;
    // Two blocks per SM: co-resident for a 128-thread block of this tiny kernel.
    let blocks = (g.ctx.limits().multiprocessor_count * 2) as usize;
    let x = g.producer.alloc_zeros::<f32>(blocks)?;
    let y = g.producer.alloc_zeros::<f32>(blocks)?;
    let counter = g.producer.alloc_zeros::<f32>(1)?;
    g.producer.synchronize()?;
    let (tx, _) = view(address(&x), blocks, 0)?;
    let (ty, _) = view(address(&y), blocks, 0)?;
    let (tc, _) = view(address(&counter), 1, 0)?;
    let cfg = LaunchConfig {
        cooperative: true,
        ..LaunchConfig::new(blocks as u32, 128)
    };
    s.launch(&k, &cfg, [tx.into(), ty.into(), tc.into()])?
        .retire()?;
    let got = g.producer.clone_dtoh(&y)?;
    g.producer.synchronize()?;
    for (b, v) in got.iter().enumerate() {
        let want = ((b + 1) % blocks + 1) as f32;
        ensure!(*v == want, "block {b}: read {v} want {want}");
    }
    // A cooperative grid larger than what can be co-resident is refused before consuming.
    let too_many = g.ctx.limits().max_cooperative_grid().min(u32::MAX as u64) as u32 + 1;
    let (tx, cx) = view(address(&x), blocks, 0)?;
    let (ty, _) = view(address(&y), blocks, 0)?;
    let (tc, _) = view(address(&counter), 1, 0)?;
    let cfg = LaunchConfig {
        cooperative: true,
        ..LaunchConfig::new(too_many, 128)
    };
    let e = s
        .launch(&k, &cfg, [tx.into(), ty.into(), tc.into()])
        .unwrap_err();
    ensure!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    ensure!(e.to_string().contains("cooperative launch"), "{e}");
    ensure!(
        cx.get() == 1,
        "the refused launch's tensor is released once by its owner"
    );
    // Occupancy-based bound: 1024-thread blocks fit fewer per SM than the device maximum.
    let (tx, _) = view(address(&x), blocks, 0)?;
    let (ty, _) = view(address(&y), blocks, 0)?;
    let (tc, _) = view(address(&counter), 1, 0)?;
    let cfg = LaunchConfig {
        cooperative: true,
        ..LaunchConfig::new(g.ctx.limits().multiprocessor_count * 3, 1024)
    };
    let e = s
        .launch(&k, &cfg, [tx.into(), ty.into(), tc.into()])
        .unwrap_err();
    ensure!(e.to_string().contains("co-resident"), "{e}");
    println!("{e}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn programmatic_dependent_launch_pair() -> Result<()> {
    let g = gpu(0)?;
    let lib = config_library(&g.ctx)?;
    let primary = lib.kernel(
        "pdl_primary",
        Signature::new([Param::output(DType::F32), Param::scalar(ScalarType::U64)]),
    )?;
    let secondary = lib.kernel(
        "pdl_secondary",
        Signature::new([
            Param::input(DType::F32),
            Param::output(DType::F32),
            Param::scalar(ScalarType::U64),
        ]),
    )?;
    let s = Stream::new(&g.ctx)?;
    let n = 1usize << 20;
    let x = g.producer.alloc_zeros::<f32>(n)?;
    let y = g.producer.alloc_zeros::<f32>(n)?;
    g.producer.synchronize()?;
    for round in 0..10 {
        let (tx, _) = view(address(&x), n, 0)?;
        let h1 = s.launch(
            &primary,
            &LaunchConfig::for_elements(n as u64, 256),
            [tx.into(), (n as u64).into()],
        )?;
        let (tx, _) = view(address(&x), n, 0)?;
        let (ty, _) = view(address(&y), n, 0)?;
        let cfg = LaunchConfig {
            programmatic_dependent_launch: true,
            ..LaunchConfig::for_elements(n as u64, 256)
        };
        let h2 = s.launch(&secondary, &cfg, [tx.into(), ty.into(), (n as u64).into()])?;
        h2.retire()?;
        h1.retire()?;
        let got = g.producer.clone_dtoh(&y)?;
        g.producer.synchronize()?;
        for (i, v) in got.iter().enumerate() {
            ensure!(*v == i as f32 * 2.0 + 1.0, "round {round}: y[{i}] = {v}");
        }
        g.producer.memset_zeros(&mut x.clone())?;
        g.producer.synchronize()?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn dynamic_shared_memory_above_48_kib_opts_in() -> Result<()> {
    let g = gpu(0)?;
    let lib = config_library(&g.ctx)?;
    let k = lib.kernel(
        "shared_sum",
        Signature::new([Param::output(DType::F32), Param::scalar(ScalarType::U32)]),
    )?;
    let s = Stream::new(&g.ctx)?;
    let out = g.producer.alloc_zeros::<f32>(1)?;
    g.producer.synchronize()?;
    let limits = *g.ctx.limits();
    for bytes in [
        16u32 << 10,
        100 << 10,
        limits.max_shared_mem_per_block_optin,
    ] {
        let words = bytes / 4;
        let (t, c) = view(address(&out), 1, 0)?;
        let cfg = LaunchConfig {
            shared_mem_bytes: bytes,
            ..LaunchConfig::new(1, 256)
        };
        s.launch(&k, &cfg, [t.into(), words.into()])?.retire()?;
        ensure!(c.get() == 1);
        let got = g.producer.clone_dtoh(&out)?[0];
        g.producer.synchronize()?;
        let want = (f64::from(words) * (f64::from(words) - 1.0) / 2.0) as f32;
        ensure!(got == want, "{bytes} bytes: sum {got} want {want}");
    }
    let (t, c) = view(address(&out), 1, 0)?;
    let cfg = LaunchConfig {
        shared_mem_bytes: limits.max_shared_mem_per_block_optin + 4,
        ..LaunchConfig::new(1, 256)
    };
    let e = s.launch(&k, &cfg, [t.into(), 1u32.into()]).unwrap_err();
    ensure!(e.to_string().contains("opt-in limit"), "{e}");
    ensure!(c.get() == 1);
    Ok(())
}
