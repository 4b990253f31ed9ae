"""GPU tests of tile_py.jax: tile kernels inside jax.jit through tile's XLA FFI handler, checked
against jax.numpy on fresh random inputs.

Needs a GPU and JAX with its CUDA plugin (jax-cuda13-plugin). Without JAX's GPU backend the tests
are skipped with the reason, even under TILE_REQUIRE_GPU=1; with TILE_REQUIRE_JAX=1 a missing
backend fails them. XLA's command buffers (CUDA graphs) are exercised in child processes, with
them off and forced on for custom calls (``XLA_FLAGS``, read once per process).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tile_py
import tile_py.jax
from tile_py import In, InOut, Out, Scalar

pytestmark = pytest.mark.gpu

SOURCE = r"""
typedef unsigned long long u64;
typedef long long i64;

extern "C" __global__ void scale(const float* x, float* y, float a, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

extern "C" __global__ void axpy_inplace(float* y, const float* x, float a, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

extern "C" __global__ void sin_and_cos(const float* x, float* s, float* c, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) { s[i] = sinf(x[i]); c[i] = cosf(x[i]); }
}

// One partial sum per block, through dynamic shared memory of blockDim.x floats.
extern "C" __global__ void block_sums(const float* x, float* partial, u64 n) {
    extern __shared__ float acc[];
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    acc[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) acc[threadIdx.x] += acc[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
}

// Array parameters: pointer, extents, strides (in elements), as i64.
extern "C" __global__ void add_rows(const float* x, i64 r, i64 c, i64 sr, i64 sc,
                                    const float* b, i64 nb, i64 sb,
                                    float* y, i64 yr, i64 yc, i64 syr, i64 syc) {
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < r * c) {
        i64 row = i / c, col = i % c;
        y[row * syr + col * syc] = x[row * sr + col * sc] + b[col * sb];
    }
}
"""

BLOCK = 256


def grid_for(n):
    return max(1, (n + BLOCK - 1) // BLOCK)


def _jax_reason():
    try:
        import jax
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"jax is not importable: {e}"
    try:
        if not jax.devices("gpu"):
            return "jax.devices('gpu') is empty"
    except RuntimeError as e:
        return f"JAX has no GPU backend (jax-cuda13-plugin): {e}"
    return None


@pytest.fixture(scope="module")
def jax():
    reason = _jax_reason()
    if reason is not None:
        if os.environ.get("TILE_REQUIRE_JAX") == "1":
            pytest.fail(f"TILE_REQUIRE_JAX=1 but {reason}", pytrace=False)
        pytest.skip(f"needs JAX's GPU backend: {reason}")
    import jax

    return jax


@pytest.fixture(scope="module")
def jnp(jax):
    import jax.numpy as jnp

    return jnp


@pytest.fixture(scope="module")
def lib(jax):
    return tile_py.Library.from_cuda_source(SOURCE)


@pytest.fixture(scope="module")
def scale(lib, jax):
    k = lib.kernel("scale", [In("float32"), Out("float32"), Scalar("f32"), Scalar("u64")])
    return tile_py.jax.call(
        k,
        out_shapes=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=lambda x: grid_for(x.size),
        block=BLOCK,
    )


def rand(jax, n, seed, dtype="float32"):
    return jax.random.normal(jax.random.key(seed), (n,), dtype=dtype)


def test_elementwise_in_jit(jax, jnp, scale):
    for n in (1, 1000, 1 << 20):
        x = rand(jax, n, n)
        y = jax.jit(lambda x: scale(x, 2.5, x.size))(x)
        np.testing.assert_allclose(np.asarray(y), np.asarray(2.5 * x), rtol=1e-6)


def test_eager_call(jax, scale):
    x = rand(jax, 4096, 1)
    np.testing.assert_allclose(np.asarray(scale(x, -1.0, x.size)), -np.asarray(x), rtol=0)


def test_mixed_with_jax_ops(jax, jnp, scale):
    x = rand(jax, 10_000, 2)

    @jax.jit
    def f(x):
        y = scale(jnp.sin(x), 3.0, x.size)
        return jnp.cumsum(y) + scale(y, 0.5, y.size)

    want = jnp.cumsum(3.0 * jnp.sin(x)) + 1.5 * jnp.sin(x)
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(want), rtol=1e-4, atol=1e-3)


def test_reduction_with_shared_memory(jax, jnp, lib):
    k = lib.kernel("block_sums", [In("float32"), Out("float32"), Scalar("u64")])
    partial = tile_py.jax.call(
        k,
        out_shapes=lambda x: jax.ShapeDtypeStruct((grid_for(x.size),), x.dtype),
        grid=lambda x: grid_for(x.size),
        block=BLOCK,
        shared_mem=BLOCK * 4,
    )
    x = rand(jax, 300_000, 3)
    total = jax.jit(lambda x: jnp.sum(partial(x, x.size)))(x)
    np.testing.assert_allclose(float(total), float(jnp.sum(x)), rtol=1e-4, atol=1e-2)


def test_in_place_with_aliasing(jax, jnp, lib):
    k = lib.kernel("axpy_inplace", [InOut("float32"), In("float32"), Scalar("f32"), Scalar("u64")])
    axpy = tile_py.jax.call(k, grid=lambda y, x: grid_for(y.size), block=BLOCK)
    y, x = rand(jax, 5000, 4), rand(jax, 5000, 5)
    want = np.asarray(y + 2.0 * x)
    # Donated: XLA writes the result over y's buffer; not donated: XLA copies y first.
    got = jax.jit(lambda y, x: axpy(y, x, 2.0, y.size))(y, x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want - 2.0 * np.asarray(x)), rtol=1e-5)
    donated = jax.jit(lambda y, x: axpy(y, x, 2.0, y.size), donate_argnums=0)(y + 0, x)
    np.testing.assert_allclose(np.asarray(donated), want, rtol=1e-6)


def test_several_outputs(jax, jnp, lib):
    k = lib.kernel("sin_and_cos", [In("float32"), Out("float32"), Out("float32"), Scalar("u64")])
    sc = tile_py.jax.call(
        k,
        out_shapes=lambda x: [jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2,
        grid=lambda x: grid_for(x.size),
        block=BLOCK,
    )
    x = rand(jax, 7777, 6)
    s, c = jax.jit(lambda x: sc(x, x.size))(x)
    np.testing.assert_allclose(np.asarray(s), np.asarray(jnp.sin(x)), atol=1e-5)
    np.testing.assert_allclose(np.asarray(c), np.asarray(jnp.cos(x)), atol=1e-5)


def test_array_parameters(jax, jnp, lib):
    k = lib.kernel("add_rows", [In("float32", ndim=2), In("float32", ndim=1), Out("float32", ndim=2)])
    add = tile_py.jax.call(
        k,
        out_shapes=lambda x, b: jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=lambda x, b: grid_for(x.size),
        block=BLOCK,
    )
    x = jax.random.normal(jax.random.key(7), (300, 17))
    b = rand(jax, 17, 8)
    np.testing.assert_allclose(np.asarray(jax.jit(add)(x, b)), np.asarray(x + b), rtol=1e-6)
    # A rank the declaration does not have is refused before anything runs.
    with pytest.raises(Exception, match=r"tile_py\.jax: kernel `add_rows`: argument 1"):
        jax.jit(add)(x, x).block_until_ready()


def test_wrong_dtype_is_refused_with_the_argument(jax, jnp, scale):
    x = jnp.arange(1000, dtype=jnp.int32)
    with pytest.raises(Exception, match=r"tile_py\.jax: kernel `scale`: argument 0.*") as e:
        jax.jit(lambda x: scale(x, 2.0, x.size))(x).block_until_ready()
    assert "RuntimeError" in type(e.value).__name__ or isinstance(e.value, RuntimeError)
    # The process carries on: a correct call after the refused one runs.
    y = rand(jax, 100, 9)
    np.testing.assert_allclose(np.asarray(scale(y, 2.0, y.size)), 2.0 * np.asarray(y), rtol=1e-6)


def test_wrong_out_shapes_and_operands_are_trace_time_errors(jax, jnp, lib, scale):
    x = rand(jax, 100, 10)
    with pytest.raises(TypeError, match="takes 3 operands"):
        jax.jit(lambda x: scale(x, 2.0))(x)
    with pytest.raises(TypeError, match="is a scalar parameter, which is static"):
        jax.jit(lambda x, a: scale(x, a, x.size))(x, 2.0)
    k = lib.kernel("sin_and_cos", [In("float32"), Out("float32"), Out("float32"), Scalar("u64")])
    bad = tile_py.jax.call(k, out_shapes=jax.ShapeDtypeStruct((100,), jnp.float32), grid=1, block=BLOCK)
    with pytest.raises(TypeError, match="2 Out parameters, out_shapes gives 1"):
        jax.jit(lambda x: bad(x, x.size))(x)
    with pytest.raises(OverflowError):
        jax.jit(lambda x: scale(x, 2.0, -1))(x)


def test_vmap_needs_a_declared_method(jax, lib):
    k = lib.kernel("scale", [In("float32"), Out("float32"), Scalar("f32"), Scalar("u64")])
    plain = tile_py.jax.call(k, out_shapes=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                             grid=lambda x: grid_for(x.size), block=BLOCK)
    looped = tile_py.jax.call(k, out_shapes=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=lambda x: grid_for(x.size), block=BLOCK, vmap_method="sequential")
    xs = jax.random.normal(jax.random.key(11), (4, 1000))
    with pytest.raises(Exception, match="vmap"):
        jax.vmap(lambda x: plain(x, 2.0, x.size))(xs)
    got = jax.jit(jax.vmap(lambda x: looped(x, 2.0, x.size)))(xs)
    np.testing.assert_allclose(np.asarray(got), 2.0 * np.asarray(xs), rtol=1e-6)


CHILD = textwrap.dedent(
    r"""
    import os, sys
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.path.insert(0, sys.argv[1])
    import numpy as np, jax, jax.numpy as jnp, tile_py, tile_py.jax
    from tile_py import In, Out, Scalar
    import test_gpu_jax as t
    lib = tile_py.Library.from_cuda_source(t.SOURCE)
    k = lib.kernel("scale", [In("float32"), Out("float32"), Scalar("f32"), Scalar("u64")])
    scale = tile_py.jax.call(k, out_shapes=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                             grid=lambda x: t.grid_for(x.size), block=t.BLOCK)

    @jax.jit
    def f(x):
        for i in range(4):
            x = scale(x, 1.5, x.size) + 1.0
        return x

    x = jax.random.normal(jax.random.key(0), (1 << 16,))
    want = x
    for i in range(4):
        want = 1.5 * want + 1.0
    for _ in range(5):  # repeated runs replay the command buffer where XLA made one
        np.testing.assert_allclose(np.asarray(f(x)), np.asarray(want), rtol=1e-5)
    print("ok", f.lower(x).compile().as_text().count("custom-call"))
    """
)


@pytest.mark.parametrize(
    "flags",
    [
        "--xla_gpu_enable_command_buffer=",
        "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
    ],
    ids=["no-command-buffers", "command-buffers"],
)
def test_with_and_without_command_buffers(jax, flags):
    env = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": os.pathsep.join(sys.path)}
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", CHILD, here], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().startswith("ok"), r.stdout
