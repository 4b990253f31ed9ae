"""The measured loop of `cargo xtask profile`'s tile_py paths: N launches of one path through
tile_py against the stub driver (bench/profile/cuda_stub.c, through TILE_LIBCUDA), with tensors
of bench/profile/fake_exchange.c (a C producer with the DLPack C exchange API, named as PyTorch's
tensor base so that tile_py treats it as a torch tensor). Run twice with different N under
callgrind; the difference over the difference in N is the instructions per launch.

    python py_launch_profile.py PATH N

PATH: torch (3 tensors + 4 u64 scalars, producer's current stream = launch stream), cross (the
same, producer's current stream another), scalars (7 u64 scalars), bound (Kernel.bind, 3 tensors),
capsule (3 arrays of a generic producer whose C `__dlpack__` returns a capsule, as CuPy's does),
hold, hold1 and hold-capsule (`tile_py.hold` of the torch path's 3 tensors, of 1 of them, and of
the capsule path's 3 arrays: what another launcher calls after its launch; nothing is launched),
cutile and cutile-capsule (the torch and capsule paths' arguments through tile_py.cutile.launch, a
cuTile kernel's cached launch: its one compile, at the first launch, registers the stub's kernel
in place of cuTile's compiler, so every measured launch is a hit; needs cuda-tile), cutile-int
(cutile-capsule's launch with an int stream handle, as most cuTile programs pass, on a handle no
stream object names: a launch-only stream) and ct (the peer:
cuTile's own ct.launch of the same kernel and arguments with the same int handle, its compiler
likewise replaced by the stub's image; needs cuda-tile).

Against the stub, which counts the driver calls it answers, it prints the driver calls the
measured loop made per launch: a line `driver calls per launch: TOTAL`, then one line per entry
point called (`  NAME PER_LAUNCH`).
"""

import ctypes
import gc
import os
import sys

import tile_py
from tile_py import In, Out, Scalar

import fake_exchange

HANDLE = 0x5000  # a stream handle the stub driver accepts
# The int-handle paths' own handle: a handle first seen through a stream object is cached as that
# object's stream (kept alive by it), so on HANDLE an int would measure the object path instead
# of a launch-only stream (an event recorded in every launch).
INT_HANDLE = 0x5100


class CudaStream:
    """A stream object as torch and cuda.core hand out (`__cuda_stream__`), kept alive by the
    caller: the common case (an int handle is a launch-only stream, with an event per launch)."""

    def __cuda_stream__(self):
        return (0, HANDLE)


STREAM = CudaStream()


def cutile_kernel():
    """A cuTile kernel with seven parameters (three arrays, four scalars). cuTile reads a
    kernel's source from its file: this one is written out first."""
    import tempfile

    import cuda.tile as ct

    ns = {"ct": ct}
    src = "import cuda.tile as ct\n\n\n@ct.kernel\ndef k7(x, y, out, a, b, c, d):\n    pass\n"
    path = os.path.join(tempfile.mkdtemp(), "profile_cutile_kernel.py")
    with open(path, "w") as f:
        f.write(src)
    exec(compile(src, path, "exec"), ns)
    return ns["k7"]


def ct_launcher(args):
    """cuTile's own ``ct.launch`` of the seven-parameter kernel with an int stream handle; its
    compile (at the first launch) returns the stub's image instead of running cuTile's compiler,
    which the stub driver loads as any other."""
    import cuda.tile as ct

    kernel = cutile_kernel()
    type(kernel)._compile = lambda self, sig, ctx, cc=None: (b"\x7fELF stub image\0", "k", None, ())
    return lambda: ct.launch(INT_HANDLE, (16,), kernel, args)


