"""cuTile kernels used by the tile_py.jax GPU tests (cuTile reads a kernel's source, so they live
in a file). Importing this module needs ``cuda.tile``; the tests import it only once that is
known to work. Every kernel works on 1-D arrays in tiles of ``tile`` elements, one per block."""

import cuda.tile as ct

ConstInt = ct.Constant[int]


@ct.kernel
def add(a, b, out, tile: ConstInt):
    """out = a + b."""
    i = ct.bid(0)
    ct.store(out, index=(i,), tile=ct.load(a, index=(i,), shape=(tile,))
             + ct.load(b, index=(i,), shape=(tile,)))


@ct.kernel
def axpb(x, out, a, b, tile: ConstInt):
    """out = a * x + b, with scalars a and b."""
    i = ct.bid(0)
    ct.store(out, index=(i,), tile=ct.load(x, index=(i,), shape=(tile,)) * a + b)


@ct.kernel
def halve(x, tile: ConstInt):
    """x = x / 2, in place."""
    i = ct.bid(0)
    ct.store(x, index=(i,), tile=ct.load(x, index=(i,), shape=(tile,)) * 0.5)


@ct.kernel
def sin_cos(x, s, c, tile: ConstInt):
    """s = sin(x), c = cos(x)."""
    i = ct.bid(0)
    t = ct.load(x, index=(i,), shape=(tile,))
    ct.store(s, index=(i,), tile=ct.sin(t))
    ct.store(c, index=(i,), tile=ct.cos(t))


@ct.kernel
def pair_diff(pair, out, tile: ConstInt):
    """out = pair[0] - pair[1], a tuple parameter."""
    i = ct.bid(0)
    ct.store(out, index=(i,), tile=ct.load(pair[0], index=(i,), shape=(tile,))
             - ct.load(pair[1], index=(i,), shape=(tile,)))
