"""cuTile kernels used by the tile_py.cutile tests (cuTile reads a kernel's source, so they live
in a file). Importing this module needs ``cuda.tile``; tests import it only once that is known
to work."""

from typing import Annotated

import cuda.tile as ct

ConstInt = ct.Constant[int]

TILE = 16


@ct.kernel
def axpy(x, y, out, alpha):
    """1-D elementwise: out = alpha * x + y, one 16-element tile per block."""
    bid = ct.bid(0)
    tx = ct.load(x, index=(bid,), shape=(TILE,))
    ty = ct.load(y, index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=tx * alpha + ty)


@ct.kernel
def scale_2d(x, out, tm: ConstInt, tn: ConstInt):
    """2-D elementwise on (tm, tn) tiles: out = 2 * x + 1 (x may be any strided view)."""
    bi = ct.bid(0)
    bj = ct.bid(1)
    t = ct.load(x, index=(bi, bj), shape=(tm, tn))
    ct.store(out, index=(bi, bj), tile=t * 2.0 + 1.0)


@ct.kernel
def row_sum(x, out, tn: ConstInt):
    """Reduction: out[i] = sum of row i of x, rows of x in tiles of tn columns (x's column
    count a multiple of tn)."""
    bid = ct.bid(0)
    acc = ct.full((1, tn), 0, dtype=ct.float32)
    for j in range(ct.num_tiles(x, axis=1, shape=(1, tn))):
        acc += ct.load(x, index=(bid, j), shape=(1, tn)).astype(ct.float32)
    ct.store(out, index=(bid,), tile=ct.sum(acc, axis=1))


@ct.kernel
def affine_pair(pair, out, scale, shift, tile: ConstInt):
    """Constants, scalars and a tuple: out = (a + b) * scale + shift for pair = (a, b)."""
    bid = ct.bid(0)
    a = ct.load(pair[0], index=(bid,), shape=(tile,))
    b = ct.load(pair[1], index=(bid,), shape=(tile,))
    ct.store(out, index=(bid,), tile=(a + b) * scale + shift)


@ct.kernel
def matmul(a, b, c, tm: ConstInt, tn: ConstInt, tk: ConstInt):
    """c = a @ b in (tm, tn) output tiles, float32 accumulation."""
    bi = ct.bid(0)
    bj = ct.bid(1)
    acc = ct.full((tm, tn), 0, dtype=ct.float32)
    for k in range(ct.num_tiles(a, axis=1, shape=(tm, tk))):
        ta = ct.load(a, index=(bi, k), shape=(tm, tk)).astype(ct.tfloat32)
        tb = ct.load(b, index=(k, bj), shape=(tk, tn)).astype(ct.tfloat32)
        acc = ct.mma(ta, tb, acc)
    ct.store(c, index=(bi, bj), tile=ct.astype(acc, c.dtype))


@ct.kernel
def copy_list(xs, out):
    """A list-of-arrays parameter: out = xs[0]."""
    bid = ct.bid(0)
    ct.store(out, index=(bid,), tile=ct.load(xs[0], index=(bid,), shape=(TILE,)))


@ct.kernel
def one_arg(x):
    """One parameter (argument-count tests)."""
    ct.store(x, index=(0,), tile=ct.load(x, index=(0,), shape=(TILE,)) + 1)


@ct.kernel
def fill_count(n, out):
    """out[i] = i for i < n, one element per iteration: ``n`` must be a scalar (an array there
    is cuTile's TileTypeError when compiling)."""
    for i in range(n):
        ct.store(out, (i,), tile=ct.full((1,), fill_value=i, dtype=ct.int32))


@ct.kernel
def copy_static(x: Annotated[ct.Array, ct.ArrayAnnotation(static_shape_dims=(0, -1))], out):
    """A 16 x 16 tile of x (whose extents are compiled in as constants) to out."""
    ct.store(out, (0, 0), ct.load(x, (0, 0), (16, 16)))


@ct.kernel
def copy_static_strides(
    x: Annotated[ct.Array, ct.ArrayAnnotation(static_stride_dims=(0, 1))], out
):
    """As copy_static, with x's strides compiled in as constants instead."""
    ct.store(out, (0, 0), ct.load(x, (0, 0), (16, 16)))


@ct.kernel
def sum_list(xs, out):
    """out = the sum of the arrays of the list xs, one 16-element tile per block."""
    bid = ct.bid(0)
    acc = ct.zeros((TILE,), dtype=out.dtype)
    for i in range(len(xs)):
        acc += ct.load(xs[i], index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=acc)


@ct.kernel
def tuple_head(out, items: tuple[int, ct.Constant[int]]):
    """A tuple annotated shorter than the tuples it may be given (cuTile refuses longer ones)."""
    ct.scatter(out, (0,), items[0] + items[1])