def cutile_launcher(lib, k3, args, stream=STREAM):
    """``tile_py.cutile.launch`` of a cuTile kernel with seven parameters, compiled (at its first
    launch) to the stub's kernel ``k3``: cuTile's compiler is replaced, the cached launch is not."""
    import tile_py.cutile as tc

    tc._compile = lambda kernel, shown, cc: tc._Compiled(k3, (True,) * 7, None)
    kernel = cutile_kernel()
    return lambda: tc.launch(stream, 16, kernel, args)


def main():
    path, n = sys.argv[1], int(sys.argv[2])
    lib = tile_py.Library.from_bytes(b"\x7fELF stub image\0")
    # The stub's kernels take seven 8-byte parameters.
    k3 = lib.kernel("k", [In("float32"), In("float32"), Out("float32")] + [Scalar("u64")] * 4)
    k7 = lib.kernel("k", [Scalar("u64")] * 7)
    a, b, c = (fake_exchange.Tensor(4096) for _ in range(3))
    x, y, z = (fake_exchange.Array(4096) for _ in range(3))
    fake_exchange.set_current_stream(0x777 if path == "cross" else HANDLE)
    bound = k3.bind(STREAM, 16, block=256)
    paths = {
        "torch": lambda: tile_py.launch(STREAM, 16, k3, (a, b, c, 1, 2, 3, 4), block=256),
        "cross": lambda: tile_py.launch(STREAM, 16, k3, (a, b, c, 1, 2, 3, 4), block=256),
        "scalars": lambda: tile_py.launch(STREAM, 16, k7, (1, 2, 3, 4, 5, 6, 7), block=256),
        "bound": lambda: bound(a, b, c, 1, 2, 3, 4),
        "capsule": lambda: tile_py.launch(STREAM, 16, k3, (x, y, z, 1, 2, 3, 4), block=256),
        "hold": lambda: tile_py.hold(STREAM, a, b, c),
        "hold1": lambda: tile_py.hold(STREAM, a),
        "hold-capsule": lambda: tile_py.hold(STREAM, x, y, z),
    }
    if path in ("cutile", "cutile-capsule"):
        paths[path] = cutile_launcher(
            lib, k3, (a, b, c, 1, 2, 3, 4) if path == "cutile" else (x, y, z, 1, 2, 3, 4)
        )
    if path == "cutile-int":
        paths[path] = cutile_launcher(lib, k3, (x, y, z, 1, 2, 3, 4), stream=INT_HANDLE)
    if path == "ct":
        paths[path] = ct_launcher((x, y, z, 1, 2, 3, 4))
    launch = paths[path]
    # From here on the interpreter hands the GIL to another thread only when the main thread
    # lets go of it: tile_py's release thread wakes on a wall-clock period, and interleaved with
    # the loop at the interpreter's whim its work would make the counts depend on timing.
    sys.setswitchinterval(1e6)
    for _ in range(300):  # warm-up: caches, first-use paths
        launch()
    gc.disable()
    counts = driver_counts()
    if counts:
        counts.stub_driver_calls_reset()
    for _ in range(n):
        launch()
    if counts:
        print_counts(counts, n)
    tile_py.synchronize()


def driver_counts():
    """The stub driver's call counters, or None for a driver without them."""
    try:
        lib = ctypes.CDLL(os.environ["TILE_LIBCUDA"])
        lib.stub_driver_calls_reset
    except (KeyError, OSError, AttributeError):
        return None
    lib.stub_driver_calls.restype = ctypes.c_ulonglong
    lib.stub_driver_calls.argtypes = [ctypes.c_char_p]
    lib.stub_driver_call_name.restype = ctypes.c_char_p
    lib.stub_driver_call_name.argtypes = [ctypes.c_int]
    return lib


def print_counts(lib, n):
    print(f"driver calls per launch: {lib.stub_driver_calls(None) / n:.3f}")
    i = 0
    while (name := lib.stub_driver_call_name(i)) is not None:
        calls = lib.stub_driver_calls(name)
        if calls:
            print(f"  {name.decode()} {calls / n:.3f}")
        i += 1


if __name__ == "__main__":
    main()
