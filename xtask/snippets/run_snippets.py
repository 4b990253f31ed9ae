"""Runs the Python programs of the documentation against the stub driver, and checks that the
programs shown in several places are one program (`cargo xtask test`).

    python run_snippets.py ROOT

Every ```python block of README.md, docs/*.md and tile-py/README.md runs in a process of its own
with TILE_LIBCUDA naming the stub driver (bench/profile/cuda_stub.c, built by xtask) and the
PyTorch stand-in of this folder first on the path: NVRTC compiles the kernel for real, tile_py
converts, checks, consumes and launches for real; the stub runs no kernel. So a block must run
to its end, except that an `assert torch.equal(...)` on a kernel's output fails (the output
keeps its poison): that is the one failure allowed, and it is checked to be that one. After a
block, every tensor export must have been released exactly once and `tile_py.stats()` must show
no leak. The blocks run in a folder holding `vector_add.ptx`, compiled by NVRTC from
tile-launch/kernels/vector_add.cu, for the programs that load PTX from a file.

A block marked ```python continued runs after the runnable block before it in the same file, as
one program. A block marked ```python gpu needs what the stub cannot stand in for (PyTorch's
compiler, CuPy, JAX, cuTile's compiler): it must follow a line saying "*Not run by CI" and why,
and is listed, not run.

Rust blocks are compiled as doctests by tile-launch (its README, the workspace README and
docs/rust.md); a Rust block in any other of these files is refused, since nothing would compile it.
"""

import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)
EFFECT = re.compile(r"^\s*assert torch\.(equal|allclose)\(")


def blocks(path):
    text = path.read_text()
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 2  # first line of the block's body
        yield m.group(1).strip(), m.group(2), line


def kernel_text(source):
    """The `vector_add` function of a CUDA source text."""
    m = re.search(r'extern "C" __global__ void vector_add\(.*?\n}\n', source, re.S)
    if not m:
        raise SystemExit("no vector_add kernel found")
    return m.group(0)


def check_one_program(root):
    """The README's programs are the examples, and their kernel is the repository's."""
    failures = []
    kernel = kernel_text((root / "tile-launch/kernels/vector_add.cu").read_text())
    py = (root / "examples/torch_vector_add.py").read_text()
    rs_file = (root / "tile-launch/examples/vector_add.rs").read_text()
    # The example file less its leading `//!` comment and the blank line after it.
    rs = re.sub(r"\A(//!.*\n)+\n", "", rs_file)
    for name, text in (("examples/torch_vector_add.py", py), ("tile-launch/examples/vector_add.rs", rs)):
        if kernel_text(text) != kernel:
            failures.append(f"{name}: its vector_add differs from tile-launch/kernels/vector_add.cu")
    for doc, lang, program, origin in (
        ("README.md", "python", py, "examples/torch_vector_add.py"),
        ("tile-py/README.md", "python", py, "examples/torch_vector_add.py"),
        ("README.md", "rust", rs, "tile-launch/examples/vector_add.rs"),
        ("tile-launch/README.md", "rust", rs, "tile-launch/examples/vector_add.rs"),
    ):
        first = next((b for info, b, _ in blocks(root / doc) if info.split(",")[0].split()[0:1] == [lang]), None)
        if first != program:
            failures.append(f"{doc}: its first {lang} block is not {origin} (below its header comment)")
    return failures


def make_ptx(source, out):
    """Compiles CUDA C++ `source` to PTX at `out` with NVRTC (on LD_LIBRARY_PATH)."""
    import ctypes

    nvrtc = ctypes.CDLL("libnvrtc.so.13")
    prog = ctypes.c_void_p()
    check = lambda r, what: r == 0 or sys.exit(f"snippets: NVRTC {what} failed ({r})")
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"vector_add.cu", 0, None, None), "create")
    check(nvrtc.nvrtcCompileProgram(prog, 0, None), "compile")
    size = ctypes.c_size_t()
    check(nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "PTX size")
    ptx = ctypes.create_string_buffer(size.value)
    check(nvrtc.nvrtcGetPTX(prog, ptx), "PTX")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    out.write_bytes(ptx.value)


