"""GPU tests of ``tile_py.hold`` with another launcher: cuda.core's ``launch`` (H200, from the GPU
bundle with TILE_REQUIRE_GPU=1; skipped where cuda.core is not installed).

The seed's scenario, as cuTile's launcher meets it: a producer whose every export is a fresh
copy (so the capsule is its only owner), a launch stream kept busy, and an allocation of the
same size right after the launch call returns. The launcher reads the data pointer from the
capsule, marks the capsule consumed and launches with cuda.core. Then either it calls the
DLPack deleter at once (the bug: the copy's memory goes back to the caching allocator, the
next allocation gets it, and the kernel, still waiting behind the busy work, copies that) or it
hands the capsule to ``tile_py.hold`` (the fix: the deleter runs once the kernel is done).
"""

import ctypes

import pytest

import tile_py
from dlpack_ctypes import DLManagedTensor
from gpu_support import BLOCK, Cloner, grid_for, settle

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void copy_f32(const float* x, float* y, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""

# Prototypes of our own: setting argtypes on `ctypes.pythonapi`'s shared function objects would
# change them for every other module of the process (dlpack_ctypes declares them otherwise).
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi)
)


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    torch.zeros(1, device="cuda")  # the primary context exists
    return torch


@pytest.fixture(scope="module")
def core(torch):
    try:
        import cuda.core as core

        core.Device  # noqa: B018 - the names moved out of cuda.core.experimental in 0.4
    except (ImportError, AttributeError):
        core = pytest.importorskip("cuda.core.experimental")
    dev = core.Device(0)
    dev.set_current()
    arch = "".join(str(v) for v in dev.compute_capability)
    prog = core.Program(SOURCE, code_type="c++", options=core.ProgramOptions(arch=f"sm_{arch}"))
    module = prog.compile("cubin")
    return core, dev, module.get_kernel("copy_f32"), module.get_kernel("spin")


def consume(capsule):
    """What cuTile's launcher does with a capsule: read the data pointer, then rename the capsule
    so that its destructor no longer calls the deleter. Returns the pointer and the managed
    tensor."""
    managed = DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    ptr = managed.dl_tensor.data + managed.dl_tensor.byte_offset
    assert _set_name(capsule, b"used_dltensor") == 0
    return ptr, managed


def run_scenario(torch, core, hold):
    """One launch of the scenario; returns how many elements of the output are wrong."""
    import numpy as np

    cc, dev, copy, spin = core
    n = 2**26
    src = torch.randn(n, device="cuda")
    out = torch.full((n,), -1.0, device="cuda")
    settle(torch)
    stream = dev.create_stream()
    # Keep the launch stream busy (about 50 ms at ~2 GHz).
    cc.launch(stream, cc.LaunchConfig(grid=1, block=1), spin, np.int64(100_000_000))
    producer = Cloner(src)
    # The copy is made and finished before the export is handed over (the stream handshake's
    # effect, done here by hand to keep the scenario to the release alone).
    capsule = producer.__dlpack__()
    torch.cuda.current_stream().synchronize()
    ptr, managed = consume(capsule)
    config = cc.LaunchConfig(grid=grid_for(n), block=BLOCK)
    cc.launch(stream, config, copy, ptr, out.data_ptr(), np.uint64(n))
    if hold:
        tile_py.hold(stream, capsule)  # the deleter runs once the copy kernel is done
    else:
        managed.deleter(ctypes.addressof(managed))  # cuTile's order: before the kernel ran
    del capsule, managed
    # Right after the launch call: an allocation of the same size, written at once.
    junk = torch.full((n,), -7.0, device="cuda")
    stream.sync()
    settle(torch)
    wrong = (out != src).sum().item()
    del junk
    stream.close()
    return wrong


def test_cuda_core_launch_with_hold_gets_every_element_right(torch, core):
    before = tile_py.stats()
    assert run_scenario(torch, core, hold=True) == 0
    settle(torch)
    after = tile_py.stats()
    assert after["pending_guards"] == before["pending_guards"]


def test_cuda_core_launch_releasing_at_once_gets_elements_wrong(torch, core):
    """The control: the same launch with the deleter called when the launch call returns.
    Shows that the scenario exposes the early release on this machine (the caching allocator
    hands the copy's block to the next allocation of its size)."""
    wrong = run_scenario(torch, core, hold=False)
    assert wrong > 0, "the early release went unseen: the scenario did not reuse the block"
