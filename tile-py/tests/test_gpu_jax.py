"""GPU tests of tile_py.jax: tile kernels inside jax.jit through tile's XLA FFI handler, checked
against jax.numpy on fresh random inputs.

Needs a GPU and JAX with its CUDA plugin (jax-cuda13-plugin). Without JAX's GPU backend the tests
are skipped with the reason, even under TILE_REQUIRE_GPU=1; with TILE_REQUIRE_JAX=1 a missing
backend fails them. The cuTile tests (``tile_py.jax.cutile_call``) also need ``cuda.tile``
(cuda-tile 1.7) and its compiler (``tileiras`` on PATH); without them they are skipped with the
reason, and with TILE_REQUIRE_CUTILE=1 a missing cuTile or compiler fails them. XLA's command buffers (CUDA graphs) are exercised in child processes, with
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
import gpu_support
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
    y0 = np.asarray(y).copy()
    # Donated: XLA writes the result over y's buffer; not donated: XLA copies y first. The
    # kernel may contract the multiply-add (one rounding), hence the absolute tolerance.
    got = jax.jit(lambda y, x: axpy(y, x, 2.0, y.size))(y, x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(y), y0)  # not donated: y is left as it was
    donated = jax.jit(lambda y, x: axpy(y, x, 2.0, y.size), donate_argnums=0)(y + 0, x)
    np.testing.assert_allclose(np.asarray(donated), want, rtol=1e-6, atol=1e-6)


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


# ---- cuTile kernels through tile_py.jax.cutile_call ---------------------------------------------

TILE = 128


@pytest.fixture(scope="module")
def CK(jax):
    gpu_support.require_cutile()
    import cutile_jax_kernels

    return cutile_jax_kernels


def tiles(n):
    return ((n + TILE - 1) // TILE,)


def test_cutile_elementwise_with_an_output_placeholder(jax, jnp, CK):
    from tile_py.jax import OutputPlaceholder, cutile_call

    @jax.jit
    def f(a, b):
        return cutile_call(tiles(a.shape[0]), CK.add, (a, b, OutputPlaceholder(a.shape, a.dtype), TILE))

    for n in (TILE, 64 * TILE, 1 << 20):
        a, b = rand(jax, n, 2 * n), rand(jax, n, 2 * n + 1)
        np.testing.assert_allclose(np.asarray(f(a, b)), np.asarray(a + b), rtol=1e-6)
    # Eagerly too.
    a, b = rand(jax, TILE, 1), rand(jax, TILE, 2)
    got = cutile_call(tiles(TILE), CK.add, (a, b, OutputPlaceholder(a.shape, a.dtype), TILE))
    np.testing.assert_allclose(np.asarray(got), np.asarray(a + b), rtol=1e-6)


def test_cutile_scalars_and_constants(jax, jnp, CK):
    from tile_py.jax import OutputPlaceholder, cutile_call

    def f(x, a, b, tile):
        return cutile_call(((x.shape[0] + tile - 1) // tile,), CK.axpb,
                           (x, OutputPlaceholder(x.shape, x.dtype), a, b, tile))

    g = jax.jit(f, static_argnums=(1, 2, 3))
    x = rand(jax, 8 * TILE, 3)
    for a, b, tile in ((2.5, -1.0, TILE), (0.5, 3.0, TILE), (2.5, -1.0, 2 * TILE)):
        np.testing.assert_allclose(np.asarray(g(x, a, b, tile)), np.asarray(a * x + b),
                                   rtol=1e-5, atol=1e-6)
    # An array where the kernel takes a compile-time constant is refused while tracing (by
    # cuTile, or by tile_py.jax where cuTile lets it through), before anything runs.
    traced_tile = jax.jit(lambda x, t: cutile_call(
        tiles(x.shape[0]), CK.axpb, (x, OutputPlaceholder(x.shape, x.dtype), 1.0, 0.0, t)))
    with pytest.raises(Exception) as e:
        traced_tile.lower(x, jnp.int32(TILE))
    assert "JaxRuntimeError" not in type(e.value).__name__, e.value


def test_cutile_in_place(jax, jnp, CK):
    from tile_py.jax import InputOutput, cutile_call

    x = rand(jax, 16 * TILE, 4)
    want = np.asarray(x) * 0.5
    f = jax.jit(lambda x: cutile_call(tiles(x.shape[0]), CK.halve, (InputOutput(x), TILE)))
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=0)
    np.testing.assert_allclose(np.asarray(x), want * 2.0, rtol=0)  # not donated: x is unchanged
    donated = jax.jit(lambda x: cutile_call(tiles(x.shape[0]), CK.halve, (InputOutput(x), TILE)),
                      donate_argnums=0)(x + 0)
    np.testing.assert_allclose(np.asarray(donated), want, rtol=0)
    # Twice in a row inside one jit, the second on the first's result.
    g = jax.jit(lambda x: cutile_call(tiles(x.shape[0]), CK.halve, (InputOutput(
        cutile_call(tiles(x.shape[0]), CK.halve, (InputOutput(x), TILE))), TILE)))
    np.testing.assert_allclose(np.asarray(g(x)), want * 0.5, rtol=0)


def test_cutile_several_outputs_and_a_tuple(jax, jnp, CK):
    from tile_py.jax import OutputPlaceholder, cutile_call

    x, y = rand(jax, 32 * TILE, 5), rand(jax, 32 * TILE, 6)

    @jax.jit
    def f(x, y):
        ph = OutputPlaceholder(x.shape, x.dtype)
        s, c = cutile_call(tiles(x.shape[0]), CK.sin_cos, (x, ph, ph, TILE))
        d = cutile_call(tiles(x.shape[0]), CK.pair_diff, ((s, y), ph, TILE))
        return s, c, jnp.cumsum(d)

    s, c, d = f(x, y)
    np.testing.assert_allclose(np.asarray(s), np.asarray(jnp.sin(x)), atol=1e-5)
    np.testing.assert_allclose(np.asarray(c), np.asarray(jnp.cos(x)), atol=1e-5)
    np.testing.assert_allclose(np.asarray(d), np.asarray(jnp.cumsum(jnp.sin(x) - y)),
                               rtol=1e-4, atol=1e-3)


def test_cutile_call_takes_cutiles_own_placeholders(jax, jnp, CK):
    """One import changed: cuTile's OutputPlaceholder and InputOutput objects work as ours, and
    the results equal ct.jax.cutile_call's."""
    import cuda.tile.jax as ctj

    import tile_py.jax

    x, y = rand(jax, 8 * TILE, 7), rand(jax, 8 * TILE, 8)

    def program(cutile_call):
        @jax.jit
        def f(x, y):
            z = cutile_call(tiles(x.shape[0]), CK.add,
                            (x, y, ctj.OutputPlaceholder(x.shape, x.dtype), TILE))
            return cutile_call(tiles(x.shape[0]), CK.halve, (ctj.InputOutput(z), TILE))

        return f(x, y)

    ours, theirs = program(tile_py.jax.cutile_call), program(ctj.cutile_call)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    np.testing.assert_allclose(np.asarray(ours), np.asarray((x + y) * 0.5), rtol=1e-6)


def test_cutile_call_without_outputs_is_refused(jax, CK):
    from tile_py.jax import cutile_call

    x = rand(jax, TILE, 9)
    with pytest.raises(TypeError, match="has no output"):
        jax.jit(lambda x: cutile_call(tiles(TILE), CK.add, (x, x, x, TILE)))(x)


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
