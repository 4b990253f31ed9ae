#!/usr/bin/env bash
# Builds target/cutile-kit/: what test_gpu_cutile.py needs on a GPU machine without network whose
# CUDA toolkit is too old for cuTile's compiler. Run from the repository root, on a machine with
# PyPI access, after `cargo xtask wheel`:
#
#   bash tile-py/tests/cutile_kit.sh
#
# It holds (about 60 MiB in all):
# - cuda_tile-1.7.0-cp312-...whl, cuTile Python for the GPU machine's Python 3.12;
# - kit.tar.xz: bin/tileiras, bin/ptxas and lib/libnvvm.so.4 from the 13.4.92 wheels
#   nvidia-cuda-tileiras, nvidia-cuda-nvcc and nvidia-nvvm (nothing else of them);
# - tile_py-*.whl, copied from target/wheels/ (the abi3 wheel `cargo xtask wheel` builds);
# - run.sh, which runs the tests there (see its header).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kit="$root/target/cutile-kit"
py=${PYTHON:-python3}
CUDA_TILE=1.7.0
TOOLKIT=13.4.92
rm -rf "$kit"
mkdir -p "$kit"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux2014_x86_64 "cuda-tile==$CUDA_TILE" -d "$kit"
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
    "nvidia-cuda-tileiras==$TOOLKIT" "nvidia-cuda-nvcc==$TOOLKIT" "nvidia-nvvm==$TOOLKIT" -d "$tmp/wheels"

# Keep three files of the toolkit wheels, as bin/ and lib/.
"$py" - "$tmp/wheels" "$tmp/kit" <<'PY'
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
want = {"nvidia/cu13/bin/tileiras": "bin/tileiras", "nvidia/cu13/bin/ptxas": "bin/ptxas",
        "nvidia/cu13/lib/libnvvm.so.4": "lib/libnvvm.so.4"}
found = set()
for whl in glob.glob(os.path.join(src, "*.whl")):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name in want:
                out = os.path.join(dst, want[name])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with z.open(name) as f, open(out, "wb") as g:
                    g.write(f.read())
                os.chmod(out, 0o755)
                found.add(name)
missing = set(want) - found
if missing:
    sys.exit(f"not found in the toolkit wheels: {sorted(missing)}")
PY
# xz -9e: about 57 MiB instead of 59, so that the kit, the wheels and a checkout stay under
# 64 MiB together.
tar -C "$tmp/kit" -cf - bin lib | xz -9e -T0 > "$kit/kit.tar.xz"

wheel=$(ls "$root"/target/wheels/tile_py-*abi3*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "no tile_py wheel in target/wheels/: run cargo xtask wheel first" >&2
    exit 1
fi
cp "$wheel" "$kit/"
cp "$root/tile-py/tests/cutile_run.sh" "$kit/run.sh"
du -sh "$kit"/*
du -sh "$kit"
