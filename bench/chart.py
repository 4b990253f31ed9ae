"""Draws bench/launch-costs.svg, the latest side by side, from bench/results/:

- CPU: host instructions per launch, from the newest `*-profile.json` that `cargo xtask profile`
  writes (counted by callgrind against the stub driver; cuTile's own `ct.launch` among the rows
  when cuda-tile was installed), else the newest `*-profile.txt` (its printed output);
- GPU: µs per launch in burst mode, from the newest `*-python.json` that has a `ct.launch` row
  (cuTile beside tile_py in one run) and the newest `*-rust.json` (raw `cuLaunchKernel` beside
  tile-launch in one run).

    target/py-venv/bin/python -m pip install matplotlib
    target/py-venv/bin/python bench/chart.py

Each panel is one run: compare bars within a panel, not across panels (see bench/README.md).
"""

import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg" if len(sys.argv) < 2 else "agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).parent / "results"
OUT = Path(__file__).parent / "launch-costs.svg"

# Rows shown, in order, with a short label.
PY_ROWS = [
    ("ct.launch (cuTile), 3 torch tensors", "ct.launch (cuTile; releases early)"),
    ("tile_py.launch, 3 torch tensors", "tile_py.launch"),
    ("tile_py prepared (Kernel.bind), 3 torch tensors", "tile_py Kernel.bind, prepared"),
    ("tile_py.cutile.launch, cuTile kernel, 3 torch tensors", "tile_py.cutile.launch"),
    ("cuda.core launch, raw pointers", "cuda.core, raw pointers"),
    ("CuPy RawKernel, CuPy arrays", "CuPy RawKernel"),
]
CPU_LABELS = {
    "tile-launch export": "3 DLPack exports alone, no launch",
    "tile-launch scalars": "tile-launch, 7 scalars",
    "tile-launch deferred": "tile-launch deferred, 3 tensors",
    "tile-launch bound": "tile-launch prepared, 3 tensors",
    "tile-launch queued": "tile-launch queued handle, 3 tensors",
    "tile_py torch": "tile_py.launch, 3 torch-like tensors",
    "tile_py cross": "the same, producer on another stream",
    "tile_py scalars": "tile_py.launch, 7 scalars",
    "tile_py bound": "tile_py Kernel.bind, 3 torch-like tensors",
    "tile_py capsule": "tile_py.launch, 3 capsule arrays",
    "tile_py ct": "ct.launch (cuTile; releases early), 3 arrays, int stream",
    "tile_py cutile-int": "tile_py.cutile.launch, the same arguments",
    "tile_py cutile-capsule": "tile_py.cutile.launch, stream object",
    "tile_py cutile": "tile_py.cutile.launch, 3 torch-like tensors",
    "tile-launch hold": "tile-launch Stream::hold, 3 tensors",
    "tile_py hold": "tile_py.hold, 3 torch-like tensors",
}
# The CPU rows drawn from a profile JSON, in order ((group, path); others are left out).
JSON_ROWS = [
    ("python", "ct"), ("python", "cutile-int"), ("python", "cutile-capsule"),
    ("python", "capsule"), ("python", "torch"), ("python", "bound"), ("python", "scalars"),
    ("python", "hold"), ("rust", "deferred"), ("rust", "bound"), ("rust", "scalars"),
    ("rust", "hold"), ("rust", "export"),
]
RUST_ROWS = [
    ("raw cuLaunchKernel (cuda-sys)", "raw cuLaunchKernel"),
    ("tile-launch deferred, 3 DLPack tensors (export included)", "tile-launch deferred"),
    ("tile-launch prepared (bound), 3 DLPack tensors, deferred", "tile-launch prepared"),
]


def newest(pattern, keep=lambda path: True):
    paths = [p for p in sorted(RESULTS.glob(pattern)) if keep(p)]
    if not paths:
        sys.exit(f"chart: no {pattern} in {RESULTS}")
    return paths[-1]


def profile_rows(path):
    """(label, instructions) of both tables of a `cargo xtask profile` output."""
    rows, table = [], None
    for line in path.read_text().splitlines():
        if line.startswith("host instructions per launch"):
            table = "tile-launch"
        elif line.startswith("tile_py: host instructions"):
            table = "tile_py"
        elif line.startswith("where "):
            table = None
        m = re.match(r"(\w+)\s+(\d+)\s+(.*)", line)
        if table and m and m.group(1) != "path":
            key = f"{table} {m.group(1)}"
            rows.append((CPU_LABELS.get(key, key), int(m.group(2))))
    return rows


def profile_json_rows(path):
    """(label, instructions) of the rows of a `cargo xtask profile` JSON, in JSON_ROWS' order."""
    found = {(r["group"], r["path"]): r["instructions_per_launch"]
             for r in json.loads(path.read_text())["rows"]}
    table = {"python": "tile_py", "rust": "tile-launch"}
    return [(CPU_LABELS.get(f"{table[g]} {p}", f"{table[g]} {p}"), round(found[(g, p)]))
            for g, p in JSON_ROWS if (g, p) in found]


def has_ct_launch(path):
    burst = json.loads(path.read_text()).get("burst", {}).get("median_us", {})
    return any(k.startswith("ct.launch") for k in burst)


def barh(ax, rows, title, unit):
    labels = [r[0] for r in rows][::-1]
    values = [r[1] for r in rows][::-1]
    bars = ax.barh(labels, values, color="#4c72b0")
    for b, v in zip(bars, values):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v:,.{0 if unit == 'instr' else 2}f}",
                va="center", fontsize=8)
    ax.set_title(title, fontsize=9, loc="left")
    ax.tick_params(labelsize=8)
    ax.set_xlim(0, max(values) * 1.25)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def main():
    jsons = sorted(RESULTS.glob("*-profile.json"))
    prof = jsons[-1] if jsons else newest("*-profile.txt")
    py = newest("*python*.json", has_ct_launch)
    rs = newest("*-rust.json")
    py_data = json.loads(py.read_text())
    rs_data = json.loads(rs.read_text())
    py_us = py_data["burst"]["median_us"]
    rs_us = {k: v["median_us"] for k, v in rs_data["burst"]["rows"].items()}
    if prof.suffix == ".json":
        cpu = profile_json_rows(prof)
    else:
        cpu = [r for r in profile_rows(prof) if not r[0].endswith(" raw")]  # the stub's own cost
    gpu_py = [(label, py_us[key]) for key, label in PY_ROWS if key in py_us]
    gpu_rs = [(label, rs_us[key]) for key, label in RUST_ROWS if key in rs_us]

    plt.rcParams["svg.hashsalt"] = "tile"
    fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), height_ratios=[len(cpu), len(gpu_py), len(gpu_rs)])
    barh(axes[0], cpu, f"CPU: host instructions per launch, stub driver ({prof.name[:10]})", "instr")
    barh(axes[1], gpu_py, f"GPU: µs per launch, Python, bursts of 64, {py_data['gpu']} ({py.name[:10]})", "us")
    barh(axes[2], gpu_rs, f"GPU: µs per launch, Rust, bursts of 64, {rs_data['device']} ({rs.name[:10]})", "us")
    fig.suptitle("Launch cost of a 4096-element float32 vector add with 3 tensors (lower is better)",
                 fontsize=10)
    fig.tight_layout()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    fig.savefig(out, metadata={"Date": None} if out.suffix == ".svg" else None)
    print(f"chart: {OUT.name} from {prof.name}, {py.name}, {rs.name}")


if __name__ == "__main__":
    main()
