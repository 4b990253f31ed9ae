"""Instructions per call of tile's XLA FFI handler (tile_py.jax) against the stub driver
(bench/profile/cuda_stub.c, through TILE_LIBCUDA): N executions of one call frame built with
ctypes, as XLA builds it (two f32 operands, one f32 result, four u64 scalar attributes; the
stub's kernel takes seven 8-byte parameters). Run under callgrind with
`--toggle-collect=*xla*handler*` so that only the handler counts:

    valgrind --tool=callgrind --toggle-collect='*xla*handler*' python xla_handler_profile.py N

Fails (exit status 1) if any call returned an XLA error, so the count is of the launch path.
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tile-py", "tests"))

import tile_py  # noqa: E402
import tile_py.jax  # noqa: E402
from tile_py import In, Out, Scalar  # noqa: E402

import test_cpu_jax as t  # noqa: E402  (the call-frame structs of the FFI C API)

HANDLE = 0x5000  # a stream handle the stub driver accepts
N_ELEMENTS = 4096
F32, ARG_BUFFER, RET_BUFFER = 11, 1, 1


class Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("dtype", ctypes.c_uint32), ("data", ctypes.c_void_p), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


def main():
    n = int(sys.argv[1])
    lib = tile_py.Library.from_bytes(b"\x7fELF stub image\0")
    k = lib.kernel("k", [In("float32"), In("float32"), Out("float32")] + [Scalar("u64")] * 4)
    attrs = tile_py.jax.attributes(k, 16, 256, None, [1, 2, 3, 4])
    xla = t.FakeXla()

    def stream_get(args):
        args.contents.stream = HANDLE
        return None

    xla._stream = t.STREAM_GET(stream_get)
    xla.api.stream_get = xla._stream
    frame = xla.frame(sorted(attrs.items()))  # XLA passes attributes sorted by name
    dims = (ctypes.c_int64 * 1)(N_ELEMENTS)
    bufs = [Buffer(ctypes.sizeof(Buffer), None, F32, 0x7F00_0000_0000 + i * 0x10000, 1, dims)
            for i in range(3)]
    arg_types = (ctypes.c_uint32 * 2)(ARG_BUFFER, ARG_BUFFER)
    arg_ptrs = (ctypes.c_void_p * 2)(*(ctypes.addressof(b) for b in bufs[:2]))
    ret_types = (ctypes.c_uint32 * 1)(RET_BUFFER)
    ret_ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(bufs[2]))
    frame.args.size, frame.args.types, frame.args.args = 2, arg_types, arg_ptrs
    frame.rets.size, frame.rets.types, frame.rets.args = 1, ret_types, ret_ptrs
    handler = t.handler()
    for _ in range(300):  # warm-up: caches, first-use paths
        handler(ctypes.byref(frame))
    for _ in range(n):
        handler(ctypes.byref(frame))
    tile_py.synchronize()
    if xla.errors:
        print(f"{len(xla.errors)} calls returned an XLA error; first: {xla.errors[0]}")
        sys.exit(1)
    print(f"{n} calls, no error")


if __name__ == "__main__":
    main()
