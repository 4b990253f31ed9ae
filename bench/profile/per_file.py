"""Instructions per launch by source file of the project, from two callgrind runs of one path.

    python3 bench/profile/per_file.py SHORT.callgrind N_SHORT LONG.callgrind N_LONG

`cargo xtask profile` runs each Python path twice (N_SHORT and N_LONG launches, files
`target/profile/callgrind.py-PATH.N`); the difference of the two, divided by the difference of N,
is the cost of one launch. This script makes that difference per source file, inlined code
counted in the file it was written in (callgrind's `fi=` / `fe=` records), and prints the
project's files whose code runs on every launch, most instructions first. It answers "which
files does one launch enter, and what does each cost" without reading the code.
"""

import re
import sys
from collections import defaultdict

PROJECT = re.compile(r"/(cuda-sys|tile-dlpack|tile-launch|tile-py|tile-capi)/src/(.+)$")


def self_cost_by_file(path):
    """Self instructions (Ir) per source file: costs after a `calls=` line are a callee's
    inclusive cost and are skipped."""
    names = {}
    costs = defaultdict(int)
    fl = fi = None
    skip_next = False
    with open(path) as f:
        for line in f:
            c = line[0]
            if c.isdigit() or c in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    costs[fi or fl] += int(parts[1])
                continue
            m = re.match(r"(c?)(fl|fi|fe)=\((\d+)\)(?: (.*))?", line)
            if m:
                callee, key, ident, name = m.groups()
                if name:
                    # A file is named at its first mention, which may be a callee's (`cfi=`).
                    names[ident] = name.strip()
                if callee:
                    continue
                if key == "fl":
                    fl, fi = names.get(ident), None
                else:
                    fi = names.get(ident)
                continue
            if line.startswith("fn="):
                fi = None
            elif line.startswith("calls="):
                skip_next = True
    return costs


def group(name):
    """Where a file outside the project belongs: a crate of the registry, Rust's standard
    library, the interpreter, the stub driver or the test producer, the C library."""
    if not name or name == "???":
        return "no line table (stripped code)"
    m = re.search(r"/registry/src/[^/]+/([A-Za-z0-9_]+(?:-[A-Za-z_][A-Za-z0-9_]*)*)-\d", name)
    if m:
        return f"crate {m.group(1)}"
    if name.startswith("/rustc/"):
        return "Rust std / core / alloc"
    if "Python-3" in name or "/Include/" in name:
        return "CPython"
    if name.endswith("cuda_stub.c"):
        return "stub driver"
    if name.endswith("fake_exchange.c"):
        return "producer (fake_exchange.c)"
    return "C library and other"


def main():
    short, n_short, long, n_long = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    a, b = self_cost_by_file(short), self_cost_by_file(long)
    per = {}
    outside = defaultdict(float)
    for name in set(a) | set(b):
        d = (b.get(name, 0) - a.get(name, 0)) / (n_long - n_short)
        m = name and PROJECT.search(name)
        if not m:
            outside[group(name)] += d
            continue
        if d >= 0.5:
            key = f"{m.group(1)}/src/{m.group(2)}"
            per[key] = per.get(key, 0) + d
    total = sum(per.values())
    for key, d in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{d:10.1f}  {key}")
    print(f"{total:10.1f}  in {len(per)} files of the project, per launch")
    print()
    for key, d in sorted(outside.items(), key=lambda kv: -kv[1]):
        if abs(d) >= 0.5:
            print(f"{d:10.1f}  {key}")
    print(f"{total + sum(outside.values()):10.1f}  per launch in all")


if __name__ == "__main__":
    main()
