#!/usr/bin/env bash
# Runs test_gpu_cutile.py on a GPU machine without network, from the kit that
# tile-py/tests/cutile_kit.sh builds (this file is copied there as target/cutile-kit/run.sh).
# Run from the repository root:
#
#   bash target/cutile-kit/run.sh
#
# Installs the tile_py wheel and cuda-tile of the kit with `pip --target` into a temporary
# directory, unpacks the compiler (tileiras, ptxas, libnvvm), unsets CUDA_HOME and CUDA_PATH (the
# machine's toolkit is too old for cuTile's compiler), puts the kit's bin first on PATH and its
# lib on LD_LIBRARY_PATH, and runs each test of test_gpu_cutile.py in its own pytest process
# under `timeout` (TEST_TIMEOUT seconds, default 600) with TILE_REQUIRE_GPU=1 and
# TILE_REQUIRE_CUTILE=1. Output goes to $OUT/log.txt (OUT defaults to target/cutile-kit/out).
set -u
kit=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$kit/../.." && pwd)
tests="$root/tile-py/tests"
out=${OUT:-$kit/out}
mkdir -p "$out"
log="$out/log.txt"
py=${PYTHON:-python3}
per_test=${TEST_TIMEOUT:-600}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
    "$py" -m pip install --quiet --no-index --no-deps --target "$tmp/site" \
        "$kit"/tile_py-*.whl "$kit"/cuda_tile-*.whl || exit 1
    tar -C "$tmp" -xJf "$kit/kit.tar.xz" || exit 1
    unset CUDA_HOME CUDA_PATH
    export PATH="$tmp/bin:$PATH"
    export LD_LIBRARY_PATH="$tmp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    export TILE_REQUIRE_GPU=1 TILE_REQUIRE_CUTILE=1
    echo "tileiras: $(command -v tileiras) ($(tileiras --version 2>&1 | tail -n 1))"
    "$py" -c 'import cuda.tile, tile_py; print("cuda.tile", cuda.tile.__version__, "tile_py", tile_py.__version__)'
    cd "$tmp"
    status=0
    names=$("$py" -m pytest -q --collect-only -p no:cacheprovider "$tests/test_gpu_cutile.py" \
        | grep '::' || true)
    for t in $names; do
        echo "== $t"
        timeout "$per_test" "$py" -m pytest -v -s -rs -p no:cacheprovider "$tests/$(basename "$t")" \
            || { echo "== FAILED (exit $?): $t"; status=1; }
    done
    echo "== overall status $status"
    exit $status
} > "$log" 2>&1