# The files whose Rust blocks tile-launch compiles as doctests (`#[doc = include_str!(...)]`).
DOCTESTED = {"README.md", "tile-launch/README.md", "docs/rust.md"}


def check_rust_blocks(root, docs):
    """A Rust block anywhere else would be shown but never compiled."""
    failures = []
    for doc in docs:
        name = str(doc.relative_to(root))
        for info, _, line in blocks(doc):
            if info.replace(",", " ").split()[:1] == ["rust"] and name not in DOCTESTED:
                failures.append(f"{name}:{line}: a Rust block outside the doctested files {sorted(DOCTESTED)}")
    return failures


def run_block(label, code):
    """In this process (a child of `main`): runs one block, then checks the releases."""
    import tile_py
    import torch  # the stand-in

    reached_effect_check = False
    try:
        exec(compile(code, label, "exec"), {"__name__": "__main__"})
    except AssertionError:
        tb = traceback.extract_tb(sys.exc_info()[2])[-1]
        line = code.splitlines()[tb.lineno - 1] if tb.filename == label else ""
        if not EFFECT.match(line):
            raise
        reached_effect_check = True
    tile_py.synchronize()
    counts = [calls for calls, _ in torch.EXPORTS]
    if any(c != 1 for c in counts):
        raise SystemExit(f"{label}: deleter calls per export {counts}, expected 1 each")
    stats = tile_py.stats()
    if stats["leaked"] != 0 or stats["released"] < len(counts):
        raise SystemExit(f"{label}: tile_py.stats() {stats}")
    how = "ran to its result check (the stub runs no kernel)" if reached_effect_check else "ran"
    exports = "1 tensor export" if len(counts) == 1 else f"{len(counts)} tensor exports"
    print(f"snippets: {label}: {how}; {exports}, each released once")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--block":
        return run_block(sys.argv[2], Path(sys.argv[3]).read_text())
    root = Path(sys.argv[1]).resolve()
    failures = check_one_program(root)
    docs = [root / "README.md", root / "tile-py/README.md", root / "tile-launch/README.md"]
    docs += sorted((root / "docs").glob("*.md"))
    failures += check_rust_blocks(root, docs)
    scratch = root / "target/snippets"
    scratch.mkdir(parents=True, exist_ok=True)
    make_ptx((root / "tile-launch/kernels/vector_add.cu").read_text(), scratch / "vector_add.ptx")
    ran = listed = 0
    for doc in docs:
        lines = doc.read_text().splitlines()
        previous = None  # the last runnable block of this file: (label, code)
        for info, code, line in blocks(doc):
            words = info.replace(",", " ").split()
            if words[:1] != ["python"]:
                continue
            label = f"{doc.relative_to(root)}:{line}"
            marks = words[1:]
            if marks not in ([], ["gpu"], ["continued"]):
                failures.append(f"{label}: unknown marks {marks} (gpu or continued)")
                continue
            if marks == ["gpu"]:
                before = lines[max(0, line - 5) : line - 1]
                if not any(l.startswith("*Not run by CI") for l in before):
                    failures.append(f"{label}: a gpu block must follow a line '*Not run by CI: why'")
                listed += 1
                print(f"snippets: {label}: not run here (marked: needs a GPU)")
                continue
            if marks == ["continued"]:
                if previous is None:
                    failures.append(f"{label}: continued, but no runnable block before it")
                    continue
                label = f"{label} (after {previous[0]})"
                code = previous[1] + code
            previous = (label, code)
            path = scratch / f"{doc.stem}-{line}.py"
            path.write_text(code)
            env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
            r = subprocess.run([sys.executable, __file__, "--block", label, str(path)], env=env, cwd=scratch)
            if r.returncode != 0:
                failures.append(f"{label}: failed (exit status {r.returncode})")
            ran += 1
    for f in failures:
        print(f"snippets: {f}", file=sys.stderr)
    print(f"snippets: {ran} Python blocks run against the stub driver, {listed} marked as needing a GPU")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
